"""Commands for users: ``export_hf``, ``gpu_check``, ``gpu_budget``, ``plot_dynamics``, ``mismatch_gap``."""
