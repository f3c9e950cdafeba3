#!/bin/sh
# stage-payload.sh DEB ROOTFS: lay out the DaemonSet image's root filesystem.
#
#   ROOTFS/opt/compat-hook/            the payload copied to the node (compat-hook-k8s.sh)
#     lib/compat_hook/                 from DEB (usr/lib/python3/dist-packages/compat_hook)
#     lib/{yaml,elftools,tomlkit}/     pure-Python copies of this machine's Debian packages
#                                      python3-yaml, python3-pyelftools, python3-tomlkit
#                                      (C extensions dropped: the node's Python may differ)
#     bin/compat-hook                  launcher using the node's /usr/bin/python3
#     share/config.yaml                DEB's /etc/compat-hook/config.yaml
#     libexec/compat-hook-nri          $NRI_PLUGIN when set (make nri-plugin's dist/compat-hook-nri):
#                                      the NRI plugin the installer registers (registration.path)
#     STAMP                            <version>-<sha256 of the above, 12 hex digits>
#   ROOTFS/bin/busybox (+ applets)     busybox-static: all the installer container runs
#                                      (stage-agent.sh adds the agent's python3 and ctr)
#   ROOTFS/usr/local/bin/compat-hook-k8s   packaging/kubernetes/compat-hook-k8s.sh
#
# Used by build-image.sh (umoci) and by the Containerfile. Needs dpkg-deb,
# sha256sum, and /bin/busybox from busybox-static. Nothing is fetched.
set -eu

[ $# -eq 2 ] || { echo "usage: $0 DEB ROOTFS" >&2; exit 2; }
deb=$1
rootfs=$2
here=$(cd "$(dirname "$0")" && pwd)
K8S_SCRIPT=${K8S_SCRIPT:-$here/../kubernetes/compat-hook-k8s.sh}
DIST_PACKAGES=${DIST_PACKAGES:-/usr/lib/python3/dist-packages}
BUSYBOX=${BUSYBOX:-/bin/busybox}
NRI_PLUGIN=${NRI_PLUGIN:-}
APPLETS="sh ash cat chroot cp dirname env find grep ln ls md5sum mkdir mv nsenter rm rmdir sed sleep sort test [ touch true false echo printf readlink sha256sum"

[ -f "$deb" ] || { echo "$0: no such .deb: $deb" >&2; exit 1; }
[ -x "$BUSYBOX" ] || { echo "$0: $BUSYBOX missing (apt-get install busybox-static)" >&2; exit 1; }
[ -f "$K8S_SCRIPT" ] || { echo "$0: $K8S_SCRIPT missing" >&2; exit 1; }
[ -z "$NRI_PLUGIN" ] || [ -f "$NRI_PLUGIN" ] || { echo "$0: NRI_PLUGIN=$NRI_PLUGIN missing (make nri-plugin)" >&2; exit 1; }
for m in yaml elftools tomlkit; do
    [ -f "$DIST_PACKAGES/$m/__init__.py" ] || {
        echo "$0: $DIST_PACKAGES/$m missing (apt-get install python3-yaml python3-pyelftools python3-tomlkit)" >&2
        exit 1
    }
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp/deb"
version=$(dpkg-deb -f "$deb" Version)

p="$rootfs/opt/compat-hook"
mkdir -p "$p/lib" "$p/bin" "$p/share"
cp -a "$tmp/deb/usr/lib/python3/dist-packages/compat_hook" "$p/lib/"
for m in yaml elftools tomlkit; do
    cp -a "$DIST_PACKAGES/$m" "$p/lib/"
done
find "$p/lib" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$p/lib" -name '*.so' -type f -exec rm -f {} +
cp "$tmp/deb/etc/compat-hook/config.yaml" "$p/share/config.yaml"
if [ -n "$NRI_PLUGIN" ]; then
    mkdir -p "$p/libexec"
    cp "$NRI_PLUGIN" "$p/libexec/compat-hook-nri"
fi
cat > "$p/bin/compat-hook" <<'SH'
#!/bin/sh
# compat-hook from this copy, with the node's Python (>= 3.9).
d=$(cd "$(dirname "$0")/.." && pwd)
exec "${COMPAT_HOOK_PYTHON:-/usr/bin/python3}" -I -c \
    'import sys; sys.path.insert(0, sys.argv.pop(1)); from compat_hook.cli import entry; entry()' \
    "$d/lib" "$@"
SH
chmod 0755 "$p/bin/compat-hook"
find "$p" -type d -exec chmod 0755 {} +
find "$p" -type f ! -path "$p/bin/*" ! -path "$p/libexec/*" -exec chmod 0644 {} +
[ ! -d "$p/libexec" ] || chmod 0755 "$p/libexec/compat-hook-nri"
sum=$(cd "$p" && find lib bin share $( [ -d libexec ] && echo libexec ) -type f | LC_ALL=C sort | while read -r f; do sha256sum "$f"; done |
      sha256sum | cut -c1-12)
echo "$version-$sum" > "$p/STAMP"

mkdir -p "$rootfs/bin" "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/etc" "$rootfs/proc" "$rootfs/sys" \
    "$rootfs/dev" "$rootfs/host"
chmod 1777 "$rootfs/tmp"
cp "$BUSYBOX" "$rootfs/bin/busybox"
chmod 0755 "$rootfs/bin/busybox"
for a in $APPLETS; do
    ln -sf busybox "$rootfs/bin/$a"
done
cp "$K8S_SCRIPT" "$rootfs/usr/local/bin/compat-hook-k8s"
chmod 0755 "$rootfs/usr/local/bin/compat-hook-k8s"
printf 'root:x:0:0:root:/:/bin/sh\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\n' > "$rootfs/etc/group"
if [ -n "$NRI_PLUGIN" ]; then
    echo "staged compat-hook $version-$sum (with the NRI plugin) into $rootfs" >&2
else
    echo "staged compat-hook $version-$sum into $rootfs (no NRI plugin: registration.path auto takes the RuntimeClass path)" >&2
fi
