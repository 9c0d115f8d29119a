"""The launcher's process group, seen as ranks that all run the same command.

Contract: `init(gpus_per_replica)` joins the run: under torchrun or `accelerate launch` (WORLD_SIZE > 1,
with RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as torch.distributed.run sets
them for each worker) it chooses the replica's GPUs and joins torch.distributed's default process group
with `init_method="env://"`. The CLI calls it when launched so; in Python the caller does, in every
process. `current()` is the group `init` made, else a group of one whose operations return at once, so
every command has one code path, and a training script that calls the API on its rank 0 alone is not
made to wait for the others.
All ranks call the same operations in the same order (they are collectives): `all_gather`, `broadcast`
(from rank 0), `on_main(fn)` (fn on rank 0 only; its error stops every rank), `check_same(what,
digests)` (refuses a run whose ranks disagree, naming the first key), `map_shards(items, fn, weight)`
(a static balanced split, fn on each rank's part, the results all-gathered back in item order).
The CLI ends a launched process by `exit_process(status)`: exit handlers, flush, no finalisation.

Why gloo, on GPU machines too: what the ranks exchange is Python objects (records, ids, digests),
which torch.distributed pickles into byte tensors; over NCCL they would be staged through GPU memory
(the note of `torch.distributed.all_gather_object`), and NCCL has no receive from any source, which
the work queue needs. No model tensor crosses processes. The object groups are gloo groups of their
own (`new_group(backend="gloo")`), so a default group that someone else set up with NCCL (accelerate's
`PartialState` in a script) is used as it is.

`replica_devices` says which GPUs a process takes (CUDA_VISIBLE_DEVICES is narrowed to them before
CUDA starts), so each replica's `--device-map auto` spreads over its own GPUs only.
"""

from __future__ import annotations

import atexit
import os
import sys
import typing
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable

from eagle_eval.errors import UserError
from eagle_eval.parallel.shard import split_balanced

# a collective waits at most this long for the slowest rank (rank 0 writing, an unbalanced shard);
# a rank that dies is seen by the launcher, which stops the others, long before
TIMEOUT = timedelta(hours=12)


class ParallelError(UserError, RuntimeError):
    """A launch that cannot work (its environment, its GPUs) or processes that disagree on the run."""


class PeerError(UserError, RuntimeError):
    """Another process stopped the run; its own error says why."""


@dataclass(frozen=True)
class Launch:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1


def launch_env(environ) -> Launch:
    """The launcher's variables (torch.distributed.run sets them for every worker; accelerate launch
    runs torch.distributed.run). Without WORLD_SIZE > 1: one process."""
    try:
        world = int(environ.get("WORLD_SIZE") or 1)
        if world <= 1:
            return Launch()
        missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if not environ.get(k)]
        if missing:
            raise ParallelError(f"WORLD_SIZE={world} but {', '.join(missing)} not set: start the processes with "
                                "torchrun or accelerate launch, which set them")
        return Launch(int(environ["RANK"]), world, int(environ["LOCAL_RANK"]),
                      int(environ.get("LOCAL_WORLD_SIZE") or world))
    except ValueError as exc:
        raise ParallelError(f"the launcher's variables WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE must be "
                            f"integers ({exc})") from exc


def replica_devices(visible: list[str], local_rank: int, local_world: int, per_replica: int | None) -> list[str]:
    """The visible GPUs local process `local_rank` of `local_world` takes on its node.

    Default: the node's GPUs in equal consecutive blocks, one per process (8 GPUs, 2 processes: 4 each;
    a remainder stays unused); with more processes than GPUs, processes share them in consecutive
    groups (2 processes, 1 GPU: both on it). `per_replica` = G takes G GPUs per process.

    >>> replica_devices(["0", "1", "2", "3"], 1, 2, None)
    ['2', '3']
    >>> replica_devices(["0"], 1, 2, None)
    ['0']
    >>> replica_devices(["4", "5", "6", "7"], 1, 4, 1), replica_devices(["0", "1", "2"], 1, 2, 1)
    (['5'], ['1'])
    >>> replica_devices([], 0, 2, None)
    []
    """
    n = len(visible)
    if per_replica is not None:
        if per_replica < 1:
            raise ParallelError(f"--gpus-per-replica must be >= 1, got {per_replica}")
        if per_replica * local_world > n:
            raise ParallelError(f"--gpus-per-replica {per_replica}: {local_world} process(es) on this node need "
                                f"{per_replica * local_world} GPUs, {n} are visible ({','.join(visible) or 'none'})")
        return visible[local_rank * per_replica:(local_rank + 1) * per_replica]
    if n == 0:
        return []
    if local_world <= n:
        g = n // local_world
        return visible[local_rank * g:(local_rank + 1) * g]
    return [visible[local_rank * n // local_world]]


def _visible_gpus(environ) -> list[str]:
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [d.strip() for d in environ["CUDA_VISIBLE_DEVICES"].split(",") if d.strip() and d.strip() != "-1"]
    import torch

    # NVML's count: CUDA is not initialised and nothing is cached (torch.cuda.device_count)
    return [str(i) for i in range(torch.cuda.device_count())]


def place_replica(environ, launch: Launch, per_replica: int | None) -> list[str]:
    """Narrow CUDA_VISIBLE_DEVICES to this process's GPUs (`replica_devices`); returns them."""
    visible = _visible_gpus(environ)
    chosen = replica_devices(visible, launch.local_rank, launch.local_world, per_replica)
    if chosen != visible:
        import torch

        if torch.cuda.is_initialized():
            raise ParallelError("CUDA was started before this replica's GPUs were chosen: call "
                                "eagle_eval.parallel.group.init() first, or set CUDA_VISIBLE_DEVICES per process")
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)
    return chosen


class Group:
    """The ranks of one run (see the module docstring); a group of one without a launcher."""

    def __init__(self, launch: Launch = Launch(), devices: list[str] | None = None):
        self.rank, self.world = launch.rank, launch.world
        self.local_rank, self.local_world = launch.local_rank, launch.local_world
        self.devices = devices or []               # this replica's GPUs (CUDA_VISIBLE_DEVICES), [] on the CPU
        self._objects = self._queue = None
        if self.world > 1:
            import torch.distributed as dist

            # collective: every rank creates both groups, in this order
            self._objects = dist.new_group(backend="gloo", timeout=TIMEOUT)
            self._queue = dist.new_group(backend="gloo", timeout=TIMEOUT)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def queue_group(self):
        """The gloo group of the work queue's point-to-point messages (None for one process)."""
        return self._queue

    def all_gather(self, obj) -> list:
        """[rank 0's obj, rank 1's, ...] on every rank."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self._objects)
        return out

    def broadcast(self, obj):
        """Rank 0's obj on every rank (the others pass anything, e.g. None)."""
        if self.world == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self._objects)
        return box[0]

    def on_main(self, fn: Callable):
        """fn() on rank 0 (None elsewhere); when it raises, every rank raises: rank 0 its own error,
        the others a PeerError naming it, so none waits for a rank that has stopped."""
        if self.world == 1:
            return fn()
        if not self.is_main:
            failed = self.broadcast(None)
            if failed is not None:
                raise PeerError(f"rank 0 stopped the run: {failed}")
            return None
        try:
            result = fn()
        except BaseException as exc:
            self.broadcast(str(exc) or type(exc).__name__)
            raise
        self.broadcast(None)
        return result

    def from_main(self, fn: Callable):
        """fn() on rank 0 and its result on every rank (an error stops every rank, as `on_main`)."""
        return self.broadcast(self.on_main(fn))

    def check_same(self, what: str, digests: dict[str, str]) -> None:
        """Refuse (on every rank) a run whose ranks' digests differ; the message names the first key."""
        if self.world == 1:
            return
        every = self.all_gather(digests)
        for rank, theirs in enumerate(every):
            keys = sorted(k for k in set(theirs) | set(every[0]) if theirs.get(k) != every[0].get(k))
            if keys:
                raise ParallelError(f"the processes disagree on the {what}: rank {rank} differs from rank 0 in "
                                    f"{keys[0]}" + (f" (and {len(keys) - 1} more)" if len(keys) > 1 else "")
                                    + "; start every process with the same command, code and inputs")

    def map_shards(self, items: list, fn: Callable[[list], list], weight: Callable) -> list:
        """fn over a balanced static split of `items` (`shard.split_balanced` by weight(item)), each
        rank its part, the results all-gathered: on every rank, fn's result for each item in item order."""
        if self.world == 1:
            return fn(items)
        mine = split_balanced([weight(x) for x in items], self.world)[self.rank]
        got = fn([items[i] for i in mine]) if mine else []
        out = [None] * len(items)
        for indices, results in self.all_gather((mine, got)):
            for i, r in zip(indices, results):
                out[i] = r
        return out


_current: Group | None = None


def init(per_replica: int | None = None, environ=None) -> Group:
    """This process's group, set up once from the launcher's environment: the replica's GPUs chosen
    (before CUDA starts), then torch.distributed's default group joined over gloo when no one has."""
    global _current
    if _current is not None:
        return _current
    environ = os.environ if environ is None else environ
    launch = launch_env(environ)
    devices = place_replica(environ, launch, per_replica) if launch.world > 1 or per_replica else []
    if launch.world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo", init_method="env://", timeout=TIMEOUT)
        if (dist.get_rank(), dist.get_world_size()) != (launch.rank, launch.world):
            raise ParallelError(f"torch.distributed is rank {dist.get_rank()} of {dist.get_world_size()}, the "
                                f"launcher's variables say rank {launch.rank} of {launch.world}")
    _current = Group(launch, devices)
    if launch.world > 1:
        atexit.register(_leave)
    return _current


def _leave() -> None:
    """Tear torch.distributed's groups down before the interpreter does, and wait for their threads.

    destroy_process_group() shuts every group down and forgets it, but a gloo group's threads (two
    workers and a transport loop per group) are joined only by its destructor, which runs when the
    last reference goes: the Group's object and queue groups would keep six threads alive into the
    interpreter's finalisation, where now and then they abort the process ("terminate called
    without an active exception", seen after a finished run). So the references go too, and the
    destructors run here, while the interpreter is whole."""
    import gc

    import torch.distributed as dist

    if _current is not None:
        _current._objects = _current._queue = None
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def exit_process(status) -> typing.NoReturn:
    """End a process of a launched run (WORLD_SIZE > 1) with `status` (SystemExit's code: None = 0, an int,
    or a message = 1) without the interpreter's finalisation: the exit handlers run (`_leave` among them,
    and every library's), stdout and stderr are flushed, then `os._exit`.

    Why: a process that had finished its work and written its results still died now and then with SIGABRT
    at exit ("terminate called without an active exception": a C++ thread or static destructor of
    torch.distributed meeting a half-finalised interpreter), seen under load after `_leave` had joined the
    groups' threads; torchrun then reports the run failed. Nothing of a run is left to finalisation: every
    results file is closed when its writer returns (and what a closed file holds is the OS's, which
    `os._exit` keeps)."""
    if status is None:
        code = 0
    elif isinstance(status, int):
        code = status
    else:
        print(status, file=sys.stderr)
        code = 1
    try:
        atexit._run_exitfuncs()          # what `sys.exit` would run; CPython's own entry point for it
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


_ALONE = Group()


def current() -> Group:
    """The group `init` set up, else a group of one (this process runs the command on its own)."""
    return _current if _current is not None else _ALONE
