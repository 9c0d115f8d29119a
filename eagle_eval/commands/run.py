"""`run`: the reference loop over a workload, every record kept.

Contract: `run_prompts(oracle, workload, ...)` yields one `SampleRecord` per prompt (turn) from prompts in
memory; `evaluate(settings, options)` is the command: it loads the oracle and the workload, owns the output
folder (samples.jsonl row by row, resumable; report.json and acceptance.csv at the end) and builds the report.
In a launched run (torchrun / accelerate launch, eagle_eval/parallel) the questions are handed out to the
processes by a work queue, rank 0 alone writes the folder, and the records and report equal a single
process's (samples.jsonl in workload order); every rank returns the report, rank 0 the samples.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from eagle_eval.commands.folder import agree_on_loaded, open_folder
from eagle_eval.oracle import Oracle, checked_workload, load_oracle
from eagle_eval.records import SampleRecord
from eagle_eval.results.report import build_report
from eagle_eval.results.resume import resumed_rows, workload_digests
from eagle_eval.results.tables import write_csv
from eagle_eval.settings import LoopOptions, Settings
from eagle_eval import parallel
from eagle_eval.workload.conversations import Workload, in_workload_order, run_turns


@dataclass
class RunResult:
    report: dict
    samples: list[SampleRecord]


def run_prompts(oracle: Oracle, workload: Workload, options: LoopOptions = LoopOptions(),
                done: dict[str, SampleRecord] | None = None) -> Iterator[SampleRecord]:
    """The loop over the workload's prompts (turn by turn, in workload order), skipping the records in `done`."""
    return run_turns(workload, prompt_decoder(oracle, workload, options, done), done)


def prompt_decoder(oracle: Oracle, workload: Workload, options: LoopOptions,
                   done: dict[str, SampleRecord] | None = None, alone: bool = True) -> Callable:
    """prompt -> record, by the loop `Oracle.loop_mode` picks. With the batched loop and the prompts in
    workload order on one process (`alone`), pending first turns are decoded together, CHUNK batches' worth
    at a time (rows reach samples.jsonl as chunks finish); later turns depend on the answers and are decoded
    one by one, as is every prompt of a launched run's work queue."""
    mode = oracle.loop_mode(options.batch_size, options.cuda_graphs)
    if mode["loop"] == "reference":
        return lambda p: oracle.decode(p, options.check_lossless)
    pending = [p for p in workload.first_prompts if p.id not in (done or {})] if alone else []
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
    return decode


CHUNK = 8          # batches of first turns decoded per call of the batched loop


def evaluate(settings: Settings, options: LoopOptions = LoopOptions(), progress: bool = True,
             oracle: Oracle | None = None) -> RunResult:
    """Run the reference loop over the prompts; with output_dir, write samples.jsonl as it goes."""
    from eagle_eval.commands.effect import refuse_no_effect

    refuse_no_effect([settings.decoding])
    torch.manual_seed(settings.decoding.seed)
    folder = open_folder("run", settings, options)
    try:
        return _evaluate(settings, options, folder, progress, oracle)
    finally:
        if folder is not None:
            folder.close()


def _evaluate(settings: Settings, options: LoopOptions, folder, progress: bool, oracle: Oracle | None) -> RunResult:
    group = parallel.current()
    oracle = load_oracle(settings, like=oracle)
    oracle.refuse_load_errors()
    workload = checked_workload(oracle)
    agree_on_loaded(oracle, workload.first_prompts)
    done = group.on_main(lambda: _resumed(folder, workload, settings, oracle)) or []
    new = []

    def deliver(prompt, rec):
        new.append(rec)
        if folder is not None:
            folder.append_row("samples.jsonl", rec.to_json())

    finished = {s.id: s for s in done}
    decode = prompt_decoder(oracle, workload, options, finished, alone=group.world == 1)
    if group.world == 1:
        from tqdm import tqdm

        t0, questions = time.perf_counter(), set()
        for rec in tqdm(run_turns(workload, decode, finished), total=workload.pending(finished), desc="prompts",
                        unit="prompt", disable=not progress):
            deliver(None, rec)
            questions.add(rec.id.rsplit("/turn", 1)[0])
        busy = round(time.perf_counter() - t0, 3)      # the shape of parallel/turns.py's WorkStats, for one process
        work = {"processes": 1, "wall_s": busy, "per_rank": [{"rank": 0, "items": len(questions), "busy_s": busy}]}
    else:                                        # a work queue over the processes (eagle_eval/parallel/turns.py)
        from eagle_eval.parallel.turns import decode_questions
        stats = decode_questions(group, workload, decode, finished, deliver, settings.workload.max_new_tokens,
                                 progress)
        work = stats.as_dict() if stats is not None else None          # rank 0's; None elsewhere
    if not group.is_main:
        return RunResult(report=group.broadcast(None), samples=[])
    samples = in_workload_order(workload, done + new)       # as one uninterrupted process writes them
    loop = oracle.loop_mode(options.batch_size, options.cuda_graphs)
    report = build_report({**settings.flat(), **options.as_dict(), "loop": loop}, oracle.resolved, workload.resolved,
                          samples, oracle.warnings + workload.warnings, settings.decoding.seed,
                          sample_prompt=workload.sample_prompt)
    report["provenance"]["work"] = work                             # questions and busy seconds per rank
    if folder is not None:
        if [s.id for s in samples] != [s.id for s in done + new]:
            folder.write_text("samples.jsonl", "".join(json.dumps(s.to_json()) + "\n" for s in samples))
        folder.write_json("report.json", report)
        folder.write_with("acceptance.csv", lambda path: write_csv(path, [(None, report)]))
        folder.finish()
    return RunResult(report=group.broadcast(report), samples=samples)


def _resumed(folder, workload, settings: Settings, oracle: Oracle) -> list[SampleRecord]:
    """Rank 0: the folder's workload fingerprints recorded, and a resumed run's finished rows (each checked
    against its own counts, the decode's num_steps, max_new_tokens and EOS ids)."""
    if folder is None:
        return []
    folder.record_workload(workload_digests(workload.first_prompts), settings.output.resume)
    if not settings.output.resume:
        return []
    return resumed_rows(folder, workload, num_steps=oracle.resolved.num_steps,
                        max_new_tokens=settings.workload.max_new_tokens, eos_ids=oracle.eos_ids)
