"""Resuming an interrupted run: its finished rows, checked against the workload, and the workload's
fingerprints that an owned output folder records (results/run_folder.py).

Contract: `resumed_rows` returns each finished prompt once. A row is this run's only when it is well
formed (the counts of one decode, checked against its tokens by `row_problem`: one accepted count and one
emitted count per verify, the emitted tokens adding up to the output, every cycle but the last emitting
accepted + 1, the output within max_new_tokens with an EOS only at its end and, when shorter, ending in one)
and names a prompt of the workload with its category and turn (and, for a first turn, its prompt length);
anything else is a foreign row and refuses the resume, naming the row. A prompt found twice with identical
rows (a file concatenated by hand) is repaired: kept once, with a warning; twice with different rows is
refused: which one is right cannot be told. Never double-counted. A well-formed row of a prompt the run
recorded (the owner file's workload) that a lower --limit leaves out is kept aside in BEYOND_LIMIT, not
counted and never deleted; a later resume with a larger --limit takes it back.
"""

from __future__ import annotations

import json
import warnings

from eagle_eval.records import Prompt, SampleRecord, read_jsonl
from eagle_eval.results.run_folder import RunFolderError, fingerprint_value

_RESTART = "pass --overwrite to start afresh"
BEYOND_LIMIT = "samples_beyond_limit.jsonl"    # finished rows a lower --limit does not cover (kept, not counted)


def _ints(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def row_problem(rec: SampleRecord, num_steps: int | None = None, max_new_tokens: int | None = None,
                eos_ids=None) -> str | None:
    """Why a row cannot be one decode's record (None when it can): its tokens against its counts. A decode
    emits the prefill token, then accepted + 1 tokens per cycle; only its last cycle may be cut, at
    max_new_tokens or after an EOS, and it stops there (so an output shorter than max_new_tokens ends in EOS).

    >>> ok = SampleRecord("a", "c", 3, [5, 6, 7, 8], [1, 0], [2, 1], 2)   # the prefill token + 2 + 1 emitted
    >>> row_problem(ok, 5, 4, {2}) is None, row_problem(SampleRecord("a", "c", 3, [5], [1], [2], 1), 5)
    (True, "key 'output_ids' holds 1 tokens, the prefill token and 'emitted_per_cycle' add up to 3")
    >>> print(row_problem(SampleRecord("a", "c", 3, [5, 6, 7, 8], [2, 0], [2, 1], 2), 5))
    cycle 1 of 2 accepted 2 drafts but emitted 2 tokens: only the last cycle may be cut, every other emits accepted + 1
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
    cut = next((i for i, (n, e) in enumerate(zip(acc[:-1], emitted[:-1])) if e != n + 1), None)
    if cut is not None:
        return (f"cycle {cut + 1} of {len(acc)} accepted {acc[cut]} drafts but emitted {emitted[cut]} tokens: only "
                "the last cycle may be cut, every other emits accepted + 1")
    for key in ("off_top1_per_cycle", "tree_shape_per_cycle"):
        if key in rec.extra and (not isinstance(rec.extra[key], list) or len(rec.extra[key]) != rec.verify_count):
            return f"key {key!r} does not hold one entry per verify cycle ({rec.verify_count})"
    if rec.lossless is not None and rec.lossless != (rec.divergence is None):
        return f"key 'lossless' is {rec.lossless} but 'divergence' is {'null' if rec.divergence is None else 'set'}"
    out = rec.output_ids
    if max_new_tokens is not None and len(out) > max_new_tokens:
        return f"key 'output_ids' holds {len(out)} tokens, more than max_new_tokens {max_new_tokens}"
    if eos_ids is not None:
        early = next((i for i, t in enumerate(out[:-1]) if t in eos_ids), None)
        if early is not None:
            return (f"key 'output_ids' holds EOS {out[early]} at token {early + 1} and {len(out) - early - 1} more "
                    "after it: a decode stops at EOS")
        if max_new_tokens is not None and len(out) < max_new_tokens and (not out or out[-1] not in eos_ids):
            return (f"key 'output_ids' holds {len(out)} tokens, fewer than max_new_tokens {max_new_tokens}, and does "
                    "not end in EOS: a decode stops only at one of them")
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


def _rows(file) -> list[tuple[dict, SampleRecord]]:
    if not file.is_file():
        return []
    try:
        rows = read_jsonl(file)
        return [(r, SampleRecord.from_json(r)) for r in rows]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"--resume: {file}: not readable as sample rows ({exc}); {_RESTART}") from exc


def _recorded(rec_id: str, recorded: dict) -> bool:
    """The run recorded this row's prompt when it started (its first turn's id: `sample_id`)."""
    question = rec_id.rsplit("/turn", 1)[0] if "/turn" in rec_id else None
    return rec_id in recorded or (question is not None and f"{question}/turn1" in recorded)


def resumed_rows(folder, workload, num_steps: int | None = None, max_new_tokens: int | None = None,
                 eos_ids=None) -> list[SampleRecord]:
    """Finished rows of an interrupted run that this workload covers, each prompt once (a last line cut short
    is dropped); samples.jsonl is rewritten with exactly those rows. Rows of prompts the run recorded that a
    lower --limit leaves out are moved to BEYOND_LIMIT (a later resume with a larger --limit takes them back),
    never deleted. Foreign or malformed rows refuse the resume; identical duplicates are kept once with a
    warning, differing ones refuse (module docstring)."""
    file, aside = folder.file("samples.jsonl"), folder.file(BEYOND_LIMIT)
    found = [(file, n, row, rec) for n, (row, rec) in enumerate(_rows(file), 1)]
    found += [(aside, n, row, rec) for n, (row, rec) in enumerate(_rows(aside), 1)]
    if not found:
        return []
    expected, recorded = workload.expected_rows(), folder.owner.get("workload") or {}
    kept: dict[str, tuple[int, dict]] = {}
    beyond: dict[str, dict] = {}
    repeated: dict[str, int] = {}
    for where, n, row, rec in found:
        said = row.get("spec_accept_length", rec.spec_accept_length)
        why = row_problem(rec, num_steps, max_new_tokens, eos_ids) or (
            f"key 'spec_accept_length' is {said}, its tokens per verify cycle are {rec.spec_accept_length}"
            if said != rec.spec_accept_length else None)
        if not why and rec.id not in expected:
            if _recorded(rec.id, recorded):           # a prompt of this run past a lower --limit: kept aside
                if beyond.setdefault(rec.id, row) != row:
                    why = "has another row for the same prompt"
                continue
        why = why or _foreign(rec, expected)
        if why:
            raise RunFolderError(f"--resume: {where}: row {n} (id {rec.id!r}) {why}: not a row of this run; "
                                 f"{_RESTART}")
        if rec.id in kept:
            first, before = kept[rec.id]
            if before != row:
                raise RunFolderError(f"--resume: {where}: prompt {rec.id!r} has two different rows ({first} and {n}): "
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
    if beyond:
        folder.write_text(BEYOND_LIMIT, "".join(json.dumps(SampleRecord.from_json(r).to_json()) + "\n"
                                                for r in beyond.values()))
        warnings.warn(f"--resume: {len(beyond)} finished row(s) of prompts past this --limit kept in "
                      f"{aside} (not in this report; a resume with a larger --limit takes them back)", stacklevel=2)
    elif aside.is_file():
        folder.remove(BEYOND_LIMIT)
    return unique


def workload_digests(prompts: list[Prompt]) -> dict[str, str]:
    return {p.id: fingerprint_value(p.input_ids) for p in prompts}
