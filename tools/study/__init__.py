"""The study runner (``study``: run, summary, probe, rewards) and its parts (``reward_shape``, ``probe_responses``)."""
