"""The Python API: what the CLI, diagnose, server-check and test suites call.

`load_oracle(config)` (a loaded target + head, eagle_eval/oracle.py), `evaluate(config)` (the
reference loop over a workload, here), `profile(pcfg)` (every num_steps from one teacher-forced pass,
eagle_eval/profiling.py) and `ablate(pcfg, variants)` (eagle_eval/ablate.py). Together they are the
only code that wires the stages: load (target, head, prompts) -> capture -> draft -> verify -> record
-> report. Every resolved setting is in `Oracle.resolved` and echoed in every report.
"""

from __future__ import annotations

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
from eagle_eval.profiling import ProfileResult, profile  # noqa: F401
from eagle_eval.results.records import SampleRecord
from eagle_eval.results.report import build_report
from eagle_eval.results.resume import resumed_rows, workload_digests
from eagle_eval.results.run_folder import open_run_output
from eagle_eval.results.tables import write_csv
from eagle_eval.workload.conversations import run_turns


@dataclass
class RunResult:
    report: dict
    samples: list[SampleRecord]


def evaluate(config: RunConfig, progress: bool = True) -> RunResult:
    """Run the reference loop over the prompts; with output_dir, write samples.jsonl as it goes."""
    torch.manual_seed(config.seed)
    folder = open_run_output("run", config, config.as_dict(), config.input_paths(), resume=config.resume)
    try:
        return _evaluate(config, folder, progress)
    finally:
        if folder is not None:
            folder.close()


def _prefetched(oracle, prompts):
    """oracle.decode, except that the first call decodes all `prompts` at once (Oracle.decode_many)."""
    ready: dict = {}

    def decode(prompt):
        if not ready and prompts:
            ready.update((p.id, r) for p, r in zip(prompts, oracle.decode_many(prompts)))
            prompts.clear()
        return ready.pop(prompt.id) if prompt.id in ready else oracle.decode(prompt)
    return decode


def _evaluate(config: RunConfig, folder, progress: bool) -> RunResult:
    from tqdm import tqdm

    oracle = load_oracle(config)
    workload = checked_workload(config, oracle)
    done = []
    if folder is not None:
        folder.record_workload(workload_digests(workload.first_prompts), config.resume)
        done = resumed_rows(folder, workload) if config.resume else []
    finished = {s.id: s for s in done}
    samples = list(done)
    decode = oracle.decode
    if config.batch_size > 1:         # first turns decoded together (later turns depend on the answers)
        decode = _prefetched(oracle, [p for p in workload.first_prompts if p.id not in finished])
    for rec in tqdm(run_turns(workload, decode, finished), total=workload.pending(finished),
                    desc="prompts", unit="prompt", disable=not progress):
        samples.append(rec)
        if folder is not None:
            folder.append_row("samples.jsonl", rec.to_json())
    report = build_report(config, {**oracle.resolved, **workload.resolved}, samples,
                          oracle.warnings + workload.warnings, sample_prompt=workload.sample_prompt)
    if folder is not None:
        folder.write_json("report.json", report)
        folder.write_with("acceptance.csv", lambda path: write_csv(path, [(None, report)]))
        folder.finish()
    return RunResult(report=report, samples=samples)
