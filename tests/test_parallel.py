"""One run over many processes: the parallel layer on its own, then every command started
by torchrun (and accelerate launch) with 2 processes on the CPU over gloo, against one process.

The equalities are exact: samples.jsonl byte for byte, and every report key except `provenance`
(date, command line, the process count) and `config.output_dir` (each run has its own folder).
The references run in this process through the Python API (one thread, as the children: conftest
sets it, the children get OMP_NUM_THREADS=1).
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from eagle_eval import api
from eagle_eval.settings import REPO_ROOT, AblateOptions, ProfileOptions, Settings
from eagle_eval.parallel.console import Tagged
from eagle_eval.parallel.group import Group, Launch, ParallelError, launch_env, replica_devices
from eagle_eval.parallel.settings import light_fingerprint, loaded_digests, settings_digests
from eagle_eval.parallel.shard import heaviest_first, split_balanced
from eagle_eval.parallel.turns import pending_questions
from eagle_eval.records import SampleRecord

CHILD = Path(__file__).parent / "parallel_child.py"
MT_BENCH = str(Path(__file__).parent / "data" / "mt_bench_question.jsonl")
SMALL = ["--max-new-tokens", "8"]


# ---- the layer on its own: pure parts -------------------------------------------------------------

def test_balanced_split_covers_every_item_once_and_is_balanced():
    rng = random.Random(0)
    for parts in (1, 2, 3, 8):
        weights = [rng.randint(1, 500) for _ in range(rng.randint(0, 60))]
        split = split_balanced(weights, parts)
        assert split == split_balanced(list(weights), parts)                  # deterministic
        assert sorted(i for p in split for i in p) == list(range(len(weights)))
        loads = [sum(weights[i] for i in p) for p in split]
        if weights:                                                           # LPT: within the heaviest item
            assert max(loads) - min(loads) <= max(weights)


def test_heaviest_first_keeps_ties_in_order():
    assert heaviest_first([2, 5, 2, 5]) == [1, 3, 0, 2]


@pytest.mark.parametrize("visible, local_rank, local_world, per, want", [
    (["0", "1", "2", "3", "4", "5", "6", "7"], 3, 8, None, ["3"]),          # 8 replicas of an 8B on a node
    (["0", "1", "2", "3", "4", "5", "6", "7"], 0, 1, None, ["0", "1", "2", "3", "4", "5", "6", "7"]),
    (["0", "1", "2", "3", "4", "5", "6", "7"], 1, 2, None, ["4", "5", "6", "7"]),
    (["0", "1", "2", "3", "4", "5", "6", "7"], 1, 3, None, ["2", "3"]),     # 8 // 3 = 2 each, 2 unused
    (["0", "1", "2", "3", "4", "5", "6", "7"], 1, 2, 2, ["2", "3"]),
    (["4", "6"], 1, 2, None, ["6"]),                                           # CUDA_VISIBLE_DEVICES kept
    (["0"], 1, 2, None, ["0"]),                                                # two replicas share one GPU
    (["0", "1"], 2, 4, None, ["1"]),
    ([], 1, 2, None, []),                                                      # the CPU
])
def test_replica_devices(visible, local_rank, local_world, per, want):
    assert replica_devices(visible, local_rank, local_world, per) == want


def test_replica_devices_refuses_too_few_gpus():
    with pytest.raises(ParallelError, match=r"--gpus-per-replica 2: 4 process\(es\) on this node need 8 GPUs, 4 are"):
        replica_devices(["0", "1", "2", "3"], 0, 4, 2)


def test_launch_env():
    assert launch_env({}) == Launch() and launch_env({"WORLD_SIZE": "1"}) == Launch()
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h",
           "MASTER_PORT": "1"}
    assert launch_env(env) == Launch(rank=3, world=4, local_rank=1, local_world=2)
    with pytest.raises(ParallelError, match="WORLD_SIZE=2 but RANK, MASTER_ADDR not set: start the processes"):
        launch_env({"WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_PORT": "1"})


def test_a_group_of_one_does_everything_in_place():
    g = Group()
    assert g.all_gather(3) == [3] and g.broadcast(4) == 4 and g.on_main(lambda: 5) == 5
    assert g.map_shards([1, 2, 3], lambda part: [x * 2 for x in part], weight=lambda x: x) == [2, 4, 6]
    g.check_same("anything", {"a": "1"})


def test_tagged_stderr_tags_every_line_and_each_redraw():
    import io
    out = io.StringIO()
    t = Tagged(out, "[rank 1/2] ")
    t.write("error: x\nwarn")
    t.write("ing\n\rbar 10%\rbar 20%\n")
    assert out.getvalue() == ("[rank 1/2] error: x\n[rank 1/2] warning\n\r[rank 1/2] bar 10%\r[rank 1/2] bar 20%\n")
    with pytest.raises(TypeError):
        t.write(b"")                      # click asks whether the stream takes bytes: it must not


def test_light_fingerprint_tells_contents_apart_not_spellings(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(REPO_ROOT / "checkpoints" / "draft", a)
    shutil.copytree(REPO_ROOT / "checkpoints" / "draft", b)
    base = {"num_steps": 5, "draft": str(a)}
    same = settings_digests("run", base, {"draft": str(a)})
    assert settings_digests("run", {**base, "draft": str(b) + "/"}, {"draft": str(b) + "/"}) == same
    cfg = json.loads((b / "config.json").read_text())
    (b / "config.json").write_text(json.dumps({**cfg, "rope_theta": 1.0}))
    other = settings_digests("run", {**base, "draft": str(b)}, {"draft": str(b)})
    assert [k for k in same if same[k] != other[k]] == ["contents of --draft"]
    assert light_fingerprint(tmp_path / "none") == {"missing": True}


def test_loaded_digests_leave_out_devices_and_path_spellings():
    inputs_a, inputs_b = {"target": "/node-a/t"}, {"target": "/node-b/t"}
    res = {"num_steps": 5, "target": {"path": "/node-a/t", "devices": ["cuda:0"], "hidden_size": 8},
           "draft_device": "cuda:0", "train_acc": {"source": "/node-a/t/training_metrics.json"}}
    moved = {"num_steps": 5, "target": {"path": "/node-b/t", "devices": ["cuda:0", "cuda:1"], "hidden_size": 8},
             "draft_device": "cuda:1", "train_acc": {"source": "/node-b/t/training_metrics.json"}}
    assert loaded_digests(res, {"p": "x"}, inputs_a) == loaded_digests(moved, {"p": "x"}, inputs_b)
    wider = {**moved, "target": {**moved["target"], "hidden_size": 16}}
    theirs = loaded_digests(wider, {"p": "y"}, inputs_b)
    assert [k for k, v in loaded_digests(res, {"p": "x"}, inputs_a).items() if theirs[k] != v] == [
        "resolved target", "prompt token ids"]


def test_pending_questions_heaviest_first_with_their_done_turns():
    from types import SimpleNamespace

    from eagle_eval.workload.datasets import Question
    qs = [Question("a", "c", ("t1",), "f"), Question("b", "c", ("t1", "t2"), "f"), Question("c", "c", ("t1",), "f")]
    prompts = [SimpleNamespace(input_ids=[0] * n) for n in (30, 10, 5)]
    workload = SimpleNamespace(questions=qs, first_prompts=prompts)
    half = SampleRecord("b/turn1", "c", 10, [1], [0], [1], 1)
    items = pending_questions(workload, {"b/turn1": half, "c": half}, max_new_tokens=16)
    assert [(i, list(d)) for i, d in items] == [(0, []), (1, ["b/turn1"])]       # 46 > 26; c is done


def test_records_in_workload_order():
    from types import SimpleNamespace

    from eagle_eval.workload.conversations import in_workload_order
    from eagle_eval.workload.datasets import Question
    workload = SimpleNamespace(questions=[Question("q", "c", ("t1", "t2"), "f"), Question("p", "c", ("t1",), "f")])
    recs = [SampleRecord(i, "c", 1, [1], [0], [1], 1) for i in ("p", "stray", "q/turn2", "q/turn1")]
    assert [r.id for r in in_workload_order(workload, recs)] == ["q/turn1", "q/turn2", "p", "stray"]


# ---- the layer over real processes -----------------------------------------------------------------

def _env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT), **extra}


def _torchrun(*args, n=2, script=None, env=None, timeout=300, check=True):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"]
    cmd += [str(script)] if script else ["-m", "eagle_eval"]
    out = subprocess.run(cmd + [str(a) for a in args], cwd=REPO_ROOT, env=env or _env(), capture_output=True,
                         text=True, timeout=timeout)
    if check:
        assert out.returncode == 0, out.stderr[-4000:]
    return out


@pytest.mark.slow
def test_group_operations_over_three_processes(tmp_path):
    _torchrun("group", tmp_path / "out.json", n=3, script=CHILD)
    every = json.loads((tmp_path / "out.json").read_text())
    queue = every[0]["queue"]
    assert sorted(i for i, _ in queue["delivered"]) == list(range(12))          # each item once, at rank 0
    assert all(r[0] == i * i for i, r in queue["delivered"])
    assert {r[1] for _, r in queue["delivered"]} == {0, 1, 2}                   # every rank worked
    assert sum(s["items"] for s in queue["stats"]) == 12
    assert every[1]["queue"] == every[2]["queue"] == {"delivered": [], "stats": None}
    for rank in range(3):
        assert "disagree on the test settings: rank 1 differs from rank 0 in b" in every[rank]["check_same"]
        assert every[rank]["map_shards"] == every[0]["map_shards"]
    assert [x for x, _ in every[0]["map_shards"]] == [x * 10 for x in range(7)]
    assert {r for _, r in every[0]["map_shards"]} == {0, 1, 2}
    assert every[0]["on_main"] == "ValueError: the folder is busy"
    assert every[1]["on_main"] == every[2]["on_main"] == "PeerError: rank 0 stopped the run: the folder is busy"
    # at exit (group._leave) each process is back to the threads it had before it joined: no gloo
    # thread is left for the interpreter's finalisation, where they abort a process now and then
    for rank in range(3):
        counts = json.loads((tmp_path / f"out.json.threads.{rank}").read_text())
        assert counts["after"] == counts["before"], (rank, counts)


@pytest.mark.slow
def test_a_launched_process_ends_with_its_status_after_the_exit_handlers_and_without_finalisation(tmp_path):
    plan = ["plan", "--target", REPO_ROOT / "checkpoints" / "target", "--gpus", 1, "--gpu-memory", "80GB"]
    # one process: the child's marks work (its exit handler runs, then finalisation runs its __del__)
    alone = subprocess.run([sys.executable, str(CHILD), *map(str, plan)], cwd=REPO_ROOT,
                           env=_env(EAGLE_EVAL_TEST_MARK=str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert (tmp_path / "atexit.0").exists() and (tmp_path / "finalised.0").exists()
    (tmp_path / "atexit.0").unlink(), (tmp_path / "finalised.0").unlink()
    # launched, both ranks finishing: every exit handler ran, rank 0's report reached stdout (flushed), and no
    # finalisation ran (where the SIGABRT at exit came from)
    out = _torchrun(*plan, script=CHILD, env=_env(EAGLE_EVAL_TEST_MARK=str(tmp_path)), timeout=120)
    assert "LlamaForCausalLM" in out.stdout
    for rank in range(2):
        assert (tmp_path / f"atexit.{rank}").exists()
        assert not (tmp_path / f"finalised.{rank}").exists()
    # a failing command's own status reaches torchrun (bad input: 2; torchrun stops the other rank at the first)
    out = _torchrun("report", tmp_path / "none.json", script=CHILD, check=False, timeout=120)
    assert out.returncode != 0
    assert "exitcode  : 2" in out.stderr and "eagle-eval: error: " in out.stderr, out.stderr[-3000:]


def _bare(report: dict) -> dict:
    """A report without what differs between two runs of one command: provenance, the folder (and
    whether it was resumed)."""
    out = json.loads(json.dumps(report))
    prov = out.pop("provenance")
    for section in (out.get("config", {}), out.get("server_check", {})):
        section.pop("output_dir", None)
        section.pop("resume", None)
    return out, prov


def _same(ref: Path, got: Path, report: str, processes: int = 2) -> dict:
    assert (got / "samples.jsonl").read_bytes() == (ref / "samples.jsonl").read_bytes()
    (a, _), (b, prov) = _bare(json.loads((ref / report).read_text())), _bare(json.loads((got / report).read_text()))
    assert b == a
    assert prov["processes"] == processes
    assert json.loads((got / "eagle_eval_run.json").read_text())["status"] == "finished"
    return prov


def _run_args(cfg: Settings) -> list[str]:
    s, w = cfg.speculation, cfg.workload
    args = ["--max-new-tokens", w.max_new_tokens, "--num-steps", s.num_steps, "--topk", s.topk]
    args += ["--num-draft-tokens", s.num_draft_tokens] if s.num_draft_tokens else []
    args += ["--dataset", w.dataset] if w.dataset else []
    args += ["--limit", w.limit] if w.limit else []
    return args


CHAIN = Settings.of(dataset=MT_BENCH, max_new_tokens=8)                      # 3 questions x 2 turns
TREE = Settings.of(limit=5, max_new_tokens=8, num_steps=3, topk=2, num_draft_tokens=5)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [CHAIN, TREE], ids=["chain-multi-turn", "tree"])
def test_run_over_two_processes_equals_one(tmp_path, cfg):
    api.evaluate(cfg.with_(output_dir=str(tmp_path / "one")), progress=False)
    out = _torchrun("run", *_run_args(cfg), "--output-dir", tmp_path / "two")
    prov = _same(tmp_path / "one", tmp_path / "two", "report.json")
    assert sorted(w["rank"] for w in prov["work"]["per_rank"]) == [0, 1] and prov["work"]["processes"] == 2
    assert sum(w["items"] for w in prov["work"]["per_rank"]) == (3 if cfg is CHAIN else 5)   # questions
    assert "tau" in out.stdout and out.stdout.count("accept length tau") == 1     # rank 0 prints, once
    bars = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if "prompts:" in ln]
    assert bars and all(ln.startswith("[rank 0/2] ") for ln in bars)          # one bar, rank 0's


@pytest.mark.slow
def test_accelerate_launch_equals_one_process(tmp_path):
    api.evaluate(CHAIN.with_(output_dir=str(tmp_path / "one")), progress=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
           str(port), "-m", "eagle_eval", "run", *map(str, _run_args(CHAIN)), "--output-dir", str(tmp_path / "two")]
    out = subprocess.run(cmd, cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    _same(tmp_path / "one", tmp_path / "two", "report.json")


def _child(*args, env):
    """The CLI in one process (no launcher), with the test hooks of tests/parallel_child.py."""
    return subprocess.run([sys.executable, str(CHILD), *map(str, args)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _cut_short(folder: Path, total: int) -> list[str]:
    owner = json.loads((folder / "eagle_eval_run.json").read_text())
    rows = (folder / "samples.jsonl").read_text().splitlines()
    assert owner["status"] == "running" and 0 < len(rows) < total, rows
    return [json.loads(r)["id"] for r in rows]


@pytest.mark.slow
def test_a_killed_process_leaves_a_run_that_resumes_with_one_or_two(tmp_path):
    cfg = Settings.of(limit=8, max_new_tokens=8)
    api.evaluate(cfg.with_(output_dir=str(tmp_path / "one")), progress=False)
    killed = tmp_path / "killed"
    # rank 1 is killed (SIGKILL) as it starts its third decode; every decode takes >= 0.2 s, so both
    # ranks have delivered prompts by then and some are left
    out = _torchrun("run", *_run_args(cfg), "--output-dir", killed, script=CHILD, check=False,
                    env=_env(EAGLE_EVAL_TEST_DIE="1:2", EAGLE_EVAL_TEST_SLOW="0.2"))
    assert out.returncode != 0 and "SIGKILL" in out.stderr
    done = _cut_short(killed, 8)
    shutil.copytree(killed, tmp_path / "killed2")
    one = subprocess.run([sys.executable, "-m", "eagle_eval", "run", *map(str, _run_args(cfg)), "--output-dir",
                          str(killed), "--resume"], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True)
    assert one.returncode == 0, one.stderr[-3000:]
    assert _same(tmp_path / "one", killed, "report.json", processes=1)["work"]["per_rank"][0]["items"] == 8 - len(done)
    _torchrun("run", *_run_args(cfg), "--output-dir", tmp_path / "killed2", "--resume")
    prov = _same(tmp_path / "one", tmp_path / "killed2", "report.json")
    assert sum(w["items"] for w in prov["work"]["per_rank"]) == 8 - len(done)            # no prompt done twice


@pytest.mark.slow
def test_a_question_cut_between_its_turns_resumes_over_two_processes(tmp_path):
    api.evaluate(CHAIN.with_(output_dir=str(tmp_path / "one")), progress=False)
    killed = tmp_path / "killed"
    # one process, killed as it starts its fourth decode: question 2's second turn
    out = _child("run", *_run_args(CHAIN), "--output-dir", killed, env=_env(EAGLE_EVAL_TEST_DIE="0:3"))
    assert out.returncode == -signal.SIGKILL
    assert _cut_short(killed, 6) == ["81/turn1", "81/turn2", "82/turn1"]
    _torchrun("run", *_run_args(CHAIN), "--output-dir", killed, "--resume")
    prov = _same(tmp_path / "one", killed, "report.json")
    assert sum(w["items"] for w in prov["work"]["per_rank"]) == 2              # question 82 (turn 2 only) and 111


@pytest.mark.slow
def test_profile_at_temperature_over_two_processes_equals_one(tmp_path):
    """At T > 0 the prompts (each with its samples) are split too; every draw is seeded per (prompt, sample),
    so two processes give one process's figures and per_start rows byte for byte."""
    run = Settings.of(limit=5, max_new_tokens=8, temperature=1.0, top_p=0.95)
    api.profile(run.with_(output_dir=str(tmp_path / "one")), ProfileOptions(max_steps=3, samples_per_prompt=2),
                progress=False)
    _torchrun("profile", *_run_args(run), "--temperature", 1.0, "--top-p", 0.95, "--samples-per-prompt", 2,
              "--max-steps", 3, "--output-dir", tmp_path / "two")
    one, two = tmp_path / "one", tmp_path / "two"
    assert (two / "samples.jsonl").read_bytes() == (one / "samples.jsonl").read_bytes()    # texts and counts
    (a, _), (b, prov) = (_bare(json.loads((d / "profile.json").read_text())) for d in (one, two))
    # the expectations are float32 sums over the target's p: a shard batches other prompts together, which moves
    # them by float32 rounding only (as --batch-tokens does in one process; seen: 1e-5 relative at most); all else
    # is equal
    _close(b, a, rel=1e-4)
    assert prov["processes"] == 2
    rows = [[json.loads(ln) for ln in (d / "per_start.jsonl").read_text().splitlines()] for d in (one, two)]
    assert len(rows[0]) > 0
    _close(rows[1], rows[0], rel=1e-4)


def _close(got, want, rel: float, path: str = "") -> None:
    """got == want, floats within `rel` (relative, 1e-12 absolute near 0)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for k in want:
            _close(got[k], want[k], rel, f"{path}/{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, rel, f"{path}[{i}]")
    elif isinstance(want, float) and isinstance(got, float):
        assert got == pytest.approx(want, rel=rel, abs=1e-12), path
    else:
        assert got == want, path


@pytest.mark.slow
def test_profile_and_ablate_over_two_processes_equal_one(tmp_path):
    for name, run in (("tree", TREE.with_(limit=6)), ("chain", Settings.of(limit=6, max_new_tokens=8))):
        api.profile(run.with_(output_dir=str(tmp_path / f"{name}1")), ProfileOptions(max_steps=4), progress=False)
        _torchrun("profile", *_run_args(run), "--max-steps", 4, "--output-dir", tmp_path / f"{name}2")
        _same(tmp_path / f"{name}1", tmp_path / f"{name}2", "profile.json")
    # ablate: variants, and a tree grid (one expansion per topk serves every num_draft_tokens)
    base = Settings.of(limit=4, max_new_tokens=8)
    variants, ratio = ["aux_layers=0,3,6"], 0.1
    api.ablate(base.with_(output_dir=str(tmp_path / "a1")),
               AblateOptions(max_steps=3, vary=tuple(variants), cost_ratio=ratio, topk_grid=(1, 2),
                             draft_tokens_grid=(3, 5)), progress=False)
    _torchrun("ablate", *_run_args(base), "--max-steps", "3", "--vary", variants[0], "--cost-ratio", ratio,
              "--topk-grid", "1,2", "--draft-tokens-grid", "3,5", "--output-dir", tmp_path / "a2")
    (a, _), (b, prov) = (_bare(json.loads((tmp_path / d / "ablation.json").read_text())) for d in ("a1", "a2"))
    assert b == a and {r["topk"] for r in a["rows"]} == {1, 2} and prov["processes"] == 2
    assert (tmp_path / "a2" / "ablation.csv").read_bytes() == (tmp_path / "a1" / "ablation.csv").read_bytes()


@pytest.mark.slow
def test_diagnose_sweep_over_two_processes_equals_one(tmp_path):
    from eagle_eval.diagnose.options import DiagnoseOptions
    from eagle_eval.diagnose.run import diagnose
    run = Settings.of(limit=8, max_new_tokens=8)
    diagnose(run.with_(output_dir=str(tmp_path / "one")), DiagnoseOptions(template_check=False))
    out = _torchrun("diagnose", "--limit", 8, *SMALL, "--no-template-check", "--output-dir", tmp_path / "two",
                    check=False)
    one = json.loads((tmp_path / "one" / "diagnosis.json").read_text())
    # torchrun reports any failing process as its own exit status 1 (the command's own status is rank 0's,
    # in its stderr and in diagnosis.json)
    assert out.returncode == (0 if one["exit_status"] == 0 else 1), out.stderr[-3000:]
    (a, _), (b, prov) = _bare(one), _bare(json.loads((tmp_path / "two" / "diagnosis.json").read_text()))
    assert b == a and a["sweep"]["rows"] and prov["processes"] == 2


@pytest.mark.slow
def test_server_check_oracle_side_over_two_processes_equals_one(tmp_path):
    from fake_servers import Engine, serve

    from eagle_eval.servers.check import run_server_check
    from eagle_eval.servers.options import ServerCheckOptions
    cfg = Settings.of(dataset=MT_BENCH, max_new_tokens=8)
    engine_oracle = api.load_oracle(cfg)
    with serve(Engine(engine_oracle, "sglang")) as url:
        ref = run_server_check(cfg.with_(output_dir=str(tmp_path / "one")), ServerCheckOptions(backend="sglang", url=url))
    with serve(Engine(engine_oracle, "sglang")) as url:
        _torchrun("server-check", "--backend", "sglang", "--url", url, "--dataset", MT_BENCH, *SMALL,
                  "--output-dir", tmp_path / "two")
    assert ref.exit_status == 0
    (a, _), (b, prov) = (_bare(json.loads((tmp_path / d / "server_check.json").read_text())) for d in ("one", "two"))
    for report in (a, b):                                  # each run had a server of its own, on its own port
        assert report["server"].pop("url").startswith("http://127.0.0.1:")
        report["server_check"].pop("url")
        report["config"].pop("url")
    assert b == a and len(a["requests"]) == 6 and prov["processes"] == 2


@pytest.mark.slow
def test_processes_with_other_settings_are_refused_at_the_start(tmp_path):
    out = _torchrun("run", "--limit", 2, *SMALL, "--output-dir", tmp_path / "out", script=CHILD, check=False,
                    env=_env(EAGLE_EVAL_TEST_ARGS="1:--num-steps 4"), timeout=120)
    assert out.returncode != 0
    for rank in (0, 1):
        assert (f"[rank {rank}/2] eagle-eval: error: the processes disagree on the settings: rank 1 differs from "
                "rank 0 in num_steps") in out.stderr
    assert not (tmp_path / "out").exists()                     # refused before the folder was taken


@pytest.mark.slow
def test_a_second_launch_into_a_running_folder_is_refused(tmp_path):
    folder = tmp_path / "out"
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(CHILD), "run",
            "--limit", "6", *SMALL, "--output-dir", str(folder)]
    gate = tmp_path / "go"                      # the first run's decodes wait for this file
    first = subprocess.Popen(args, cwd=REPO_ROOT, env=_env(EAGLE_EVAL_TEST_GATE=str(gate)), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (folder / "eagle_eval_run.json").exists():
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.2)
        second = _torchrun("run", "--limit", 6, *SMALL, "--output-dir", folder, check=False, timeout=120)
        assert second.returncode != 0
        assert "[rank 0/2] eagle-eval: error: --output-dir" in second.stderr
        assert "another eagle-eval is writing there right now" in second.stderr
        assert "[rank 1/2] eagle-eval: error: rank 0 stopped the run: --output-dir" in second.stderr
        assert first.poll() is None                                         # the first run goes on
        gate.touch()
        _, err = first.communicate(timeout=300)
        assert first.returncode == 0, err[-3000:]
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGTERM)
    ref = api.evaluate(Settings.of(limit=6, max_new_tokens=8), progress=False)
    got = [SampleRecord.from_json(json.loads(r)) for r in (folder / "samples.jsonl").read_text().splitlines()]
    assert got == ref.samples


@pytest.mark.slow
def test_parallel_benchmark_runs_tiny_and_its_records_agree(tmp_path):
    """The GPU command's code (a random target built, 1 vs 2 processes) at tiny shapes on the CPU."""
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_parallel.py"), "--shape", "tiny",
                    "--prompts", "5", "--max-new-tokens", "8", "--work", str(tmp_path / "work"), "--out",
                    str(tmp_path)], check=True, capture_output=True, timeout=600, env=_env())
    res = json.loads((tmp_path / "bench_parallel_tiny.json").read_text())
    assert res["records_byte_equal"] is True
    two = res["runs"]["2"][0]
    assert two["prompts"] == 5 and sorted(r["rank"] for r in two["per_rank"]) == [0, 1]
    assert sum(r["items"] for r in two["per_rank"]) == 5 and res["speedup_decode"] > 0
