"""``plan`` against the truth: what it predicts for an image read without unpacking it is what a
real container of the same image loads under the hook, driver by driver.

The images are real OCI layouts built with umoci in several layers (the compat driver - Debian's
real libcuda 550 with NVIDIA's note added - and a probe in the first, a whiteout and the
``/usr/local/cuda`` -> ``cuda-12.4`` symlink in a later one), and the same images as
``docker-archive`` made by skopeo. For each case, ``compat-hook plan`` runs on the image and a
runc container of ``umoci unpack``'s rootfs runs the probe with compat-hook's hook after the
legacy-toolkit stand-in (it mounts the host driver's libcuda), on a fake host with that driver
and GPU. The probe reports the libcuda it loaded.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from compat_hook.core import registration
from tests.support import hookenv
from tests.support import runtimes as rt
from tests.support.images import umoci
from tests.support.planimages import GEFORCE, H100, images  # noqa: F401  (the module-scoped images fixture)
from tests.support.trees import write_fake_host
from tests.support.versions import COMPAT_550, HOST_535, HOST_555

pytestmark = pytest.mark.containers

REPO = pathlib.Path(__file__).resolve().parent.parent
COMPAT_DIR = "/usr/local/cuda-12.4/compat"


def _plan(images, tmp, name, version, gpu) -> dict:
    conf = tmp / "plan.yaml"
    conf.write_text(f"log_file: null\nnvml: 'off'\nhost_root: {tmp / 'host'}\n")
    src = images[name]
    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "plan", src["oci"], src["docker"],
                        "--driver", version, "--config", str(conf), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["gpus"][0]["model"] == gpu
    oci, docker = r["images"]
    assert oci.get("error") is None and docker.get("error") is None, r
    # the docker-archive of the same image reads the same
    assert {k: v for k, v in oci.items() if k != "image"} == {k: v for k, v in docker.items() if k != "image"}
    assert oci["needs_cuda"] == "12.4"
    return oci["after"]


def _run(images, tmp, name, version) -> dict:
    bundle = tmp / "bundle"
    umoci("unpack", "--image", str(images[name]["layout"]) + ":v1", bundle)
    assert not (bundle / "rootfs/etc/removed-later").exists()
    log = tmp / "hook.log"
    conf = hookenv.write_config(tmp / "hook.yaml", host_root=tmp / "host", log_file=log)
    hooks = {"prestart": [rt.nvidia_standin_hook(images["libs"][version], tmp / "work", "prestart")],
             "createContainer": [registration.hook_entry(stage="createContainer", config=str(conf),
                                                         state_dir=str(tmp / "state"))]}
    b = rt.make_bundle(bundle, bundle / "rootfs", hooks=hooks, env=list(rt.DEFAULT_ENV))
    res = rt.run_container(b, "runc")
    assert res.rc == 0, str(res)
    rec = json.loads(log.read_text().splitlines()[-1])
    return {"probe": res.probe, "record": rec}


@pytest.mark.parametrize("name, version, gpu, outcome, reason", [
    ("compat", HOST_535, H100, "compat", "compat_newer_supported"),     # enable
    ("compat", HOST_555, H100, "host", "compat_not_newer"),             # a newer host
    ("compat", HOST_535, GEFORCE, "host-minor", "device_unsupported"),  # 804 avoided: the host driver
    ("plain", HOST_535, H100, "host-minor", "no_candidate"),            # no compat libs
    ("plain", HOST_555, H100, "host", "no_candidate"),
], ids=["enable", "newer-host", "geforce", "no-compat-old-host", "no-compat-new-host"])
def test_plan_predicts_what_the_container_loads(images, tmp_path, name, version, gpu, outcome, reason):
    write_fake_host(tmp_path / "host", version=version, gpus={"0000:17:00.0": gpu})
    predicted = _plan(images, tmp_path, name, version, gpu)
    assert (predicted["outcome"], predicted["reason"]) == (outcome, reason), predicted
    ran = _run(images, tmp_path, name, version)
    assert ran["record"]["reason"] == predicted["reason"], ran["record"]
    loaded = ran["probe"]["libcuda"]
    if predicted["outcome"] == "compat":
        assert loaded == f"{COMPAT_DIR}/libcuda.so.{COMPAT_550}", ran
        assert ran["probe"]["cuDriverGetVersion"] == "12040"
    else:
        assert loaded == f"{rt_sys()}/libcuda.so.{version}", ran
        # what plan said the host driver provides is what the driver reports
        major, minor = predicted["cuda"].split(".")
        assert ran["probe"]["cuDriverGetVersion"] == str(int(major) * 1000 + int(minor) * 10)


def rt_sys() -> str:
    return "/usr/lib/x86_64-linux-gnu"
