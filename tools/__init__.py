"""Scripts around evolrl, run from the repository root as ``python -m tools.<group>.<name> --help``: ``commands``
for users, ``bench`` benchmarks, ``study`` the study runner (each package's docstring lists its modules), ``common``
what several of them share."""
