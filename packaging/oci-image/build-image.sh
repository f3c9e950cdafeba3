#!/bin/sh
# build-image.sh: the DaemonSet's OCI image, built locally with umoci (no registry, no daemon).
# `make image` runs it after building the NRI plugin and the package that carries it.
#
#   packaging/oci-image/build-image.sh [--deb DEB] [--layout DIR] [--tag TAG] [--tar FILE] [--nri-plugin BIN|none]
#
# DEB defaults to the newest dist/compat-hook_*.deb (make image), DIR to
# dist/oci/compat-hook, TAG to the package version, FILE to
# dist/compat-hook-image_<version>.tar (the layout as one tar). The root
# filesystem is stage-payload.sh's (busybox-static, the installer script and the
# payload copied to the node: the chart's `installer` container) plus stage-agent.sh's
# (Debian's python3 with python3-kubernetes, and ctr: the chart's `agent` container,
# `compat-hook cluster agent`) plus stage-probe.sh's compat-hook-probe (the validator's probe,
# compiled here). BIN (default: the plugin DEB carries, /usr/libexec/compat-hook/compat-hook-nri)
# is the NRI plugin the installer registers on containerd 2.x (registration.path). A DEB without
# it (plain `make deb`) is refused unless --nri-plugin names one, or none: an image without the
# plugin takes the RuntimeClass path on every node, so plain GPU pods never reach compat-hook.
# Then, on a node (or for kind, `kind load image-archive`):
#
#   ctr -n k8s.io images import --base-name localhost/compat-hook dist/compat-hook-image_<version>.tar
#   podman load -i dist/compat-hook-image_<version>.tar    # then: podman tag <id> localhost/compat-hook:<version>
#
# or push it: skopeo copy oci:dist/oci/compat-hook:<version> docker://REGISTRY/compat-hook:<version>
# Needs umoci, dpkg-deb, tar, busybox-static, gcc, libc6-dev, binutils, and installed: python3-yaml, python3-pyelftools,
# python3-tomlkit, python3-kubernetes, containerd (for ctr); Debian bookworm (see stage-agent.sh).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
deb= layout= tag= tar= nri=
while [ $# -gt 0 ]; do
    case $1 in
        --deb) deb=$2; shift 2 ;;
        --layout) layout=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --tar) tar=$2; shift 2 ;;
        --nri-plugin) nri=$2; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "$0: unknown argument $1" >&2; exit 2 ;;
    esac
done
if [ -z "$deb" ]; then
    deb=$(ls -t "$repo"/dist/compat-hook_*.deb 2>/dev/null | head -n1 || true)
    [ -n "$deb" ] || { echo "$0: no dist/compat-hook_*.deb: build the image with 'make image'" >&2; exit 1; }
fi
version=$(dpkg-deb -f "$deb" Version)
tag=${tag:-$version}
layout=${layout:-$repo/dist/oci/compat-hook}
tar=${tar:-$repo/dist/compat-hook-image_$version.tar}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$nri" ]; then
    # The plugin the package carries (make image builds it with it).
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" ./usr/libexec/compat-hook/compat-hook-nri 2>/dev/null || true
    [ -f "$work/usr/libexec/compat-hook/compat-hook-nri" ] || {
        echo "$0: $deb carries no NRI plugin (plain 'make deb'): build with 'make image' (needs Go >= 1.24), or pass --nri-plugin none for an image without it (RuntimeClass path only)" >&2
        exit 1
    }
    nri=$work/usr/libexec/compat-hook/compat-hook-nri
fi
[ "$nri" != none ] || nri=
rm -rf "$layout"
mkdir -p "$(dirname "$layout")"
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
NRI_PLUGIN=$nri "$here/stage-payload.sh" "$deb" "$work/bundle/rootfs"
"$here/stage-agent.sh" "$work/bundle/rootfs"
"$here/stage-probe.sh" "$work/bundle/rootfs"
umoci repack --image "$layout:$tag" "$work/bundle"
umoci config --image "$layout:$tag" \
    --config.cmd /usr/local/bin/compat-hook-k8s --config.cmd run \
    --config.env PATH=/usr/local/bin:/usr/bin:/bin --config.workingdir / \
    --config.label "org.opencontainers.image.title=compat-hook" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.description=installs compat-hook on GPU nodes and runs its cluster agent (packaging/helm/compat-hook)" \
    --history.created_by "packaging/oci-image/build-image.sh"
umoci gc --layout "$layout"
mkdir -p "$(dirname "$tar")"
tar -C "$layout" -cf "$tar" .
echo "$layout:$tag"
echo "$tar"
