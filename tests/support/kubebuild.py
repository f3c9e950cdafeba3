"""Go-built binaries for the control-plane tests, each built once into the test cache.

* ``kube_apiserver()``: kube-apiserver ``KUBE_VERSION`` from the ``k8s.io/kubernetes`` module;
  ``kubelet()``, ``kube_controller_manager()`` and ``kube_scheduler()`` the same way, for the real
  single-node cluster (tests/support/node.py; 1-3 minutes each once kube-apiserver's packages are cached),
  and ``kubectl()``, the client docs' command lines are run with.
  That module's go.mod replaces its staging modules (``k8s.io/api``, ``k8s.io/apiserver`` ...)
  with ``./staging/...`` paths, so ``go install`` refuses it; a throwaway module requires it and
  replaces each staging module with the published ``v0.X.Y`` of the same release (~10 min on 2 cores).
* ``kwok()``: the simulated kubelets, ``sigs.k8s.io/kwok/cmd/kwok@KWOK_VERSION``, with the stage files
  that ship in its own module.
* ``helm()``: ``helm.sh/helm/v4/cmd/helm@HELM_VERSION``.
* ``upgrade_harness()``: tests/upgrade_harness, which runs NVIDIA's own upgrade state machine.
* ``nri_plugin()``: compat-hook's NRI plugin (packaging/nri, containerd's NRI stub), per content hash.
* ``containerd_release(version)``: containerd (``containerd``, ``ctr``, ``containerd-shim-runc-v2``) of one
  upstream release, for the releases Debian does not ship (:data:`CONTAINERD_RELEASES`: NRI's default
  validator, which can require a plugin, came in 2.2).

All share one GOPATH/GOCACHE under the cache (``go-k8s/``) so module downloads and compiled
packages are reused between them; each final binary lands in its own directory by rename
(:func:`tests.support.cache.ensure_dir`). ``python3 -m tests.support.kubebuild`` builds them all.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

from tests.support.cache import cache_dir, ensure_dir, go_compiling
from tests.support.engines import ENV, GO_PROXY, go_command
from tests.support.progress import done, start

KUBE_VERSION = "v1.34.2"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.3.2"
HARNESS = pathlib.Path(__file__).resolve().parents[1] / "upgrade_harness"
#: containerd releases built from the Go module proxy: the first with NRI's default validator (2.2) and the
#: newest 2.x the proxy serves. Debian's (sid: 2.1) comes from tests/support/engines.containerd2().
CONTAINERD_RELEASES = ("v2.2.9", "v2.4.2")
NRI_PLUGIN = pathlib.Path(__file__).resolve().parents[2] / "packaging" / "nri"
#: As packaging/nri/build.py (make nri-plugin) builds it: stripped, as the package ships it.
NRI_FLAGS = ("-trimpath", "-ldflags=-s -w")
#: Every other build here: without the symbol table and DWARF, which nothing here reads, neither written by
#: the linker nor made by the compiler for each package: a cold run compiles and links less, and the
#: cache takes less disk.
BUILD_FLAGS = ("-trimpath", "-gcflags=all=-dwarf=false", "-ldflags=-s -w")
Path = pathlib.Path


def _timed(what: str, build):
    """``build`` in the shared build cache's compile slot (tests/support/cache.py ``go_compiling``), saying when
    it starts and ends (tests.support.progress): these builds take minutes."""

    def run(tmp: Path) -> None:
        with go_compiling():  # said once it is this build's turn (the builder puts off one it would wait for)
            t0 = start(f"building {what} into the test cache (once)")
            build(tmp)
            done(t0, f"built {what}")

    return run


def go_env() -> dict:
    """One GOPATH and build cache for all of these builds (module downloads are shared)."""
    root = cache_dir() / "go-k8s"
    root.mkdir(exist_ok=True)
    return dict(ENV, GOPATH=str(root / "path"), GOCACHE=str(root / "build"), GOFLAGS="-modcacherw",
                CGO_ENABLED="0", GOTOOLCHAIN="auto", GOPROXY=f"{GO_PROXY},direct", GOTMPDIR=str(root),
                HOME=str(root))


def _go(*args, cwd=None, timeout=1800) -> str:
    go, env = go_command(), go_env()
    with go_compiling():
        p = subprocess.run([go, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                           capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)}: exit {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}")
    return p.stdout


def staging_replaces(gomod: str, version: str) -> list:
    """``replace k8s.io/X => k8s.io/X v0.M.P`` for every ``=> ./staging/`` line of kubernetes' go.mod.

    >>> staging_replaces("replace (\\n\\tk8s.io/api => ./staging/src/k8s.io/api\\n)\\n", "v1.34.2")
    ['k8s.io/api => k8s.io/api v0.34.2']
    """
    minor_patch = "v0." + version.split(".", 1)[1]
    out = []
    for line in gomod.splitlines():
        parts = line.replace("replace", "").split()
        if len(parts) == 3 and parts[1] == "=>" and parts[2].startswith("./staging/"):
            out.append(f"{parts[0]} => {parts[0]} {minor_patch}")
    return out


def _kube_binary(name: str) -> Path:
    """``k8s.io/kubernetes/cmd/<name>`` at ``KUBE_VERSION``, built in the throwaway module (module docstring)."""
    final = cache_dir() / name / KUBE_VERSION

    def build(tmp: Path) -> None:
        info = json.loads(_go("mod", "download", "-json", f"k8s.io/kubernetes@{KUBE_VERSION}"))
        replaces = staging_replaces(Path(info["GoMod"]).read_text(), KUBE_VERSION)
        work = tmp / "mod"
        work.mkdir()
        # The same module text for every binary: go's build cache keys on it, so what one build
        # compiled (client-go, apimachinery ...) the next one reuses.
        (work / "go.mod").write_text(
            "module example.invalid/apiserver\n\ngo 1.25\n\n"
            f"require k8s.io/kubernetes {KUBE_VERSION}\n\nreplace (\n"
            + "".join(f"\t{r}\n" for r in replaces) + ")\n")
        (work / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/{name}"\n')
        _go("build", "-mod=mod", *BUILD_FLAGS, "-o", str(tmp / name), f"k8s.io/kubernetes/cmd/{name}", cwd=work,
            timeout=3600)
        shutil.rmtree(work)

    ensure_dir(final, _timed(f"{name} {KUBE_VERSION} (1-10 minutes on 2 cores)", build), lock=name)
    return final / name


def kube_apiserver() -> Path:
    return _kube_binary("kube-apiserver")


def kubelet() -> Path:
    """The node agent; with containerd's CRI it runs real pods (tests/support/node.py)."""
    return _kube_binary("kubelet")


def kube_controller_manager() -> Path:
    """DaemonSets, Jobs, the node lifecycle, service-account tokens' CA, garbage collection."""
    return _kube_binary("kube-controller-manager")


def kube_scheduler() -> Path:
    return _kube_binary("kube-scheduler")


def kubectl() -> Path:
    """The client an operator runs: the tests run docs' command lines with it as written."""
    return _kube_binary("kubectl")


#: What a real single-node cluster needs besides etcd (tests/support/node.py).
NODE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")


def kwok() -> tuple:
    """(kwok binary, [stage files]) for KWOK_VERSION."""
    final = cache_dir() / "kwok" / KWOK_VERSION

    def build(tmp: Path) -> None:
        env = go_env()
        p = subprocess.run([go_command(), "install", *BUILD_FLAGS, f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}"],
                           env=dict(env, GOBIN=str(tmp)), capture_output=True, text=True, timeout=1800,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"go install kwok: {p.stderr[-4000:]}")
        stage = Path(env["GOPATH"]) / "pkg" / "mod" / f"sigs.k8s.io/kwok@{KWOK_VERSION}" / "kustomize" / "stage"
        (tmp / "stages").mkdir()
        for rel in ("node/fast/node-initialize.yaml", "node/heartbeat/node-heartbeat.yaml",
                    "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"):
            shutil.copyfile(stage / rel, tmp / "stages" / rel.replace("/", "-"))

    ensure_dir(final, _timed(f"kwok {KWOK_VERSION}", build), lock="kwok")
    return final / "kwok", sorted((final / "stages").glob("*.yaml"))


def helm() -> Path:
    final = cache_dir() / "helm" / HELM_VERSION

    def build(tmp: Path) -> None:
        p = subprocess.run([go_command(), "install", *BUILD_FLAGS, f"helm.sh/helm/v4/cmd/helm@{HELM_VERSION}"],
                           env=dict(go_env(), GOBIN=str(tmp)), capture_output=True, text=True, timeout=1800,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"go install helm: {p.stderr[-4000:]}")

    ensure_dir(final, _timed(f"helm {HELM_VERSION}", build), lock="helm")
    return final / "helm"


def upgrade_harness() -> Path:
    """tests/upgrade_harness built once per content hash of its sources."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(HARNESS.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    final = cache_dir() / "upgrade-harness" / h.hexdigest()[:16]

    def build(tmp: Path) -> None:
        work = tmp / "src"
        shutil.copytree(HARNESS, work)
        _go("build", "-mod=mod", *BUILD_FLAGS, "-o", str(tmp / "upgrade-harness"), ".", cwd=work, timeout=1800)
        shutil.rmtree(work)

    ensure_dir(final, _timed("tests/upgrade_harness", build), lock="upgrade-harness")
    return final / "upgrade-harness"


def nri_plugin() -> Path:
    """packaging/nri (``compat-hook-nri``) built once per content hash of its sources (~40 s the first time)."""
    import hashlib

    h = hashlib.sha256(" ".join(NRI_FLAGS).encode())
    for f in sorted(NRI_PLUGIN.iterdir()):
        if f.is_file() and (f.suffix == ".go" or f.name in ("go.mod", "go.sum")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    final = cache_dir() / "compat-hook-nri" / h.hexdigest()[:16]

    def build(tmp: Path) -> None:
        work = tmp / "src"
        shutil.copytree(NRI_PLUGIN, work)
        _go("build", *NRI_FLAGS, "-o", str(tmp / "compat-hook-nri"), ".", cwd=work, timeout=1800)
        shutil.rmtree(work)

    ensure_dir(final, _timed("packaging/nri (compat-hook-nri)", build), lock="compat-hook-nri")
    return final / "compat-hook-nri"


def containerd_release(version: str) -> Path:
    """The bin dir of containerd ``version`` built from the Go module proxy (5-12 minutes each on 2 cores).

    Without cgo, as the tests build everything: the build tags leave out the snapshotters that need it
    (btrfs, devmapper), which the tests do not use (overlayfs, native). ``GOTOOLCHAIN=auto`` fetches the
    Go a newer release's go.mod asks for. The version is linked in as upstream's Makefile does, so
    ``containerd --version`` says it (compat-hook's installer reads it)."""
    final = cache_dir() / "containerd" / version
    module = "github.com/containerd/containerd/v2"

    def build(tmp: Path) -> None:
        flags = f"-s -w -X {module}/version.Version={version} -X {module}/version.Revision=proxy"
        p = subprocess.run([go_command(), "install", "-trimpath", "-gcflags=all=-dwarf=false",
                            "-tags", "no_btrfs no_devmapper no_zfs", f"-ldflags={flags}",
                            *(f"{module}/cmd/{c}@{version}" for c in CONTAINERD_COMMANDS)],
                           env=dict(go_env(), GOBIN=str(tmp)), capture_output=True, text=True, timeout=3600,
                           stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"go install containerd {version}: {p.stderr[-4000:]}")

    ensure_dir(final, _timed(f"containerd {version} (5-12 minutes on 2 cores)", build), lock=f"containerd-{version}")
    for c in CONTAINERD_COMMANDS:
        assert (final / c).is_file(), f"{final / c} missing"
    return final


#: What the tests run of containerd: the daemon, its runc shim, and ``ctr`` (images, readiness).
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")


if __name__ == "__main__":  # pragma: no cover - a convenience for warming the cache
    fns = {"kube-apiserver": kube_apiserver, "kube-controller-manager": kube_controller_manager,
           "kube-scheduler": kube_scheduler, "kubelet": kubelet, "kwok": kwok, "helm": helm,
           "harness": upgrade_harness, "nri": nri_plugin,
           **{f"containerd-{v}": (lambda v=v: containerd_release(v)) for v in CONTAINERD_RELEASES}}
    which = sys.argv[1:] or list(fns)
    for name in which:
        print(name, fns[name](), flush=True)
