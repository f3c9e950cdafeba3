#!/bin/sh
# stage-probe.sh ROOTFS: build the validator's probe into ROOTFS/usr/local/libexec/compat-hook-probe.
#
# compat-hook-probe.c is the program `compat-hook cluster validate` runs inside each workload's
# image (docs/validation.md): a probe pod's init container copies it from this image into an
# emptyDir the workload image's container runs it from. It must start on the image's own glibc,
# however old, so it is linked against the oldest symbol versions; after the build this script
# checks the ELF asks for nothing newer than GLIBC_2.3 (x86_64) and fails otherwise.
# Needs gcc, libc6-dev and binutils (objdump).
set -eu

[ $# -eq 1 ] || { echo "usage: $0 ROOTFS" >&2; exit 2; }
rootfs=$1
here=$(cd "$(dirname "$0")" && pwd)
CC=${CC:-gcc}
src=$here/compat-hook-probe.c
dest=$rootfs/usr/local/libexec/compat-hook-probe

command -v "$CC" >/dev/null || { echo "$0: no $CC (apt-get install gcc libc6-dev)" >&2; exit 1; }
command -v objdump >/dev/null || { echo "$0: no objdump (apt-get install binutils)" >&2; exit 1; }
mkdir -p "$(dirname "$dest")"
flags="-O2 -Wall -Werror -fno-stack-protector -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -fno-pie -no-pie"
case $(uname -m) in
    x86_64)
        # its own _start (the old __libc_start_main), and libdl.so.2, where dlopen was before glibc 2.34
        libdl=$("$CC" -print-file-name=libdl.so.2)
        [ -f "$libdl" ] || { echo "$0: no libdl.so.2 for $CC" >&2; exit 1; }
        # shellcheck disable=SC2086 # flags is a list of words on purpose
        "$CC" $flags -nostartfiles -Wl,--hash-style=both -o "$dest" "$src" -Wl,--no-as-needed "$libdl"
        allowed="GLIBC_2.2.5 GLIBC_2.3" ;;
    *)
        # shellcheck disable=SC2086
        "$CC" $flags -o "$dest" "$src" -ldl
        allowed= ;;
esac
strip "$dest" 2>/dev/null || true
chmod 0755 "$dest"
if [ -n "$allowed" ]; then
    for v in $(objdump -T "$dest" | grep -o 'GLIBC_[0-9.]*' | sort -u); do
        case " $allowed " in
            *" $v "*) ;;
            *) echo "$0: $dest needs $v (newer than the images it must run in allow)" >&2; exit 1 ;;
        esac
    done
fi
echo "built $dest" >&2
