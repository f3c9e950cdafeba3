#!/usr/bin/python3
"""Build dist/compat-hook_<version>_all.deb for Debian's own Python (no network, no debhelper).

Usage (what ``make deb`` runs)::

    /usr/bin/python3 packaging/debian/build-deb.py [--out DIR] [--stage DIR] [--nri-plugin BIN]

With ``--nri-plugin`` (``make image``, or ``make deb NRI_PLUGIN=dist/compat-hook-nri``)
the package also ships the built NRI plugin at ``/usr/libexec/compat-hook/compat-hook-nri``
(``compat-hook install containerd --via nri`` finds it there); a Go binary is
architecture-specific, so that package is ``compat-hook_<version>_<arch>.deb``
(amd64 or arm64, read from the binary's ELF header). Without it the package is
architecture-independent and carries no plugin.

The package is a staged tree turned into a .deb with ``dpkg-deb --build
--root-owner-group``:

=====================================================  ==============================================
/usr/lib/python3/dist-packages/compat_hook/             the modules (+ data/), byte-compiled by postinst
/usr/bin/compat-hook, /usr/bin/compat-hook-runtime      console scripts (``#!/usr/bin/python3 -I``)
/usr/libexec/compat-hook/compat-hook-runtime            the shell runtime wrapper, rendered for the above
/usr/libexec/compat-hook/compat-hook-nri                the NRI plugin (``--nri-plugin`` only)
/usr/share/containers/oci/hooks.d/50-compat-hook.json   the Podman/CRI-O hook (``/usr/bin/python3 -I -S``)
/etc/compat-hook/config.yaml                            conffile (config/compat-hook.yaml)
/etc/logrotate.d/compat-hook                            conffile (packaging/debian/logrotate)
/usr/share/man/man8/compat-hook.8.gz                    packaging/man/compat-hook.8 (+ compat-hook-runtime.8)
/usr/share/doc/compat-hook/{copyright,changelog.gz}     packaging/debian/
=====================================================  ==============================================

Nothing is fetched: the dependencies are Debian packages (python3,
python3-yaml, python3-pyelftools; python3-tomlkit recommended).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import pathlib
import shutil
import stat
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent
PKG = "compat-hook"
DIST_PACKAGES = "usr/lib/python3/dist-packages"
SYSTEM_PYTHON = "/usr/bin/python3"
CONFFILE = "etc/compat-hook/config.yaml"
LOGROTATE = "etc/logrotate.d/compat-hook"
HOOKSD = "usr/share/containers/oci/hooks.d/50-compat-hook.json"
WRAPPER_SRC = "compat_hook/data/compat-hook-runtime.sh"
WRAPPER_DST = "usr/libexec/compat-hook/compat-hook-runtime"
NRI_DST = "usr/libexec/compat-hook/compat-hook-nri"
NRI_SRC = REPO / "packaging" / "nri"
#: A string only compat-hook-nri's binary holds (compat_hook/install/nri.py checks the same).
NRI_MARK = b"compat-hook-nri: no configuration"
#: ELF e_machine -> Debian architecture, for the architectures Go builds the plugin for here.
ELF_ARCH = {0x3E: "amd64", 0xB7: "arm64"}

SCRIPT = """#!/usr/bin/python3 -I
# {name} (Debian package {pkg}): {what}
import sys

from {module} import {func}

sys.exit({func}())
"""


def version() -> str:
    sys.path.insert(0, str(REPO))
    import compat_hook

    return compat_hook.__version__


def changelog_version() -> str:
    first = (HERE / "changelog").read_text().splitlines()[0]
    return first.split("(", 1)[1].split(")", 1)[0]


def changelog_epoch() -> int:
    """SOURCE_DATE_EPOCH from the changelog's first trailer line (reproducible builds)."""
    import email.utils

    for line in (HERE / "changelog").read_text().splitlines():
        if line.startswith(" -- ") and "  " in line[4:]:
            return int(email.utils.parsedate_to_datetime(line.rsplit("  ", 1)[1]).timestamp())
    raise SystemExit("packaging/debian/changelog: no trailer line")


def gz(data: bytes) -> bytes:
    """``gzip -9n``: maximum compression, no name, mtime 0 (reproducible; lintian checks both)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as f:
        f.write(data)
    return buf.getvalue()


def put(stage: pathlib.Path, rel: str, data: bytes, mode: int = 0o644) -> pathlib.Path:
    p = stage / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    p.chmod(mode)
    return p


def python_files() -> list:
    """The files setuptools would install (pyproject.toml [tool.setuptools] packages, data/*)."""
    import tomllib

    out = []
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    for pkg in packages:  # one list of packages for the wheel and the Debian package
        out += sorted((REPO / pkg.replace(".", "/")).glob("*.py"))
    data = REPO / "compat_hook" / "data"
    if data.is_dir():
        out += sorted(p for p in data.iterdir() if p.is_file() and not p.name.startswith("."))
    return out


def config_text() -> bytes:
    src = REPO / "config" / "compat-hook.yaml"
    if src.is_file():
        return src.read_bytes()
    p = subprocess.run([SYSTEM_PYTHON, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]);"
                        "from compat_hook.commands.cli import main; sys.exit(main(['config']))", str(REPO)],
                       capture_output=True, check=True)
    return p.stdout


def hooksd_text() -> bytes:
    sys.path.insert(0, str(REPO))
    from compat_hook.install import hooksd

    return hooksd.render(hooksd.package_document(python=SYSTEM_PYTHON, paths=["/" + DIST_PACKAGES])).encode()


def wrapper_text() -> bytes:
    """The runtime wrapper rendered for the installed locations (``podman --runtime``, ``--wrapper-path``)."""
    sys.path.insert(0, str(REPO))
    from compat_hook.install.wrapper import PACKAGED_LOG, render_wrapper

    # The package's log, not the build machine's configuration: the build is the same everywhere.
    return render_wrapper(None, python=SYSTEM_PYTHON, paths=["/" + DIST_PACKAGES], log_file=PACKAGED_LOG).encode()


def nri_plugin(path: pathlib.Path) -> tuple:
    """``(bytes, Debian architecture)`` of a built compat-hook-nri; SystemExit with one line otherwise."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SystemExit(f"build-deb: the NRI plugin {path}: {e.strerror} (make nri-plugin)") from None
    if data[:4] != b"\x7fELF" or NRI_MARK not in data:
        raise SystemExit(f"build-deb: {path} is not compat-hook's NRI plugin (make nri-plugin)")
    arch = ELF_ARCH.get(int.from_bytes(data[18:20], "big" if data[5:6] == b"\x02" else "little"))
    if arch is None:
        raise SystemExit(f"build-deb: {path}: an ELF machine this package does not know (amd64, arm64)")
    newer = [f.name for f in sorted(NRI_SRC.iterdir()) if f.is_file() and f.suffix in (".go", ".mod", ".sum")
             and f.stat().st_mtime > path.stat().st_mtime]
    if newer:  # a stale plugin would ship silently otherwise
        print(f"build-deb: warning: {path} is older than packaging/nri/{newer[0]}: make nri-plugin", file=sys.stderr)
    return data, arch


def installed_size_kib(stage: pathlib.Path) -> int:
    total = 0
    for root, dirs, files in os.walk(stage):
        if pathlib.Path(root) == stage / "DEBIAN":
            continue
        total += len(dirs) + len(files)  # dpkg counts each entry as at least 1 KiB-ish
        for n in files:
            total += (os.lstat(os.path.join(root, n)).st_size + 1023) // 1024
    return max(total, 1)


def build(out: pathlib.Path, stage: pathlib.Path, nri: pathlib.Path | None = None) -> pathlib.Path:
    ver = version()
    plugin, arch = nri_plugin(nri) if nri is not None else (None, "all")
    if changelog_version() != ver:
        raise SystemExit(f"packaging/debian/changelog says {changelog_version()}, compat_hook says {ver}: "
                         f"add a changelog entry for {ver}")
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    os.umask(0o022)

    # Python modules and data.
    for src in python_files():
        rel = src.relative_to(REPO)
        data = src.read_bytes()
        put(stage, f"{DIST_PACKAGES}/{rel}", data, 0o644)  # data/*.sh is a template, not a program

    # Console scripts (pyproject [project.scripts]).
    put(stage, "usr/bin/compat-hook", SCRIPT.format(
        name="compat-hook", pkg=PKG, what="explain, install/uninstall, store, the OCI hook",
        module="compat_hook.commands.cli", func="main").encode(), 0o755)
    put(stage, "usr/bin/compat-hook-runtime", SCRIPT.format(
        name="compat-hook-runtime", pkg=PKG, what="the runtime wrapper (execs the real OCI runtime)",
        module="compat_hook.commands.runtime", func="main").encode(), 0o755)
    if (REPO / WRAPPER_SRC).is_file():
        put(stage, WRAPPER_DST, wrapper_text(), 0o755)
    if plugin is not None:
        put(stage, NRI_DST, plugin, 0o755)
        # Static by design: CGO off, so containerd runs it on a node of any libc.
        put(stage, f"usr/share/lintian/overrides/{PKG}",
            f"{PKG}: statically-linked-binary [{NRI_DST}]\n".encode())

    # Configuration, hook, man pages, docs.
    put(stage, CONFFILE, config_text())
    put(stage, LOGROTATE, (HERE / "logrotate").read_bytes())
    put(stage, HOOKSD, hooksd_text())
    put(stage, "usr/share/man/man8/compat-hook.8.gz", gz((REPO / "packaging/man/compat-hook.8").read_bytes()))
    put(stage, "usr/share/man/man8/compat-hook-runtime.8.gz", gz(b".so man8/compat-hook.8\n"))
    put(stage, f"usr/share/doc/{PKG}/copyright", (HERE / "copyright").read_bytes())
    put(stage, f"usr/share/doc/{PKG}/changelog.gz", gz((HERE / "changelog").read_bytes()))

    # Control area.
    for d, _, _ in os.walk(stage):
        os.chmod(d, 0o755)
    control = (HERE / "control").read_text().replace("@VERSION@", ver).replace(
        "@INSTALLED_SIZE@", str(installed_size_kib(stage))).replace("Architecture: all", f"Architecture: {arch}")
    put(stage, "DEBIAN/control", control.encode())
    put(stage, "DEBIAN/conffiles", f"/{CONFFILE}\n/{LOGROTATE}\n".encode())
    for script in ("postinst", "prerm", "postrm"):
        put(stage, f"DEBIAN/{script}", (HERE / script).read_bytes(), 0o755)
    sums = []
    for root, dirs, files in os.walk(stage):
        dirs[:] = sorted(d for d in dirs if not (pathlib.Path(root) == stage and d == "DEBIAN"))
        for n in sorted(files):
            p = pathlib.Path(root) / n
            if stat.S_ISREG(p.lstat().st_mode):
                sums.append(f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(stage)}\n")
    put(stage, "DEBIAN/md5sums", "".join(sums).encode())

    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{PKG}_{ver}_{arch}.deb"
    env = dict(os.environ, SOURCE_DATE_EPOCH=os.environ.get("SOURCE_DATE_EPOCH", str(changelog_epoch())))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(stage), str(deb)],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    return deb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "dist"), help="where the .deb goes (default dist/)")
    ap.add_argument("--stage", default=None, help="keep the staged tree in this dir (default: a temp dir)")
    ap.add_argument("--nri-plugin", default=None, metavar="BIN",
                    help="ship this built compat-hook-nri (make nri-plugin) as /" + NRI_DST)
    a = ap.parse_args(argv)
    nri = pathlib.Path(a.nri_plugin).resolve() if a.nri_plugin else None
    if a.stage:
        deb = build(pathlib.Path(a.out).resolve(), pathlib.Path(a.stage).resolve(), nri)
    else:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="compat-hook-deb-") as d:
            deb = build(pathlib.Path(a.out).resolve(), pathlib.Path(d) / "root", nri)
    if nri is None:
        print("build-deb: no NRI plugin in this package (make image, or make deb NRI_PLUGIN=dist/compat-hook-nri, "
              "ships it)", file=sys.stderr)
    print(deb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
