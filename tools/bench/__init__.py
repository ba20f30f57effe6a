"""Benchmarks: ``bench`` (evolrl vs TRL), the update alone (``bench_update``, ``update_profile``), its parts
(``bench_logprobs``, ``bench_sdpa``, ``bench_embed``, ``cpu_matmul``, ``host_memory``), and ``fsdp_check`` (FSDP2 on
CPU processes, run by tests/test_distributed.py)."""
