"""Scale-out benchmark: the same `eagle-eval run` in 1 process and in N processes, side by side.

    python benchmarks/bench_parallel.py                        # CPU: the bundled pair, each process 1 thread
    python benchmarks/bench_parallel.py --shape 1b --prompts 64 --max-new-tokens 128 --out benchmarks/results
                                                               # GPU: N replicas of a 1B-shaped target

N processes are started by torchrun (`python -m torch.distributed.run --standalone --nproc-per-node N -m
eagle_eval run ...`), one process by `python -m eagle_eval run ...`, on the same prompts into their own
folders. For each it reports the wall time of the whole command (start, load, decode, report) and of the
decode phase (`report.json` provenance.work.wall_s, on rank 0), each rank's busy seconds in the loop and
its share of the decode phase (1.0 = never waiting for work or for the gather), and checks that the
records are byte-equal. The ratio 1-process / N-process decode time is the scale-out; a utilisation near
1 shows that handing out questions and gathering records to rank 0 is not what limits it.

Shapes: `bundled` is checkpoints/target + checkpoints/draft; `1b` builds into --work a random
Llama-3.2-1B-shaped target (hidden 2048, 16 layers, 32/8 heads, MLP 8192) with the bundled tokenizer (vocab
929) and a random EAGLE-3 head of its width, saved in bf16 (`tiny`: the same code at hidden 128, a CPU smoke
run). `--dtype auto`: bf16 on a GPU, fp32 on the CPU. Random weights accept almost nothing: every cycle
emits about one token, so what is timed is the loop, not a speedup. On one GPU the N replicas share it
(the default placement, docs/parallel.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# hidden, layers, attention heads, KV heads, MLP width: Llama-3.2-1B's, and a tiny one for a CPU smoke run
SHAPES = {"1b": (2048, 16, 32, 8, 8192), "tiny": (128, 8, 4, 2, 256)}


def build(work: Path, shape: str) -> tuple[Path, Path]:
    """A random Llama target of `shape` with the bundled tokenizer and an EAGLE-3 head of its width (bf16
    for 1b, fp32 for tiny), built once per --work folder."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from eagle_eval.heads.io import save_head
    from eagle_eval.heads.eagle3.layer import Eagle3Head, HeadConfig

    hidden, layers, heads, kv, mlp = SHAPES[shape]
    dtype = torch.bfloat16 if shape == "1b" else torch.float32
    target, head = work / f"target-{shape}", work / f"head-{shape}"
    bundled = REPO / "checkpoints" / "target"
    vocab = json.loads((bundled / "config.json").read_text())["vocab_size"]
    if not (target / "config.json").exists():
        cfg = AutoConfig.for_model("llama", vocab_size=vocab, hidden_size=hidden, intermediate_size=mlp,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                   max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=1,
                                   eos_token_id=2, pad_token_id=0)
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=dtype).save_pretrained(target)
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(bundled / f, target / f)
    if not (head / "config.json").exists():
        torch.manual_seed(1)
        h = Eagle3Head(HeadConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                                  head_dim=hidden // heads, intermediate_size=mlp, vocab_size=vocab,
                                  draft_vocab_size=vocab, target_hidden_size=hidden, max_position_embeddings=4096))
        for p in h.parameters():
            if p.dim() > 1:
                torch.nn.init.normal_(p, std=0.02)
        save_head(h.to(dtype), head)                 # aux layers: the engine default HF[2], HF[N//2], HF[N-3]
    return target, head


def write_prompts(path: Path, n: int) -> Path:
    """n prompts: the bundled 32 in turn, each copy with its own id."""
    rows = [json.loads(r) for r in (REPO / "data" / "prompts.jsonl").read_text().splitlines() if r.strip()]
    path.write_text("".join(json.dumps({**rows[i % len(rows)], "id": f"{rows[i % len(rows)]['id']}-{i}"}) + "\n"
                            for i in range(n)))
    return path


def launch(n: int, args: list[str], out: Path, env: dict) -> dict:
    """One `eagle-eval run` with n processes; wall time and the report's work section."""
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}"] if n > 1
           else [sys.executable]) + ["-m", "eagle_eval", "run", *args, "--output-dir", str(out), "--overwrite",
                                     "--allow-load-errors"]           # random weights: an untrained head by design
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    work = report["provenance"]["work"]
    return {"processes": n, "wall_s": round(wall, 3), "decode_wall_s": work["wall_s"],
            "per_rank": [{**r, "share_of_decode": round(r["busy_s"] / work["wall_s"], 3)} for r in work["per_rank"]],
            "tau": report["summary"]["accept_length"], "prompts": report["summary"]["prompts"],
            "emitted_tokens": report["summary"]["emitted_tokens"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=("bundled", *SHAPES), default="bundled")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1, help="Runs of each; the medians are compared.")
    ap.add_argument("--work", default="/tmp/eagle-eval-bench-parallel")
    ap.add_argument("--out", default=None, help="Folder for bench_parallel_<shape>.json.")
    a = ap.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    args = ["--prompts", str(write_prompts(work / "prompts.jsonl", a.prompts)), "--max-new-tokens",
            str(a.max_new_tokens)]
    if a.shape != "bundled":
        target, head = build(work, a.shape)
        args += ["--target", str(target), "--draft", str(head)]          # --dtype auto: bf16 on a GPU
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}   # each process one thread
    runs = {1: [], a.processes: []}
    for rep in range(a.repeats):
        for n in runs:
            runs[n].append(launch(n, args, work / f"run-{n}", env))
            print(f"repeat {rep + 1}: {n} process(es): {runs[n][-1]['wall_s']:.2f} s "
                  f"(decode {runs[n][-1]['decode_wall_s']:.2f} s)", flush=True)
    samples = [(work / f"run-{n}" / "samples.jsonl").read_bytes() for n in runs]
    equal = samples[0] == samples[-1]
    med = {n: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "decode_wall_s")} for n, rs in runs.items()}
    import torch
    result = {"shape": a.shape, "prompts": a.prompts, "max_new_tokens": a.max_new_tokens, "repeats": a.repeats,
              "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
              "cpu_cores": os.cpu_count(), "records_byte_equal": equal, "runs": runs, "median": med,
              "speedup_wall": med[1]["wall_s"] / med[a.processes]["wall_s"],
              "speedup_decode": med[1]["decode_wall_s"] / med[a.processes]["decode_wall_s"]}
    print(f"\n{a.shape}, {a.prompts} prompts x {a.max_new_tokens} new tokens, {result['device']}:")
    print(f"  1 process   {med[1]['wall_s']:7.2f} s whole command, {med[1]['decode_wall_s']:7.2f} s decoding")
    print(f"  {a.processes} processes {med[a.processes]['wall_s']:7.2f} s whole command, "
          f"{med[a.processes]['decode_wall_s']:7.2f} s decoding")
    print(f"  speedup     {result['speedup_wall']:.2f}x whole command, {result['speedup_decode']:.2f}x decoding; "
          f"records byte-equal: {equal}")
    last = runs[a.processes][-1]["per_rank"]
    print("  per rank (last run): " + ", ".join(f"rank {r['rank']} {r['items']} prompts, busy {r['busy_s']:.2f} s "
                                               f"({r['share_of_decode']:.0%} of the decode phase)" for r in last))
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / f"bench_parallel_{a.shape}.json").write_text(json.dumps(result, indent=2) + "\n")
    if not equal:
        raise SystemExit("the records differ between 1 and N processes")


if __name__ == "__main__":
    main()
