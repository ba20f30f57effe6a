"""Scripts around evolrl, run from the repository root as ``python -m tools.<group>.<name> --help``.

* ``tools.commands``: commands for users (data files, the GPU acceptance check, the memory budget, curves, the gap,
  a grace period for schedulers).
* ``tools.bench``: benchmarks (against TRL, the update alone, on one GPU, sampling beside training).
* ``tools.study``: the study runner, its task probe and the leak measure.
* ``tools.common``: what several of them share.
"""
