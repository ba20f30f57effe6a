"""The GPU acceptance check, one command: ``python -m tools.commands.gpu_check`` (``check.py``; the machine in
``env.py``, the CLI runs in ``runs.py``)."""
