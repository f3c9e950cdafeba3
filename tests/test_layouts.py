"""What ``explain`` and ``plan`` say about the layouts of issue 27, through the CLI a user runs.

* Tegra: Jetson Orin's ``compat_orin`` only on an Orin host (no kernel driver version,
  ``/dev/nvgpu``, a host CUDA version), the SBSA/dGPU ``compat`` never there; the
  NVIDIA toolkit's own root is ``compat_orin`` on such a host (its PR #1690);
* conda's ``cuda-compat`` in ``plan``, from a rootfs dir and from an OCI layout;
* ``explain`` after compat-hook's own earlier start: it predicts the next start;
* ``explain`` for ``NVIDIA_VISIBLE_DEVICES=void`` / empty: the toolkit adds nothing.
The real containers for the same layouts are in tests/test_layout_containers.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from compat_hook.effects import ldcache
from tests.conftest import Symlink, build_tree, elf
from tests.elfgen import NOTE_575, NOTE_ORIN
from tests.support.images import Layout, gz, tar_layer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: An SBSA/dGPU compat driver of CUDA 13.2, its note as NVIDIA's carry one.
NOTE_SBSA_132 = ('{"format":1,"CUDA version":"13.2","driver":[535,550,570,575,580,590,595],'
                 '"device":[1,2,7,8,9,10,11,12,13,14]}')
SBSA = {"usr/local/cuda-13.2/compat/libcuda.so.595.45.04": elf(NOTE_SBSA_132),
        "usr/local/cuda-13.2/compat/libcuda.so.1": Symlink("libcuda.so.595.45.04")}
ORIN = {"usr/local/cuda-13.2/compat_orin/libcuda.so.1.1": elf(NOTE_ORIN, soname=None)}
CUDA_LINK = {"usr/local/cuda": Symlink("cuda-13.2")}
CONDA = {"opt/conda/cuda-compat/libcuda.so.575.57.08": elf(NOTE_575),
         "opt/conda/cuda-compat/libcuda.so.1": Symlink("libcuda.so.575.57.08"),
         "opt/conda/lib/libcuda.so.1": Symlink("/opt/conda/cuda-compat/libcuda.so.1"),
         "opt/conda/lib/libcuda.so.575.57.08": Symlink("/opt/conda/cuda-compat/libcuda.so.575.57.08"),
         "opt/conda/conda-meta/cuda-compat-impl-575.57.08-h0_0.json": "{}"}


def run(cmd, *args, config) -> dict:
    p = subprocess.run([sys.executable, "-m", "compat_hook", cmd, *args, "--config", str(config), "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
    assert p.returncode in (0, 3), p.stderr
    return json.loads(p.stdout)


@pytest.fixture
def conf(tmp_path):
    p = tmp_path / "config.yaml"
    p.write_text(json.dumps({"nvml": "off", "log_file": None, "store_dir": str(tmp_path / "store")}))
    return p


# -- Tegra ---------------------------------------------------------------------------------

@pytest.mark.parametrize("image, host_cuda, reason, chosen, toolkit", [
    # an Orin host, an image for both kinds of Jetson: compat_orin is the one, never the SBSA lib
    ({**SBSA, **ORIN}, "13.1", "compat_cuda_newer", "/usr/local/cuda-13.2/compat_orin", True),
    ({**SBSA, **ORIN}, "13.2", "compat_cuda_not_newer", None, False),
    # only the SBSA/dGPU compat: never on Orin (the bug of NVIDIA's toolkit before its PR #1690)
    (SBSA, "13.1", "compat_dgpu_on_tegra", None, False),
    (ORIN, "13.1", "compat_cuda_newer", "/usr/local/cuda-13.2/compat_orin", True),
], ids=["both-newer", "both-not-newer", "sbsa-only", "orin-only"])
def test_explain_on_an_orin_host(make_rootfs, fake_host, conf, image, host_cuda, reason, chosen, toolkit):
    rootfs = make_rootfs({**image, **CUDA_LINK})
    host = fake_host(tegra=True)
    r = run("explain", "--rootfs", str(rootfs), "--host-root", str(host), "--host-cuda-version", host_cuda,
            config=conf)
    assert r["host"]["tegra"] is True and r["host_driver_version"] is None
    assert (r["reason"], r["compat_dir"] if r["decision"] == "enable" else None) == (reason, chosen), r["details"]
    assert r["effect"] == ("compat" if chosen else "host")
    assert r["toolkit"]["root"] == "/usr/local/cuda/compat_orin" and r["toolkit"]["enables"] is toolkit
    if chosen:
        assert r["toolkit"]["with_hook"]["dir"] == chosen
    else:
        # compat is wrong here: no copy of it is left where the loader looks first
        assert r["toolkit"]["with_hook"]["result"] == "host"
        assert sorted(x["dir"] for x in r["losing_compat_dirs"]) == sorted(
            "/" + k.rsplit("/", 1)[0] for k in image if k.endswith((".1.1", ".595.45.04")))


def test_explain_on_a_dgpu_host_never_takes_compat_orin(make_rootfs, fake_host, conf):
    """A dGPU host where NVML also gives a CUDA version: the Orin library was enabled before."""
    rootfs = make_rootfs({**ORIN, **CUDA_LINK})
    host = fake_host(version="550.54.15")
    r = run("explain", "--rootfs", str(rootfs), "--host-root", str(host), "--host-cuda-version", "12.4",
            config=conf)
    assert (r["reason"], r["effect"]) == ("compat_orin_not_tegra", "host")
    assert r["toolkit"]["root"] == "/usr/local/cuda/compat" and r["toolkit"]["enables"] is False


@pytest.mark.parametrize("image, after, reason", [
    (ORIN, "host", "compat_orin_not_tegra"),
    # both kinds: the SBSA/dGPU compat (note: 13.2, branch 550 listed) decides; compat_orin loses
    ({**SBSA, **ORIN}, "compat", "compat_newer_supported"),
], ids=["orin-only", "both"])
def test_plan_on_a_dgpu_target(make_rootfs, conf, image, after, reason):
    rootfs = make_rootfs({**image, **CUDA_LINK})
    r = run("plan", str(rootfs), "--driver", "550.54.15", "--from-driver", "535.261.03", config=conf)
    [img] = r["images"]
    assert (img["after"]["outcome"], img["after"]["reason"]) == (after, reason)


# -- conda's cuda-compat in plan ---------------------------------------------------------------

def _conda_layout(path) -> str:
    """An OCI layout of the conda image (one layer, files and links as tar entries)."""
    entries = []
    for name, value in CONDA.items():
        if isinstance(value, Symlink):
            entries.append(("symlink", name, value.target))
        else:
            entries.append(("file", name, value if isinstance(value, bytes) else value.encode()))
    lay = Layout(path)
    lay.tag(lay.image([gz(tar_layer(entries))], env=["PATH=/opt/conda/bin:/usr/bin"]), "v1")
    return f"oci:{path}:v1"


@pytest.mark.parametrize("source", ["dir", "oci"])
def test_plan_sees_conda_compat(make_rootfs, tmp_path, conf, source):
    src = str(make_rootfs(CONDA)) if source == "dir" else _conda_layout(tmp_path / "layout")
    # a newer target: compat-hook keeps the stale package from loading; the toolkit alone does not
    r = run("plan", src, "--driver", "580.65.06", "--from-driver", "550.54.15", "--fail-on", "broken",
            config=conf)
    [img] = r["images"]
    assert (img["now"]["outcome"], img["now"]["reason"]) == ("compat", "compat_newer_supported")
    assert (img["after"]["outcome"], img["after"]["reason"]) == ("host", "compat_not_newer")
    assert (img["toolkit_only_after"]["outcome"], img["toolkit_only_after"]["error"]) == ("broken", 803)
    assert r["summary"]["fixed_by_compat_hook"] == 1


def test_explain_shows_the_conda_package(make_rootfs, conf):
    r = run("explain", "--rootfs", str(make_rootfs(CONDA)), "--host-driver-version", "580.65.06", config=conf)
    img = r["image"]
    assert (img["origin"], img["prefix"], img["compat_dir"]) == ("conda", "/opt/conda", "/opt/conda/cuda-compat")
    assert img["package"] == "cuda-compat-impl-575.57.08-h0_0"
    assert img["links"] == ["/opt/conda/lib/libcuda.so.1", "/opt/conda/lib/libcuda.so.575.57.08"]
    assert r["effects"]["hook"][0] == "mask /opt/conda/cuda-compat with an empty read-only tmpfs (createContainer)"
    assert r["toolkit"]["alone"]["result"] == "compat" and r["toolkit"]["alone"]["via"] == "link"
    assert r["toolkit"]["with_hook"]["result"] == r["toolkit"]["with_wrapper"]["result"] == "host"


# -- explain after compat-hook's own start ---------------------------------------------------

def test_explain_leaves_out_compat_hooks_own_dropin(make_rootfs, conf):
    """A rootfs started once on a newer host (555) carries our drop-in naming the host driver's
    dir. On an older host the next start rewrites it to name the compat dir: explain says so."""
    entries = {"usr/local/cuda-12.4/compat/libcuda.so.550.163.01": elf(None),
               "usr/local/cuda": Symlink("cuda-12.4"),
               "usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02": b"\x7fELF host",
               "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/lib/x86_64-linux-gnu\n",
               ldcache.DROPIN_PATH.lstrip("/"): ldcache.dropin_text("/usr/lib/x86_64-linux-gnu", "host")}
    rootfs = make_rootfs(entries)
    r = run("explain", "--rootfs", str(rootfs), "--host-driver-version", "535.261.03", config=conf)
    assert (r["decision"], r["reason"]) == ("enable", "compat_major_newer")
    assert r["toolkit"]["with_hook"] == {
        "result": "compat", "by": "compat-hook's drop-in names the compat dir and sorts first",
        "via": "compat-hook", "path": None, "dir": "/usr/local/cuda-12.4/compat",
        "maps": "/usr/local/cuda-12.4/compat/libcuda.so.550.163.01"}
    assert r["summary"].endswith("-> compat library (/usr/local/cuda-12.4/compat)")
    assert any(n.startswith(f"{ldcache.DROPIN_NAME} in the rootfs is compat-hook's own from an earlier start "
                            "(naming /usr/lib/x86_64-linux-gnu)") for n in r["notes"]), r["notes"]
    assert r["effects"]["hook"][0] == ("write /etc/ld.so.conf.d/00-00-compat-hook.conf naming "
                                       "/usr/local/cuda-12.4/compat (the compat dir)")


# -- the NVIDIA toolkit and a container without a GPU ----------------------------------------------

@pytest.mark.parametrize("nvd", ["void", "", "none"])
def test_explain_toolkit_does_nothing_without_a_gpu_request(make_rootfs, tmp_path, conf, nvd):
    rootfs = make_rootfs({"usr/local/cuda-12.4/compat/libcuda.so.550.163.01": elf(None),
                          "usr/local/cuda": Symlink("cuda-12.4")})
    bundle = build_tree(tmp_path / "bundle", {})
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "root": {"path": str(rootfs)},
        "process": {"args": ["/bin/true"], "cwd": "/", "env": [f"NVIDIA_VISIBLE_DEVICES={nvd}"]}}))
    r = run("explain", "--bundle", str(bundle), "--host-driver-version", "535.261.03", config=conf)
    assert (r["reason"], r["effect"]) == ("no_gpu_request", "leave")
    assert r["toolkit"]["enables"] is False, r["toolkit"]
    assert r["toolkit"]["why"].startswith("the container requests no GPU")
    assert r["summary"].startswith("toolkit: would not enable;")


# -- hostile and bounded: the new places compat-hook looks ---------------------------------------------

def _assess(rootfs, driver: str, env, actors=("hook",)):
    from compat_hook.core.versions import parse_version
    from compat_hook.facts.container import Request
    from compat_hook.facts.hostfacts import HostFacts
    from compat_hook.facts.rootfs import Root
    from compat_hook.policy.assess import assess
    from tests.conftest import config_for

    h = HostFacts(driver_version=parse_version(driver), driver_source="test", driver_text=driver)
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all", *env]}, "root": {"path": str(rootfs)}}
    with Root(str(rootfs)) as root:
        return assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=h, actors=actors,
                      toolkit=True, mount_ns=True,
                      hook_entry=lambda: {"path": "/usr/bin/python3", "args": ["python3", "compat_hook", "hook"]})


def test_a_conda_compat_dir_linked_to_etc_is_never_masked(tmp_path):
    """Hostile: /opt/conda/cuda-compat -> /etc holding a libcuda: a candidate, wrong here, but /etc
    (no compat dir once resolved) is never hidden; CONDA_PREFIX out of the root stays inside."""
    rootfs = build_tree(tmp_path / "r", {"opt/conda/cuda-compat": Symlink("/etc"),
                                         "etc/libcuda.so.550.163.01": elf(None),
                                         "etc/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                                         "opt/conda/lib/libcuda.so.1": Symlink("/opt/conda/cuda-compat/libcuda.so.1")})
    outside = tmp_path / "cuda-compat"
    outside.mkdir()
    (outside / "libcuda.so.999.1.1").write_bytes(elf(None))  # next to the rootfs: never reached
    a = _assess(rootfs, "555.58.02", ["CONDA_PREFIX=/../../../.."])
    assert [(c.compat_dir, c.links) for c in a.image.all()] == [("/etc", ["/opt/conda/lib/libcuda.so.1"])]
    assert a.effect == "host" and a.hook_masks == [], a.hook_masks
    assert any("resolves to /etc, not a compat dir: not masked" in n for n in a.notes), a.notes


def test_the_new_lookups_are_bounded(tmp_path):
    from compat_hook.facts import imagefacts

    entries = {f"opt/conda/envs/e{i:04d}/bin/x": b"" for i in range(200)}
    entries.update({f"usr/local/cuda-{i}.0/compat/libcuda.so.550.{i}.1": b"" for i in range(40)})
    rootfs = build_tree(tmp_path / "r", entries)
    ld = ":".join(f"/usr/local/cuda-{i}.0/compat" for i in range(40))
    a = _assess(rootfs, "555.58.02", [f"LD_LIBRARY_PATH={ld}"])
    origins = [c.origin for c in a.image.all()]
    assert origins == ["LD_LIBRARY_PATH"] * imagefacts.MAX_LD_DIRS
    from compat_hook.facts.rootfs import Root
    with Root(str(rootfs)) as root:
        prefixes = imagefacts.conda_prefixes(root, {})
    assert len(prefixes) == 1 + imagefacts.MAX_ENVS and prefixes[0] == ("/opt/conda", "a conda root")


def test_a_start_without_conda_costs_one_lookup_per_root(tmp_path):
    """The hot path (docs/design.md): no conda in the image, no CONDA_PREFIX: each well-known root
    is one confined lookup, and nothing under it is touched."""
    from compat_hook.facts import imagefacts
    from compat_hook.facts.rootfs import Root
    from tests.conftest import config_for

    rootfs = build_tree(tmp_path / "r", {"usr/local/cuda-12.4/lib64/libcudart.so.12": b"x",
                                         "usr/local/cuda": Symlink("cuda-12.4"), "opt/other/x": b"",
                                         "root/.bashrc": b""})

    class Counting(Root):
        walks: list = []

        def _walk(self, path, *a, **kw):
            self.walks.append(path)
            return super()._walk(path, *a, **kw)

    with Counting(str(rootfs)) as root:
        img = imagefacts.gather(root, config_for(None), env={"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"})
    assert img.status == "none" and img.others == []
    conda = [w for w in Counting.walks if "conda" in w or "mamba" in w]
    assert conda == list(imagefacts.CONDA_ROOTS), Counting.walks
    # the homes of /etc/passwd (none here: one lookup), nothing under the system PATH dirs
    assert len(Counting.walks) == len(config_for(None).compat_dirs) + len(imagefacts.CONDA_ROOTS) + 1
    assert "/etc/passwd" in Counting.walks
