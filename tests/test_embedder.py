"""The real packaged all-MiniLM-L6-v2, offline."""

import pytest
import torch

from evolrl.rewards import Embedder, EmbedderError, EvolReward, NoveltyBands, SentenceTransformerEmbedder
from evolrl.rewards.embedders import check_embeddings
from evolrl.types import Prompt, ResponseGroup, RolloutBatch


def test_paraphrases_are_closer_than_unrelated_texts(minilm):
    texts = [
        "Add 3 and 4 to get 7, so the answer is 7.",
        "Three plus four equals seven; the result is 7.",
        "The train leaves the station at noon and arrives in Paris at six.",
        "Photosynthesis turns sunlight, water and carbon dioxide into sugar.",
    ]
    e = minilm.embed(texts)
    assert e.shape == (4, 384)
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(4))
    s = e @ e.T
    assert s[0, 1] > s[0, 2] + 0.2
    assert s[0, 1] > s[0, 3] + 0.2
    assert s[0, 1] > s[2, 3]


def test_identical_texts_embed_identically(minilm):
    e = minilm.embed(["x = 5 because 2x = 10.", "something else entirely, longer than the first text", "x = 5 because 2x = 10."])
    torch.testing.assert_close(e[0], e[2], atol=1e-5, rtol=0)


def test_a_bf16_embedder_returns_unit_rows():
    """Qwen3-Embedding-4B runs in bf16 in the paper configs: its rows, normalized in bf16, were up to 0.4% off unit
    length and failed the embedder's own check. Normalized in float32 they are unit to float32 rounding."""
    e = SentenceTransformerEmbedder(device="cpu", dtype="bfloat16").embed(["Add 3 and 4.", "Seven.", "x = 5"] * 20)
    torch.testing.assert_close(e.norm(dim=-1), torch.ones(60), atol=1e-6, rtol=0)


def test_missing_model_is_a_clear_error(tmp_path):
    embedder = SentenceTransformerEmbedder(model=str(tmp_path / "no-such-model"))
    with pytest.raises(EmbedderError, match="no-such-model"):
        embedder.embed(["hello"])


class BrokenEmbedder(Embedder):
    """Returns NaN: stands for a remote or GPU embedder that fails mid-run."""

    def embed(self, texts):
        return check_embeddings(torch.full((len(texts), 4), float("nan")), len(texts))


def test_embedder_failure_raises_instead_of_random_vectors():
    batch = RolloutBatch((ResponseGroup(Prompt("p0", "q"), (r"\boxed{1}", r"\boxed{1}", r"\boxed{2}")),))
    with pytest.raises(EmbedderError, match="non-finite"):
        EvolReward(NoveltyBands(BrokenEmbedder()))(batch)


def test_check_embeddings_rejects_wrong_count_and_unnormalized():
    with pytest.raises(EmbedderError, match="expected 3 embeddings"):
        check_embeddings(torch.ones(2, 4) / 2, 3)
    with pytest.raises(EmbedderError, match="not L2-normalized"):
        check_embeddings(torch.ones(2, 4), 2)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU case is the next test")
def test_default_device_without_a_gpu_is_the_cpu():
    embedder = SentenceTransformerEmbedder()
    assert embedder.embed(["hello"]).shape == (1, 384)
    assert embedder.model.device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_default_device_is_this_process_gpu():
    """On several ranks each embedder sits on its own rank's GPU (Lightning sets the current device)."""
    last = torch.cuda.device_count() - 1
    torch.cuda.set_device(last)
    embedder = SentenceTransformerEmbedder()
    embedder.embed(["hello"])
    assert embedder.model.device == torch.device("cuda", last)
