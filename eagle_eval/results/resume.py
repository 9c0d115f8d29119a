"""Resuming an interrupted run: its finished rows, checked against the workload, and the workload's
fingerprints that an owned output folder records (results/run_folder.py).

Contract: `resumed_rows` returns each finished prompt once. A row is this run's only when it is well
formed (the counts of one decode: one accepted count and one emitted count per verify, the emitted
tokens adding up to the output), names a prompt of the workload with its category and turn (and, for a
first turn, its prompt length); anything else is a foreign row and refuses the resume, naming the row.
A prompt found twice with identical rows (a file concatenated by hand) is repaired: kept once, with a
warning; twice with different rows is refused: which one is right cannot be told. Never double-counted.
"""

from __future__ import annotations

import json
import warnings

from eagle_eval.results.records import Prompt, SampleRecord, read_jsonl
from eagle_eval.results.run_folder import RunFolderError, fingerprint_value

_RESTART = "pass --overwrite to start afresh"


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def row_problem(rec: SampleRecord, num_steps: int | None = None) -> str | None:
    """Why a row cannot be one decode's record (None when it can).

    >>> ok = SampleRecord("a", "c", 3, [5, 6, 7, 8], [1, 0], [2, 1], 2)   # the prefill token + 2 + 1 emitted
    >>> row_problem(ok, 5) is None, row_problem(SampleRecord("a", "c", 3, [5], [1], [2], 1), 5)
    (True, "key 'output_ids' holds 1 tokens, the prefill token and 'emitted_per_cycle' add up to 3")
    """
    for key in ("output_ids", "accepted_per_cycle", "emitted_per_cycle"):
        if not _ints(getattr(rec, key)):
            return f"key {key!r} is not a list of integers"
    if not isinstance(rec.id, str) or not isinstance(rec.category, str):
        return "keys 'id' and 'category' must be strings"
    for key in ("verify_count", "turn", "prompt_len"):
        value = getattr(rec, key)
        if isinstance(value, bool) or not isinstance(value, int):
            return f"key {key!r} is not an integer"
    acc, emitted = rec.accepted_per_cycle, rec.emitted_per_cycle
    if not len(acc) == len(emitted) == rec.verify_count:
        return (f"'verify_count' {rec.verify_count}, {len(acc)} accepted counts and {len(emitted)} emitted counts "
                "differ")
    if any(n < 0 or (num_steps is not None and n > num_steps) for n in acc):
        return f"key 'accepted_per_cycle' holds a count outside 0..{num_steps if num_steps is not None else 'S'}"
    if any(not 1 <= e <= n + 1 for n, e in zip(acc, emitted)):
        return "key 'emitted_per_cycle' holds a count outside 1..accepted + 1"
    want = sum(emitted) + (1 if rec.output_ids else 0)
    if len(rec.output_ids) != want:
        return (f"key 'output_ids' holds {len(rec.output_ids)} tokens, the prefill token and 'emitted_per_cycle' "
                f"add up to {want}")
    return None


def _foreign(rec: SampleRecord, expected: dict) -> str | None:
    """Why a well-formed row is not one of this workload's prompts (None when it is)."""
    want = expected.get(rec.id)
    if want is None:
        return "is not a prompt of this workload"
    if rec.category != want["category"] or rec.turn != want["turn"]:
        return (f"has category {rec.category!r} turn {rec.turn}, the workload's prompt has category "
                f"{want['category']!r} turn {want['turn']}")
    if want["prompt_len"] is not None and rec.prompt_len != want["prompt_len"]:
        return f"has prompt_len {rec.prompt_len}, the workload's prompt has {want['prompt_len']} tokens"
    return None


def resumed_rows(folder, workload, num_steps: int | None = None) -> list[SampleRecord]:
    """Finished rows of an interrupted run, each prompt once (a last line cut short is dropped); the
    file is rewritten with exactly those rows. Foreign or malformed rows refuse the resume; identical
    duplicates are kept once with a warning, differing ones refuse (module docstring)."""
    file = folder.file("samples.jsonl")
    if not file.is_file():
        return []
    try:
        rows = read_jsonl(file)
        done = [SampleRecord.from_json(r) for r in rows]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"--resume: {file}: not readable as sample rows ({exc}); {_RESTART}") from exc
    expected = workload.expected_rows()
    kept: dict[str, tuple[int, dict]] = {}
    repeated: dict[str, int] = {}
    for n, (row, rec) in enumerate(zip(rows, done), 1):
        why = row_problem(rec, num_steps) or _foreign(rec, expected)
        if why:
            raise RunFolderError(f"--resume: {file}: row {n} (id {rec.id!r}) {why}: not a row of this run; {_RESTART}")
        if rec.id in kept:
            first, before = kept[rec.id]
            if before != row:
                raise RunFolderError(f"--resume: {file}: prompt {rec.id!r} has two different rows ({first} and {n}): "
                                     f"which one this run wrote cannot be told; {_RESTART}")
            repeated[rec.id] = repeated.get(rec.id, 1) + 1
            continue
        kept[rec.id] = (n, row)
    if repeated:
        warnings.warn(f"--resume: {file}: {len(repeated)} prompt(s) had identical duplicate rows (first "
                      f"{next(iter(repeated))!r}, {next(iter(repeated.values()))} times): kept once, never counted "
                      "twice", stacklevel=2)
    unique = [SampleRecord.from_json(row) for _, row in kept.values()]
    folder.write_text("samples.jsonl", "".join(json.dumps(s.to_json()) + "\n" for s in unique))
    return unique


def workload_digests(prompts: list[Prompt]) -> dict[str, str]:
    return {p.id: fingerprint_value(p.input_ids) for p in prompts}
