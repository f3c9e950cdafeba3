#!/bin/sh
# stage-agent.sh ROOTFS: add what the cluster agent runs with to a rootfs staged by stage-payload.sh.
#
#   ROOTFS/usr/bin/python3 (+ its stdlib and libraries)   Debian's python3 and, from Debian too,
#   ROOTFS/usr/lib/python3/dist-packages/...                python3-kubernetes, python3-yaml,
#                                                           python3-pyelftools, python3-tomlkit and
#                                                           what they depend on
#   ROOTFS/usr/bin/ctr                                      containerd's client, from Debian's
#                                                           containerd (only that binary)
#   ROOTFS/usr/local/bin/compat-hook                        runs /opt/compat-hook (the payload) with
#                                                           that python3
#   ROOTFS/etc/ssl/certs/ca-certificates.crt               this machine's CA bundle
#
# The agent (`compat-hook cluster agent`, the chart's `agent` container) reads the node through
# the host root mounted at /host: containerd's socket (ctr) and the snapshot dirs it names. The
# installer container of the same image does not use any of this; compat-hook on the node still
# runs with the node's python3.
#
# The files are the installed packages' own (`dpkg -L`), taken from this machine, which must be
# Debian bookworm with those packages installed (make deps-test; the Containerfile installs them
# in its build stage): nothing is fetched. Dependencies are followed through dpkg's Depends and
# Pre-Depends, except SKIP, packages the agent never loads (package tools, interactive
# terminals, databases, build tools); docs, man pages, locales and glibc's iconv modules are left out.
set -eu

[ $# -eq 1 ] || { echo "usage: $0 ROOTFS" >&2; exit 2; }
rootfs=$1
PACKAGES=${PACKAGES:-"python3 python3-kubernetes python3-yaml python3-pyelftools python3-tomlkit"}
SKIP=" dpkg tar tzdata debconf openssl perl-base python3-setuptools python3-pkg-resources python3-lib2to3
python3-distutils libdb5.3 libsqlite3-0 readline-common libreadline8 libncursesw6 libtinfo6 media-types
ca-certificates gcc-12-base libselinux1 libpcre2-8-0 libacl1 libmd0 init-system-helpers debianutils "
CTR=${CTR:-/usr/bin/ctr}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

[ -d "$rootfs/opt/compat-hook/lib/compat_hook" ] || { echo "$0: $rootfs: run stage-payload.sh first" >&2; exit 1; }
[ -x "$CTR" ] || { echo "$0: $CTR missing (apt-get install containerd)" >&2; exit 1; }
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q ' installed$' ||
        { echo "$0: Debian package $p is not installed (apt-get install $p)" >&2; exit 1; }
done

installed() { dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q ' installed$'; }

# The closure: each Depends/Pre-Depends alternative group gives its first installed member.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/seen"
todo=$PACKAGES
while [ -n "$todo" ]; do
    set -- $todo
    p=$1; shift; todo=$*
    grep -qx "$p" "$tmp/seen" && continue
    echo "$p" >> "$tmp/seen"
    deps=$(dpkg-query -W -f='${Depends}, ${Pre-Depends}' "$p" | tr ',' '\n')
    echo "$deps" | while IFS= read -r group; do
        for alt in $(echo "$group" | sed 's/([^)]*)//g; s/|/ /g'); do
            alt=${alt%%:*}
            installed "$alt" && { echo "$alt"; break; }
        done
    done > "$tmp/deps"
    for d in $(cat "$tmp/deps"); do
        case "$SKIP" in *" $d "*) continue ;; esac
        grep -qx "$d" "$tmp/seen" || todo="$todo $d"
    done
done

# Each package's files (not its dirs): regular files and links, at the paths the package gives.
# This machine may be usr-merged (/lib -> usr/lib): paths are kept as listed, and the rootfs gets
# the links a usr-merged system has, so both spellings resolve.
mkdir -p "$rootfs/usr/lib" "$rootfs/usr/lib64" "$rootfs/usr/sbin"
for l in lib lib64 sbin; do
    [ -e "$rootfs/$l" ] || ln -s "usr/$l" "$rootfs/$l"
done
sort -u "$tmp/seen" | while read -r p; do
    dpkg-query -L "$p"
done | grep -v -e '^/usr/share/doc' -e '^/usr/share/man' -e '^/usr/share/locale' -e '^/usr/share/lintian' \
    -e '^/usr/share/info' -e '^/usr/share/bug' -e '/gconv/' -e '^/etc/' -e '^/usr/share/python3/debian_defaults$' -e '^diverted' \
  | sort -u > "$tmp/files"
while read -r f; do
    [ -L "$f" ] || [ -f "$f" ] || continue
    case $f in /lib/*|/lib64/*|/sbin/*) dst=/usr$f ;; *) dst=$f ;; esac
    mkdir -p "$rootfs$(dirname "$dst")"
    cp -P --preserve=mode,links "$f" "$rootfs$dst"
done < "$tmp/files"
[ -e "$rootfs/usr/bin/python3" ] || { echo "$0: python3 did not land in $rootfs" >&2; exit 1; }

cp "$CTR" "$rootfs/usr/bin/ctr"
chmod 0755 "$rootfs/usr/bin/ctr"
mkdir -p "$rootfs/etc/ssl/certs"
[ -f "$CA_BUNDLE" ] && cp "$CA_BUNDLE" "$rootfs/etc/ssl/certs/ca-certificates.crt"
# The loader's search path, as libc6 sets it on Debian (no ld.so.cache is needed with it).
mkdir -p "$rootfs/etc/ld.so.conf.d"
printf '/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' \
    > "$rootfs/etc/ld.so.conf.d/x86_64-linux-gnu.conf"
printf 'include /etc/ld.so.conf.d/*.conf\n' > "$rootfs/etc/ld.so.conf"
ldconfig -r "$rootfs" 2>/dev/null || true

cat > "$rootfs/usr/local/bin/compat-hook" <<'SH'
#!/bin/sh
# compat-hook in the image (the cluster agent): the payload's copy, with the image's python3.
COMPAT_HOOK_PYTHON=/usr/bin/python3 exec /opt/compat-hook/bin/compat-hook "$@"
SH
chmod 0755 "$rootfs/usr/local/bin/compat-hook"
echo "staged the agent ($(wc -l < "$tmp/seen") Debian packages, ctr) into $rootfs" >&2
