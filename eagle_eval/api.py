"""The Python API: what the CLI, diagnose, server-check and test suites call.

`load_oracle(config)` (a loaded target + head, eagle_eval/oracle.py), `evaluate(config)` (the
reference loop over a workload, here), `profile(pcfg)` (every num_steps from one teacher-forced pass,
eagle_eval/profiling.py) and `ablate(pcfg, variants)` (eagle_eval/ablate.py). Together they are the
only code that wires the stages: load (target, head, prompts) -> capture -> draft -> verify -> record
-> report. Every resolved setting is in `Oracle.resolved` and echoed in every report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from eagle_eval.ablate import ablate  # noqa: F401
from eagle_eval.config import RunConfig
from eagle_eval.oracle import (  # noqa: F401
    SGLANG_TOPK1_MESSAGE,
    Oracle,
    checked_workload,
    load_oracle,
    resolve_speculative,  # noqa: F401
)
from eagle_eval.parallel import group as parallel
from eagle_eval.parallel.settings import loaded_digests, settings_digests
from eagle_eval.parallel.turns import decode_questions
from eagle_eval.profiling import ProfileResult, profile  # noqa: F401
from eagle_eval.results.records import SampleRecord
from eagle_eval.results.report import build_report
from eagle_eval.results.resume import resumed_rows, workload_digests
from eagle_eval.results.run_folder import open_run_output
from eagle_eval.results.tables import write_csv
from eagle_eval.workload.conversations import in_workload_order


@dataclass
class RunResult:
    report: dict
    samples: list[SampleRecord]


def evaluate(config: RunConfig, progress: bool = True) -> RunResult:
    """Run the reference loop over the prompts; with output_dir, write samples.jsonl as it goes.
    In a launched run (torchrun / accelerate launch, `parallel.group.init`, which the CLI calls) the
    questions are shared between the processes and rank 0 alone writes the folder (eagle_eval/parallel);
    every rank returns the report, rank 0 the samples."""
    group = parallel.current()               # first: a replica's GPUs are chosen before CUDA starts
    torch.manual_seed(config.seed)
    group.check_same("settings", settings_digests("run", config.as_dict(), config.input_paths()))
    folder = group.on_main(lambda: open_run_output("run", config, config.as_dict(), config.input_paths(),
                                                   resume=config.resume))
    try:
        return _evaluate(config, folder, progress, group)
    finally:
        if folder is not None:
            folder.close()


def _evaluate(config: RunConfig, folder, progress: bool, group) -> RunResult:
    oracle = load_oracle(config)
    workload = checked_workload(config, oracle)
    group.check_same("loaded target, head and prompts", loaded_digests(
        oracle.resolved, workload_digests(workload.first_prompts), config.input_paths()))
    done = group.on_main(lambda: _resumed(config, folder, workload)) or []
    new = []

    def deliver(prompt, rec):
        new.append(rec)
        if folder is not None:
            folder.append_row("samples.jsonl", rec.to_json())

    stats = decode_questions(group, workload, oracle.decode, {s.id: s for s in done}, deliver,
                             config.max_new_tokens, progress)
    if not group.is_main:
        return RunResult(report=group.broadcast(None), samples=[])
    samples = in_workload_order(workload, done + new)       # as one uninterrupted process writes them
    report = build_report(config, {**oracle.resolved, **workload.resolved}, samples,
                          oracle.warnings + workload.warnings, sample_prompt=workload.sample_prompt)
    report["provenance"]["work"] = stats.as_dict()                 # questions and busy seconds per rank
    if folder is not None:
        if [s.id for s in samples] != [s.id for s in done + new]:
            folder.write_text("samples.jsonl", "".join(json.dumps(s.to_json()) + "\n" for s in samples))
        folder.write_json("report.json", report)
        folder.write_with("acceptance.csv", lambda path: write_csv(path, [(None, report)]))
        folder.finish()
    return RunResult(report=group.broadcast(report), samples=samples)


def _resumed(config: RunConfig, folder, workload) -> list[SampleRecord]:
    """Rank 0: the folder's workload fingerprints recorded, and a resumed run's finished rows."""
    if folder is None:
        return []
    folder.record_workload(workload_digests(workload.first_prompts), config.resume)
    return resumed_rows(folder, workload) if config.resume else []
