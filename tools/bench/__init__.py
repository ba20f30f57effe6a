"""Benchmarks: ``bench`` (evolrl vs TRL), the update alone (``bench_update`` with ``update_profile``, and
``gpu_update`` on one GPU), and sampling beside training (``async_rollouts``)."""
