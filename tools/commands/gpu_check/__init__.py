"""The GPU acceptance check, one command: ``python -m tools.commands.gpu_check`` (``check.py``; the machine in
``env.py``, the in-process measurements in ``probes.py``, the CLI runs in ``runs.py``)."""
