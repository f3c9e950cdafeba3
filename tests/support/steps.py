"""Output of the tests' multi-step shell scripts: `step NAME` prints `=== NAME`."""

from __future__ import annotations


def sections(out: str) -> dict:
    """``{step name: its output}`` from lines headed ``=== NAME``."""
    res: dict = {}
    cur = None
    for line in out.splitlines():
        if line.startswith("=== "):
            cur = line[4:]
            res[cur] = []
        elif cur is not None:
            res[cur].append(line)
    return {k: "\n".join(v) for k, v in res.items()}
