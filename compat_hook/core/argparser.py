"""The command lines' argument parser: bad usage is one line on stderr and exit status 2.

``compat-hook``, ``compat-hook cluster`` and ``compat-hook cluster validate``
parse with :class:`Parser` (their subcommands too, as ``parser_class``), so a
mistyped option reads the same everywhere: ``PROG: MESSAGE (see --help)`` and
:data:`~compat_hook.core.errors.EXIT_USAGE`, never argparse's usage block (it
stays in ``--help``). Imported only when a command line is parsed: argparse
is not cheap, and a container start never parses one.

>>> import contextlib, io
>>> err = io.StringIO()
>>> with contextlib.redirect_stderr(err):
...     try:
...         Parser(prog="compat-hook demo").parse_args(["--nope"])
...     except SystemExit as e:
...         status = e.code
>>> status, err.getvalue()
(2, 'compat-hook demo: unrecognized arguments: --nope (see --help)\\n')
"""

from __future__ import annotations

import argparse
import sys

from .errors import EXIT_USAGE

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line and :data:`EXIT_USAGE`."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)
