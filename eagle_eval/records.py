"""Records passed between stages and their JSONL form (no torch).

A `SampleRecord` is one prompt's outcome: the new tokens and, for every verify forward in order, the
drafts it accepted and the tokens it emitted. Everything in a report is derived from these counts.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle_eval.errors import UserError


class JsonlError(UserError, ValueError):
    """A JSONL file that cannot be read as rows; the message names the file and line."""


@dataclass
class Prompt:
    id: str
    category: str
    input_ids: list[int]
    text: str | None = None            # the rendered prompt, when it came from text


@dataclass
class SampleRecord:
    id: str
    category: str
    prompt_len: int
    output_ids: list[int]              # new tokens only, cut at max_new_tokens or after EOS
    accepted_per_cycle: list[int]      # accepted drafts of each verify forward, in order
    emitted_per_cycle: list[int]       # tokens each cycle added to output_ids (accepted + 1 unless cut)
    verify_count: int
    turn: int = 1                      # conversation turn (MT-Bench style: turn 2 follows the turn-1 answer)
    lossless: bool | None = None       # None: not checked
    divergence: dict | None = None     # first mismatch with plain greedy decoding
    extra: dict = field(default_factory=dict)

    @property
    def spec_accept_length(self) -> float | None:
        """SGLang's meta_info.spec_accept_length: completion_tokens / spec_verify_ct."""
        return len(self.output_ids) / self.verify_count if self.verify_count else None

    def to_json(self) -> dict:
        row = asdict(self)
        row.update(row.pop("extra"))
        row["spec_accept_length"] = self.spec_accept_length
        return row

    @classmethod
    def from_json(cls, row: dict) -> "SampleRecord":
        known = {f for f in cls.__dataclass_fields__ if f != "extra"}
        extra = {k: v for k, v in row.items() if k not in known and k != "spec_accept_length"}
        return cls(**{k: row[k] for k in known if k in row}, extra=extra)


def append_jsonl(path: Path, row: dict) -> None:
    """Append one row and flush it to disk, so an interrupted run keeps every finished prompt."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file; a last line cut short by an interrupted write is dropped."""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except UnicodeDecodeError as exc:
        raise JsonlError(f"{path}: not a text (UTF-8 JSONL) file ({exc.reason} at byte {exc.start})") from exc
    except IsADirectoryError as exc:
        raise JsonlError(f"{path}: is a folder, a JSONL file was expected") from exc
    rows = []
    for lineno, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if lineno == len(lines):
                break
            raise JsonlError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise JsonlError(f"{path}:{lineno}: a JSON object per line was expected, got {type(row).__name__}")
        rows.append(row)
    return rows
