"""A dynamic work queue over the group: rank 0 hands items out in a given order, every rank works on
them, and each result reaches rank 0 as soon as it is done.

Contract: `distribute(group, items, work, deliver)`: `items` on rank 0 (the others pass None), in the
order to hand them out; `work(item)` runs on whichever rank takes the item; `deliver(item, result)` runs
on rank 0 only, one call at a time, as results arrive (a writer needs no lock of its own). Returns, on
rank 0, one `RankStats` per rank (items done, seconds spent in `work`); elsewhere None. One process:
`work` then `deliver` for each item in order, in the calling thread.

Protocol, over the group's own gloo group: a worker sends ("done", result, seconds) (the first time
("ready",)) and gets back ("item", item) or ("stop",). Rank 0 works too: its main thread takes items
from the same list, while a thread of its own answers the other ranks, receiving from any source
(torch.distributed.recv with src=None: gloo's recv_anysource; `recv_object_list` no longer takes
src=None in torch 2.13). Each message is a pickled object sent as its size then its bytes, with a tag
for each, so a size is never read as a body.

Why a queue and not lockstep rounds (every rank one item, then a gather): a round lasts as long as
its slowest item, and decode times differ by prompt, EOS and acceptance; here a rank waits only when
the list is empty, and handing the heaviest items out first keeps the tail short. Which rank decodes
an item does not change its record (the same weights, one prompt at a time), so the assignment, which
depends on timing, changes no byte of the results.

A rank that dies: its item is not delivered, and the launcher (torchrun's agent) stops every process;
what rank 0 delivered stays with the caller (written to the run folder), and a resumed run hands the
rest out again.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

_SIZE_TAG, _BODY_TAG = 2501, 2502


@dataclass
class RankStats:
    rank: int
    items: int = 0
    busy_s: float = 0.0

    def as_dict(self) -> dict:
        return {"rank": self.rank, "items": self.items, "busy_s": round(self.busy_s, 3)}


def _send(obj, dst: int, group) -> None:
    import torch
    import torch.distributed as dist

    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    dist.send(torch.tensor([len(data)], dtype=torch.long), dst=dst, group=group, tag=_SIZE_TAG)
    dist.send(torch.frombuffer(bytearray(data), dtype=torch.uint8), dst=dst, group=group, tag=_BODY_TAG)


def _recv(group, src: int | None = None):
    """(sender's rank, object); src None = from any rank."""
    import torch
    import torch.distributed as dist

    size = torch.zeros(1, dtype=torch.long)
    sender = dist.recv(size, src=src, group=group, tag=_SIZE_TAG)
    body = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(body, src=sender, group=group, tag=_BODY_TAG)
    return sender, pickle.loads(body.numpy().tobytes())


def _timed(work: Callable, item) -> tuple[object, float]:
    t0 = time.perf_counter()
    result = work(item)
    return result, time.perf_counter() - t0


def distribute(group, items: list | None, work: Callable, deliver: Callable) -> list[RankStats] | None:
    """See the module docstring."""
    if group.world == 1:
        stats = RankStats(0)
        for item in items:
            result, seconds = _timed(work, item)
            deliver(item, result)
            stats.items, stats.busy_s = stats.items + 1, stats.busy_s + seconds
        return [stats]
    if group.is_main:
        return _serve_and_work(group, list(items), work, deliver)
    _ask_and_work(group, work)
    return None


def _ask_and_work(group, work: Callable) -> None:
    message = ("ready",)
    while True:
        _send(message, 0, group.queue_group)
        _, reply = _recv(group.queue_group, src=0)
        if reply[0] == "stop":
            return
        result, seconds = _timed(work, reply[1])
        message = ("done", result, seconds)


class _Desk:
    """Rank 0's shared state: the items left, the results delivered, the first error."""

    def __init__(self, items: list, deliver: Callable, world: int):
        self.items, self.deliver = deque(items), deliver
        self.lock = threading.Lock()
        self.stats = [RankStats(r) for r in range(world)]
        self.error: BaseException | None = None

    def take(self):
        with self.lock:
            return (True, self.items.popleft()) if self.items and self.error is None else (False, None)

    def done(self, rank: int, item, result, seconds: float) -> None:
        with self.lock:
            self.deliver(item, result)
            s = self.stats[rank]
            s.items, s.busy_s = s.items + 1, s.busy_s + seconds


def _serve_and_work(group, items: list, work: Callable, deliver: Callable) -> list[RankStats]:
    desk = _Desk(items, deliver, group.world)

    def serve():
        given, active = {}, group.world - 1
        try:
            while active:
                rank, message = _recv(group.queue_group)
                if message[0] == "done":
                    desk.done(rank, given.pop(rank), message[1], message[2])
                more, item = desk.take()
                if more:
                    given[rank] = item
                    _send(("item", item), rank, group.queue_group)
                else:
                    _send(("stop",), rank, group.queue_group)
                    active -= 1
        except BaseException as exc:          # a rank gone, a deliver that failed: rank 0 raises it
            desk.error = exc

    # a daemon: when rank 0's own work raises, the process ends without waiting for it
    server = threading.Thread(target=serve, name="eagle-eval work queue", daemon=True)
    server.start()
    while True:
        more, item = desk.take()
        if not more:
            break
        result, seconds = _timed(work, item)
        desk.done(0, item, result, seconds)
    server.join()
    if desk.error is not None:
        raise desk.error
    return desk.stats
