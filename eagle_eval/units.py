"""Sizes of memory, read and written in one place. The ground floor beside errors: imports nothing else.

Contract: `parse_size(text, option)` -> bytes is the one reading of every size eagle-eval takes
(`plan --gpu-memory` and `--reserve`, each device of `--max-memory`); `spell_size(n)` writes bytes so that
`parse_size` reads them back (the plan's advice). What is read, and what is refused with the forms listed:

| written | read as |
|---|---|
| `141GB`, `141 GB`, `1.5GB`, `500kB`, `2TB` | decimal: KB (kB) 10^3, MB 10^6, GB 10^9, TB 10^12 bytes |
| `80GiB`, `80 GiB`, `512MiB`, `80GIB` | binary: KiB 2^10, MiB 2^20, GiB 2^30, TiB 2^40 bytes |
| `20000B` | bytes |
| `0` | zero, where zero is allowed (`--reserve 0`) |
| `80gb`, `80Gb`, `80gib` | refused: a lower-case b means bits, not bytes (accelerate reads `80Gb` as 10 GB) |
| `80`, `1.5` | refused: a bare number has no unit (bytes? GB?) |
| `-1GB`, `1e3GB`, `lots`, more than 2^60 bytes | refused: not a size |

A fraction of a byte is dropped (`0.3KiB` is 307 bytes).
"""

from __future__ import annotations

import re
from decimal import Decimal

from eagle_eval.errors import UserError

UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
         "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
LARGEST = 2**60                           # bytes: no memory a plan or a placement is given comes near
FORMS = "a number and a unit: 141GB (GB = 10^9 bytes), 80GiB (GiB = 2^30 bytes); KB MB GB TB, KiB MiB GiB TiB, B"
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kKmMgGtT])([iI]?))?([Bb])")


class SizeError(UserError, ValueError):
    """A size eagle-eval cannot read; the message names the option and the accepted forms."""


def parse_size(text, option: str, error: type[Exception] = SizeError, allow_zero: bool = False,
               said: str | None = None) -> int:
    """Bytes of `text` (module contract); `error(message)` naming `option` when it is not a size (`said`: how
    the message quotes the input, default `--option 'text'`).

    >>> parse_size("141GB", "--gpu-memory"), parse_size("80 GiB", "--gpu-memory"), parse_size("500kB", "x")
    (141000000000, 85899345920, 500000)
    """
    def refuse(why: str):
        return error(f"{said or f'{option} {text!r}'}: {why}; write {FORMS}")

    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise refuse(f"expected a size, got {type(text).__name__}")
    s = str(text).strip()
    if s in ("0", "0B"):
        if allow_zero:
            return 0
        raise refuse("not a positive size")
    if re.fullmatch(r"\d+(\.\d+)?", s):
        raise refuse("not a size: a bare number has no unit (bytes? GB?)")
    m = _SIZE.fullmatch(s)
    if m is None:
        raise refuse("not a size")
    number, prefix, binary, byte = m.groups()
    if byte == "b":
        unit = f"{(prefix or '').upper()}{'i' if binary else ''}"
        raise refuse(f"a lower-case 'b' means bits, not bytes (accelerate reads 80Gb as 10 GB); for bytes write "
                     f"{number}{unit}B")
    if prefix is None and "." in number:
        raise refuse("not a whole number of bytes")
    n = int(Decimal(number) * UNITS[(prefix or "").upper() + ("i" if binary else "")])
    if n == 0 and not allow_zero:
        raise refuse("not a positive size")
    if n > LARGEST:
        raise refuse(f"more than {LARGEST // 2**60} EiB, not the memory of a machine")
    return n


def spell_size(n: int, up: bool = False) -> str:
    """`n` bytes (> 0) in the largest of GiB, MiB, KiB that holds at least one, rounded down (`up`: up), as
    `parse_size` reads it: never zero, never negative, and off by less than one unit (so never TiB).

    >>> spell_size(141 * 10**9), spell_size(141 * 10**9, up=True), spell_size(1000), spell_size(5 * 2**20)
    ('131GiB', '132GiB', '1000B', '5MiB')
    """
    if n <= 0:
        raise ValueError(f"spell_size: {n} is not a positive number of bytes")
    for unit in ("Gi", "Mi", "Ki"):
        size = UNITS[unit]
        if n >= size:
            return f"{-(-n // size) if up else n // size}{unit}B"
    return f"{n}B"
