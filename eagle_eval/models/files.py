"""Opening model files with our own words for what is wrong with them (no torch at import).

Contract: `read_json_file` and `check_safetensors` say, in one line naming the file (and the key or
byte position), why a config or weights file cannot be used: missing, truncated, not what its name says.
`said_by(file, exc)` re-says a loader's exception (torch, safetensors, tokenizers, transformers): our
sentence first, the loader's first line after it; the whole chain stays on the exception (`--debug`).
Every error is the caller's `UserError` subclass, so each wing keeps its own error type.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from eagle_eval.errors import UserError


def first_line(exc: BaseException, width: int = 200) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def said_by(what: str, exc: BaseException, error_cls: type[UserError] = UserError) -> UserError:
    """`what` (our sentence, naming the file) + the loader's own first line, as error_cls."""
    err = error_cls(f"{what} ({type(exc).__name__}: {first_line(exc)})")
    err.__cause__ = exc
    return err


def read_json_file(file: Path, error_cls: type[UserError] = UserError, what: str = "a JSON object") -> dict:
    """A JSON object from `file`, or error_cls naming the file and the line/column."""
    try:
        text = Path(file).read_text()
    except UnicodeDecodeError as exc:
        raise error_cls(f"{file}: not a text file ({exc.reason} at byte {exc.start}); {what} was expected") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error_cls(f"{file}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg}); "
                        f"{what} was expected") from exc
    if not isinstance(value, dict):
        raise error_cls(f"{file}: {what} was expected, got a JSON {type(value).__name__}")
    return value


def check_safetensors(file: Path, error_cls: type[UserError] = UserError) -> None:
    """The safetensors header parses and every tensor's bytes lie inside the file (truncation, a file
    that is something else under a .safetensors name)."""
    safetensors_header(file, error_cls)


def safetensors_header(file: Path, error_cls: type[UserError] = UserError) -> dict:
    """check_safetensors, and the header it read: tensor name -> {"dtype", "shape", "data_offsets"}
    (no `__metadata__`); no tensor data is read."""
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise error_cls(f"{file}: {size} bytes, too short for a safetensors file (truncated or empty?)")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8 or n > 100 << 20:
            raise error_cls(f"{file}: not a safetensors file (header length {n} at byte 0 does not fit its "
                            f"{size} bytes; truncated, or another format under this name?)")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise error_cls(f"{file}: not a safetensors file (its header is not JSON)") from exc
    end = 0
    header.pop("__metadata__", None)
    for key, info in header.items():
        try:
            start, stop = info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise error_cls(f"{file}: tensor {key!r}: header entry has no 'data_offsets'") from exc
        end = max(end, stop)
    if 8 + n + end > size:
        raise error_cls(f"{file}: truncated: its header needs {8 + n + end} bytes, the file has {size}")
    return header
