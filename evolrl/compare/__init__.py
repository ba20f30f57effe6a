"""``python -m evolrl compare``: label-free methods compared as a researcher does, over seeds on held-out problems.

``spec`` (what is compared), ``resolve`` (a run's configuration as ``fit`` parses it), ``plan`` (written and frozen
before the runs), ``runner`` (the runs, or their command lines), ``paired`` (per-problem differences and the
bootstrap over seeds and problems), ``report`` with ``curves`` and ``figure``; ``cli`` ties them together.
"""
