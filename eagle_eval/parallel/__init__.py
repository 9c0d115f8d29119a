"""One run over many processes: each process a replica of the target and head, started by torchrun or
`accelerate launch`, with rank 0 the only writer of the run folder.

Rooms: `shard` (pure: heaviest-first order and balanced splits by weight), `group` (the launcher's
process group over gloo: rank, world, collectives, `on_main`, `check_same`, `map_shards`, which GPUs a
replica takes), `settings` (what every process must agree on, as digests), `work_queue` (a dynamic
queue: rank 0 hands out items, every rank works, results reach rank 0 as they finish), `turns` (the
workload's questions over the queue, a question's turns kept on one process), `console` (one progress
bar, stderr tagged by rank, stdout only on rank 0).

May import: results (records, run_folder's hashing), workload (conversations), errors.
Never: models, speculative, diagnose, servers, api, cli (decoding comes in as a callable).
"""

import sys


class _Alone:
    """The group of one process (a command that was not launched): the same answers as a one-process
    `group.Group`, without loading the parallel rooms on the single-process path."""
    rank, world, local_rank, local_world, is_main = 0, 1, 0, 1, True

    def on_main(self, fn):
        return fn()

    def from_main(self, fn):
        return fn()

    def broadcast(self, obj):
        return obj

    def all_gather(self, obj) -> list:
        return [obj]

    def check_same(self, what: str, digests: dict) -> None:
        return None

    def map_shards(self, items: list, fn, weight) -> list:
        return fn(items)


ALONE = _Alone()


def current():
    """The launched run's group (`group.init`, which the CLI calls under torchrun / accelerate launch), else the
    group of one: `group` is imported only where a launch was joined."""
    group = sys.modules.get("eagle_eval.parallel.group")
    return group.current() if group is not None else ALONE
