"""``python -m tools.commands.gpu_check``: see ``check.py``."""

import sys

from tools.commands.gpu_check.check import main
from tools.common import pass_on_sigterm

pass_on_sigterm()
sys.exit(main())
