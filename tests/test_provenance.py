"""A run's record names the checkout it ran from: the commit is this repository's, not a folder above it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from evolrl.provenance import CHECKOUT, commit, processor

ROOT = Path(__file__).parent.parent


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout (the commit is 'unknown' by design)")
def test_the_commit_is_the_checkout_s_own():
    assert CHECKOUT == ROOT.resolve()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert commit().split("+")[0] == head


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert commit(tmp_path) == "unknown"
    assert processor()  # a name, on any machine
