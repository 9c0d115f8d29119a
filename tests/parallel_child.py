"""Test helper that torchrun starts in each process: eagle-eval's CLI, in a process that can be told
to die or to be given other settings than its peers (tests/test_parallel.py).

    EAGLE_EVAL_TEST_DIE="R:N"       rank R kills itself (SIGKILL, as the OOM killer would) when it
                                    starts its decode number N+1
    EAGLE_EVAL_TEST_ARGS="R:ARGS"   rank R gets ARGS after the command's own (e.g. "1:--num-steps 4")
    EAGLE_EVAL_TEST_SLOW="S"        every decode of every rank first sleeps S seconds
    EAGLE_EVAL_TEST_GATE=FILE       every decode of every rank first waits until FILE exists
    EAGLE_EVAL_TEST_MARK=DIR        rank R writes DIR/atexit.R from an exit handler and DIR/finalised.R from
                                    an object's __del__ during the interpreter's finalisation
    python tests/parallel_child.py group OUT.json
                                    the group scenarios of test_parallel.py, rank 0 writing OUT.json
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))      # this checkout's eagle_eval


def _decode_hooks(rank: int) -> None:
    die, slow = os.environ.get("EAGLE_EVAL_TEST_DIE"), float(os.environ.get("EAGLE_EVAL_TEST_SLOW") or 0)
    gate = os.environ.get("EAGLE_EVAL_TEST_GATE")
    after = int(die.split(":")[1]) if die and int(die.split(":")[0]) == rank else None
    if after is None and not slow and not gate:
        return
    from eagle_eval.oracle import Oracle

    decode, calls = Oracle.decode, []

    def hooked(self, prompt, check_lossless=None):
        if len(calls) == after:
            os.kill(os.getpid(), signal.SIGKILL)
        calls.append(prompt.id)
        time.sleep(slow)
        while gate and not os.path.exists(gate):
            time.sleep(0.05)
        return decode(self, prompt, check_lossless)

    Oracle.decode = hooked


def _extra_args(rank: int) -> list[str]:
    spec = os.environ.get("EAGLE_EVAL_TEST_ARGS")
    if not spec or int(spec.split(":", 1)[0]) != rank:
        return []
    return shlex.split(spec.split(":", 1)[1])


def group_scenarios(out_path: str) -> None:
    """Each scenario's outcome on every rank, gathered and written by rank 0."""
    from eagle_eval.parallel import group as parallel
    from eagle_eval.parallel.group import ParallelError, PeerError
    from eagle_eval.parallel.work_queue import distribute

    threads = lambda: len(os.listdir("/proc/self/task"))           # this process's OS threads
    before = threads()
    g = parallel.init()
    seen = {}
    # the queue: item i takes i % 3 * 20 ms, its result is (i * i, the rank that worked on it)
    delivered = []
    stats = distribute(g, list(range(12)) if g.is_main else None,
                       lambda i: (time.sleep(i % 3 * 0.02), (i * i, g.rank))[1],
                       lambda i, r: delivered.append((i, r)))
    seen["queue"] = {"delivered": delivered, "stats": [s.as_dict() for s in stats] if stats else None}
    # disagreement: rank 1 has another value for key "b"
    try:
        g.check_same("test settings", {"a": "1", "b": "2" if g.rank != 1 else "3"})
        seen["check_same"] = None
    except ParallelError as exc:
        seen["check_same"] = str(exc)
    # rank 0 fails inside on_main: the others are told
    try:
        g.on_main(lambda: (_ for _ in ()).throw(ValueError("the folder is busy")))
        seen["on_main"] = None
    except (ValueError, PeerError) as exc:
        seen["on_main"] = f"{type(exc).__name__}: {exc}"
    seen["map_shards"] = g.map_shards(list(range(7)), lambda part: [(x * 10, g.rank) for x in part],
                                      weight=lambda x: x + 1)
    every = g.all_gather(seen)
    if g.is_main:
        with open(out_path, "w") as f:
            json.dump(every, f)
    # what runs at exit: every thread the groups started is gone before the interpreter finalises
    parallel._leave()
    Path(f"{out_path}.threads.{g.rank}").write_text(json.dumps({"before": before, "after": threads()}))


class _Finalised:
    """Writes its file when the interpreter's finalisation clears this module (not before)."""

    def __init__(self, path: Path):
        self.path = path

    def __del__(self):
        self.path.write_text("finalised")


def _exit_marks(rank: int) -> None:
    mark = os.environ.get("EAGLE_EVAL_TEST_MARK")
    if not mark:
        return
    import atexit

    atexit.register(lambda: (Path(mark) / f"atexit.{rank}").write_text("ran"))
    globals()["_FINALISED"] = _Finalised(Path(mark) / f"finalised.{rank}")


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    if sys.argv[1:2] == ["group"]:
        group_scenarios(sys.argv[2])
        return
    _exit_marks(rank)
    _decode_hooks(rank)
    sys.argv += _extra_args(rank)
    from eagle_eval.cli import entry

    entry()


if __name__ == "__main__":
    main()
