"""``python -m compat_hook`` is ``compat-hook``."""

import sys

from compat_hook.cli import main

sys.exit(main())
