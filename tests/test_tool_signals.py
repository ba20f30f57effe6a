"""A SIGTERM to a tool alone (``kill PID``) reaches the processes it runs (``tools.common.pass_on_sigterm``).

Real processes and real signals: a tool whose child runs a tool whose child sleeps, as ``tools.bench.bench`` runs its
``--child`` and ``tools.bench.gpu_update`` its sections. Only the top process is signalled. The waits are generous
bounds on a loaded CI machine, not timings: each passes as soon as the processes have reported.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.parent

TOOL = """
import subprocess, sys
from tools.common import pass_on_sigterm
pass_on_sigterm()
print("started", flush=True)
sys.exit(subprocess.run([sys.executable, "-c", sys.argv[1]]).returncode)
"""
LAST = """
import os, signal, sys, time
def stop(signum, frame):
    time.sleep(1.0)  # a fit child saving its checkpoint
    open(sys.argv[1], "w").write(str(os.getpid()))
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("child", os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_tool_passes_sigterm_down_and_exits_143_after_its_children(tmp_path):
    marker = tmp_path / "ended"
    inner = f"import sys; sys.argv = ['tool', {LAST!r}, {str(marker)!r}]\n" + TOOL.replace(
        'sys.argv[1]]', 'sys.argv[1], sys.argv[2]]')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    top = subprocess.Popen([sys.executable, "-c", TOOL, inner], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    lines = [top.stdout.readline() for _ in range(3)]  # started, started, child PID
    assert lines[:2] == ["started\n", "started\n"] and lines[2].startswith("child"), lines
    last = int(lines[2].split()[1])
    top.send_signal(signal.SIGTERM)
    assert top.wait(timeout=60) == 143
    assert marker.read_text() == str(last), "the tool exited before its grandchild had ended"
    said = [f"{name}: SIGTERM passed on to its children, which ended; exit 143" for name in ("tool", "-c")]
    assert top.stderr.read().splitlines() == said, "each tool, the inner one first, says why it ended (its argv[0])"
    deadline = time.monotonic() + 10
    while Path(f"/proc/{last}").exists() and time.monotonic() < deadline:  # reaped by its parent, already ended
        time.sleep(0.1)
    assert not Path(f"/proc/{last}").exists()


def ended(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper (an orphan's reaper in a container may never come)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_child_leading_its_own_session_gets_sigterm_for_its_whole_group(tmp_path):
    """``gpu_check`` starts pytest in a session of its own; pytest's children must end with it, although pytest passes
    nothing on (here: a child without a handler, whose own child sleeps)."""
    sleeper = "import os, time; print('child', os.getpid(), flush=True); time.sleep(600)"
    middle = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper!r}])"
    tool = TOOL.replace("sys.argv[1]])", "sys.argv[1]], start_new_session=True)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    top = subprocess.Popen([sys.executable, "-c", tool, middle], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           text=True)
    lines = [top.stdout.readline() for _ in range(2)]
    assert lines[0] == "started\n" and lines[1].startswith("child"), lines
    last = int(lines[1].split()[1])
    try:
        top.send_signal(signal.SIGTERM)
        assert top.wait(timeout=60) == 143
        deadline = time.monotonic() + 10
        while not ended(last) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ended(last), "the grandchild in the child's process group outlived the tool"
    finally:
        if not ended(last):
            os.kill(last, signal.SIGKILL)
