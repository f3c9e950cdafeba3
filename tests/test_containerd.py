"""A real containerd (Debian's 1.6), registered with ``compat-hook install containerd``.

The module starts its own containerd on its own socket, root and state dirs
(runc state under ``options.Root`` too), imports a registry-free image built
here with umoci from the harness rootfs (busybox, glibc, the probe), and
runs it through ``ctr run --runc-binary <wrapper>`` and through a CRI pod
whose ``runtime_handler`` is the installed runtime (a grpcio client with our
own minimal proto, tests/cri). At the end containerd is stopped by PID, its
shims are gone, and nothing is left mounted under the work dir.

How the "host driver" gets into the container: the compat-hook config chains
(``runtime:``) to a stand-in for nvidia-container-runtime (see
tests/support/wrapperenv.py:standin_runtime) that records its argv and, on
create, bind-mounts the current fake host's libcuda at
``/usr/lib/x86_64-linux-gnu/libcuda.so.1``, as the NVIDIA toolkit would. The
fake host (``<work>/host``, a symlink switched per test to a 535 or a 555
host root) is what compat-hook reads its host facts from, so the driver the
decision sees and the library the container gets always match.

Images (tags of one OCI layout): ``compat`` (libcuda 550.163.01 in
/usr/local/cuda-12.4/compat, /usr/local/cuda -> cuda-12.4), ``stale``
(compat + LD_LIBRARY_PATH=/usr/local/cuda/compat:/usr/local/lib), ``base``
(no compat libs, CUDA_VERSION=12.4.1) and ``pause`` (the CRI sandbox).
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

from compat_hook.commands import store
from compat_hook.commands.runtime import find_verb
from tests import cri
from tests.support import debs, engines, rootfs
from tests.support.engines import build_image, config_dump as dump, sh
from tests.support.versions import COMPAT_550 as C550, HOST_535 as H535, HOST_555 as H555
from tests.support.wrapperenv import fake_host, log_records, probe_of, standin_calls, standin_runtime, write_config

pytestmark = pytest.mark.containers

PY = "/usr/bin/python3"
REPO = pathlib.Path(__file__).resolve().parents[1]
CRI = "io.containerd.grpc.v1.cri"
RUNTIME = "cuda-compat"
IMAGE = "docker.io/library/bb"
COMPAT_LIB = f"/usr/local/cuda-12.4/compat/libcuda.so.{C550}"
HOST_LIB = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
STORE_LIB = f"/usr/local/cuda/compat/libcuda.so.{C550}"


class Containerd(engines.DirectContainerd):
    """The support harness's containerd with compat-hook's wrapper registered as the runtime ``cuda-compat``."""

    def __init__(self, work: pathlib.Path, libs: dict) -> None:
        super().__init__(work)
        self.libs = libs
        self.wrapper = work / "bin" / "compat-hook-runtime"
        self.hook_config = work / "compat-hook.yaml"
        self.log = work / "compat-hook.log"
        self.standin = work / "bin" / "nvidia-container-runtime"
        self.calls = work / "standin-argv.log"
        self.host = work / "host"
        self.store = work / "store"
        self.timings: dict = {}

    # -- set-up ---------------------------------------------------------------
    def prepare(self) -> None:
        w = self.work
        (w / "bin").mkdir()
        self.dump_before = dump(self.main)
        t = time.monotonic()
        p = sh(PY, "-m", "compat_hook", "install", "containerd", "--engine-config", self.main,
               "--wrapper-path", self.wrapper, "--hook-config", self.hook_config, cwd=REPO)
        self.install_out = p.stdout
        self.dump_after = dump(self.main)
        self.timings["install"] = time.monotonic() - t
        for v in (H535, H555):
            fake_host(w / f"host{v.split('.')[0]}", v, self.libs[v])
        self.use_host(H535)
        standin_runtime(self.standin, self.calls, self.host / HOST_LIB.lstrip("/"))
        pkg = w / "pkg"
        rootfs.install_libcuda(pkg, self.libs[C550], "usr/local/cuda-12.4/compat")
        store.add(str(self.store), str(pkg), None)
        self.configure()
        t = time.monotonic()
        self.image_tar = build_image(w, self.libs)
        self.timings["image"] = time.monotonic() - t

    def configure(self, **over) -> None:
        values = dict(host_root=str(self.host), log_file=str(self.log), mode="env", runtime=str(self.standin),
                      store_dir=str(self.store), wrapper_drop_oom_score_adj=True)
        values.update(over)
        write_config(self.hook_config, **values)

    def use_host(self, version: str) -> None:
        tmp = self.work / ".host-link"
        os.symlink(f"host{version.split('.')[0]}", tmp)
        os.replace(tmp, self.host)

    def start(self, images: bool = True) -> None:
        t = time.monotonic()
        super().start()
        self.timings["start"] = time.monotonic() - t
        if images:
            t = time.monotonic()
            for ns in ("default", "k8s.io"):
                self.ctr("-n", ns, "images", "import", "--base-name", IMAGE, self.image_tar)
            self.timings["import"] = time.monotonic() - t


@pytest.fixture(scope="module")
def libs() -> dict:
    return {v: debs.libcuda(v) for v in debs.VERSIONS}


@pytest.fixture(scope="module")
def ctrd(tmp_path_factory, libs):
    c = Containerd(tmp_path_factory.mktemp("ctrd"), libs)
    try:
        c.prepare()
        c.start()
        yield c
    finally:
        c.stop()


class Run:
    """What one container run produced: probe output, compat-hook records, stand-in calls."""

    def __init__(self, ctrd: Containerd, fn) -> None:
        n_log = len(log_records(ctrd.log))
        n_calls = len(standin_calls(ctrd.calls))
        t = time.monotonic()
        self.result = fn()
        self.seconds = time.monotonic() - t
        self.records = log_records(ctrd.log)[n_log:]
        self.calls = standin_calls(ctrd.calls)[n_calls:]


def ctr_run(ctrd: Containerd, tag: str, name: str, *extra) -> Run:
    def go():
        return ctrd.ctr("-n", "default", "run", "--rm", "--runc-binary", ctrd.wrapper,
                        "--runc-root", ctrd.work / "runc-ctr", *extra, f"{IMAGE}:{tag}", name)
    return Run(ctrd, go)


# --------------------------------------------------------------------------- the registration


def test_install_keeps_every_other_setting(ctrd):
    assert f"wrote {ctrd.main}" in ctrd.install_out and "restart containerd" in ctrd.install_out
    after, before = ctrd.dump_after, ctrd.dump_before
    rts = after["plugins"][CRI]["containerd"]["runtimes"]
    runc = before["plugins"][CRI]["containerd"]["runtimes"]["runc"]
    assert rts[RUNTIME] == dict(runc, options=dict(runc["options"], BinaryName=str(ctrd.wrapper)))
    del rts[RUNTIME]
    after.pop("imports"), before.pop("imports")
    assert after == before
    # The running daemon has the runtime (its CRI config, as the CRI plugin reports it).
    assert ctrd.wrapper.read_text().startswith("#!/bin/sh\n# compat-hook-runtime:")


# --------------------------------------------------------------------------- ctr run --runc-binary


def test_ctr_env_mode_turns_compat_on(ctrd):
    ctrd.use_host(H535)
    ctrd.configure()
    r = ctr_run(ctrd, "compat", "env-on")
    assert probe_of(r.result.stdout) == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}, r.result
    [rec] = r.records
    assert (rec["decision"], rec["reason"], rec["verb"]) == ("enable", "compat_major_newer", "create")
    assert "LD_LIBRARY_PATH=/usr/local/cuda-12.4/compat" in rec["actions"]
    assert rec["runtime"] == str(ctrd.standin) and rec["container_id"] == "env-on"


def test_ctr_newer_host_keeps_compat_off(ctrd):
    ctrd.use_host(H555)
    ctrd.configure()
    r = ctr_run(ctrd, "compat", "newer-host")
    assert probe_of(r.result.stdout) == {"cuDriverGetVersion": "12050", "libcuda": HOST_LIB}, r.result
    [rec] = r.records
    assert (rec["decision"], rec["reason"]) == ("skip", "compat_not_newer")
    assert not any(a.startswith("LD_LIBRARY_PATH") for a in rec["actions"])


def test_ctr_stale_image_compat_path_is_stripped(ctrd):
    ctrd.use_host(H555)
    ctrd.configure()
    # Control: the stand-in alone (no compat-hook): the image's stale path wins, the older driver loads.
    control = Run(ctrd, lambda: ctrd.ctr("-n", "default", "run", "--rm", "--runc-binary", ctrd.standin,
                                         "--runc-root", ctrd.work / "runc-ctr", f"{IMAGE}:stale", "stale-control"))
    assert probe_of(control.result.stdout)["cuDriverGetVersion"] == "12040", control.result
    r = ctr_run(ctrd, "stale", "stale")
    assert probe_of(r.result.stdout) == {"cuDriverGetVersion": "12050", "libcuda": HOST_LIB}, r.result
    [rec] = r.records
    assert rec["reason"] == "compat_not_newer" and "LD_LIBRARY_PATH=/usr/local/lib" in rec["actions"]


def test_ctr_host_store_injection(ctrd):
    ctrd.use_host(H535)
    ctrd.configure()
    r = ctr_run(ctrd, "base", "store")
    assert probe_of(r.result.stdout) == {"cuDriverGetVersion": "12040", "libcuda": STORE_LIB}, r.result
    [rec] = r.records
    assert (rec["decision"], rec["reason"], rec["source"]) == ("enable", "store_package", "store")
    assert f"mount {ctrd.store / C550} at /usr/local/cuda/compat (rbind,ro,nosuid,nodev)" in rec["actions"]
    # Without the store the same image gets the host driver only.
    ctrd.configure(store_inject=False)
    r = ctr_run(ctrd, "base", "no-store")
    assert probe_of(r.result.stdout) == {"cuDriverGetVersion": "12020", "libcuda": HOST_LIB}, r.result


def test_ctr_runtime_chaining(ctrd):
    """Every verb the shim sends reaches the second runtime with the same argv."""
    ctrd.use_host(H535)
    ctrd.configure()
    r = ctr_run(ctrd, "compat", "chain")
    assert r.result.returncode == 0
    verbs = [find_verb(c)[1] for c in r.calls]
    assert verbs[:2] == ["create", "start"] and "delete" in verbs, r.calls
    create = r.calls[0]
    [rec] = r.records
    root = str(ctrd.work / "runc-ctr" / "default")
    assert create[:2] == ["--root", root]
    i = create.index("create")
    assert create[i + 1:i + 3] == ["--bundle", rec["bundle"]] and create[-1] == "chain"
    assert all(c[:2] == ["--root", root] for c in r.calls)


def test_ctr_run_is_quick(ctrd):
    """A create through the wrapper costs one Python start; the other verbs none."""
    ctrd.use_host(H535)
    ctrd.configure()
    r = ctr_run(ctrd, "compat", "timing")
    assert r.result.returncode == 0
    [rec] = r.records
    assert rec["duration_ms"] < 2000, rec
    assert r.seconds < 10


# --------------------------------------------------------------------------- the CRI


def test_cri_pod_with_the_runtime_handler(ctrd, tmp_path):
    ctrd.use_host(H535)
    ctrd.configure()
    client = cri.Client(str(ctrd.sock), tmp_path / "gen")
    try:
        v = client.version()
        assert v.runtime_name == "containerd" and v.runtime_version.startswith("1.6"), v
        logs = ctrd.work / "pods" / "p1"
        logs.mkdir(parents=True)
        sandbox = client.sandbox_config("p1", str(logs))
        n_log = len(log_records(ctrd.log))
        pod = client.run_pod(sandbox, RUNTIME)
        try:
            st, c1 = client.run_container(pod, sandbox, "compat", f"{IMAGE}:compat",
                                          command=["/usr/local/bin/probe"])
            assert st.exit_code == 0, (st, cri.read_log(logs / "compat.log"))
            assert probe_of(cri.read_log(logs / "compat.log")) == \
                {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}
            st, c2 = client.run_container(pod, sandbox, "store", f"{IMAGE}:base")
            assert st.exit_code == 0, (st, cri.read_log(logs / "store.log"))
            assert probe_of(cri.read_log(logs / "store.log")) == \
                {"cuDriverGetVersion": "12040", "libcuda": STORE_LIB}
            client.remove_container(c1)
            client.remove_container(c2)
        finally:
            client.remove_pod(pod)
    finally:
        client.close()
    recs = log_records(ctrd.log)[n_log:]
    kinds = {}
    for r in recs:
        kinds.setdefault(r.get("reason"), []).append(r)
    # The sandbox (pause) went through the wrapper too: no GPU, only its oomScoreAdj dropped.
    [pause] = kinds["no_gpu_request"]
    assert pause["actions"] == ["dropped process.oomScoreAdj (-998)"], pause
    assert [r["decision"] for r in kinds["compat_major_newer"]] == ["enable"]
    assert [r["decision"] for r in kinds["store_package"]] == ["enable"]
    assert all(r["bundle"].startswith(str(ctrd.work / "state")) for r in recs)
    # runc state lives under the runtime's options.Root (copied from runc's).
    calls = standin_calls(ctrd.calls)
    assert any(c[:2] == ["--root", str(ctrd.work / "runc" / "k8s.io")] for c in calls)


def test_base_spec_registration(ctrd, tmp_path):
    """``--via base-spec``: runc itself, with the hook (ldconfig mode) in containerd's base spec."""
    assert ctrd.stop() == {"containers": [], "shims": [], "mounts": [], "runc": []}
    state = ctrd.work / "compat-hook-state"
    # CI quirk (no CAP_SYS_RESOURCE: the sandbox's oomScoreAdj -998 fails under plain runc):
    # runc's own options name a stand-in that drops it, and the runtime copies runc's options.
    dropper = standin_runtime(ctrd.work / "bin" / "oom-dropper", ctrd.work / "dropper.log",
                              ctrd.host / HOST_LIB.lstrip("/"), drop_oom=True)
    text = ctrd.main.read_text()
    ctrd.main.write_text(text.replace('        SystemdCgroup = false\n',
                                      f'        SystemdCgroup = false\n        BinaryName = "{dropper}"\n', 1))
    out = sh(PY, "-m", "compat_hook", "install", "containerd", "--engine-config", ctrd.main, "--via", "base-spec",
             "--wrapper-path", ctrd.wrapper, "--hook-config", ctrd.hook_config, "--state-dir", state, cwd=REPO).stdout
    assert f"removed {ctrd.wrapper}" in out  # the wrapper registration is replaced
    rt_cfg = dump(ctrd.main)["plugins"][CRI]["containerd"]["runtimes"][RUNTIME]
    base = ctrd.main.parent / "compat-hook-base-spec.json"
    assert rt_cfg["base_runtime_spec"] == str(base) and rt_cfg["options"]["BinaryName"] == str(dropper)
    ctrd.use_host(H535)
    ctrd.configure(mode="ldconfig")
    ctrd.start(images=False)
    client = cri.Client(str(ctrd.sock), tmp_path / "gen")
    n_hook = len(log_records(ctrd.log, "hook"))
    try:
        logs = ctrd.work / "pods" / "p2"
        logs.mkdir(parents=True)
        sandbox = client.sandbox_config("p2", str(logs))
        pod = client.run_pod(sandbox, RUNTIME)
        try:
            st, cid = client.run_container(pod, sandbox, "hooked", f"{IMAGE}:compat")
            text = cri.read_log(logs / "hooked.log")
            assert st.exit_code == 0, (st, text)
            # No host driver is mounted here: the compat driver comes through the ld cache
            # the hook refreshed (its drop-in names the resolved compat dir).
            assert probe_of(text) == {"cuDriverGetVersion": "12040", "libcuda": COMPAT_LIB}
            client.remove_container(cid)
        finally:
            client.remove_pod(pod)
    finally:
        client.close()
    hooks = log_records(ctrd.log, "hook")[n_hook:]
    # The base spec reaches app containers only: one hook run, for the app container.
    assert [(h["decision"], h["stage"]) for h in hooks] == [("enable", "createContainer")], hooks


# --------------------------------------------------------------------------- the end


def test_zz_stop_leaves_nothing_behind(ctrd):
    left = ctrd.stop()
    assert left == {"containers": [], "shims": [], "mounts": [], "runc": []}
    # containerd's environment reached the wrapper through the shims: its cache went to the
    # state dir given to containerd, not to this machine's /var/lib/compat-hook.
    assert any((ctrd.work / "compat-hook-state" / "cache").iterdir())
    print("timings:", json.dumps({k: round(v, 2) for k, v in ctrd.timings.items()}))
