"""Driver and CUDA versions, and the driver-branch -> CUDA table.

NVIDIA versions have one to three numeric parts and keep leading zeros
(``575.57.08``); they compare as integer tuples, never as strings. Missing
parts count as zero, as in NVIDIA's toolkit (Masterminds/semver "coerce").
A parsed version remembers how it was spelled, so it is shown as the driver
shows it (``535.183.01``, never ``535.183.1``):

>>> format_version(parse_version("535.183.01"), 3)
'535.183.01'

>>> parse_version("575.57.08") == parse_version("575.57.8")
True
>>> parse_version("12.10") > parse_version("12.9")
True
>>> parse_version("515.76")
(515, 76, 0)
>>> parse_version("1.2.3.4")
Traceback (most recent call last):
    ...
compat_hook.core.errors.InvalidVersion: not a version of 1-3 numeric parts: '1.2.3.4'
>>> branch_max_cuda(535)
(12, 2, 0)
>>> format_version(decode_cuda_driver_version(12040))
'12.4'

No regular expressions here: ``re`` costs ~10 ms to import on the CI machine
kind (``python3 -X importtime``), more than the whole hook budget.
"""

from __future__ import annotations

from .errors import InvalidVersion

__all__ = [
    "InvalidVersion",
    "Version",
    "parse_version",
    "try_parse_version",
    "format_version",
    "decode_cuda_driver_version",
    "BRANCH_MAX_CUDA",
    "branch_max_cuda",
]

_DIGITS = frozenset("0123456789")


class Version(tuple):
    """``(X, Y, Z)`` ints, as a plain tuple compares and hashes, plus :attr:`spelled`.

    ``spelled`` holds the parts as written (``("535", "183", "01")``), which
    :func:`format_version` shows: leading zeros are part of a driver's name.

    >>> v = Version((535, 183, 1), ("535", "183", "01"))
    >>> v == (535, 183, 1), v, v.spelled
    (True, (535, 183, 1), ('535', '183', '01'))
    """

    def __new__(cls, nums: tuple, spelled: tuple = ()) -> "Version":
        self = super().__new__(cls, nums)
        self.spelled = tuple(spelled)
        return self

    def __getnewargs__(self) -> tuple:  # copy and pickle keep the spelling
        return tuple(self), self.spelled


def parse_version(text: str) -> tuple:
    """Parse ``X``, ``X.Y`` or ``X.Y.Z`` (ASCII digits, leading zeros allowed).

    Returns a 3-tuple of ints (a :class:`Version`, which remembers the spelling),
    missing parts as 0. Surrounding whitespace is ignored; anything else raises
    :class:`InvalidVersion`.
    """
    if not isinstance(text, str):
        raise InvalidVersion(f"not a version string: {text!r}")
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or any(
        not p or len(p) > 9 or not _DIGITS.issuperset(p) for p in parts
    ):
        raise InvalidVersion(f"not a version of 1-3 numeric parts: {text!r}")
    nums = [int(p) for p in parts]
    while len(nums) < 3:
        nums.append(0)
    return Version((nums[0], nums[1], nums[2]), parts)


def try_parse_version(text) -> tuple | None:
    """:func:`parse_version`, or ``None`` for anything unparseable ("unknown")."""
    try:
        return parse_version(text)
    except InvalidVersion:
        return None


def format_version(version: tuple | None, parts: int = 0) -> str | None:
    """Render a version tuple; ``parts=0`` drops trailing zero parts past two.

    Each part is shown as it was spelled when the tuple came from
    :func:`parse_version` (leading zeros kept), else as the number.

    >>> format_version((550, 54, 15))
    '550.54.15'
    >>> format_version((12, 4, 0))
    '12.4'
    >>> format_version((12, 4, 0), parts=3)
    '12.4.0'
    >>> format_version(parse_version("575.57.08")), format_version((575, 57, 8))
    ('575.57.08', '575.57.8')
    """
    if version is None:
        return None
    nums = list(version)
    spelled = getattr(version, "spelled", ())
    texts = [spelled[i] if i < len(spelled) else str(n) for i, n in enumerate(nums)]
    if parts:
        texts = texts[:parts]
    else:
        while len(texts) > 2 and nums[len(texts) - 1] == 0:
            texts.pop()
    return ".".join(texts)


def decode_cuda_driver_version(value: int) -> tuple:
    """Decode ``cuDriverGetVersion`` / NVML's ``1000*major + 10*minor``.

    >>> decode_cuda_driver_version(12020)
    (12, 2, 0)
    """
    value = int(value)
    if value <= 0:
        raise InvalidVersion(f"not a CUDA driver version: {value!r}")
    return (value // 1000, (value % 1000) // 10, 0)


#: Kernel driver branch (major) -> the highest CUDA it runs without forward
#: compatibility. A branch's value is the toolkit whose minimum driver falls in
#: it (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
BRANCH_MAX_CUDA = {
    418: (10, 1, 0),
    440: (10, 2, 0),
    450: (11, 0, 0),
    455: (11, 1, 0),
    460: (11, 2, 0),
    465: (11, 3, 0),
    470: (11, 4, 0),
    495: (11, 5, 0),
    510: (11, 6, 0),
    515: (11, 7, 0),
    520: (11, 8, 0),
    525: (12, 0, 0),
    530: (12, 1, 0),
    535: (12, 2, 0),
    545: (12, 3, 0),
    550: (12, 4, 0),
    555: (12, 5, 0),
    560: (12, 6, 0),
    565: (12, 7, 0),
    570: (12, 8, 0),
    575: (12, 9, 0),
    580: (13, 0, 0),
    590: (13, 1, 0),
    595: (13, 2, 0),
    610: (13, 3, 0),
    615: (13, 4, 0),
    616: (13, 4, 0),
}


def branch_max_cuda(major: int) -> tuple | None:
    """The CUDA version a driver branch supports natively, or ``None``.

    A branch not in the table (newer than it, or an odd one) is treated as
    the nearest lower known branch only when it is below the newest entry;
    newer than every entry is unknown.
    """
    if major in BRANCH_MAX_CUDA:
        return BRANCH_MAX_CUDA[major]
    lower = [b for b in BRANCH_MAX_CUDA if b < major]
    if not lower or major > max(BRANCH_MAX_CUDA):
        return None
    return BRANCH_MAX_CUDA[max(lower)]
