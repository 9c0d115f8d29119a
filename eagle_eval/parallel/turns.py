"""The workload's questions over the work queue, a question's turns on one process (turn t+1 is built
from the answer to turn t, workload/conversations.py).

Contract: `decode_questions(group, workload, decode, done, deliver, max_new_tokens, progress)` decodes
every turn whose id is not in `done` (a resumed run's records, known on rank 0), and calls
`deliver(prompt, record)` on rank 0 for each new turn as it arrives, under one progress bar (rank 0's,
counting the turns of the whole run). Rank 0 hands the questions out heaviest first, the weight being
pending turns x (first-turn prompt tokens + max_new_tokens): a decode's cost grows with both, and the
later turns' prompts are not known before the earlier answers. A partly finished question travels with
its done turns. One process: the questions in workload order, each turn delivered as it is decoded,
exactly as `run_turns`. Returns `WorkStats` on rank 0 (wall time, per-rank items and busy
seconds), None elsewhere.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from eagle_eval.parallel.shard import heaviest_first
from eagle_eval.parallel.work_queue import RankStats, distribute
from eagle_eval.workload.conversations import question_turns, sample_ids


def pending_questions(workload, done: dict, max_new_tokens: int) -> list[tuple[int, dict]]:
    """(question index, its done records) of each question with a turn left, heaviest first."""
    items, weights = [], []
    for index, ids in enumerate(sample_ids(workload)):
        left = sum(sid not in done for sid in ids)
        if left:
            items.append((index, {sid: done[sid] for sid in ids if sid in done}))
            weights.append(left * (len(workload.first_prompts[index].input_ids) + max_new_tokens))
    return [items[i] for i in heaviest_first(weights)]


@dataclass
class WorkStats:
    """How the decoding went: its wall time on rank 0 and each rank's items and busy seconds."""
    wall_s: float
    ranks: list[RankStats]

    def as_dict(self) -> dict:
        return {"processes": len(self.ranks), "wall_s": round(self.wall_s, 3),
                "per_rank": [r.as_dict() for r in self.ranks]}


def decode_questions(group, workload, decode: Callable, done: dict, deliver: Callable, max_new_tokens: int,
                     progress: bool = True) -> WorkStats | None:
    """See the module docstring."""
    from tqdm import tqdm

    bar = tqdm(total=workload.pending(done) if group.is_main else 0, desc="prompts", unit="prompt",
               disable=not (progress and group.is_main))

    def got(prompt, rec):
        deliver(prompt, rec)
        bar.update(1)

    t0 = time.perf_counter()
    try:
        if group.world == 1:
            stats = RankStats(0)
            for index in range(len(workload.questions)):
                pairs = 0
                for prompt, rec in question_turns(workload, index, decode, done):
                    got(prompt, rec)
                    pairs += 1
                stats.items += pairs > 0
            stats.busy_s = time.perf_counter() - t0
            return WorkStats(stats.busy_s, [stats])

        def work(item):
            index, done_turns = item
            return list(question_turns(workload, index, decode, done_turns))

        items = pending_questions(workload, done, max_new_tokens) if group.is_main else None
        ranks = distribute(group, items, work, lambda item, pairs: [got(p, r) for p, r in pairs])
        return WorkStats(time.perf_counter() - t0, ranks) if ranks is not None else None
    finally:
        bar.close()
