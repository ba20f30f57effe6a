"""What the tools share: the repository root and its commit, this process's memory, this machine's matmul rate, a free
port, a run's TensorBoard scalars, a markdown table, a failed child's report, a SIGTERM passed on to the children."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

from evolrl.provenance import commit as checkout_commit
from evolrl.compare.curves import read_scalars, table

__all__ = ["ROOT", "commit", "failure_report", "free_port", "matmul_peak", "pass_on_sigterm", "read_scalars",
           "reset_peak", "status_mib", "table"]

ROOT = Path(__file__).resolve().parent.parent
"""The repository root: the working directory of ``python -m tools....`` children, so that ``tools`` imports."""


def commit() -> str:
    """The checkout's commit, ``+changes`` when tracked files differ from it (what a run or report was made with);
    ``unknown`` outside a git checkout."""
    return checkout_commit(ROOT)


def status_mib(field: str = "VmRSS") -> float:
    """This process's resident set (``VmRSS``) or its high-water mark (``VmHWM``), in MiB, from /proc.

    Not ``getrusage``'s ``ru_maxrss``: a child process inherits its parent's peak there.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Start ``VmHWM`` again from the current ``VmRSS`` (Linux >= 4.0), to measure one phase's peak."""
    Path("/proc/self/clear_refs").write_text("5")


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now (for a process group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def matmul_peak(dtype: str, size: int, repeats: int, device: str = "cpu") -> float:
    """FLOP/s of the fastest of ``repeats`` ``size``-square matmuls (on a GPU, each timed to its end)."""
    import torch

    a, b = (torch.randn(size, size, device=device).to(getattr(torch, dtype)) for _ in range(2))
    sync = torch.cuda.synchronize if a.is_cuda else lambda: None
    torch.matmul(a, b)  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        torch.matmul(a, b)
        sync()
        times.append(time.perf_counter() - start)
    return 2 * size**3 / min(times)


EXCEPTION = re.compile(r"^(\[rank\d+\]:\s*)?([\w.]+(Error|Exception|Interrupt)\b.*)")


def failure_report(stderr: str, tail: int = 3000) -> str:
    """What a failed child process printed, shortened: the lines that name an exception (a compiler's dump can push
    the traceback's last line out of any tail), then the tail."""
    named = [m.group(2)[:300] for line in stderr.splitlines() if (m := EXCEPTION.match(line.strip()))]
    head = "exceptions raised:\n" + "\n".join(named[-8:]) + "\n...\n" if named else ""
    return head + stderr[-tail:]


def pass_on_sigterm() -> None:
    """SIGTERM to a tool (``kill PID``) goes on to its children (the whole group of one leading its own session); once
    they end, the tool says so and exits ``128 + 15`` (a ``fit`` child saves its checkpoint first)."""

    def stop(signum, frame) -> None:
        import psutil  # accelerate's dependency
        children = psutil.Process().children()
        for child in children:
            with contextlib.suppress(ProcessLookupError, psutil.NoSuchProcess):
                os.killpg(child.pid, signum) if os.getpgid(child.pid) == child.pid else child.send_signal(signum)
        psutil.wait_procs(children)
        os.write(2, f"{sys.argv[0]}: SIGTERM passed on to its children, which ended; exit {128 + signum}\n".encode())
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
