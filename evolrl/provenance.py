"""Where a result came from: the checkout's commit and the processor, for a run's record and a report.

Standard library only (torch is imported when a processor is named): ``tools`` import it and start in a blink.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
"""The checkout ``evolrl`` is imported from (the repository root in a development install)."""


def commit(root: Path = CHECKOUT) -> str:
    """The checkout's commit, ``+changes`` when tracked files differ from it; ``unknown`` outside a git checkout (an
    installed wheel)."""
    try:
        head, dirty = (subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                      check=True).stdout.strip()
                       for args in (["rev-parse", "--short", "HEAD"],
                                    ["status", "--porcelain", "--untracked-files=no"]))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def processor() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else ``platform``), and each visible GPU's name after it."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return "; ".join([cpu, *(torch.cuda.get_device_name(i) for i in range(count))])
