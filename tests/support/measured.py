"""NVIDIA's measured tables: what the NVIDIA Container Toolkit v1.20.0 does per host driver, per image.

Shared by tests/test_decision.py (the decision) and tests/test_explain.py (``explain``
prints the same rows).
"""

from __future__ import annotations

from tests.elfgen import NOTE_575
from tests.support.trees import Symlink, elf

__all__ = ["TESTDATA_575", "measured_rootfs", "ELF590", "ELF575", "NOELF590", "CUDA_ONLY"]

#: NVIDIA's e2e test data layout: a 575 compat library under /compat/575.57.08.
TESTDATA_575 = {"compat/575.57.08/libcuda.so.575.57.08": elf(NOTE_575, soname=None)}


# -- The measured table (docs/background.md "The NVIDIA toolkit"), v1.20.0 column ---------------
#
# W = enable, '-' = skip. The fixtures are x86-64 here (NVIDIA's elf590 is
# AArch64): our decision refuses a library the host loader cannot load.
# The rows with a host CUDA version and no driver version (NVIDIA: the CUDA
# versions compared, W when the note's is newer) are on a dGPU host here (no
# /dev/nvgpu): compat-hook takes that host-CUDA path on a Tegra host only, and a
# dGPU host whose driver version is unknown is host_driver_unknown (CUDA_ONLY).

#: What a dGPU host with a CUDA version but no driver version gets, whatever the note says.
CUDA_ONLY = ("skip", "host_driver_unknown")

def measured_rootfs(data) -> dict:
    """A rootfs (``build_tree`` entries) shaped like NVIDIA's measured image: ``data`` as its 590 compat library."""
    return {"usr/local/cuda-13.1/compat/libcuda.so.590.44.01": data,
            "usr/local/cuda-13.1/compat/libcuda.so.1": Symlink("libcuda.so.590.44.01"),
            "usr/local/cuda": Symlink("cuda-13.1")}


ELF590 = [
    ("535.183.01", None, "enable", "compat_newer_supported"),
    ("550.54.15", None, "enable", "compat_newer_supported"),
    ("570.133.20", None, "enable", "compat_newer_supported"),
    ("575.51.03", None, "enable", "compat_newer_supported"),
    ("575.57.08", None, "enable", "compat_newer_supported"),
    ("580.65.06", None, "enable", "compat_newer_supported"),
    ("560.35.03", None, "skip", "host_branch_unsupported"),
    ("590.30.01", None, "enable", "compat_newer_supported"),  # same major, older: W on v1.20.0
    ("590.44.01", None, "skip", "compat_not_newer"),
    ("590.48.01", None, "skip", "compat_not_newer"),
    ("600.10", None, "skip", "compat_not_newer"),
    ("abc", None, "skip", "host_driver_unknown"),
    (None, "12.8", *CUDA_ONLY),
    (None, "13.0", *CUDA_ONLY),
    (None, "13.1", *CUDA_ONLY),
    (None, "13.2", *CUDA_ONLY),
]


ELF575 = [
    ("535.183.01", None, "enable", "compat_newer_supported"),
    ("550.54.15", None, "enable", "compat_newer_supported"),
    ("560.35.03", None, "enable", "compat_newer_supported"),
    ("570.133.20", None, "enable", "compat_newer_supported"),
    ("575.51.03", None, "enable", "compat_newer_supported"),  # v1.20.0/HEAD only
    ("575.57.08", None, "skip", "compat_not_newer"),
    ("580.65.06", None, "skip", "compat_not_newer"),
    ("590.44.01", None, "skip", "compat_not_newer"),
    ("600.10", None, "skip", "compat_not_newer"),
    (None, "12.8", *CUDA_ONLY),
    (None, "13.0", *CUDA_ONLY),
    (None, "13.1", *CUDA_ONLY),
]


NOELF590 = [
    ("535.183.01", None, "enable", "compat_major_newer"),
    ("550.54.15", None, "enable", "compat_major_newer"),
    ("560.35.03", None, "enable", "compat_major_newer"),  # no note: no branch list to refuse it
    ("570.133.20", None, "enable", "compat_major_newer"),
    ("575.57.08", None, "enable", "compat_major_newer"),
    ("580.65.06", None, "enable", "compat_major_newer"),
    ("590.30.01", None, "skip", "compat_major_not_newer"),
    ("590.44.01", None, "skip", "compat_not_newer"),
    ("590.48.01", None, "skip", "compat_not_newer"),
    ("600.10", None, "skip", "compat_not_newer"),
    (None, "12.8", *CUDA_ONLY),
    (None, "13.0", *CUDA_ONLY),
    (None, "13.2", *CUDA_ONLY),
]
