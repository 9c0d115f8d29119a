"""GPU speed: the profile against a plain forward, the graph-captured loop against the eager
one and the decode floor, and many prompts at once, side by side in one process, on both benchmark
shapes (bench_gpu.py's Llama-3.1-8B shape, bench_deepseek.py's DeepSeek-V3 width with a few layers).

Per shape:
  profile   the profile step (all num_steps <= max_steps from one teacher-forced pass) in tokens/s, as
            it is now (survivor-only drafting, profile/run_lengths.py) and as it was (the dense
            all-starts unroll of every step), against a plain teacher-forced forward of the same batch;
            the parts (target forward with feature capture, drafting); both give equal run lengths
  loop      ms per cycle: the reference loop (chain.speculative_decode), the batched loop at B = 1
            eager, and replayed as a CUDA graph (or the reason it is not); a plain batch-1 decode step
            and the weight-bandwidth floor of one (parameter bytes / measured copy bandwidth); whether
            the graphed tokens equal the eager batched ones and where the reference loop's part (bf16)
  batched   tokens/s of batched_decode for B = 1, 4, 16, 64 (graphs where they can be captured), with
            the time spent in prefill apart
  prefill   B = 64 over the same prompts, the rows prefilled one at a time against together (the
            default padded-token budget), side by side: prefill seconds, tokens/s, equal tokens
  split     (--split-cpu-layers N, DeepSeek shape) the last N decoder layers on the CPU through
            accelerate, B = 1, 4, 16, 64: what batching buys when part of the target is slow
  --profiler  a torch.profiler table of the profile step, before and after, into the log

    python benchmarks/bench_speed.py                      # one H200: every figure, both shapes
    python benchmarks/bench_speed.py --tiny               # CPU smoke run of the same code, tiny shapes

Writes bench_speed.json under --out (benchmarks/results/h200_speed_bf16.json is a kept copy) and ends
with one table of every figure. Random weights accept almost nothing: a cycle emits about one token.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench_deepseek  # noqa: E402
import bench_gpu  # noqa: E402
from bench_gpu import sync, timed  # noqa: E402

from eagle_eval.models.capture import FeatureCapture  # noqa: E402
from eagle_eval.profile import teacher_forced as prof  # noqa: E402
from eagle_eval.loop.batched import batched_decode  # noqa: E402
from eagle_eval.loop.reference import speculative_decode  # noqa: E402
from eagle_eval.profile.unroll import unroll_chains  # noqa: E402
from eagle_eval.loop.graphed import capture_blockers  # noqa: E402
from eagle_eval.profile.run_lengths import chain_run_lengths  # noqa: E402


def batch_ids(seqs):
    width = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
    return ids, mask


def profile_section(spec, prompts, max_steps, max_new, profiler_out=None):
    conts = prof.greedy_continuations(spec, prompts, max_new + max_steps, 0, 1 << 30)
    items = [(SimpleNamespace(id=str(i), category="", input_ids=p), c) for i, (p, c) in enumerate(zip(prompts, conts))]
    seqs = [p + c for p, c in zip(prompts, conts)]
    n_tokens = sum(map(len, seqs))
    ids, mask = batch_ids(seqs)
    dev = spec.draft_device
    lengths = torch.tensor([len(s) for s in seqs], device=dev)

    def forward_captured():
        with FeatureCapture(spec.target.layers, spec.aux_hf, dev) as cap:
            logits = spec.target.forward(ids, None, attention_mask=mask, upcast=False)
            return logits, cap.pop()
    logits, aux = forward_captured()
    ids_d = ids.to(dev)
    embeds = spec.embed(ids_d[:, 1:])

    def drafting_now():
        return chain_run_lengths(spec.head, aux[:, :-1], embeds, ids_d, lengths, max_steps, spec.position_offset)

    def drafting_before():
        steps = unroll_chains(spec.head, aux[:, :-1], embeds, max_steps, spec.position_offset, argmax_only=True)
        preds = torch.stack(steps, dim=1)
        return [prof.run_lengths_from_predictions(preds[r, :, : len(s) - 1], ids_d[r, : len(s)])
                for r, s in enumerate(seqs)]

    now, before = drafting_now(), drafting_before()
    equal = all(torch.equal(now[r, : len(s) - 1], before[r]) for r, s in enumerate(seqs))
    del logits

    def step_before():                   # profile_batch as it was: forward, argmax, dense unroll
        logits, a = forward_captured()
        logits.argmax(-1)
        steps = unroll_chains(spec.head, a[:, :-1], spec.embed(ids_d[:, 1:]), max_steps, spec.position_offset,
                              argmax_only=True)
        torch.stack(steps, dim=1).cpu()

    t_now = timed(lambda: prof.profile_batch(spec, items, max_steps, max_new, 0), reps=3)
    t_before = timed(step_before, reps=3)
    t_forward = timed(lambda: spec.target.forward(ids, None, upcast=False), reps=3)
    t_forward_cap = timed(forward_captured, reps=3)
    t_draft_now, t_draft_before = timed(drafting_now, reps=3), timed(drafting_before, reps=3)
    out = {"prompts": len(prompts), "tokens": n_tokens, "max_steps": max_steps,
           "forward_tokens_per_s": n_tokens / t_forward,
           "profile_step_tokens_per_s": n_tokens / t_now, "profile_step_share_of_forward": t_forward / t_now,
           "before_tokens_per_s": n_tokens / t_before, "before_share_of_forward": t_forward / t_before,
           "parts_ms": {"forward": t_forward * 1e3, "forward_with_capture": t_forward_cap * 1e3,
                        "drafting_now": t_draft_now * 1e3, "drafting_before": t_draft_before * 1e3,
                        "profile_step_now": t_now * 1e3, "profile_step_before": t_before * 1e3},
           "mean_run_length": float(now[:, :-1].float().mean()), "run_lengths_equal_before": equal}
    if profiler_out is not None and torch.cuda.is_available():
        from torch.profiler import ProfilerActivity, profile
        now_fn = lambda: prof.profile_batch(spec, items, max_steps, max_new, 0)      # noqa: E731
        for name, fn in (("before", step_before), ("now", now_fn)):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                fn()
                sync()
            table = p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60)
            Path(profiler_out).write_text(Path(profiler_out).read_text() + f"\n== {name}\n{table}"
                                          if Path(profiler_out).exists() else f"== {name}\n{table}")
            print(f"[profiler {name}]\n{table}", flush=True)
    return out


def bandwidth_gb_s(device) -> float | None:
    if device == "cpu":
        return None
    x = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), reps=5)
    return 2 * x.numel() / t / 1e9


def loop_section(spec, prompts, num_steps, new, graphs):
    target = spec.target
    p = prompts[0]
    ref = []
    t_ref = timed(lambda: ref.append(speculative_decode(spec, p, num_steps, new, set())), reps=1)
    ref_cycles = len(ref[-1].accepted_per_cycle)
    runs = {}
    for name, g in (("eager", False), ("graphed", graphs)):
        box = []
        t = timed(lambda g=g: box.append(batched_decode(spec, [p], num_steps, new, set(), 1, cuda_graphs=g)), reps=1)
        r = box[-1]
        runs[name] = {"ms_per_cycle": (t - r.prefill_s - r.capture_s) / r.cycles * 1e3, "capture_s": r.capture_s,
                      "cuda_graphs": r.cuda_graphs,
                      "fallback": r.fallback, "tokens": r.decoded[0].output_ids}
    cache = target.new_cache()
    ctx = len(p) + new // 2
    target.forward(torch.randint(10, target.info.vocab_size, (1, ctx)), cache)

    def decode_step():
        target.forward(torch.randint(10, target.info.vocab_size, (1, 1)), cache)
        target.rollback(cache, ctx)
    t_decode = timed(decode_step, reps=10)
    params = sum(x.numel() * x.element_size() for x in target.model.parameters())
    # one decode step reads every weight once, but of a MoE layer's routed experts only the top-k
    experts = sum(x.numel() * x.element_size() for m in target.model.modules() if type(m).__name__.endswith("Experts")
                  for x in m.parameters(recurse=False))
    cfg = target.model.config
    active = params - experts + (experts * cfg.num_experts_per_tok / cfg.n_routed_experts if experts else 0)
    bw = bandwidth_gb_s(target.input_device)
    ref_tokens = ref[-1].output_ids
    part = next((i for i, (a, b) in enumerate(zip(ref_tokens, runs["graphed"]["tokens"])) if a != b), None)
    return {"num_steps": num_steps, "new_tokens": new,
            "reference_ms_per_cycle": t_ref / ref_cycles * 1e3,
            "batched_b1_eager_ms_per_cycle": runs["eager"]["ms_per_cycle"],
            "graphed_ms_per_cycle": runs["graphed"]["ms_per_cycle"],
            "graphed": runs["graphed"]["cuda_graphs"], "capture_s": runs["graphed"]["capture_s"],
            "graph_fallback": runs["graphed"]["fallback"],
            "decode_step_ms": t_decode * 1e3, "target_param_gib": params / 2**30,
            "decode_read_gib": active / 2**30, "copy_gb_s": bw,
            "decode_floor_ms": active / (bw * 1e9) * 1e3 if bw else None,
            "graphed_tokens_equal_eager": runs["graphed"]["tokens"] == runs["eager"]["tokens"],
            "batched_tokens_equal_reference": runs["eager"]["tokens"] == ref_tokens,
            "graphed_first_difference_from_reference": part}


def batched_section(spec, prompts, num_steps, new, graphs, sizes, prompts_for):
    out = {}
    for b in sizes:
        n = prompts_for(b)
        box = []
        t = timed(lambda: box.append(batched_decode(spec, prompts[:n], num_steps, new, set(), b, cuda_graphs=graphs)),
                  reps=1)
        r = box[-1]
        tokens = sum(len(d.output_ids) for d in r.decoded)
        out[str(b)] = {"prompts": n, "tokens": tokens, "seconds": t, "tokens_per_s": tokens / t,
                       "decode_tokens_per_s": tokens / max(t - r.prefill_s - r.capture_s, 1e-9),
                       "prefill_s": r.prefill_s, "capture_s": r.capture_s,
                       "cycles": r.cycles, "ms_per_cycle": (t - r.prefill_s - r.capture_s) / r.cycles * 1e3,
                       "cuda_graphs": r.cuda_graphs, "fallback": r.fallback}
        print(json.dumps({"B": b, **out[str(b)]}), flush=True)
    return out


def prefill_section(spec, prompts, num_steps, new, graphs, b):
    """B rows admitted one at a time (the loop before batched prefills: a budget of 1 token makes every
    prefill group one row) against together (the default budget), side by side: the same B prompts."""
    from eagle_eval.loop import batched

    out, tokens, default = {}, {}, batched.PREFILL_TOKENS
    for label, budget in (("one_row_at_a_time", 1), ("batched", default)):
        batched.PREFILL_TOKENS = budget
        try:
            box = []
            t = timed(lambda: box.append(batched_decode(spec, prompts[:b], num_steps, new, set(), b, cuda_graphs=graphs)),
                      reps=1)
        finally:
            batched.PREFILL_TOKENS = default
        r = box[-1]
        tokens[label] = [d.output_ids for d in r.decoded]
        n = sum(len(x) for x in tokens[label])
        out[label] = {"prefill_budget_tokens": budget, "prefill_s": r.prefill_s, "seconds": t, "tokens_per_s": n / t}
    out["B"] = b
    out["prefill_speedup"] = out["one_row_at_a_time"]["prefill_s"] / out["batched"]["prefill_s"]
    out["tokens_per_s_ratio"] = out["batched"]["tokens_per_s"] / out["one_row_at_a_time"]["tokens_per_s"]
    out["tokens_equal"] = tokens["batched"] == tokens["one_row_at_a_time"]
    out["first_differing_prompt"] = next((i for i, (x, y) in enumerate(zip(tokens["batched"], tokens["one_row_at_a_time"]))
                                          if x != y), None)
    print(json.dumps({"prefill": out}), flush=True)
    return out


def shape_sections(name, oracle, args, deadline):
    spec = oracle.speculator
    gpu = torch.cuda.is_available() and not args.tiny
    vocab = spec.target.info.vocab_size
    g = torch.Generator().manual_seed(1)
    res = {"capture_blocker": capture_blockers(spec)}
    cfg = {"8b": dict(profile=(16, 128, 64, 8), loop=(5, 64), batched=(5, 64, 128)),
           "deepseek": dict(profile=(8, 512, 64, 5), loop=(3, 32), batched=(3, 32, 128))}[name]
    if args.tiny:
        cfg = dict(profile=(4, 24, 12, 4), loop=(3, 12), batched=(3, 12, 16))
    n_prof, len_prof, new_prof, steps_prof = cfg["profile"]
    prof_prompts = [torch.randint(10, vocab, (len_prof,), generator=g).tolist() for _ in range(n_prof)]
    res["profile"] = profile_section(spec, prof_prompts, steps_prof, new_prof,
                                     Path(args.out) / f"profiler_{name}.txt" if args.profiler else None)
    print(json.dumps({name: {"profile": res["profile"]}}), flush=True)
    s, new, plen = cfg["batched"]
    prompts = [torch.randint(10, vocab, (plen,), generator=g).tolist() for _ in range(64)]
    res["loop"] = loop_section(spec, prompts, *cfg["loop"], graphs=gpu)
    print(json.dumps({name: {"loop": res["loop"]}}), flush=True)
    if time.time() < deadline:
        res["batched"] = batched_section(spec, prompts, s, new, gpu, [1, 4, 16, 64] if not args.tiny else [1, 4],
                                         lambda b: min(64, max(4, 2 * b)) if not args.tiny else 4)
    else:
        res["batched"] = "skipped: past --deadline"
    if time.time() < deadline:
        res["prefill"] = prefill_section(spec, prompts, s, new, gpu, 64 if not args.tiny else 4)
    else:
        res["prefill"] = "skipped: past --deadline"
    return res


def split_section(model, head, args, vocab):
    """The last N decoder layers computed on the CPU (moved there, an accelerate AlignDevicesHook moving
    their inputs in and their outputs back), the rest on the GPU: what batching buys when part of the
    target is slow. Not captured (parameters on the CPU)."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    n = model.config.num_hidden_layers
    cpu = list(range(n - args.split_cpu_layers, n))
    for i in cpu:
        layer = model.model.layers[i].to("cpu")
        add_hook_to_module(layer, AlignDevicesHook(execution_device="cpu", io_same_device=True))
    oracle = bench_deepseek.make_oracle(model, head, 3, 8)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(10, vocab, (16,), generator=g).tolist() for _ in range(64)]
    ref = [speculative_decode(oracle.speculator, p, 3, 8, set()).output_ids for p in prompts[:2]]
    out = {"cpu_layers": cpu, "capture_blocker": capture_blockers(oracle.speculator)}
    out["batched"] = batched_section(oracle.speculator, prompts, 3, 8, True, [1, 4, 16, 64], lambda b: max(2, b))
    first = batched_decode(oracle.speculator, prompts[:2], 3, 8, set(), 2).decoded
    out["batched_tokens_equal_reference"] = [d.output_ids for d in first] == ref
    return out


def table(results) -> str:
    rows = []
    for name in ("8b", "deepseek"):
        r = results.get(name)
        if not isinstance(r, dict):
            continue
        p, lp = r["profile"], r["loop"]
        rows += [f"[{name}] plain teacher-forced forward        {p['forward_tokens_per_s']:>10.0f} tokens/s",
                 f"[{name}] profile step, before (dense unroll) {p['before_tokens_per_s']:>10.0f} tokens/s  "
                 f"{100 * p['before_share_of_forward']:.0f}% of the forward",
                 f"[{name}] profile step, now (survivors)       {p['profile_step_tokens_per_s']:>10.0f} tokens/s  "
                 f"{100 * p['profile_step_share_of_forward']:.0f}% of the forward  (run lengths equal: "
                 f"{p['run_lengths_equal_before']})",
                 f"[{name}] reference loop                      {lp['reference_ms_per_cycle']:>10.1f} ms/cycle",
                 f"[{name}] batched loop B=1, eager             {lp['batched_b1_eager_ms_per_cycle']:>10.1f} ms/cycle",
                 f"[{name}] batched loop B=1, {'CUDA graph' if lp['graphed'] else 'eager (fallback)'}"
                 f"{' ' * (18 if lp['graphed'] else 12)}{lp['graphed_ms_per_cycle']:>10.1f} ms/cycle"
                 + ("" if lp["graphed"] else f"  ({lp['graph_fallback']})"),
                 f"[{name}] plain batch-1 decode step           {lp['decode_step_ms']:>10.1f} ms"
                 + (f"   (weight-bandwidth floor {lp['decode_floor_ms']:.1f} ms)" if lp["decode_floor_ms"] else ""),
                 f"[{name}] graphed tokens == eager: {lp['graphed_tokens_equal_eager']}; batched == reference: "
                 f"{lp['batched_tokens_equal_reference']} "
                 f"(first difference {lp['graphed_first_difference_from_reference']})"]
        if isinstance(r.get("batched"), dict):
            for b, x in r["batched"].items():
                rows.append(f"[{name}] batched B={b:<3} {x['tokens_per_s']:>8.0f} tokens/s "
                            f"({x['decode_tokens_per_s']:.0f} without prefill and capture), "
                            f"{x['ms_per_cycle']:.1f} ms/cycle, graphs {x['cuda_graphs']}")
        if isinstance(r.get("prefill"), dict):
            x = r["prefill"]
            rows.append(f"[{name}] B={x['B']} prefill one row at a time {x['one_row_at_a_time']['prefill_s']:.2f} s, "
                        f"batched {x['batched']['prefill_s']:.2f} s ({x['prefill_speedup']:.1f}x); tokens/s "
                        f"{x['one_row_at_a_time']['tokens_per_s']:.0f} -> {x['batched']['tokens_per_s']:.0f} "
                        f"({x['tokens_per_s_ratio']:.2f}x); tokens equal: {x['tokens_equal']}")
    sp = results.get("split")
    if isinstance(sp, dict):
        for b, x in sp["batched"].items():
            rows.append(f"[deepseek, layers {sp['cpu_layers']} on the CPU] B={b:<3} {x['tokens_per_s']:>7.1f} tokens/s "
                        f"({x['decode_tokens_per_s']:.1f} without prefill), {x['ms_per_cycle']:.0f} ms/cycle")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny shapes")
    ap.add_argument("--shapes", default="8b,deepseek")
    ap.add_argument("--layers", type=int, default=4, help="DeepSeek decoder layers (the first dense)")
    ap.add_argument("--split-cpu-layers", type=int, default=0, help="DeepSeek: also run with the last N layers on CPU")
    ap.add_argument("--profiler", action="store_true", help="torch.profiler tables of the profile step")
    ap.add_argument("--deadline", type=float, default=480, help="seconds after which optional parts are skipped")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    deadline = time.time() + args.deadline
    gpu = torch.cuda.is_available() and not args.tiny
    device, dtype = ("cuda:0", torch.bfloat16) if gpu else ("cpu", torch.float32)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "dtype": str(dtype),
               "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    for name in args.shapes.split(","):
        t0 = time.perf_counter()
        try:
            if name == "8b":
                model, head = bench_gpu.build("tiny" if args.tiny else "8b", device, dtype)
                oracle = bench_gpu.make_oracle(model, head, 5, 64)
            else:
                model, head = bench_deepseek.build(args.tiny, args.layers, device, dtype)
                oracle = bench_deepseek.make_oracle(model, head, 3, 64)
            print(f"built {name} in {time.perf_counter() - t0:.1f}s", flush=True)
            results[name] = shape_sections(name, oracle, args, deadline)
            if name == "deepseek" and args.split_cpu_layers and time.time() < deadline:
                del oracle
                try:
                    results["split"] = split_section(model, head, args, model.config.vocab_size)
                except Exception as exc:
                    results["split"] = f"failed: {type(exc).__name__}: {exc}"
        except Exception as exc:                     # one shape's failure must not lose the other's figures
            import traceback
            traceback.print_exc()
            results[name] = f"failed: {type(exc).__name__}: {exc}"
        model = head = oracle = None
        gc.collect()
        torch.cuda.empty_cache() if gpu else None
        (Path(args.out) / "bench_speed.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
