"""``python -m tools.commands.gpu_check``: see ``check.py``."""

import sys

from tools.commands.gpu_check.check import main

sys.exit(main())
