"""compat_hook.policy.toolkit, the model of what the NVIDIA Container Toolkit does, against the toolkit itself.

Differential tests: on small real trees (ELF stubs from compat_hook.facts.elfgen,
which ldconfig accepts as libraries) the model says which ld.so.conf.d file
first names the host driver's dir and which libcuda wins; the real
``nvidia-cdi-hook update-ldcache`` (v1.20.2, :mod:`tests.support.toolkit`)
then runs on the tree as it runs at a container's createContainer, with the
host's real ``ldconfig``, and

* ``ldconfig -r ROOT -p`` lists the cache in lookup order: its first
  ``libcuda.so.1`` line is the library the loader takes;
* ``ldconfig -r ROOT -v -N -X`` prints each dir with the file that named it
  first (``(from /etc/ld.so.conf.d/NAME:LINE)``, or ``<builtin>`` for a
  trusted dir).

Likewise the real ``enable-cuda-compat`` with ``--host-cuda-version`` (the
Tegra/CSV path) is compared with :func:`compat_hook.policy.toolkit.would_enable`.

``update-ldcache`` pivots into the root, so each run gets a private mount
namespace (``unshare -m``) in which the root is bind-mounted onto itself,
as a runtime's rootfs is; nothing of the machine is touched.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from compat_hook.facts import elfgen, imagefacts
from compat_hook.policy import toolkit as model
from compat_hook.core.config import from_mapping
from compat_hook.facts.rootfs import Root
from compat_hook.core.versions import parse_version
from tests.support.toolkit import toolkit  # noqa: F401  (the session fixture)

pytestmark = pytest.mark.containers

LDCONFIG = "/sbin/ldconfig"
COMPAT = "/usr/local/cuda/compat"
DEBIAN_HOST = "/usr/lib/x86_64-linux-gnu"   # where the toolkit mounts the host libcuda on Debian/Ubuntu hosts
RHEL_HOST = "/usr/lib64"                    # ... and on RHEL hosts
ARM_HOST = "/usr/lib/aarch64-linux-gnu"

#: Image layouts: (debian_version?, {drop-in name: dirs}).
IMAGES = {
    "debian-amd64": (True, {"x86_64-linux-gnu.conf": ["/usr/local/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu",
                                                      "/usr/lib/x86_64-linux-gnu"], "libc.conf": ["/usr/local/lib"]}),
    "debian-arm64": (True, {"aarch64-linux-gnu.conf": ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"],
                            "libc.conf": ["/usr/local/lib"]}),
    "ubi8": (False, {}),                        # RHEL: no multiarch drop-in, libs in /usr/lib64
    "debian-no-multiarch": (True, {}),          # a trimmed Debian image without x86_64-linux-gnu.conf
}
COMPAT_DROPINS = ["00-cuda-compat.conf", "cuda-compat.conf", "zzz-cuda-compat.conf"]
CASES = [(img, host) for img in ("debian-amd64", "ubi8", "debian-no-multiarch") for host in (DEBIAN_HOST, RHEL_HOST)]
CASES.append(("debian-arm64", ARM_HOST))


def lib(path: pathlib.Path, note: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(elfgen.make_elf(note_json=note))


def image_tree(tmp: pathlib.Path, image: str, host_dir: str, compat_dropin: str | None) -> pathlib.Path:
    """``tmp/bundle``: config.json and a rootfs with the compat libcuda, the host libcuda at ``host_dir``."""
    debian, dropins = IMAGES[image]
    bundle = tmp / "bundle"
    root = bundle / "rootfs"
    lib(root / COMPAT.lstrip("/") / "libcuda.so.550.54.15")
    lib(root / host_dir.lstrip("/") / "libcuda.so.535.183.01")
    conf_d = root / "etc/ld.so.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    if debian:
        (root / "etc/debian_version").write_text("12.8\n")
    for name, dirs in dropins.items():
        (conf_d / name).write_text("".join(d + "\n" for d in dirs))
    if compat_dropin:
        (conf_d / compat_dropin).write_text(COMPAT + "\n")
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
    return bundle


def predict(rootfs: pathlib.Path, host_dir: str, *, update_ldcache: bool = True) -> tuple:
    """``(first file naming host_dir, result)`` as the model sees the tree (the gathering code assess uses)."""
    with Root(str(rootfs)) as root:
        conf = model.ld_conf(root)
        dropins, _ = imagefacts.compat_dropins(root)
    first = model.host_dir_first(conf, host_dir, update_ldcache=update_ldcache)
    eff = model.effective(has_compat=True, toolkit_enables=False, dropins=dropins, ld_library_path=[],
                          hook_effect=None, wrapper_strips=False, host_first=first)
    return first[0], eff["result"]


def update_ldcache(tk, bundle: pathlib.Path, host_dir: str) -> None:
    state = bundle.parent / "state.json"
    state.write_text(json.dumps({"ociVersion": "1.0.2", "id": "m", "status": "creating", "pid": os.getpid(),
                                 "bundle": str(bundle)}))
    script = ('mount --bind "$1" "$1" && exec "$2" update-ldcache --ldconfig-path "$3" --folder "$4" '
              '--container-spec "$5"')
    p = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                        str(bundle / "rootfs"), str(tk.cdi_hook), LDCONFIG, host_dir, str(state)],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr


def loaded_dir(rootfs: pathlib.Path) -> str:
    """The dir of the first ``libcuda.so.1`` in the real cache: the one the loader takes."""
    out = subprocess.run([LDCONFIG, "-r", str(rootfs), "-p"], capture_output=True, text=True, timeout=30).stdout
    hits = [line.split("=>", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("libcuda.so.1 ")]
    assert hits, out
    return os.path.dirname(hits[0])


def named_first_by(rootfs: pathlib.Path, d: str) -> str:
    """Which file ldconfig says named dir ``d`` first (``<builtin>`` for a trusted dir), or ``""``."""
    out = subprocess.run([LDCONFIG, "-r", str(rootfs), "-v", "-N", "-X"], capture_output=True, text=True,
                         timeout=30).stdout
    for line in out.splitlines():
        if line.startswith(d + ":") and "(from " in line:
            src = line.split("(from ", 1)[1].rsplit(":", 1)[0]
            return os.path.basename(src)
    return ""


def result_of(d: str) -> str:
    return "compat" if d == COMPAT else "host"


@pytest.mark.parametrize("compat_dropin", COMPAT_DROPINS)
@pytest.mark.parametrize("image,host_dir", CASES)
def test_model_matches_real_update_ldcache(tmp_path, image, host_dir, compat_dropin, toolkit):
    """The file the model says names the host dir first, and the winner, are the real ones."""
    bundle = image_tree(tmp_path, image, host_dir, compat_dropin)
    rootfs = bundle / "rootfs"
    first, result = predict(rootfs, host_dir)
    update_ldcache(toolkit, bundle, host_dir)
    real_first = named_first_by(rootfs, host_dir)
    assert real_first.startswith(first), (first, real_first)   # 00-nvcr-<random>.conf: the model names the prefix
    assert result_of(loaded_dir(rootfs)) == result, (image, host_dir, compat_dropin, first)


def test_expected_winners_per_layout(tmp_path):
    """The cases that differ by layout, spelled out (each also checked against the real tools above)."""
    want = {
        ("debian-amd64", DEBIAN_HOST): ("x86_64-linux-gnu.conf", ["compat", "compat", "host"]),
        ("debian-arm64", ARM_HOST): ("aarch64-linux-gnu.conf", ["compat", "host", "host"]),
        ("ubi8", RHEL_HOST): ("zz-nvcr-", ["compat", "compat", "host"]),
        ("ubi8", DEBIAN_HOST): ("00-nvcr-", ["compat", "host", "host"]),
        ("debian-amd64", RHEL_HOST): ("00-nvcr-", ["compat", "host", "host"]),
        ("debian-no-multiarch", DEBIAN_HOST): ("zz-nvcr-", ["compat", "compat", "host"]),
    }
    for (image, host_dir), (first, results) in want.items():
        got = []
        for i, name in enumerate(COMPAT_DROPINS):
            bundle = image_tree(tmp_path / f"{image}-{i}-{host_dir[5:8]}", image, host_dir, name)
            got_first, res = predict(bundle / "rootfs", host_dir)
            assert got_first == first, (image, host_dir, got_first)
            got.append(res)
        assert got == results, (image, host_dir, got)


@pytest.mark.parametrize("image,host_dir", [("ubi8", RHEL_HOST), ("debian-no-multiarch", DEBIAN_HOST)])
def test_without_update_ldcache_the_trusted_dir_comes_last(tmp_path, image, host_dir):
    """Only the host's ldconfig (no toolkit drop-ins): a dir no drop-in names is met after every drop-in,
    so even ``zzz-cuda-compat.conf`` wins; on a Debian host ``/usr/lib64`` is not even a trusted dir."""
    bundle = image_tree(tmp_path, image, host_dir, "zzz-cuda-compat.conf")
    rootfs = bundle / "rootfs"
    first, result = predict(rootfs, host_dir, update_ldcache=False)
    assert (first, result) == (None, "compat")
    subprocess.run([LDCONFIG, "-r", str(rootfs)], check=True, timeout=30)
    assert named_first_by(rootfs, host_dir) in ("<builtin>", "")
    assert loaded_dir(rootfs) == COMPAT


# --------------------------------------------------------------------------- the Tegra (CSV) path


NOTE_124 = json.dumps({"format": 1, "CUDA version": "12.4", "driver": [470, 525, 535]})


@pytest.mark.parametrize("name,note,driver,cuda", [
    ("libcuda.so.550.54.15", NOTE_124, None, "12.2"),    # note CUDA newer: use
    ("libcuda.so.550.54.15", NOTE_124, None, "12.4"),    # equal: no
    ("libcuda.so.550.54.15", NOTE_124, None, "13.0"),    # older: no
    ("libcuda.so.550.54.15", None, None, "12.2"),        # no note with a host CUDA version: never
    ("libcuda.so.1.1", elfgen.NOTE_ORIN, None, "13.1"),  # Orin's file name, note 13.2: use
    ("libcuda.so.1.1", elfgen.NOTE_ORIN, None, "13.2"),
    ("libcuda.so.550.54.15", NOTE_124, "535.183.01", "13.0"),  # both: the driver rule, CUDA ignored
    ("libcuda.so.550.54.15", None, "535.183.01", "12.2"),      # both, no note: never
    ("libcuda.so.550.54.15", None, "535.183.01", None),        # CDI path, no note: the major rule
])
def test_would_enable_matches_enable_cuda_compat(tmp_path, name, note, driver, cuda, toolkit):
    bundle = tmp_path / "bundle"
    rootfs = bundle / "rootfs"
    lib(rootfs / COMPAT.lstrip("/") / name, note)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "m", "status": "creating", "pid": os.getpid(),
                        "bundle": str(bundle)})
    with Root(str(rootfs)) as root:
        facts = imagefacts.gather(root, from_mapping({"nvml": "off", "log_file": None}))
    predicted, why = model.would_enable(facts, parse_version(driver) if driver else None,
                                        parse_version(cuda) if cuda else None)
    args = [str(toolkit.cdi_hook), "enable-cuda-compat"]
    args += [f"--host-driver-version={driver}"] if driver else []
    args += [f"--host-cuda-version={cuda}"] if cuda else []
    p = subprocess.run(args, input=state, capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    conf_d = rootfs / "etc/ld.so.conf.d"
    wrote = conf_d.is_dir() and any(n.startswith("00-compat-") for n in os.listdir(conf_d))
    assert wrote == predicted, (name, driver, cuda, why, p.stderr)


# --------------------------------------------------------------------------- through explain


def _explain(rootfs: pathlib.Path, tmp: pathlib.Path, *flags) -> dict:
    host = tmp / "host"
    (host / "proc/driver/nvidia").mkdir(parents=True, exist_ok=True)
    conf = tmp / "config.json"
    conf.write_text(json.dumps({"host_root": str(host), "nvml": "off", "log_file": None}))
    p = subprocess.run(["/usr/bin/python3", "-m", "compat_hook", "explain", "--rootfs", str(rootfs),
                        "--config", str(conf), "--json", *flags], capture_output=True, text=True, timeout=60,
                       cwd=str(pathlib.Path(__file__).resolve().parents[1]))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["toolkit"]


@pytest.mark.parametrize("image,host_dir,dropin,alone,by", [
    ("debian-arm64", ARM_HOST, "cuda-compat.conf", "host", "aarch64-linux-gnu.conf names"),
    ("ubi8", RHEL_HOST, "cuda-compat.conf", "compat", "cuda-compat.conf names /usr/local/cuda/compat"),
    ("ubi8", RHEL_HOST, "zzz-cuda-compat.conf", "host", "update-ldcache names it in zz-nvcr-*.conf"),
    ("ubi8", DEBIAN_HOST, "cuda-compat.conf", "host", "update-ldcache names /usr/lib/x86_64-linux-gnu in 00-nvcr"),
])
def test_explain_uses_the_image_layout(tmp_path, image, host_dir, dropin, alone, by):
    """explain's "toolkit alone" view reads the image's drop-ins and where the host libcuda is mounted
    (host 555: the toolkit does not enable; only the image's own drop-in can make compat win)."""
    rootfs = image_tree(tmp_path, image, host_dir, dropin) / "rootfs"
    (rootfs / host_dir.lstrip("/") / "libcuda.so.535.183.01").rename(
        rootfs / host_dir.lstrip("/") / "libcuda.so.555.58.02")
    view = _explain(rootfs, tmp_path, "--host-driver-version", "555.58.02")
    assert view["alone"]["result"] == alone and by in view["alone"]["by"], view


def test_explain_tegra_path_uses_the_host_cuda_version(tmp_path):
    """No host driver version, a host CUDA version: the toolkit's CSV path, decided on the note's CUDA."""
    rootfs = tmp_path / "rootfs"
    lib(rootfs / COMPAT.lstrip("/") / "libcuda.so.1.1", elfgen.NOTE_ORIN)    # note: CUDA 13.2
    assert _explain(rootfs, tmp_path, "--host-cuda-version", "13.1")["enables"] is True
    assert _explain(rootfs, tmp_path, "--host-cuda-version", "13.2")["enables"] is False
