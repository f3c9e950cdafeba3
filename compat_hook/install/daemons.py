"""The engine daemons running now that read a given configuration file.

containerd, dockerd and CRI-O read their runtime table when they start and
keep it in memory: after ``uninstall`` takes compat-hook's runtime out of the
file, the running daemon still execs the wrapper's path for every new pod or
container until it restarts (a pod whose sandbox is created in that window
fails with ``fork/exec <wrapper>: no such file or directory`` if the file is
gone). So the uninstall leaves a pass-through at the wrapper's path while such
a daemon runs, and records *which* process it was (:class:`Daemon`: pid,
start time, boot id); a later ``uninstall`` removes the pass-through once that
very process is gone, i.e. the engine has restarted and loaded the file
without compat-hook.

Which file a daemon reads comes from its command line (``--config`` and the
like, else the engine's default) resolved through ``/proc/<pid>/root`` and
``/proc/<pid>/cwd``: a daemon in another mount namespace (a test's, a
node-in-a-container's) counts only when its file is the very same file (device
and inode) as ours.

>>> config_args(["containerd", "--log-level", "info", "-c", "/x/config.toml"], "containerd")
['/x/config.toml']
>>> config_args(["/usr/bin/dockerd", "--config-file=/d.json"], "docker")
['/d.json']
>>> config_args(["crio"], "crio")
['/etc/crio/crio.conf', '/etc/crio/crio.conf.d']
>>> Daemon.parse("containerd 41 1234 0d5f-boot")
Daemon(engine='containerd', pid=41, start=1234, boot='0d5f-boot')
"""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Daemon", "running", "alive", "processes", "config_args", "RECORD_TAG"]

#: The daemon's program name and, per engine, the flags naming its configuration and their defaults.
_ENGINES = {
    "containerd": ("containerd", ("--config", "-c"), ("/etc/containerd/config.toml",)),
    "docker": ("dockerd", ("--config-file",), ("/etc/docker/daemon.json",)),
    # CRI-O reads the main file and then its drop-in dir, where compat-hook's registration lives.
    "crio": ("crio", ("--config", "-c", "--config-dir", "-d"), ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d")),
}
#: How a pass-through names the daemon it waits for, one line each.
RECORD_TAG = "# engine-process: "


@dataclass(frozen=True)
class Daemon:
    """One running engine daemon: pid, start time (clock ticks after boot) and boot id, which pin the process."""

    engine: str
    pid: int
    start: int
    boot: str

    def record(self) -> str:
        return f"{self.engine} {self.pid} {self.start} {self.boot}"

    @classmethod
    def parse(cls, text: str) -> Daemon | None:
        parts = text.split()
        if len(parts) != 4 or not (parts[1].isdigit() and parts[2].isdigit()):
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]), parts[3])

    def __str__(self) -> str:
        return f"{_ENGINES.get(self.engine, (self.engine,))[0]} (pid {self.pid})"


def config_args(argv: list, engine: str) -> list:
    """The configuration paths a daemon started with ``argv`` reads (its flags, else the engine's defaults).

    For CRI-O, ``--config`` replaces the first default and ``--config-dir`` the second.
    """
    _, flags, defaults = _ENGINES[engine]
    found = list(defaults)
    for i, a in enumerate(argv[1:], 1):
        for k, flag in enumerate(flags):
            value = None
            if a == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif a.startswith(flag + "=") and flag.startswith("--"):
                value = a[len(flag) + 1:]
            if value is not None:
                slot = 0 if engine != "crio" else k // 2
                found[slot] = value
    return found


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or "-"
    except OSError:
        return "-"


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (after the command name, which may hold spaces and parens)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _identity(path: str):
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def running(engine: str, config: str) -> list:
    """The daemons of ``engine`` running now whose configuration (file or CRI-O's drop-in dir) is ``config``.

    ``config``: the file compat-hook's registration is read through: containerd's
    main ``config.toml`` (its ``conf.d`` drop-ins are imported by it), Docker's
    ``daemon.json``, CRI-O's drop-in directory. ``[]`` for an engine without a
    daemon of its own (the NVIDIA toolkit's runtime reads its file at every
    container) and when ``/proc`` cannot be read.
    """
    if engine not in _ENGINES:
        return []
    want = _identity(config)
    if want is None:
        return []
    program = _ENGINES[engine][0].encode()
    boot = _boot_id()
    found = []
    for pid, raw in processes():
        if os.path.basename(raw[0]) != program:
            continue
        argv = [a.decode("utf-8", "surrogateescape") for a in raw]
        for arg in config_args(argv, engine):
            # Through the daemon's own root and cwd: the same path may be another file in its mount namespace.
            where = f"/proc/{pid}/root{arg}" if os.path.isabs(arg) else os.path.join(f"/proc/{pid}/cwd", arg)
            if _identity(where) == want:
                start = _start_time(pid)
                if start is not None:
                    found.append(Daemon(engine, pid, start, boot))
                break
    return found


def processes():
    """``(pid, argv as bytes)`` of each process now (``/proc/<pid>/cmdline``; kernel threads, which have none,
    and processes gone meanwhile are left out). The one walk over ``/proc`` of the install commands."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        if argv:
            yield pid, argv


def alive(daemons) -> list:
    """Those of ``daemons`` (:class:`Daemon`) still running: same pid, same start time, same boot."""
    boot = _boot_id()
    return [d for d in daemons if d.boot == boot and _start_time(d.pid) == d.start]
