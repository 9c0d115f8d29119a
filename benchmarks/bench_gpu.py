"""GPU benchmark: a Llama-3.1-8B-shaped target and an 8B-shaped EAGLE-3 head, random bf16 weights.

Measures, side by side in one process (docs/eagle3.md, issues 2-4):
  loop     plain greedy decode time per token; the reference loop's time per cycle; the sum of its
           parts (one verify forward of S+1 tokens + S draft steps); overhead = cycle / parts - 1
  split    the same loop with the target split over 2 GPUs (accelerate device_map); tokens must equal
  profile  the teacher-forced profile for all S <= 8 (generation included, and with --responses)
           against the reference loop once per S; the profile step alone in tokens/s against a plain
           teacher-forced target forward of the same batch
  tree     verify forward of a tree of D in {8, 16, 32, 64} nodes vs the chain verify of the same S,
           and whole tree-loop cycles vs chain cycles

    python benchmarks/bench_gpu.py                 # on the GPU machine (one or two H200s)
    python benchmarks/bench_gpu.py --tiny          # a CPU smoke run of the same code, tiny shapes

Random weights accept almost nothing, so every cycle emits about one token: the loop's cost per
cycle is what is measured, not its speedup. Absolute times are only meaningful on the GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_eval.api import profile_prompts  # noqa: E402
from eagle_eval.heads.io import vocab_map_from_used  # noqa: E402
from eagle_eval.heads.eagle3.layer import Eagle3Head, HeadConfig  # noqa: E402
from eagle_eval.oracle import oracle_from_models  # noqa: E402
from eagle_eval.records import Prompt  # noqa: E402
from eagle_eval.settings import ProfileOptions, Settings  # noqa: E402
from eagle_eval.loop import reference as chain  # noqa: E402
from eagle_eval.loop.draft import DraftState  # noqa: E402
from eagle_eval.loop.plain import plain_greedy  # noqa: E402
from eagle_eval.profile.teacher_forced import greedy_continuations  # noqa: E402
from eagle_eval.loop.tree import select_tree  # noqa: E402
from eagle_eval.loop.verify import verify_chain, verify_tree  # noqa: E402

SHAPES = {
    "8b": dict(hidden=4096, layers=32, heads=32, kv=8, inter=14336, vocab=128256, draft_vocab=32000),
    "tiny": dict(hidden=64, layers=8, heads=4, kv=2, inter=128, vocab=512, draft_vocab=256),
}


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, reps=5):
    fn()
    sync()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def build(shape, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    cfg = LlamaConfig(hidden_size=s["hidden"], num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                      num_key_value_heads=s["kv"], intermediate_size=s["inter"], vocab_size=s["vocab"],
                      max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    hcfg = HeadConfig(hidden_size=s["hidden"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
                      head_dim=s["hidden"] // s["heads"], intermediate_size=s["inter"], vocab_size=s["vocab"],
                      draft_vocab_size=s["draft_vocab"], target_hidden_size=s["hidden"], rope_theta=500000.0)
    with torch.device(device):
        head = Eagle3Head(hcfg)
    d2t, t2d = vocab_map_from_used(torch.randperm(s["vocab"])[: s["draft_vocab"]], s["vocab"])
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    return model, head.to(device=device, dtype=dtype).eval()


def make_oracle(model, head, num_steps, max_new, aux_hf=None, **more):
    """An Oracle over an in-memory target + head; aux_hf: HF indices (default: the engine defaults); more: other
    settings (topk, num_draft_tokens)."""
    settings = Settings.of(num_steps=num_steps, max_new_tokens=max_new, draft_embedding="target",
                           aux_layers=aux_hf, aux_convention="hf", **more)
    return oracle_from_models(model, head, settings)


def bench_loop(oracle, prompts, s, max_new):
    spec = oracle.speculator
    target, head = spec.target, spec.head
    p = prompts[0]
    t_greedy = timed(lambda: plain_greedy(target, p, max_new, set()), reps=2) / max_new
    runs = []

    def loop():
        runs.append(chain.speculative_decode(spec, p, s, max_new, set()))
    t_loop = timed(loop, reps=2)
    cycles = len(runs[-1].accepted_per_cycle)
    # the parts, on a cache of the same length as mid-decode
    cache = target.new_cache()
    ctx = len(p) + max_new // 2
    ids = torch.randint(0, target.info.vocab_size, (1, ctx))
    target.forward(ids, cache)

    def verify():
        target.forward(torch.randint(0, target.info.vocab_size, (1, s + 1)), cache)
        target.rollback(cache, ctx)
    state = DraftState(head, spec.embed)
    dev = spec.draft_device
    state.extend(torch.randn(1, ctx, 3 * target.info.hidden_size, device=dev, dtype=head.lm_head.weight.dtype),
                 torch.randint(0, 256, (1, ctx), device=dev))
    tok = torch.randint(0, 256, (1, 1), device=dev)
    pos = torch.tensor([[ctx]], device=dev)

    def draft_step():
        out = state.head.step(spec.embed(tok), state.last_out, pos, state.cache)
        head.to_target_ids(head.logits(out)[:, -1].argmax(-1)).tolist()
        state.cache.rollback(ctx)
    t_verify, t_draft = timed(verify), timed(draft_step)
    parts = t_verify + s * t_draft
    cycle = t_loop / cycles
    return {"num_steps": s, "new_tokens": max_new, "cycles": cycles,
            "greedy_ms_per_token": t_greedy * 1e3, "loop_ms_per_cycle": cycle * 1e3,
            "verify_ms": t_verify * 1e3, "draft_step_ms": t_draft * 1e3, "parts_ms": parts * 1e3,
            "overhead": cycle / parts - 1, "tokens": runs[-1].output_ids}


def bench_profile(oracle, prompts, max_steps, max_new, loop_prompts):
    spec = oracle.speculator
    items = [Prompt(id=f"p{i}", category="", input_ids=p) for i, p in enumerate(prompts)]
    oracle = oracle.with_(max_new_tokens=max_new, num_steps=5)
    log = lambda msg: print(f"  [profile] {msg} at {time.perf_counter() - t_start:.1f}s", flush=True)  # noqa: E731
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    res = profile_prompts(oracle, items, ProfileOptions(max_steps=max_steps, batch_tokens=32768))
    sync()
    t_profile = time.perf_counter() - t0
    log("profile with generation done")
    t0 = time.perf_counter()
    res_r = profile_prompts(oracle, items, ProfileOptions(max_steps=max_steps, batch_tokens=32768),
                            [s.output_ids for s in res.samples])
    sync()
    t_responses = time.perf_counter() - t0
    log("profile with responses done")
    # the profile step alone vs a plain teacher-forced forward of the same batch
    from eagle_eval.profile import teacher_forced as prof
    need = max_new + max_steps
    conts = greedy_continuations(spec, prompts[:16], need, 0, 1 << 30)
    items = [(SimpleNamespace(id=str(i), category="", input_ids=p), c) for i, (p, c) in enumerate(zip(prompts, conts))]
    n_tokens = sum(len(p) + len(c) for p, c in zip(prompts, conts))
    t_step = timed(lambda: prof.profile_batch(spec, items, max_steps, max_new, 0), reps=3)
    ids = torch.tensor([p + c for p, c in zip(prompts[:16], conts)])
    t_forward = timed(lambda: spec.target.forward(ids, None, upcast=False), reps=3)
    log("profile step vs forward done")
    # the loop once per S on a subset, scaled to all prompts (cycles are independent per prompt)
    # In fp32 the two agree exactly (tests). In bf16 the batched and the incremental forwards round
    # differently, and a near-tie argmax can flip: compare the cycles that lie wholly inside the common
    # prefix of the loop's tokens and the profile's continuation, and say where the tokens part.
    t0 = time.perf_counter()
    agree, loop_cycles, compared, equal, parted = True, 0, 0, 0, []
    for s in range(1, max_steps + 1):
        for i in range(loop_prompts):
            d = chain.speculative_decode(spec, prompts[i], s, max_new, set())
            prof_cycles = res.samples[i].extra["accepted_per_cycle_by_num_steps"][str(s)]
            agree &= d.accepted_per_cycle == prof_cycles
            loop_cycles += len(d.accepted_per_cycle)
            ref = res.samples[i].output_ids
            common = next((j for j, (a, b) in enumerate(zip(d.output_ids, ref)) if a != b), min(len(ref), len(d.output_ids)))
            parted.append(common)
            done = 1                                   # the prefill emits the first token
            for a, b in zip(d.accepted_per_cycle, prof_cycles):
                done += a + 1
                if done > common:
                    break
                compared += 1
                equal += a == b
    sync()
    t_loop = time.perf_counter() - t0
    t_sweep = t_loop * len(prompts) / loop_prompts
    return {"prompts": len(prompts), "new_tokens": max_new, "max_steps": max_steps,
            "profile_s": t_profile, "profile_with_responses_s": t_responses,
            "loop_sweep_s_extrapolated": t_sweep, "loop_sweep_prompts_measured": loop_prompts,
            "speedup_vs_sweep": t_sweep / t_profile, "speedup_vs_sweep_responses": t_sweep / t_responses,
            "profile_step_tokens_per_s": n_tokens / t_step, "forward_tokens_per_s": n_tokens / t_forward,
            "profile_step_share_of_forward": t_forward / t_step, "loop_equals_profile": agree,
            "loop_ms_per_cycle": t_loop / loop_cycles * 1e3,
            "cycles_in_common_prefix": compared, "cycles_equal_in_common_prefix": equal,
            "tokens_part_at_by_num_steps": parted,
            "own_generation_numeric_divergences": len(res.report["numeric_divergences"]),
            "responses_divergences": len(res_r.report["response_divergences"])}


def bench_tree(oracle, prompt, s, k, sizes, ctx_new=64):
    spec = oracle.speculator
    target, head = spec.target, spec.head
    cache = target.new_cache()
    ids = torch.tensor([prompt + [7] * ctx_new])
    ctx = ids.shape[1]
    from eagle_eval.models.capture import FeatureCapture
    out = {"num_steps": s, "topk": k}
    with FeatureCapture(target.layers, spec.aux_hf, spec.draft_device) as cap:
        target.forward(ids, cache)
        aux = cap.pop()
        state = DraftState(head, spec.embed)
        state.extend(aux, torch.cat([ids[:, 1:], ids[:, -1:]], 1).to(spec.draft_device))

        def chain_cycle():
            v = verify_chain(target, cache, cap, 7, state.propose_chain(s))
            target.rollback(cache, ctx)
            return v

        def chain_verify():
            verify_chain(target, cache, cap, 7, torch.full((s,), 7, device=spec.draft_device))
            target.rollback(cache, ctx)
        out["chain_verify_ms"] = timed(chain_verify) * 1e3
        out["chain_cycle_ms"] = timed(chain_cycle) * 1e3
        for d in sizes:
            pool = state.propose_tree(s, k)
            tree = select_tree(pool, 7, d)

            def tree_verify(tree=tree):
                verify_tree(target, cache, cap, tree)
                target.rollback(cache, ctx)

            def tree_cycle(d=d):
                verify_tree(target, cache, cap, select_tree(state.propose_tree(s, k), 7, d))
                target.rollback(cache, ctx)
            out[f"tree_D{d}_verify_ms"] = timed(tree_verify) * 1e3
            out[f"tree_D{d}_cycle_ms"] = timed(tree_cycle) * 1e3
    return out


def split_two_gpus(model):
    from accelerate import dispatch_model

    n = model.config.num_hidden_layers
    dm = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    dm.update({f"model.layers.{i}": 0 if i < n // 2 else 1 for i in range(n)})
    return dispatch_model(model, device_map=dm)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run with tiny shapes")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sections", default="loop,split,profile,tree")
    ap.add_argument("--fp32", action="store_true", help="fp32 weights (exact-equality check of profile vs loop)")
    ap.add_argument("--prompts", type=int, help="number of prompts (default 64; 8 with --tiny)")
    ap.add_argument("--new-tokens", type=int, help="new tokens per prompt (default 256; 24 with --tiny)")
    ap.add_argument("--loop-prompts", type=int, default=1, help="prompts the loop sweep runs (then scaled)")
    args = ap.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    device = "cuda:0" if gpu else "cpu"
    dtype = torch.bfloat16 if gpu and not args.fp32 else torch.float32
    shape = "tiny" if args.tiny else "8b"
    n_prompts = args.prompts or (8 if args.tiny else 64)
    new = args.new_tokens or (24 if args.tiny else 256)
    loop_prompts = args.loop_prompts
    t0 = time.perf_counter()
    model, head = build(shape, device, dtype)
    print(f"built {shape} target + head on {device} in {time.perf_counter() - t0:.1f}s", flush=True)
    oracle = make_oracle(model, head, 5, new)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, SHAPES[shape]["vocab"], (128,), generator=g).tolist() for _ in range(n_prompts)]
    sections = args.sections.split(",")
    results = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "shape": shape, "dtype": str(dtype),
               "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    if "loop" in sections:
        results["loop"] = bench_loop(oracle, prompts, 5, 64 if args.tiny else 128)
        print(json.dumps({k: v for k, v in results["loop"].items() if k != "tokens"}), flush=True)
    if "tree" in sections:
        results["tree"] = bench_tree(oracle, prompts[0], 5, 4, [8, 16, 32, 64])
        print(json.dumps(results["tree"]), flush=True)
    if "split" in sections and gpu and torch.cuda.device_count() >= 2:
        single = bench_loop(oracle, prompts, 5, 128)
        model = split_two_gpus(model)
        oracle2 = make_oracle(model, head, 5, 128)
        split = bench_loop(oracle2, prompts, 5, 128)
        results["split"] = {**{k: v for k, v in split.items() if k != "tokens"},
                            "single_gpu_ms_per_cycle": single["loop_ms_per_cycle"],
                            "devices": sorted({str(p.device) for p in model.parameters()}),
                            "tokens_equal_single_gpu": split["tokens"] == single["tokens"]}
        print(json.dumps(results["split"]), flush=True)
        oracle = oracle2
    if "profile" in sections:
        results["profile"] = bench_profile(oracle, prompts, 8, new, loop_prompts)
        print(json.dumps(results["profile"]), flush=True)
    if "loop" in results:
        results["loop"].pop("tokens")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"bench_gpu{'_fp32' if args.fp32 else ''}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
