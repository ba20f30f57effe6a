"""The study runner (``study``: run, summary, probe, leak) and its parts (``probe``, ``probe_responses``, ``leak``)."""
