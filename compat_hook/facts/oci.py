"""Reading the OCI state (hook stdin) and the bundle's config.json.

runc and crun differ (runtime-spec hooks, as measured here): crun adds a
``root`` field, ``pid`` is 1 (runc) or 0 (crun) at createContainer, and the
cwd is the rootfs (runc createContainer) or the bundle. None of that is used:
the rootfs is always ``bundle`` + config.json ``root.path`` (joined when
relative).

>>> rootfs_path("/b", {"root": {"path": "rootfs"}})
'/b/rootfs'
>>> rootfs_path("/b", {"root": {"path": "/var/lib/x/merged"}})
'/var/lib/x/merged'
"""

from __future__ import annotations

from ..core import fastos as os  # os without importing os: ~1 ms of a container start
import stat as _stat

from ..core import jsonfast
from ..core.errors import StateError

__all__ = ["read_state", "load_spec", "rootfs_path", "HOOK_MEMBERS", "MAX_STATE_BYTES", "MAX_SPEC_BYTES"]

#: A state is a few hundred bytes; anything past this is not a runtime talking.
MAX_STATE_BYTES = 1 << 20
#: config.json with thousands of env entries and mounts stays well below this.
MAX_SPEC_BYTES = 64 << 20


def _read_limited(fd: int, limit: int, what: str) -> bytes:
    from ..core.bounded import read_all

    # A regular file is read in one call of its size (+1 to see EOF): a 1 MB
    # config.json in 64 KiB chunks costs ~0.5 ms more in copies and syscalls.
    step = 1 << 16
    try:
        st = os.fstat(fd)
        if st.st_size > 0 and st.st_mode & 0o170000 == 0o100000:
            step = min(st.st_size, limit) + 1
    except OSError:
        pass
    return read_all(lambda n: os.read(fd, n), limit, step,
                    lambda: StateError(f"{what} is larger than {limit >> 20} MiB"))


def read_state(fd: int = 0) -> dict:
    """Parse the OCI state JSON from ``fd`` (stdin); :class:`StateError` if unusable."""
    try:
        data = _read_limited(fd, MAX_STATE_BYTES, "the OCI state on stdin")
    except OSError as e:
        raise StateError(f"cannot read the OCI state on stdin: {e.strerror}") from None
    if not data.strip():
        raise StateError("no OCI state on stdin (empty input)")
    try:
        state = jsonfast.loads(data)
    except ValueError as e:
        raise StateError(f"the OCI state on stdin is not JSON: {e}") from None
    if not isinstance(state, dict):
        raise StateError("the OCI state on stdin is not a JSON object")
    bundle = state.get("bundle")
    if not isinstance(bundle, str) or not bundle.startswith("/"):
        raise StateError("the OCI state has no absolute 'bundle' path")
    if "\0" in bundle:
        raise StateError("the OCI state's 'bundle' path contains a NUL byte")
    return state


#: The members of config.json the hook reads for every container. The rest
#: (mounts, annotations, linux: most of a large spec) is searched as text and
#: parsed only when it may hold what a decision looks for.
HOOK_MEMBERS = ("process", "root")


def load_spec(bundle: str, members=None):
    """Parse ``<bundle>/config.json``; :class:`StateError` if unusable.

    Without ``members``, a dict of the whole validated document. With them, a
    :class:`jsonfast.LazyObject` that stops scanning after the last of them
    (``stop_early``): for the hook, which the runtime runs only after it has
    parsed this very file; an error past that point shows only if a member
    there is read (``ValueError`` from ``get``).
    """
    if not isinstance(bundle, str) or "\0" in bundle:
        raise StateError("the bundle path is not a string without NUL bytes")
    path = os.path.join(bundle, "config.json")
    try:
        # O_NONBLOCK: a FIFO in its place must not block the open (and is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        raise StateError(f"{path}: no such file (is the bundle right?)") from None
    except OSError as e:
        raise StateError(f"{path}: cannot open: {e.strerror}") from None
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateError(f"{path}: not a regular file")
        data = _read_limited(fd, MAX_SPEC_BYTES, path)
    except OSError as e:
        raise StateError(f"{path}: cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        if members is not None:
            return jsonfast.loads_object(data, members, stop_early=True)
        spec = jsonfast.loads(data)
    except ValueError as e:
        raise StateError(f"{path}: not JSON: {e}") from None
    except TypeError:
        spec = None
    if not isinstance(spec, dict):
        raise StateError(f"{path}: not a JSON object")
    return spec


def rootfs_path(bundle: str, spec: dict) -> str:
    """The host path of the container's root filesystem."""
    root = spec.get("root")
    path = root.get("path") if isinstance(root, dict) else None
    if not isinstance(path, str) or not path:
        raise StateError("config.json has no root.path")
    if "\0" in path:
        raise StateError("config.json root.path contains a NUL byte")
    return path if path.startswith("/") else os.path.normpath(os.path.join(bundle, path))
