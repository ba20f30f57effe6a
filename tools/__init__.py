"""Scripts around evolrl, run from the repository root as ``python -m tools.<group>.<name> --help``.

* ``tools.commands``: commands for users (export, the GPU acceptance check, the memory budget, curves, the gap).
* ``tools.bench``: benchmarks (against TRL, of the update alone) and the multi-process FSDP check the tests run.
* ``tools.study``: the study runner and its reward and response probes.
* ``tools.common``: what several of them share.
"""
