"""server-check at temperature > 0: what a server's sampled answers must satisfy, judged on the answers alone.

Contract: a sampling server's tokens come from its own random stream, so they cannot equal the oracle's; what
can be checked is fixed by the answers themselves (docs/eagle3.md section 8):
- `request_sampling(decoding, prompt_id)`: the sampling parameters each request carries (the run's temperature,
  top-k, top-p, min-p and a per-request seed derived from (seed, prompt id), so a rerun sends the same requests);
- `plausibility(oracle, pairs)`: are the answers samples of the target at these settings? One teacher-forced
  forward per answer gives p_t (rules/filters.py, in the rule's filter order); every token counted in its
  rank cell under p_t and judged by the chi-square of stats/distribution.py (consistent / differs / undecided,
  false-alarm rate 0.001), beside the mean log p_t of the answer's tokens and what samples of p would average
  (minus the mean entropy): a server whose tokens the target finds impossible is named as such;
- `redrafted(oracle, prompt, answer)`: under the one-hot rules (vllm, sglang at its default thresholds, eagle) a
  draft is accepted exactly when the emitted token equals it, so the server's per-step accepted counts are fixed
  by its own answer: the drafts re-made along the answer (the teacher-forced all-starts drafting of the profile)
  and the longest prefix the answer continues with, cycle by cycle. The last cycle may look past the answer's
  end (tokens the server cut at max_new_tokens): it is a lower bound, marked as such;
- `compare_redrafted(ours, last_capped, server)`: the server's per-step counts (vLLM's detailed per-request
  metrics) against those, or its totals when that is all it reports.
- `expected_along(oracle, prompts, answers)` and `expectation_check(...)`: under every rule, the accepted drafts
  a faithful engine expects at each cycle the server ran (its per-step counts give the cycle roots along its
  answer): E[A | root] and Var[A | root] from P(A >= i | root) (profile/sampled.py: exact for the
  one-hot rules, rollouts for sampled drafts). The cycles' A - E[A | root] are martingale differences, so their
  sum over the cycles that could not reach the answer's end (decided by the root alone) is judged by a z score:
  |z| > 3.29 differs (false-alarm rate 0.001), else consistent when the 95% interval of the relative difference
  is within the tolerance, else undecided. It is what decides the rules with sampled drafts, whose per-step
  counts no answer fixes; `emitted_mismatch` checks the counts add up to the answer's length.
"""

from __future__ import annotations

import hashlib
import math

import torch

def request_seed(seed: int, prompt_id: str) -> int:
    """A request's seed, from (the run's seed, the prompt id) alone (31 bits: every engine takes it).

    >>> request_seed(0, "q1") == request_seed(0, "q1") != request_seed(1, "q1")
    True
    """
    digest = hashlib.sha256(f"eagle-eval-request/{seed}/{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def request_sampling(decoding, prompt_id: str) -> dict:
    """The sampling parameters of one request: {temperature, top_p, top_k, min_p, seed}."""
    return {"temperature": decoding.temperature, "top_p": decoding.top_p, "top_k": decoding.top_k,
            "min_p": decoding.min_p, "seed": request_seed(decoding.seed, prompt_id)}


def exact_per_request(decoding) -> bool:
    """Whether the rule fixes each request's per-step accepted counts from its answer: a one-hot rule whose output
    is plain sampling (rules/base.py `Rule`)."""
    from eagle_eval.rules.base import rule

    record = rule(decoding.accept_rule)
    return record.node is not None and record.lossless(decoding)


@torch.no_grad()
def plausibility(oracle, pairs: list[tuple[list[int], list[int]]]) -> dict:
    """pairs: (prompt ids, answer ids) of every request -> the distribution check of the answers against p."""
    from eagle_eval.stats.distribution import CellCounts, judge
    from eagle_eval.rules.lossless import counts_of, relaxed
    from eagle_eval.rules.filters import target_probs

    target, decoding = oracle.speculator.target, oracle.settings.decoding
    counts, logp, entropy, tokens = CellCounts(), 0.0, 0.0, 0
    for prompt_ids, answer in pairs:
        if not answer:
            continue
        ids = torch.tensor([prompt_ids + answer[:-1]], device=target.input_device)
        logits = target.forward(ids, None)[0, len(prompt_ids) - 1:]                        # [n, V]
        p = target_probs(logits, decoding).double().cpu()
        counts = counts.merge(counts_of(p, answer, target_probs(logits, relaxed(decoding))))
        x = torch.tensor(answer)
        logp += float(p.gather(1, x[:, None])[:, 0].clamp_min(1e-30).log().sum())
        entropy += float(-(p * p.clamp_min(1e-300).log()).sum())
        tokens += len(answer)
    verdict = judge(counts)
    return {**verdict, "message": _message(verdict), "tokens": tokens,
            "mean_log_p": logp / tokens if tokens else None,
            "mean_log_p_of_samples": -entropy / tokens if tokens else None,
            "definition": "the answers' tokens counted by their rank under the target's p at these settings (the "
                          "rule's filter order), chi-square against the counts samples of p would give; mean_log_p: "
                          "the mean log p of the answers' tokens (p = 0 counted as 1e-30), mean_log_p_of_samples: "
                          "what samples of p would average (minus the mean entropy)"}


@torch.no_grad()
def redrafted(oracle, prompt, answer: list[int]) -> tuple[list[int], bool]:
    """(accepted drafts per cycle along `answer`, whether the last cycle is a lower bound) under a one-hot rule."""
    from eagle_eval.profile import teacher_forced as prof

    if not answer:
        return [], False
    r = oracle.resolved
    s, pad = r.num_steps, 0
    cont = list(answer) + [pad] * (s + 1)
    shapes = sorted({(s, r.num_draft_tokens)}) if r.topk > 1 else None
    [p] = prof.profile_batch(oracle.speculator, [(prompt, cont)], s, len(answer), pad, r.topk, shapes)
    runs = p.run_lengths if p.tree_runs is None else p.tree_runs[(s, r.num_draft_tokens)][0]
    known = [min(run, len(answer) - 1 - k) for k, run in enumerate(runs)]     # never past the answer's end
    d = prof.simulate_cycles(known, cont, s, len(answer), oracle.eos_ids)
    last_capped = bool(d.accepted_per_cycle) and _start_of_last(d.accepted_per_cycle) + s >= len(answer) - 1
    return d.accepted_per_cycle, last_capped


def _message(v: dict) -> str:
    """The distribution check's result in words."""
    parts = []
    if v.get("outside_support"):
        parts.append(f"{v['outside_support']} token(s) the target gives probability 0 at these settings")
    if v.get("p_value") is not None:
        parts.append(f"chi-square {v['statistic']:.1f} on {v['df']} df over {v['tokens']} tokens, p = {v['p_value']:.2g}")
    if v.get("reason"):
        parts.append(v["reason"])
    return "; ".join(parts) or f"{v['tokens']} tokens"


def _start_of_last(accepted: list[int]) -> int:
    """Index of the root of the last cycle in the answer."""
    return sum(n + 1 for n in accepted[:-1])


def compare_redrafted(ours: list[int], last_capped: bool, server: dict, num_steps: int) -> dict:
    """The server's counts (its per-step sequence, else its totals) against the re-drafted ones.
    server: {accepted_per_cycle, verify_count, accepted_drafts}.

    >>> compare_redrafted([2, 0, 1], True, {"accepted_per_cycle": [2, 0, 3]}, 3)["equal"]
    True
    >>> compare_redrafted([2, 0, 1], False, {"verify_count": 3, "accepted_drafts": 4}, 3)["equal"]
    False
    """
    steps = server.get("accepted_per_cycle")
    if steps is not None:
        body_equal = list(steps[:-1]) == list(ours[:-1]) and len(steps) == len(ours)
        last_ok = bool(ours) and (steps[-1] >= ours[-1] if last_capped else steps[-1] == ours[-1])
        equal = body_equal and (last_ok or not ours)
        first = next((i for i, (a, b) in enumerate(zip(steps, ours)) if a != b), None)
        return {"compared": "per step", "equal": equal, "first_differing_cycle": None if equal else first,
                "server": list(steps), "redrafted": list(ours), "last_cycle_lower_bound": last_capped}
    cycles, accepted = server.get("verify_count"), server.get("accepted_drafts")
    if cycles is None or accepted is None:
        return {"compared": None, "equal": None, "redrafted": list(ours), "last_cycle_lower_bound": last_capped}
    low = sum(ours)
    high = low - ours[-1] + num_steps if last_capped and ours else low     # the last cycle: at least ours, at most S
    equal = cycles == len(ours) and low <= accepted <= high
    return {"compared": "totals", "equal": equal, "server": {"verify_count": cycles, "accepted_drafts": accepted},
            "redrafted": list(ours), "last_cycle_lower_bound": last_capped}


def ask_sampled(oracle, workload, client, check, progress: bool) -> tuple[list, list, list[dict]]:
    """(prompts, records, per-request rows) of a check at temperature > 0: every turn sent to the server with the
    run's sampling settings; the server's answer is the record's output (a later turn is built from the server's
    earlier answers: there is no oracle answer to use), its accepted_per_cycle the counts re-drafted along it."""
    from tqdm import tqdm

    from eagle_eval.errors import stage
    from eagle_eval.records import SampleRecord
    from eagle_eval.workload.conversations import run_turns

    decoding, s = oracle.settings.decoding, oracle.resolved.num_steps
    max_new, exact = oracle.settings.workload.max_new_tokens, exact_per_request(decoding)
    prompts, rows = [], []

    def decode(prompt):
        with stage([prompt.id], "request to the server"):
            reply = client.generate(prompt.input_ids, max_new, request_sampling(decoding, prompt.id))
        answer = list(reply.output_ids or [])
        with stage([prompt.id], "drafts re-made along the server's answer"):
            ours, capped = redrafted(oracle, prompt, answer) if exact else ([], False)
        server = {"accepted_per_cycle": reply.accepted_per_cycle, "verify_count": reply.verify_count,
                  "accepted_drafts": reply.accepted_drafts}
        row = {"id": prompt.id, "prompt_len": len(prompt.input_ids), "tokens": len(answer),
               "sampling": request_sampling(decoding, prompt.id),
               "server": {**server, "output_tokens": reply.completion_tokens, "source": reply.source,
                          "figure": (1 + reply.accepted_drafts / reply.verify_count)
                          if reply.verify_count and reply.accepted_drafts is not None else None},
               "notes": list(reply.notes), "output_ids": answer}
        if exact and reply.output_ids is not None:
            row["redrafted"] = compare_redrafted(ours, capped, server, s)
        rows.append(row)
        prompts.append(prompt)
        return SampleRecord(id=prompt.id, category=prompt.category, prompt_len=len(prompt.input_ids),
                            output_ids=answer, accepted_per_cycle=ours, emitted_per_cycle=[n + 1 for n in ours],
                            verify_count=len(ours))

    records = list(tqdm(run_turns(workload, decode), total=workload.num_prompts, desc="prompts", unit="prompt",
                        disable=not progress))
    return prompts, records, rows


def judge_sampled(rows: list[dict], plaus: dict | None, exact: bool,
                  expectation: dict | None = None) -> tuple[str, list[str]]:
    """The verdict of a check at temperature > 0 and its reasons (undecided is never agree)."""
    reasons = {"disagree": [], "undecided": [], "incomplete": []}
    if plaus is not None and plaus.get("verdict") == "differs":
        reasons["disagree"].append(
            f"the server's tokens are not samples of the target at these settings: {plaus.get('message', '')} "
            f"(mean log p of its tokens {plaus['mean_log_p']:.3f} per token where samples of the target average "
            f"{plaus['mean_log_p_of_samples']:.3f})")
    elif plaus is not None and plaus.get("verdict") == "undecided":
        reasons["undecided"].append(f"too few tokens to tell whether the server's tokens are samples of the target "
                                    f"({plaus.get('message', '')})")
    if expectation is not None and expectation["verdict"] == "differs":
        reasons["disagree"].append(f"the server's acceptance is not what a faithful engine gives along its own "
                                   f"answers: {expectation['message']}")
    if exact:
        compared = [r for r in rows if r.get("redrafted", {}).get("equal") is not None]
        bad = [r for r in compared if r["redrafted"]["equal"] is False]
        if bad:
            r = bad[0]["redrafted"]
            where = (f" at cycle {r['first_differing_cycle']}" if r.get("first_differing_cycle") is not None else "")
            reasons["disagree"].append(
                f"{len(bad)} of {len(compared)} request(s) accepted other drafts than the drafts re-made along their "
                f"own answers (first: {bad[0]['id']}{where}: server {r.get('server')}, re-drafted {r['redrafted']})")
        if len(compared) < len(rows):
            reasons["incomplete"].append(f"{len(rows) - len(compared)} request(s) report no acceptance counts to "
                                         "compare with the drafts re-made along their answers")
    else:
        off = [r["id"] for r in rows if r["server"].get("accepted_per_cycle") is not None
               and emitted_mismatch(r["server"]["accepted_per_cycle"], r["output_ids"])]
        if off:
            reasons["disagree"].append(f"{len(off)} request(s) report per-step counts that cannot have emitted their "
                                       f"answers (first: {off[0]}): the counts and the tokens disagree")
        if expectation is None:
            reasons["incomplete"].append("the rule samples its drafts (vllm-probabilistic, sglang-rs): no per-request "
                                         "count follows from the answers, and the server reports no per-step counts "
                                         "to judge against the expected acceptance; only the answers' distribution "
                                         "is checked")
        elif expectation["verdict"] == "undecided":
            reasons["undecided"].append(f"the server's acceptance against a faithful engine's expectation along its "
                                        f"answers is not decided: {expectation.get('message')} (tolerance "
                                        f"{expectation['tolerance']:g}; more prompts or tokens would decide)")
    for verdict in ("disagree", "undecided", "incomplete"):
        if reasons[verdict]:
            return verdict, [r for v in ("disagree", "undecided", "incomplete") for r in reasons[v]]
    return "agree", []


@torch.no_grad()
def expected_along(oracle, prompts, answers: list[list[int]], rollouts: int = 32, batch_tokens: int = 4096,
                   floor: float = 1e-6) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(P(A >= i | root k) [len(answer), S], the estimate's variance or None) along each answer, chains only:
    each answer taken as it is (padded past its end; those roots are not used)."""
    from eagle_eval.profile import teacher_forced as prof
    from eagle_eval.profile.sampled import profile_batch_rollouts, profile_batch_sampled
    from eagle_eval.rules.base import rule

    spec, dec, s = oracle.speculator, oracle.settings.decoding, oracle.resolved.num_steps
    max_new = max(len(a) for a in answers)
    items = [(p, list(a) + [0] * (max_new + s - len(a))) for p, a in zip(prompts, answers)]
    out = [None] * len(items)
    sampled_drafts = rule(dec.accept_rule).sampled_drafts
    for batch in prof.batches([p.input_ids + c for p, c in items], 0, max(1, batch_tokens // (
            rollouts if sampled_drafts else 1))):
        part = [items[j] for j in batch]
        if sampled_drafts:
            got = profile_batch_rollouts(spec, part, [(p.id, 0) for p, _ in part], s, max_new, 0, dec, rollouts)
        else:
            got = profile_batch_sampled(spec, part, s, max_new, 0, dec, floor=floor)
        for j, res in zip(batch, got):
            out[j] = (res.expected.chain[:, :s], None if res.expected.variance is None else res.expected.variance[:, :s])
    return out


def emitted_mismatch(steps: list[int], answer: list[int]) -> bool:
    """Whether per-step counts cannot have produced `answer`: the first token comes from the prefill and cycle c
    emits steps[c] + 1 tokens, so they sum to its length (the last cycle may be cut at max_tokens or EOS)."""
    emitted = 1 + sum(n + 1 for n in steps)
    return not (emitted >= len(answer) and emitted - (steps[-1] + 1 if steps else 0) < len(answer))


def expectation_check(rows: list[dict], expected: list, num_steps: int, tolerance: float) -> dict:
    """The server's accepted drafts, cycle by cycle, against E[A | root] along its own answers (module docstring).
    rows: the per-request rows (server.accepted_per_cycle, output_ids); expected: `expected_along`'s, per row."""
    cycles = server = mean = var = 0.0
    used = 0
    pos = [[0.0, 0.0, 0.0] for _ in range(num_steps)]      # per position i: server's 1[A >= i], sum P, sum Var
    for row, exp in zip(rows, expected):
        steps, answer = row["server"]["accepted_per_cycle"], row["output_ids"]
        if exp is None or not steps:
            continue
        at_least, est_var = exp
        used += 1
        k = 0
        for a in steps:
            if k + num_steps + 1 >= len(answer):          # this cycle could reach the answer's end: not used
                break
            p = at_least[k].double()
            e = float(p.sum())
            e2 = float(sum((2 * i + 1) * float(p[i]) for i in range(num_steps)))
            v = max(e2 - e * e, 0.0)
            if est_var is not None:                       # rollouts: the estimate's own noise (Cauchy-Schwarz bound)
                v += float(est_var[k].clamp_min(0).sqrt().sum()) ** 2
            cycles, server, mean, var = cycles + 1, server + a, mean + e, var + v
            for i in range(num_steps):
                pi = float(p[i])
                extra = float(est_var[k, i].clamp_min(0)) if est_var is not None else 0.0
                pos[i][0] += a >= i + 1
                pos[i][1] += pi
                pos[i][2] += pi * (1 - pi) + extra
            k += a + 1
    out = {"requests": used, "cycles": int(cycles), "server_accepted": int(server), "expected_accepted": mean,
           "tolerance": tolerance,
           "definition": "over the cycles of every request whose root is more than num_steps + 1 tokens before the "
                         "answer's end: the server's accepted drafts against the sum of E[A | root] a faithful engine "
                         "expects there (P(A >= i | root) at the run's settings and rule); z = (server - expected) / "
                         "sqrt(sum Var[A | root]); relative_difference = (server - expected) / (cycles + expected), "
                         "the accept length's relative difference"}
    if cycles == 0:
        return {**out, "verdict": "undecided", "z": None, "relative_difference": None, "interval": None,
                "message": "no cycle far enough from its answer's end"}
    per_position = []
    for i, (got, want, v) in enumerate(pos):
        half_i = 1.96 * math.sqrt(v) / cycles
        per_position.append({"position": i + 1, "server_rate": got / cycles, "expected_rate": want / cycles,
                             "difference": (got - want) / cycles,
                             "interval": [(got - want) / cycles - half_i, (got - want) / cycles + half_i],
                             "z": (got - want) / math.sqrt(v) if v > 0 else None})
    out["per_position"] = per_position
    out["per_position_definition"] = ("per position i over the same cycles: the server's rate of A >= i against "
                                      "the mean P(A >= i | root), 95% interval of the difference (sum of "
                                      "P(1 - P) over the cycles); informative, the verdict is the total's")
    sd = math.sqrt(var)
    z = (server - mean) / sd if sd > 0 else (0.0 if server == mean else math.copysign(math.inf, server - mean))
    rel, half = (server - mean) / (cycles + mean), 1.96 * sd / (cycles + mean)
    verdict = "differs" if abs(z) > 3.29 else "consistent" if half <= tolerance else "undecided"
    tau_s, tau_e = 1 + server / cycles, 1 + mean / cycles
    message = (f"accept length {tau_s:.3f} over {int(cycles)} cycles where a faithful engine expects {tau_e:.3f} "
               f"along the same answers (relative difference {rel:+.3f}, 95% interval +-{half:.3f}, z = {z:.2f})")
    return {**out, "verdict": verdict, "z": z, "relative_difference": rel, "interval": [rel - half, rel + half],
            "server_accept_length": tau_s, "expected_accept_length": tau_e, "message": message}
