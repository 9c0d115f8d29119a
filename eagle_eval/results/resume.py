"""Resuming an interrupted run: its finished rows, checked against the workload, and the workload's
fingerprints that an owned output folder records (results/run_folder.py)."""

from __future__ import annotations

import json

from eagle_eval.results.records import Prompt, SampleRecord, read_jsonl
from eagle_eval.results.run_folder import RunFolderError, fingerprint_value


def resumed_rows(folder, workload) -> list[SampleRecord]:
    """Finished rows of an interrupted run (a last line cut short is dropped); rows naming prompts the
    workload does not hold are refused."""
    file = folder.file("samples.jsonl")
    if not file.is_file():
        return []
    try:
        done = [SampleRecord.from_json(r) for r in read_jsonl(file)]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"--resume: {file}: not readable as sample rows ({exc}); pass --overwrite to "
                             "start afresh") from exc
    known = {f"{q.id}" for q in workload.questions} | {p.id for p in workload.first_prompts}
    stray = [s.id for s in done if s.id not in known and s.id.rsplit("/turn", 1)[0] not in known]
    if stray:
        raise RunFolderError(f"--resume: {file}: row id {stray[0]!r} is not a prompt of this workload")
    folder.write_text("samples.jsonl", "".join(json.dumps(s.to_json()) + "\n" for s in done))
    return done


def workload_digests(prompts: list[Prompt]) -> dict[str, str]:
    return {p.id: fingerprint_value(p.input_ids) for p in prompts}
