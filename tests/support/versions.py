"""The versions the tests pin, in one place.

The three Debian ``libcuda1`` builds the container tests load (tests/support/debs.py
fetches them) play three parts: an older host driver, the compat driver an image
carries, and a newer host driver. ``cuDriverGetVersion`` gives 12020, 12040 and
12050 for them (``debs.EXPECTED_CUDA``).

>>> HOST_535 < COMPAT_550 < HOST_555
True
"""

from __future__ import annotations

__all__ = ["HOST_535", "COMPAT_550", "HOST_555", "HOST_470", "OLD_GLIBC", "CONTAINERD2_VERSION", "CRICTL_VERSION"]

#: The older host driver (Debian 12 bookworm's libcuda1, CUDA 12.2).
HOST_535 = "535.261.03"
#: The compat driver in the images (trixie's libcuda1, CUDA 12.4).
COMPAT_550 = "550.163.01"
#: The newer host driver (experimental's libcuda1, CUDA 12.5).
HOST_555 = "555.58.02"

#: An R470 host (CUDA 11.4), the branch a fleet may roll back to: bookworm's libnvidia-tesla-470-cuda1.
HOST_470 = "470.256.02"
#: An older glibc than the build machine's (before dlopen moved into libc.so.6): bullseye's libc6.
OLD_GLIBC = "2.31"

#: containerd 2.x from Debian sid (docs/background.md "Test machines"); any 2.x there is taken when
#: this one is gone (tests/support/engines.py containerd2()).
CONTAINERD2_VERSION = "2.1.9+ds1-5"
#: cri-tools' crictl, built from the Go module proxy (tests/support/engines.py crictl()).
CRICTL_VERSION = "v1.37.0"
