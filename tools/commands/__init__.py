"""Commands for users: ``gpu_check``, ``gpu_budget``, ``plot_dynamics``, ``mismatch_gap``."""
