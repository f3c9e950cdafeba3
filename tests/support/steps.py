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


#: The start of a script run under ``unshare -m``: the machine's /usr, /etc and /var behind overlays in
#: ``{tmp}`` (so a package or a registration can be installed for real and nothing of the machine
#: changes), and ``step NAME`` printing the headers :func:`sections` splits on. A ``str.format``
#: template: ``{tmp}`` is filled in, braces of the shell are doubled.
NODE_OVERLAY = r"""
set -eu
T={tmp}
for d in usr etc var; do
    mkdir -p "$T/upper/$d" "$T/work/$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$T/upper/$d,workdir=$T/work/$d" "/$d"
done
step() {{ echo "=== $1"; }}
"""
