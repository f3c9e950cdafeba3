"""``python -m compat_hook`` is ``compat-hook``."""

import sys

from compat_hook.commands.cli import main

sys.exit(main())
