"""The CPU allocator setting: freed large buffers stay in the heap for reuse (glibc), in a process of its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys, torch
from evolrl.logprobs.allocator import keep_freed_memory

def rss_mib():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS:")).split()[1]) / 1024

if sys.argv[1] == "keep":
    assert keep_freed_memory()
before = rss_mib()
x = torch.ones(64 * 2**20)  # 256 MiB, touched
del x
print(rss_mib() - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_stay_for_reuse_only_when_asked():
    kept = {mode: float(subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                                       check=True).stdout.split()[-1]) for mode in ("keep", "default")}
    assert kept["keep"] > 200  # the freed 256 MiB are still resident, ready for the next allocation
    assert kept["default"] < 50  # glibc's default: unmapped on free (and page-faulted in again next time)
