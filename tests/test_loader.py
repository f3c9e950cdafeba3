"""The loader model (compat_hook/facts/loader.py) and what it finds (issue: every libcuda the container can load).

Unit level, on small trees: ldconfig's reading of ``/etc/ld.so.conf`` (lines in order, includes in
place), the env roots of conda, pixi and micromamba 2, the candidate dirs ``imagefacts.gather`` finds
through each, the model's ``LD_LIBRARY_PATH`` walk, and the wrapper handing the hook what it took off.
The order ldconfig really keeps is checked against the real ``ldconfig -r`` (containers marker);
what real containers map is tests/test_loader_containers.py's.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

from compat_hook.core.ldpath import is_compat_entry
from compat_hook.facts import imagefacts, loader
from compat_hook.facts.container import ANNOTATION_LD_BEFORE, Request
from compat_hook.facts.hostfacts import HostFacts
from compat_hook.facts.rootfs import Root
from compat_hook.policy import toolkit
from compat_hook.policy.assess import assess
from tests.conftest import Symlink, build_tree, config_for, elf

COMPAT = {"usr/local/cuda-12.9/compat/libcuda.so.550.163.01": elf(None),
          "usr/local/cuda-12.9/compat/libcuda.so.1": Symlink("libcuda.so.550.163.01")}


def ngc(link: bool) -> dict:
    """NGC's layout: the driver in compat/lib.real, cuda -> /etc/alternatives/cuda -> cuda-12.9, a drop-in naming compat/lib."""
    t = {"usr/local/cuda-12.9/compat/lib.real/libcuda.so.550.163.01": elf(None),
         "usr/local/cuda-12.9/compat/lib.real/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
         "etc/alternatives/cuda": Symlink("/usr/local/cuda-12.9"),
         "usr/local/cuda": Symlink("/etc/alternatives/cuda"),
         "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
         "etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat/lib\n"}
    if link:
        t["usr/local/cuda-12.9/compat/lib"] = Symlink("lib.real")
    return t


def gather(rootfs: pathlib.Path, env: dict | None = None, cwd: str | None = None, extra_ld=()):
    with Root(str(rootfs)) as root:
        conf = loader.ld_so_conf(root, skip="00-00-compat-hook.conf")
        return imagefacts.gather(root, config_for(None), env=env, cwd=cwd, conf=conf, extra_ld=extra_ld)


# --------------------------------------------------------------------------- ldconfig's order

def test_ld_so_conf_reads_lines_in_order_with_includes_in_place(make_rootfs):
    rootfs = make_rootfs({
        "etc/ld.so.conf": "/opt/first  # a comment\ninclude /etc/ld.so.conf.d/*.conf\n/opt/last\n"
                          "include extra/*.conf\nhwcap 0 nosegneg\n",
        "etc/ld.so.conf.d/b.conf": "/b1\n/b2=libc6\n",
        "etc/ld.so.conf.d/a.conf": "/a\n",
        "etc/ld.so.conf.d/notconf.txt": "/never\n",
        "etc/extra/x.conf": "/x\n",
    })
    with Root(str(rootfs)) as root:
        c = loader.ld_so_conf(root)
    assert [d for _k, _s, d in c.entries] == ["/opt/first", "/a", "/b1", "/b2", "/opt/last", "/x"]
    keys = [k for k, _s, _d in c.entries]
    assert keys == sorted(keys) and keys[2] == keys[3]  # one file's lines share its place
    assert [s for _k, s, _d in c.entries][0] == "/etc/ld.so.conf:1"
    # a drop-in that is not there yet falls where ldconfig would read it
    ours = c.dropin_key("00-00-compat-hook.conf")
    assert keys[0] < ours < keys[1] and c.dropin_key("zz.conf") > keys[3] and c.dropin_key("zz.conf") < keys[4]
    assert c.dropin_key("00-00-compat-hook.conf") < c.dropin_key("00-compat-x.conf") < c.dropin_key("a.conf")
    assert c.dropin_key("x.txt") is None  # the glob never reads it
    assert c.label(c.dropin_key("a.conf")) == "/etc/ld.so.conf.d/a.conf"


def test_ld_so_conf_without_the_drop_in_include(make_rootfs):
    rootfs = make_rootfs({"etc/ld.so.conf": "/usr/local/lib\n", "etc/ld.so.conf.d/a.conf": "/a\n"})
    with Root(str(rootfs)) as root:
        c = loader.ld_so_conf(root)
    assert [d for _k, _s, d in c.entries] == ["/usr/local/lib"]
    assert c.dropin_key("00-00-compat-hook.conf") is None
    assert any("never read" in n for n in c.notes)


def test_ld_so_conf_is_bounded_and_confined(make_rootfs):
    many = {f"etc/ld.so.conf.d/{i:04}.conf": f"/d{i}\n" for i in range(600)}
    rootfs = make_rootfs({"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\ninclude ../../../../etc/*.conf\n",
                          **many, "etc/ld.so.conf.d/zz.conf": Symlink("/etc/shadow-like")})
    with Root(str(rootfs)) as root:
        c = loader.ld_so_conf(root)
    assert len(c.entries) <= loader.MAX_FILES
    assert any("only the first" in n for n in c.notes)


# --------------------------------------------------------------------------- where compat drivers are found

def test_ngc_lib_real_is_found_with_and_without_the_link(make_rootfs):
    for link in (True, False):
        img = gather(make_rootfs(ngc(link)))
        assert img.status == "found", link
        assert img.compat_dir == "/usr/local/cuda-12.9/compat/lib.real"
        assert img.configured_dir == "/usr/local/cuda/compat/lib.real"
        assert img.others == []  # the drop-in's compat/lib is the same dir, not a second one


def test_a_dir_named_only_by_a_drop_in_is_a_candidate(make_rootfs):
    rootfs = make_rootfs({"opt/nvidia/compat/libcuda.so.550.163.01": elf(None),
                          "opt/nvidia/compat/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
                          "etc/ld.so.conf.d/nvidia-compat.conf": "/opt/nvidia/compat\n",
                          "etc/ld.so.conf.d/libc.conf": "/usr/local/lib\n"})
    img = gather(rootfs)
    assert (img.status, img.compat_dir, img.origin) == ("found", "/opt/nvidia/compat", "ld.so.conf")


def test_a_line_of_ld_so_conf_before_the_include_is_a_candidate(make_rootfs):
    rootfs = make_rootfs({**COMPAT, "etc/ld.so.conf": "/usr/local/cuda-12.9/compat\ninclude /etc/ld.so.conf.d/*.conf\n"})
    img = gather(rootfs)
    assert (img.status, img.origin) == ("found", "ld.so.conf")
    with Root(str(rootfs)) as root:
        dropins, _ = imagefacts.compat_dropins(root, dirs=[img.compat_dir])
    assert [(d["file"], d["dirs"]) for d in dropins] == [("ld.so.conf:1", ["/usr/local/cuda-12.9/compat"])]


def test_pixi_env_found_from_the_working_dir_and_from_path(make_rootfs):
    pixi = "app/.pixi/envs/default"
    rootfs = make_rootfs({f"{pixi}/cuda-compat/libcuda.so.550.163.01": elf(None),
                          f"{pixi}/cuda-compat/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          f"{pixi}/lib/libcuda.so.1": Symlink(f"/{pixi}/cuda-compat/libcuda.so.1"),
                          f"{pixi}/conda-meta/cuda-compat-impl-550.163.01-h0_0.json": "{}"})
    for env, cwd in (({}, "/app"), ({"PATH": f"/{pixi}/bin:/usr/bin:/bin"}, "/")):
        img = gather(rootfs, env, cwd)
        assert (img.status, img.origin, img.prefix) == ("found", "conda", f"/{pixi}"), (env, cwd)
        assert img.links == [f"/{pixi}/lib/libcuda.so.1"]
    assert gather(rootfs, {}, "/").status == "none"  # nothing names the project: not probed


def test_micromamba2_default_root_of_any_user(make_rootfs):
    env = "home/mambauser/.local/share/mamba/envs/torch"
    rootfs = make_rootfs({"etc/passwd": "root:x:0:0:root:/root:/bin/bash\n"
                                        "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
                                        "mambauser:x:57439:57439::/home/mambauser:/bin/bash\n",
                          f"{env}/cuda-compat/libcuda.so.550.163.01": elf(None),
                          f"{env}/conda-meta/cuda-compat-impl-550.163.01-h0_0.json": "{}"})
    img = gather(rootfs)
    assert (img.status, img.prefix) == ("found", f"/{env}")
    with Root(str(rootfs)) as root:
        assert ("/home/mambauser/.local/share/mamba", "a root under /home/mambauser") in \
            loader.env_prefixes(root, {}, None)


def test_ld_library_path_dir_holding_a_libcuda_is_a_candidate_but_not_a_host_dir(make_rootfs):
    rootfs = make_rootfs({"opt/drv/libcuda.so.550.163.01": elf(None),
                          "opt/drv/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          "usr/local/nvidia/lib64/libcuda.so.1": elf(None),
                          "usr/local/cuda-12.4/compat-tools/lib/libcuda.so.1": elf(None)})
    img = gather(rootfs, {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/opt/drv:/nonexistent"})
    assert [c.compat_dir for c in img.all()] == ["/opt/drv"]


def test_compat_tools_is_no_compat_dir():
    assert not is_compat_entry("/usr/local/cuda-12.4/compat-tools/lib")
    assert is_compat_entry("/usr/local/cuda-13.0/compat_orin") and is_compat_entry("/usr/local/cuda/compat/lib")


def test_a_start_without_compat_reads_no_big_dir(make_rootfs):
    """The hot path: a dir of ldconfig's configuration is probed for libcuda.so.1 by one lookup, never listed."""
    rootfs = make_rootfs({"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
                          "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/local/lib/x86_64-linux-gnu\n/opt/big\n",
                          **{f"opt/big/lib{i}.so": b"" for i in range(50)}})

    class Counting(Root):
        listed: list = []

        def listdir(self, path):
            self.listed.append(path)
            return super().listdir(path)

    with Counting(str(rootfs)) as root:
        conf = loader.ld_so_conf(root)
        img = imagefacts.gather(root, config_for(None), conf=conf)
    assert img.status == "none"
    assert "/opt/big" not in Counting.listed and "/usr/local/lib/x86_64-linux-gnu" not in Counting.listed


# --------------------------------------------------------------------------- the model's walk

def test_an_earlier_host_entry_on_ld_library_path_wins_and_a_missing_one_does_not():
    common = dict(has_compat=True, toolkit_enables=False, dropins=[], ld_library_path=[], hook_effect=None,
                  wrapper_strips=False)
    host_first = [{"entry": "/usr/local/nvidia/lib64", "kind": "host"}, {"entry": "/c", "kind": "compat"}]
    assert toolkit.effective(ld_path=host_first, **common)["result"] == "host"
    assert toolkit.effective(ld_path=host_first[1:], **common)["result"] == "compat"
    # a missing compat entry is no entry: the model is handed only entries that hold a libcuda
    assert toolkit.effective(ld_path=[], **common)["result"] == "host"


def test_explain_names_what_a_dangling_drop_in_does_not_reach(make_rootfs, fake_host):
    rootfs = make_rootfs({"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
                          "etc/ld.so.conf.d/00-cuda-compat.conf": "/usr/local/cuda/compat/lib\n"})
    with Root(str(rootfs)) as root:
        a = assess(config_for(None), Request.assume_gpu(), root, host=HostFacts(driver_version=(470, 256, 2)),
                   actors=("hook",), toolkit=True, full=True)
    assert "carries no compat" not in a.toolkit["alone"]["by"]
    assert "/usr/local/cuda/compat/lib" in a.toolkit["alone"]["by"]


# --------------------------------------------------------------------------- wrapper -> hook

def _spec(rootfs, env):
    return {"ociVersion": "1.0.2", "root": {"path": str(rootfs)},
            "process": {"cwd": "/", "args": ["/bin/true"], "env": env, "user": {"uid": 0, "gid": 0}}}


@pytest.mark.parametrize("text", ["470.256.02", "555.58.02"])
def test_the_hook_the_wrapper_adds_sees_what_the_wrapper_took_off(make_rootfs, text):
    """vLLM's layout: the compat dir on LD_LIBRARY_PATH and in a drop-in, outside /usr/local/cuda."""
    rootfs = make_rootfs({"usr/local/cuda-12.9/compat/libcuda.so.550.163.01": elf(None),
                          "usr/local/cuda-12.9/compat/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
                          "etc/ld.so.conf.d/cuda-compat.conf": "/usr/local/cuda-12.9/compat\n",
                          f"usr/lib/x86_64-linux-gnu/libcuda.so.{text}": b"h"})
    env = ["NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/usr/local/cuda-12.9/compat"]
    spec = _spec(rootfs, env)
    cfg = config_for(None)
    host = tuple(int(x) for x in text.split("."))
    hf = HostFacts(driver_version=host, arch="x86_64", driver_text=text)
    with Root(str(rootfs)) as root:
        w = assess(cfg, Request.from_spec(spec), root, spec=spec, host=hf, actors=("wrapper",),
                   hook_entry=lambda: {"path": "/usr/bin/true", "args": ["compat-hook", "hook"]})
        if w.effect == "host":  # the wrapper took the entry off, and says what it was
            assert w.new_spec["annotations"][ANNOTATION_LD_BEFORE] == "/usr/local/cuda-12.9/compat"
        h = assess(cfg, Request.from_spec(w.new_spec), root, spec=w.new_spec, host=hf, actors=("hook",),
                   mount_ns=True)
    assert (h.decision.reason, h.effect) == (w.decision.reason, w.effect)
    assert [c.compat_dir for c in h.image.all()] == ["/usr/local/cuda-12.9/compat"]
    if w.effect == "host":
        # the drop-in naming the dir is beaten by ours, and the env entry is gone
        assert "LD_LIBRARY_PATH" not in " ".join(e for e in w.new_spec["process"]["env"] if "compat" in e)
        assert h.hook_target == "/usr/lib/x86_64-linux-gnu"


# --------------------------------------------------------------------------- against the real ldconfig

LDCONFIG = "/sbin/ldconfig"


def _cache_dir(rootfs: pathlib.Path) -> str:
    out = subprocess.run([LDCONFIG, "-r", str(rootfs), "-p"], capture_output=True, text=True, timeout=30).stdout
    hits = [line.split("=>", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("libcuda.so.1 ")]
    assert hits, out
    return os.path.dirname(hits[0])


@pytest.mark.containers
@pytest.mark.parametrize("conf_text, ours_wins", [
    ("include /etc/ld.so.conf.d/*.conf\n", True),
    ("/usr/local/cuda-12.9/compat\ninclude /etc/ld.so.conf.d/*.conf\n", False),
    ("include /etc/ld.so.conf.d/*.conf\n/usr/local/cuda-12.9/compat\n", True),
])
def test_the_order_is_ldconfigs(tmp_path, conf_text, ours_wins):
    """The model's order against the real ldconfig: our drop-in (naming the host dir) against a compat line."""
    from compat_hook.facts import elfgen

    root = tmp_path / "r"
    for d, v in (("usr/local/cuda-12.9/compat", "550.163.01"), ("opt/host", "555.58.02")):
        (root / d).mkdir(parents=True)
        (root / d / f"libcuda.so.{v}").write_bytes(elfgen.make_elf())
    (root / "etc/ld.so.conf.d").mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text(conf_text)
    (root / "etc/ld.so.conf.d/00-00-compat-hook.conf").write_text("/opt/host\n")
    with Root(str(root)) as r:
        c = toolkit.ld_conf(r)
        dropins, _ = imagefacts.compat_dropins(r, conf=c["ldconf"], dirs=["/usr/local/cuda-12.9/compat"])
    eff = toolkit.effective(has_compat=True, toolkit_enables=False, dropins=dropins, ld_library_path=[],
                            hook_effect="host", wrapper_strips=False, host_first=(None, ""), conf=c)
    subprocess.run([LDCONFIG, "-r", str(root)], check=True, timeout=30)
    assert (_cache_dir(root) == "/opt/host") is ours_wins
    assert (eff["result"] == "host") is ours_wins, eff


def test_the_programs_own_env_is_found_and_only_its_links_predict(make_rootfs, fake_host):
    """A pixi env nothing names but the container's program (``args[0]``), beside a micromamba env."""
    pixi, mamba = "app/.pixi/envs/cuda", "home/app/.local/share/mamba/envs/x"
    tree = {"etc/passwd": "app:x:1000:1000::/home/app:/bin/sh\n", f"{pixi}/bin/probe": b"\x7fELF",
            "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n",
            "etc/ld.so.conf.d/x86_64-linux-gnu.conf": "/usr/lib/x86_64-linux-gnu\n"}
    for prefix, ver in ((pixi, "550.163.01"), (mamba, "555.58.02")):
        tree.update({f"{prefix}/cuda-compat/libcuda.so.{ver}": elf(None),
                     f"{prefix}/cuda-compat/libcuda.so.1": Symlink(f"libcuda.so.{ver}"),
                     f"{prefix}/lib/libcuda.so.1": Symlink(f"/{prefix}/cuda-compat/libcuda.so.1"),
                     f"{prefix}/conda-meta/cuda-compat-impl-{ver}-h0_0.json": "{}"})
    rootfs = make_rootfs(tree)
    with Root(str(rootfs)) as root:
        assert loader.exe_prefix(root, f"/{pixi}/bin/probe") == f"/{pixi}"
        assert loader.exe_prefix(root, "probe", {"PATH": f"/usr/bin:/{pixi}/bin"}) == f"/{pixi}"
        assert loader.exe_prefix(root, "/usr/bin/python3") is None
    spec = _spec(rootfs, ["NVIDIA_VISIBLE_DEVICES=all"])
    spec["process"]["args"] = [f"/{pixi}/bin/probe"]
    with Root(str(rootfs)) as root:
        # a 535 host: the 555 mamba driver is chosen; the program's RUNPATH still reaches its own env's link
        a = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=HostFacts(
            driver_version=(535, 261, 3), arch="x86_64"), actors=("hook",), mount_ns=False, toolkit=True, full=True)
    assert {c.prefix for c in a.image.all()} == {f"/{pixi}", f"/{mamba}"}
    assert a.decision.compat_dir == f"/{mamba}/cuda-compat"
    # outside the mount namespace the hook cannot hide the pixi dir: its link wins, and explain says so
    assert a.toolkit["with_hook"]["dir"] == f"/{pixi}/cuda-compat"
    assert any("links into" in w for w in a.warnings)


def test_an_env_lib_dir_on_ld_library_path_reaches_its_cuda_compat(make_rootfs):
    prefix = "app/.pixi/envs/default"
    rootfs = make_rootfs({f"{prefix}/cuda-compat/libcuda.so.550.163.01": elf(None),
                          f"{prefix}/cuda-compat/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          f"{prefix}/lib/libcuda.so.1": Symlink("../cuda-compat/libcuda.so.1"),
                          f"{prefix}/conda-meta/x.json": "{}"})
    env = ["NVIDIA_VISIBLE_DEVICES=all", f"LD_LIBRARY_PATH=/{prefix}/lib:/usr/lib/x86_64-linux-gnu",
           f"PATH=/{prefix}/bin:/usr/bin"]
    spec = _spec(rootfs, env)
    with Root(str(rootfs)) as root:
        a = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=HostFacts(
            driver_version=(470, 256, 2), arch="x86_64"), actors=("hook",), mount_ns=True, toolkit=True, full=True)
    assert a.toolkit["alone"]["via"] == "LD_LIBRARY_PATH"
    assert a.toolkit["alone"]["dir"] == f"/{prefix}/cuda-compat"
    assert a.toolkit["alone"]["maps"] == f"/{prefix}/cuda-compat/libcuda.so.550.163.01"


def test_a_tenants_before_wrapper_annotation_is_dropped_by_the_wrapper(make_rootfs):
    rootfs = make_rootfs({"srv/x/libcuda.so.560.35.03": elf(None), "srv/x/libcuda.so.1": Symlink("libcuda.so.560.35.03")})
    spec = _spec(rootfs, ["NVIDIA_VISIBLE_DEVICES=all"])
    spec["annotations"] = {ANNOTATION_LD_BEFORE: "/srv/x"}
    with Root(str(rootfs)) as root:
        w = assess(config_for(None), Request.from_spec(spec), root, spec=spec, actors=("wrapper",),
                   host=HostFacts(driver_version=(535, 261, 3), arch="x86_64"),
                   hook_entry=lambda: {"path": "/usr/bin/true", "args": ["compat-hook", "hook"]})
    assert ANNOTATION_LD_BEFORE not in w.new_spec.get("annotations", {})
    assert f"dropped annotation {ANNOTATION_LD_BEFORE} (not this wrapper's)" in w.spec_edits


def test_ld_so_conf_lines_as_glibc_reads_them(make_rootfs):
    """A tab after include, a NUL ending a line, a CRLF include (its glob then ends in \\r: nothing)."""
    rootfs = make_rootfs({"etc/ld.so.conf": "include\t/etc/ld.so.conf.d/*.conf\n/opt/a\0junk\n",
                          "etc/ld.so.conf.d/b.conf": "/b\n"})
    with Root(str(rootfs)) as root:
        assert [d for _k, _s, d in loader.ld_so_conf(root).entries] == ["/b", "/opt/a"]
    crlf = make_rootfs({"etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\r\n", "etc/ld.so.conf.d/b.conf": "/b\n"})
    with Root(str(crlf)) as root:
        assert loader.ld_so_conf(root).entries == []


def test_an_ld_library_path_link_to_a_candidate_dir_comes_off(make_rootfs):
    rootfs = make_rootfs({"opt/drv/libcuda.so.550.163.01": elf(None),
                          "opt/drv/libcuda.so.1": Symlink("libcuda.so.550.163.01"), "opt/drvlink": Symlink("/opt/drv"),
                          "usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02": b"h"})
    spec = _spec(rootfs, ["NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/opt/drvlink:/usr/local/lib"])
    hf = HostFacts(driver_version=(555, 58, 2), arch="x86_64", driver_text="555.58.02")
    with Root(str(rootfs)) as root:
        w = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=hf, actors=("wrapper",),
                   hook_entry=lambda: {"path": "/usr/bin/true", "args": ["compat-hook", "hook"]})
        h = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=hf, actors=("hook",),
                   mount_ns=True)
    assert w.effect == "host" and "LD_LIBRARY_PATH=/usr/local/lib" in w.spec_edits
    assert h.hook_masks == ["/opt/drv"]


def test_an_app_dir_holding_a_libcuda_is_never_hidden_nor_taken_off(make_rootfs):
    rootfs = make_rootfs({"app/server": b"\x7fELF", "app/libcuda.so.550.163.01": elf(None),
                          "app/libcuda.so.1": Symlink("libcuda.so.550.163.01"),
                          "usr/lib/x86_64-linux-gnu/libcuda.so.555.58.02": b"h"})
    spec = _spec(rootfs, ["NVIDIA_VISIBLE_DEVICES=all", "LD_LIBRARY_PATH=/app"])
    hf = HostFacts(driver_version=(555, 58, 2), arch="x86_64", driver_text="555.58.02")
    with Root(str(rootfs)) as root:
        w = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=hf, actors=("wrapper",),
                   hook_entry=lambda: {"path": "/usr/bin/true", "args": ["compat-hook", "hook"]})
        h = assess(config_for(None), Request.from_spec(spec), root, spec=spec, host=hf, actors=("hook",),
                   mount_ns=True)
    assert not any(e.startswith(("LD_LIBRARY_PATH", "unset LD_LIBRARY_PATH")) for e in w.spec_edits)
    assert h.hook_masks == [] and any("/app holds a compat libcuda" in x for x in h.warnings)
    assert "maps" not in h.log_fields()  # it does not claim what this start gets
