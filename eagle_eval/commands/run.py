"""`run`: the reference loop over a workload, one prompt at a time, every record kept.

Contract: `run_prompts(oracle, workload, ...)` yields one `SampleRecord` per prompt (turn) from prompts in
memory; `evaluate(settings, options)` is the command: it loads the oracle and the workload, owns the output
folder (samples.jsonl row by row, resumable; report.json and acceptance.csv at the end) and builds the report.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from eagle_eval.commands.folder import open_folder
from eagle_eval.oracle import Oracle, checked_workload, load_oracle
from eagle_eval.results.records import SampleRecord
from eagle_eval.results.report import build_report
from eagle_eval.results.resume import resumed_rows, workload_digests
from eagle_eval.results.tables import write_csv
from eagle_eval.settings import LoopOptions, Settings
from eagle_eval.workload.conversations import Workload, run_turns


@dataclass
class RunResult:
    report: dict
    samples: list[SampleRecord]


def run_prompts(oracle: Oracle, workload: Workload, options: LoopOptions = LoopOptions(),
                done: dict[str, SampleRecord] | None = None) -> Iterator[SampleRecord]:
    """The loop over the workload's prompts (turn by turn), skipping the records in `done`. With the batched
    loop (`Oracle.loop_mode`), pending first turns are decoded together, CHUNK batches' worth at a time (so rows
    reach samples.jsonl as chunks finish); later turns depend on the answers and are decoded one by one."""
    mode = oracle.loop_mode(options.batch_size, options.cuda_graphs)
    if mode["loop"] == "reference":
        return run_turns(workload, lambda p: oracle.decode(p, options.check_lossless), done)
    pending = [p for p in workload.first_prompts if p.id not in (done or {})]
    index = {p.id: i for i, p in enumerate(pending)}
    ready: dict[str, SampleRecord] = {}

    def decode(prompt):
        if prompt.id in index and prompt.id not in ready:
            start = index[prompt.id]
            chunk = pending[start: start + CHUNK * options.batch_size]
            ready.update((p.id, r) for p, r in zip(chunk, oracle.decode_many(
                chunk, options.batch_size, options.cuda_graphs, options.check_lossless)))
        if prompt.id in ready:
            return ready.pop(prompt.id)
        return oracle.decode_many([prompt], 1, options.cuda_graphs, options.check_lossless)[0]
    return run_turns(workload, decode, done)


CHUNK = 8          # batches of first turns decoded per call of the batched loop


def evaluate(settings: Settings, options: LoopOptions = LoopOptions(), progress: bool = True,
             oracle: Oracle | None = None) -> RunResult:
    """Run the reference loop over the prompts; with output_dir, write samples.jsonl as it goes."""
    torch.manual_seed(settings.decoding.seed)
    folder = open_folder("run", settings, options)
    try:
        return _evaluate(settings, options, folder, progress, oracle)
    finally:
        if folder is not None:
            folder.close()


def _evaluate(settings: Settings, options: LoopOptions, folder, progress: bool, oracle: Oracle | None) -> RunResult:
    from tqdm import tqdm

    oracle = load_oracle(settings, like=oracle)
    oracle.refuse_load_errors()
    workload = checked_workload(oracle)
    done = []
    if folder is not None:
        folder.record_workload(workload_digests(workload.first_prompts), settings.output.resume)
        done = resumed_rows(folder, workload, num_steps=oracle.resolved.num_steps) if settings.output.resume else []
    finished = {s.id: s for s in done}
    samples = list(done)
    for rec in tqdm(run_prompts(oracle, workload, options, finished), total=workload.pending(finished),
                    desc="prompts", unit="prompt", disable=not progress):
        samples.append(rec)
        if folder is not None:
            folder.append_row("samples.jsonl", rec.to_json())
    loop = oracle.loop_mode(options.batch_size, options.cuda_graphs)
    report = build_report({**settings.flat(), **options.as_dict(), "loop": loop}, oracle.resolved, workload.resolved,
                          samples,
                          oracle.warnings + workload.warnings, settings.decoding.seed,
                          sample_prompt=workload.sample_prompt)
    if folder is not None:
        folder.write_json("report.json", report)
        folder.write_with("acceptance.csv", lambda path: write_csv(path, [(None, report)]))
        folder.finish()
    return RunResult(report=report, samples=samples)
