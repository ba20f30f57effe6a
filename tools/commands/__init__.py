"""Commands for users: ``prepare_data``, ``gpu_check``, ``gpu_budget``, ``plot_dynamics``, ``mismatch_gap``,
``grace_period``, ``import_map``."""
