"""The profile at temperature > 0 on the bundled pair: T -> 0 is the greedy profile; per_start.jsonl rows
recomputed without the cache (plain forwards over prompt + first t tokens + drafts, drafts from the loop's
own DraftState); each closed form against a Monte-Carlo simulation of its engine rule written here; sampled
drafts exact at position 1 and unbiased deeper; seeds reproduce runs byte for byte."""

import json
import math
import random

import pytest
import torch
from click.testing import CliRunner

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.commands.profile import profile_oracle
from eagle_eval.models.capture import FeatureCapture
from eagle_eval.heads.eagle3.layer import DraftCache
from eagle_eval.settings import ConfigError, DecodingSettings, ProfileOptions, Settings
from eagle_eval.loop.draft import DraftState
from eagle_eval.rules.filters import draft_probs, target_probs
from eagle_eval.loop.tree import select_tree

MAX_NEW = 16


@pytest.fixture(scope="module")
def oracle():
    return api.load_oracle(Settings.of(max_new_tokens=MAX_NEW, limit=6))


@pytest.fixture(scope="module")
def prompts(oracle):
    return api.checked_workload(oracle).first_prompts


# -- references: the loop's drafting and plain target forwards, no cache --------------------------------

def draft_state(oracle, ctx):
    """The loop's draft state after the committed sequence ctx (its real pairs 0..len-2)."""
    spec = oracle.speculator
    with FeatureCapture(spec.target.layers, spec.aux_hf, spec.draft_device) as cap:
        spec.target.forward(torch.tensor([ctx]), None)
        aux = cap.pop()
    state = DraftState(spec.head, spec.embed, spec.position_offset)
    state.extend(aux[:, :-1], torch.tensor([ctx[1:]]))
    return state


def target_p(oracle, seq, decoding):
    """p after the whole of seq: one plain forward, no cache."""
    return target_probs(oracle.speculator.target.forward(torch.tensor([seq]), None)[0, -1], decoding)


def reference_chain(oracle, ctx, k, decoding):
    """(drafts d_1..d_k, p_i(d_i)): the drafts the loop proposes after ctx, each p after ctx + d_<i."""
    drafts = draft_state(oracle, ctx).propose_chain(k).tolist()
    logits = oracle.speculator.target.forward(torch.tensor([ctx + drafts[:-1]]), None)[0, len(ctx) - 1:]
    p = target_probs(logits, decoding)
    return drafts, [float(p[i, d]) for i, d in enumerate(drafts)]


def reference_tree(oracle, ctx, s, topk, d, decoding):
    """(tree, {node: p at it}) for the loop's tree after ctx; p at every node with children, each from a plain
    forward over ctx + the node's path."""
    tree = select_tree(draft_state(oracle, ctx).propose_tree(s, topk), ctx[-1], d)
    p = {}
    for u in set(tree.parents) - {-1}:
        path, v = [], u
        while v != 0:
            path.append(tree.tokens[v])
            v = tree.parents[v]
        p[u] = target_p(oracle, ctx + path[::-1], decoding)
    return tree, p


def children(tree):
    kids = {}
    for i, par in enumerate(tree.parents):
        if par >= 0:
            kids.setdefault(par, []).append(i)
    return kids


def profile(oracle, options, output_dir=None, **decoding):
    o = oracle.with_(**decoding)
    if output_dir is None:
        return profile_oracle(o, options)
    return api.profile(o.settings.with_(output_dir=str(output_dir)), options, progress=False, oracle=o)


def rows_by_key(per_start):
    return {(r["prompt_id"], r["sample"], r["start"], r["num_steps"], r.get("num_draft_tokens")): r for r in per_start}


# -- T -> 0 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [{}, {"topk": 3, "num_draft_tokens": 8, "accept_rule": "sglang"},
                                   {"topk": 2, "num_draft_tokens": 6, "accept_rule": "eagle"}])
def test_temperature_to_zero_reproduces_the_greedy_profile(oracle, extra):
    options = ProfileOptions(max_steps=5, expectation_floor=0.0)
    greedy = profile(oracle, options, **extra)
    cold = profile(oracle, options, temperature=1e-4, **extra)
    assert [p.continuation for p in cold.profiled] == [p.continuation for p in greedy.profiled]
    for s, section in greedy.report["by_num_steps"].items():
        got = cold.report["by_num_steps"][s]
        for key in ("summary", "per_position", "histogram"):
            assert got[key] == section[key], (s, key)
        e = got["expected"]
        tau = section["summary"]["accept_length"]
        assert e["sampled"]["accept_length"]["value"] == pytest.approx(tau, abs=1e-12)
        assert e["along_trajectories"]["expected_tokens_per_step"]["value"] == pytest.approx(tau, abs=1e-12)
    assert [(r["start"], r["p_accept_at_least"]) for r in cold.per_start] == \
        [(r["start"], r["p_accept_at_least"]) for r in greedy.per_start]
    assert any(0 < r["expected_tokens_per_step"] - 1 < r["num_steps"] for r in greedy.per_start)   # not all 0/all S


# -- per_start.jsonl without the cache -------------------------------------------------------------------

def test_per_start_chain_rows_recomputed_without_the_cache(oracle, prompts, tmp_path):
    dec = dict(temperature=2.0, top_k=60, top_p=0.95, accept_rule="vllm")
    k = 5
    res = profile(oracle, ProfileOptions(max_steps=k, expectation_floor=0.0), tmp_path / "run", **dec)
    rows = [json.loads(line) for line in (tmp_path / "run" / "per_start.jsonl").read_text().splitlines()]
    assert rows == json.loads(json.dumps(res.per_start))
    by_key = rows_by_key(rows)
    decoding = DecodingSettings(**dec)
    checked = off = 0
    for p in res.profiled[:4]:
        for t in (1, 2, 5, 9, 14):
            drafts, acc = reference_chain(oracle, p.prompt.input_ids + p.continuation[:t], k, decoding)
            want = [math.prod(acc[:i]) for i in range(1, k + 1)]
            row = by_key[(p.prompt.id, 0, t, k, None)]
            assert row["p_accept_at_least"] == pytest.approx(want, abs=2e-6), (p.prompt.id, t)
            assert row["expected_tokens_per_step"] == pytest.approx(1 + sum(want), abs=1e-5)
            for s in range(1, k):
                assert by_key[(p.prompt.id, 0, t, s, None)]["p_accept_at_least"] == row["p_accept_at_least"][:s]
            checked += 1
            m = next((i for i, x in enumerate(drafts) if x != p.continuation[t + i]), k)
            off += m < k - 1 and want[m] > 1e-3           # a row whose deeper p came from branch tokens
    assert checked == 20 and off >= 5


def test_branch_nodes_shared_between_starts_read_what_their_own_would(oracle, monkeypatch):
    """A start that leaves the continuation where an earlier start did, with the same drafts, reads that start's
    branch node instead of running its own: the same expectations as when every chain runs its own nodes (up
    to float rounding), with fewer target tokens."""
    from eagle_eval.profile import branches

    opts, dec = ProfileOptions(max_steps=6, expectation_floor=0.0), dict(temperature=1.5, accept_rule="vllm")
    shared = profile(oracle, opts, **dec)
    monkeypatch.setattr(branches.KnownNodes, "lookup",
                        lambda self, *keys: (torch.zeros(keys[0].shape, dtype=torch.float64),
                                             torch.full(keys[0].shape, -1, dtype=torch.long)))
    own = profile(oracle, opts, **dec)
    flat = [[x for r in res.per_start for x in r["p_accept_at_least"]] for res in (shared, own)]
    assert len(flat[0]) == len(flat[1]) and flat[0] == pytest.approx(flat[1], abs=1e-6)
    ran = [sum(p.expected.branch_nodes for p in res.profiled) for res in (shared, own)]
    assert 0 < ran[0] < 0.95 * ran[1], ran


def test_chains_at_one_level_share_a_node_and_ask_each_token_once():
    """Four chains of two rows: two reach the same node (row 0, context 5, no parent, token 7) asking 3 and 4,
    one asks 3 again there, one is under another parent; row 1's node has the same key but its own row."""
    from eagle_eval.profile.branches import shared_nodes

    t = lambda *x: torch.tensor(x)
    branches, slot, ask_slot = shared_nodes(2, bb=t(0, 0, 0, 0, 1), token=t(7, 7, 7, 7, 7),
                                             position=t(6, 6, 6, 6, 6), context_end=t(5, 5, 5, 5, 5),
                                             parent=t(-1, -1, -1, 2, -1), ask=t(3, 4, 3, 3, 3))
    assert branches.tokens.tolist() == [[7, 7], [7, 0]]
    assert branches.parents.tolist() == [[-1, 2], [-1, -1]] and branches.context_end.tolist() == [[5, 5], [5, -1]]
    assert branches.asked.tolist() == [[[3, 4], [3, -1]], [[3, -1], [-1, -1]]]
    assert slot.tolist() == [0, 0, 0, 1, 0] and ask_slot.tolist() == [0, 1, 0, 0, 0]


def tree_at_least(tree, p, decoding, s):
    """P(depth >= d) by each rule's loop, computed exactly: SGLang's one coin integrated over [0, 1) on a grid
    (test_expected's literal kernel loop); EAGLE's rejections one sibling after another, the vocab vector
    zeroed and renormalised as evaluate_posterior does. Reach multiplied along paths."""
    from test_expected import sglang_by_integration

    kids, at = children(tree), [0.0] * s
    reach = {0: 1.0}
    for u in sorted(kids):                             # tree order: parents before children
        if decoding.accept_rule == "sglang":
            a = [float(p[u][tree.tokens[c]]) for c in kids[u]]
            prob = sglang_by_integration(a, decoding.accept_threshold_single, decoding.accept_threshold_acc, 20_000)
        else:
            q, none_yet, prob = p[u].double().clone(), 1.0, []
            for c in kids[u]:
                x = tree.tokens[c]
                prob.append(none_yet * float(q[x]))
                none_yet *= 1 - float(q[x])
                q[x] = 0.0
                q = q / q.sum() if float(q.sum()) > 0 else q
        for c, accepted in zip(kids[u], prob):
            reach[c] = reach[u] * accepted
            at[tree.depths[c] - 1] += reach[c]
    return at


@pytest.mark.parametrize("dec", [dict(accept_rule="sglang", accept_threshold_single=0.5, accept_threshold_acc=0.8),
                                 dict(accept_rule="sglang"), dict(accept_rule="eagle", top_p=0.95)])
def test_per_start_tree_rows_recomputed_without_the_cache(oracle, dec, tmp_path):
    s, topk, d = 4, 3, 8
    dec = dict(temperature=1.5, **dec)
    res = profile(oracle, ProfileOptions(max_steps=s, draft_tokens_grid=(5,), expectation_floor=0.0), tmp_path / "run",
                  topk=topk, num_draft_tokens=d, **dec)
    by_key = rows_by_key([json.loads(x) for x in (tmp_path / "run" / "per_start.jsonl").read_text().splitlines()])
    decoding = DecodingSettings(**dec)
    for p in res.profiled[:3]:
        for t in (1, 4, 11):
            ctx = p.prompt.input_ids + p.continuation[:t]
            for shape in ((s, d), (3, 5)):
                tree, probs = reference_tree(oracle, ctx, shape[0], topk, shape[1], decoding)
                want = tree_at_least(tree, probs, decoding, shape[0])
                got = by_key[(p.prompt.id, 0, t, shape[0], shape[1])]["p_accept_at_least"]
                assert got == pytest.approx(want, abs=2e-4 if dec["accept_rule"] == "sglang" else 2e-6), (t, shape)


@pytest.mark.parametrize("rule", ["sglang", "eagle"])
def test_tree_floor_leaves_each_start_low_by_at_most_its_cut(oracle, rule):
    """A tree node off the continuation reached with probability below the floor is not expanded: every P(A >= d)
    of every shape is then at most the exact one and short of it by at most the start's `cut` (the unexpanded
    nodes' reach, summed); some starts are cut, fewer branch tokens run, and the report says so for trees."""
    dec = dict(temperature=1.5, accept_rule=rule)
    shape = dict(topk=3, num_draft_tokens=8)
    exact = profile(oracle, ProfileOptions(max_steps=5, draft_tokens_grid=(5,), expectation_floor=0.0), **shape, **dec)
    floored = profile(oracle, ProfileOptions(max_steps=5, draft_tokens_grid=(5,), expectation_floor=1e-3),
                      **shape, **dec)
    want = rows_by_key(exact.per_start)
    assert len(want) == len(floored.per_start)
    cut_rows = 0
    for row in floored.per_start:
        ref = want[(row["prompt_id"], row["sample"], row["start"], row["num_steps"], row["num_draft_tokens"])]
        assert "cut" not in ref
        short = [a - b for a, b in zip(ref["p_accept_at_least"], row["p_accept_at_least"])]
        assert min(short) >= -1e-6 and max(short) <= row.get("cut", 0.0) + 1e-6, (row, ref)
        cut_rows += "cut" in row and max(short) > 1e-6
    assert cut_rows > 0
    ran = [sum(p.expected.branch_nodes for p in res.profiled) for res in (exact, floored)]
    assert 0 < ran[1] < ran[0], ran
    section = floored.report["sampling"]["expectation_floor"]
    assert section["floor"] == 1e-3 and section["starts_cut"] > 0 and 0 < section["largest_cut"]
    assert "tree node" in section["definition"]


# -- closed forms against Monte-Carlo simulations of each rule ------------------------------------------

def simulate_vllm_chain(acc, draws, rng):
    """vLLM's rejection sampler, one-hot drafts: a uniform per position, d_i accepted while u_i < p_i(d_i)."""
    out = []
    for _ in range(draws):
        n = 0
        for a in acc:
            if not rng.random() < a:
                break
            n += 1
        out.append(n)
    return out


def simulate_sglang_tree(tree, p, t_single, t_acc, draws, rng):
    """SGLang's kernel: one coin per depth (the accepted node's), children's cumulative p in sibling order."""
    kids, out = children(tree), []
    for _ in range(draws):
        node, depth = 0, 0
        while kids.get(node):
            u, acc, nxt = rng.random(), 0.0, None
            for c in kids[node]:
                a = float(p[node][tree.tokens[c]])
                acc += a
                if a > 0 and (u < acc / t_acc or a >= t_single):
                    nxt = c
                    break
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        out.append(depth)
    return out


def simulate_eagle_tree(tree, p, draws, rng):
    """EAGLE's evaluate_posterior: a fresh coin per sibling against p, the rejected one zeroed and p
    renormalised (the whole vocab vector)."""
    kids, out = children(tree), []
    for _ in range(draws):
        node, depth = 0, 0
        while kids.get(node):
            q, nxt = p[node].double().clone(), None
            for c in kids[node]:
                if rng.random() <= float(q[tree.tokens[c]]):
                    nxt = c
                    break
                q[tree.tokens[c]] = 0.0
                if float(q.sum()) <= 0:
                    break
                q = q / q.sum()
            if nxt is None:
                break
            node, depth = nxt, depth + 1
        out.append(depth)
    return out


def interval_check(samples, at_least):
    """The simulated mean of A and each P(A >= k) within 4.5 standard errors of the closed form (the errors
    under the closed form: Var A = sum_k (2k - 1) P(A >= k) - E[A]^2)."""
    n = len(samples)
    mean = sum(samples) / n
    expected = sum(at_least)
    var = sum((2 * k - 1) * pk for k, pk in enumerate(at_least, start=1)) - expected ** 2
    assert abs(mean - expected) <= 4.5 * math.sqrt(max(var, 1e-4) / n), (mean, expected)
    for k, pk in enumerate(at_least, start=1):
        freq = sum(x >= k for x in samples) / n
        assert abs(freq - pk) <= 4.5 * math.sqrt(max(pk * (1 - pk), 1e-4) / n), (k, freq, pk)


@pytest.mark.slow
def test_chain_closed_form_against_monte_carlo_of_vllm(oracle):
    dec = dict(temperature=1.6, accept_rule="vllm")
    res = profile(oracle, ProfileOptions(max_steps=5, expectation_floor=0.0), **dec)
    by_key, rng, decoding = rows_by_key(res.per_start), random.Random(3), DecodingSettings(**dec)
    pooled, pooled_want, informative = [], 0.0, 0
    for p in res.profiled[:5]:
        for t in (2, 6, 10):
            _, acc = reference_chain(oracle, p.prompt.input_ids + p.continuation[:t], 5, decoding)
            want = by_key[(p.prompt.id, 0, t, 5, None)]["p_accept_at_least"]
            samples = simulate_vllm_chain(acc, 4000, rng)
            interval_check(samples, want)
            informative += 0.05 < want[0] < 0.95
            pooled += samples
            pooled_want += sum(want)
    assert informative >= 3
    assert abs(sum(pooled) / len(pooled) - pooled_want / 15) < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("dec", [dict(accept_rule="sglang"),
                                 dict(accept_rule="sglang", accept_threshold_single=0.3, accept_threshold_acc=0.6),
                                 dict(accept_rule="eagle")])
def test_tree_closed_forms_against_monte_carlo_of_each_rule(oracle, dec):
    s, topk, d = 3, 3, 7
    dec = dict(temperature=1.6, **dec)
    res = profile(oracle, ProfileOptions(max_steps=s, expectation_floor=0.0), topk=topk, num_draft_tokens=d, **dec)
    by_key, rng, decoding = rows_by_key(res.per_start), random.Random(5), DecodingSettings(**dec)
    for p in res.profiled[:3]:
        for t in (3, 8):
            tree, probs = reference_tree(oracle, p.prompt.input_ids + p.continuation[:t], s, topk, d, decoding)
            if dec["accept_rule"] == "eagle":
                samples = simulate_eagle_tree(tree, probs, 1500, rng)
            else:
                samples = simulate_sglang_tree(tree, probs, decoding.accept_threshold_single,
                                               decoding.accept_threshold_acc, 3000, rng)
            interval_check(samples, by_key[(p.prompt.id, 0, t, s, d)]["p_accept_at_least"])


# -- sampled drafts -------------------------------------------------------------------------------------

@pytest.mark.slow
@torch.no_grad()
def test_sampled_drafts_exact_at_position_one_and_unbiased_deeper(oracle):
    """vllm-probabilistic: P(A >= 1) = sum_x min(p_1, q_1) exactly; P(A >= 2) = sum_x w_1(x) alpha_2(x) worked out
    here over every draft token x (a plain forward per x, the draft stepped once per x), against the rollout
    estimate: per start, z = (estimate - exact) / sqrt(Var / M), Var the estimator's own variance
    sum_x r(x) (alpha_1 alpha_2(x))^2 - P(A >= 2)^2 (r = w_1 / alpha_1, the rollouts' law of x_1); the reported
    variance estimates Var / M (checked with many rollouts: with few, x's of small r carry much of Var and the
    sample variance, unbiased, is usually far below it)."""
    for m in (24, 128):
        _check_rollouts(oracle.with_(limit=3), m, check_variance=m > 100)


def _check_rollouts(oracle, m, check_variance):
    dec = dict(temperature=1.5, accept_rule="vllm-probabilistic")
    res = profile(oracle, ProfileOptions(max_steps=2, rollouts=m), **dec)
    decoding, spec = DecodingSettings(**dec), oracle.speculator
    head = spec.head
    vocab = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    by_key = rows_by_key(res.per_start)
    zs, reported, true = [], 0.0, 0.0
    for p in res.profiled:
        for t in (1, 4, 7):
            ctx = p.prompt.input_ids + p.continuation[:t]
            state = draft_state(oracle, ctx)
            q1 = draft_probs(head.logits(state.last_out)[0, -1], decoding)
            w1 = torch.minimum(target_p(oracle, ctx, decoding)[vocab], q1).double()
            row = by_key[(p.prompt.id, 0, t, 2, None)]
            assert row["p_accept_at_least"][0] == pytest.approx(float(w1.sum()), abs=1e-5)
            assert row["variance"][0] == 0.0
            xs = (w1 > 0).nonzero()[:, 0]
            seqs = torch.tensor([ctx + [int(vocab[x])] for x in xs])
            p2 = target_probs(spec.target.forward(seqs, None)[:, -1], decoding)[:, vocab]
            many = DraftCache()                          # the draft's real pairs, once per x
            many.keys = state.cache.keys.expand(len(xs), -1, -1, -1)
            many.values = state.cache.values.expand(len(xs), -1, -1, -1)
            out = head.step(spec.embed(vocab[xs][:, None]), state.last_out.expand(len(xs), 1, -1),
                            torch.full((len(xs), 1), len(ctx) - 1), many)
            alpha2 = torch.minimum(p2, draft_probs(head.logits(out)[:, -1], decoding)).sum(-1).double()
            alpha1 = float(w1.sum())
            exact = float((w1[xs] * alpha2).sum())
            var = float((w1[xs] / alpha1 * (alpha1 * alpha2) ** 2).sum()) - exact ** 2
            if var > 1e-10:
                zs.append((row["p_accept_at_least"][1] - exact) / math.sqrt(var / m))
            reported += row["variance"][1]
            true += var / m
    assert len(zs) >= 6 and max(abs(z) for z in zs) < 4.0, zs
    assert sum(z * z for z in zs) < len(zs) + 5 * math.sqrt(2 * len(zs)), zs         # chi-square, generous
    if check_variance:
        assert 0.5 < reported / true < 2, (reported, true)


@pytest.fixture(scope="module")
def full_vocab(tmp_path_factory):
    """A random tiny target and a head with the full vocab (sglang-rs refuses a reduced one)."""
    from fixtures import make_head, make_target, write_prompts

    root = tmp_path_factory.mktemp("full_vocab")
    return api.load_oracle(Settings.of(target=str(make_target(root / "target")), draft=str(make_head(root / "head")),
                                       prompts=str(write_prompts(root / "prompts.jsonl", n=2)), max_new_tokens=8))


@torch.no_grad()
@pytest.mark.parametrize("case", ["bundled, vllm-probabilistic", "full vocab, sglang-rs, top-p 0.9"])
def test_weighted_estimate_averages_to_the_exact_value_over_the_next_token(oracle, full_vocab, case):
    """The default sampled-draft estimate (profile/weighted.py) from one continuation, at start t: P(A >= 1)
    = alpha_1 exactly, and at depth 2 rho_1(x) alpha_2(x) with x the continuation's next token. Every x the
    target can emit is put after the same context here (no sampling), each x's estimate is checked against
    min(1, q_1(x) / p_1(x)) alpha_2(x) of plain forwards, and their average under p_1 against P(A >= 2) =
    sum_x w_1(x) alpha_2(x): the estimate is unbiased exactly, not within an interval. Dropping the weights
    (rho = 1) would miss it by far more than the tolerance (asserted); a token outside the reduced draft
    vocab can never be a draft: its estimate is 0. Its variance, summed here over the same tokens, is within
    the bound the docs give, P (1 - P). Both rules that sample drafts: vLLM's filter order on the bundled
    pair's reduced vocab, SGLang's with top-p on a full-vocab head."""
    from eagle_eval.profile.sampled import teacher_forced
    from eagle_eval.profile.weighted import weighted_expectations

    if case.startswith("bundled"):
        o, dec, starts = oracle, dict(temperature=1.5, accept_rule="vllm-probabilistic"), (3, 6)
    else:
        o, dec, starts = full_vocab, dict(temperature=1.0, top_p=0.9, accept_rule="sglang-rs"), (2, 5)
    decoding = DecodingSettings(**dec)
    base = profile(o.with_(limit=2), ProfileOptions(max_steps=2), **dec)
    spec, head = o.speculator, o.speculator.head
    vocab = head.to_target_ids(torch.arange(head.config.draft_vocab_size))
    for p, t in zip(base.profiled, starts):
        ctx = p.prompt.input_ids + p.continuation[:t]
        p1 = target_p(o, ctx, decoding).double()
        outside = [x for x in sorted(set(range(len(p1))) - set(vocab.tolist())) if p1[x] > 0][:1]
        state = draft_state(o, ctx)
        q1 = draft_probs(head.logits(state.last_out)[0, -1], decoding).double()
        w1 = torch.minimum(p1[vocab], q1)
        xs = (w1 > 0).nonzero()[:, 0]                                    # draft ids the first draft can be
        seqs = torch.tensor([ctx + [int(vocab[x])] for x in xs])
        p2 = target_probs(spec.target.forward(seqs, None)[:, -1], decoding)[:, vocab]
        many = DraftCache()
        many.keys = state.cache.keys.expand(len(xs), -1, -1, -1)
        many.values = state.cache.values.expand(len(xs), -1, -1, -1)
        out = head.step(spec.embed(vocab[xs][:, None]), state.last_out.expand(len(xs), 1, -1),
                        torch.full((len(xs), 1), len(ctx) - 1), many)
        alpha2 = torch.minimum(p2, draft_probs(head.logits(out)[:, -1], decoding)).sum(-1).double()
        exact2 = float((w1[xs] * alpha2).sum())
        items = [(p.prompt, p.continuation[:t] + [int(vocab[x]), 0]) for x in xs] + \
            [(p.prompt, p.continuation[:t] + [x, 0]) for x in outside]
        est = weighted_expectations(spec, teacher_forced(spec, items, 0), 2, t, decoding)[:, t - 1]   # [N, 2]
        assert torch.allclose(est[:, 0], w1.sum().expand(len(items)), atol=1e-5)
        n = len(xs)
        want = torch.minimum(torch.ones_like(alpha2), q1[xs] / p1[vocab[xs]]) * alpha2
        assert torch.allclose(est[:n, 1], want, atol=1e-5), (est[:n, 1] - want).abs().max()
        assert (est[n:, 1] == 0).all() and len(outside) == (1 if case.startswith("bundled") else 0)
        assert float((p1[vocab[xs]] * est[:n, 1]).sum()) == pytest.approx(exact2, abs=1e-5)
        assert abs(float((p1[vocab[xs]] * alpha2).sum()) - exact2) > 1e-2
        var = float((p1[vocab[xs]] * est[:n, 1] ** 2).sum()) - exact2 ** 2        # docs/sampling.md: its variance
        assert 0 < var <= exact2 * (1 - exact2)


def test_weighted_estimate_is_the_same_in_row_chunks(oracle, monkeypatch):
    """At an 8B vocab the target's p is taken a row or two at a time (CHUNK_ELEMENTS); one row per chunk gives
    the same estimates as the whole batch at once."""
    from eagle_eval.profile import weighted as weighted_module

    dec = dict(temperature=1.0, top_p=0.9, accept_rule="vllm-probabilistic")
    whole = profile(oracle, ProfileOptions(max_steps=4), **dec)
    monkeypatch.setattr(weighted_module, "CHUNK_ELEMENTS", 1)
    rows = profile(oracle, ProfileOptions(max_steps=4), **dec)
    a, b = rows_by_key(whole.per_start), rows_by_key(rows.per_start)
    assert a.keys() == b.keys() and len(whole.profiled) > 1
    assert all(x == pytest.approx(y, abs=1e-6) for k in a
               for x, y in zip(a[k]["p_accept_at_least"], b[k]["p_accept_at_least"]))


@pytest.mark.slow
def test_weighted_and_rollout_estimates_agree_along_the_whole_chain(oracle, monkeypatch):
    """Both sampled-draft estimates, on the same sampled continuations (the seed fixes them), are unbiased for
    every P(A >= k): per prompt, the mean over its starts of (weighted - rollouts) has mean 0, prompts being
    independent; a t statistic over 24 prompts per position, |t| < 4. The weights dropped (rho = 1) give t
    far beyond it at every k >= 2 (checked here on the same numbers)."""
    from eagle_eval.profile import weighted as weighted_module

    dec = dict(temperature=1.2, accept_rule="vllm-probabilistic")
    o = oracle.with_(limit=24)
    weighted = profile(o, ProfileOptions(max_steps=4), **dec)
    rolled = profile(o, ProfileOptions(max_steps=4, rollouts=4), **dec)
    monkeypatch.setattr(weighted_module, "weight", lambda p, q: torch.ones_like(p))
    planted = profile(o, ProfileOptions(max_steps=4), **dec)
    assert [p.continuation for p in weighted.profiled] == [p.continuation for p in rolled.profiled]
    assert weighted.report["sampling"]["draft_estimator"].startswith("importance-weighted")
    assert rolled.report["sampling"]["draft_estimator"].startswith("4 rollouts")
    a, b, bad = rows_by_key(weighted.per_start), rows_by_key(rolled.per_start), rows_by_key(planted.per_start)
    assert a.keys() == b.keys() and all("variance" not in r for r in a.values())
    assert len(weighted.profiled) == 24

    def t_stat(x, k):
        """t of the per-prompt mean over its starts of x - rollouts, at P(A >= k + 1)."""
        diffs = []
        for p in weighted.profiled:
            keys = [key for key in x if key[0] == p.prompt.id and key[3] == 4]
            diffs.append(sum(x[key]["p_accept_at_least"][k] - b[key]["p_accept_at_least"][k] for key in keys)
                         / len(keys))
        n, mean = len(diffs), sum(diffs) / len(diffs)
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        return max(abs(d) for d in diffs) if k == 0 else mean / (sd / math.sqrt(n))

    assert t_stat(a, 0) < 1e-5                                              # alpha_1: exact in both
    ts, planted_ts = [t_stat(a, k) for k in (1, 2, 3)], [t_stat(bad, k) for k in (1, 2, 3)]
    assert all(abs(t) < 4.0 for t in ts), ts
    assert all(t > 8.0 for t in planted_ts), planted_ts


def test_rules_the_profile_cannot_verify_are_refused(oracle):
    with pytest.raises(ConfigError, match="sglang-rs.*draft vocab"):
        profile(oracle, ProfileOptions(max_steps=2), temperature=1.0, accept_rule="sglang-rs")
    with pytest.raises(ConfigError, match="as a chain"):
        profile(oracle, ProfileOptions(max_steps=2), temperature=1.0, accept_rule="vllm", topk=2, num_draft_tokens=4)
    with pytest.raises(ConfigError, match="as a chain"):
        profile(oracle, ProfileOptions(max_steps=2), temperature=1.0, accept_rule="vllm-probabilistic", topk=2,
                num_draft_tokens=4)


# -- trajectories, responses, seeds ----------------------------------------------------------------------

def test_acceptance_along_a_sampled_trajectory_is_the_loops_prefix_match_on_it(oracle):
    """The realized counts at T > 0: the loop's own drafts (DraftState at each cycle start) matched against the
    sampled text, cycle after cycle, stopping at max_new_tokens or EOS as the loop does."""
    res = profile(oracle, ProfileOptions(max_steps=4), temperature=1.2, top_p=0.95)
    eos, nonzero = oracle.eos_ids, 0
    for rec, p in zip(res.samples, res.profiled):
        cont = p.continuation
        for s in (1, 3):
            k, want = 0, []
            while k + 1 < MAX_NEW and cont[k] not in eos:
                drafts = draft_state(oracle, p.prompt.input_ids + cont[: k + 1]).propose_chain(s).tolist()
                n = next((i for i, d in enumerate(drafts) if d != cont[k + 1 + i]), s)
                want.append(n)
                if any(x in eos for x in cont[k + 1: k + n + 2]):
                    break
                k += n + 1
            assert rec.extra["accepted_per_cycle_by_num_steps"][str(s)] == want, (p.prompt.id, s)
            nonzero += sum(want)
        assert rec.id == p.prompt.id and rec.extra["sample"] == 0
    assert nonzero > 0


def test_given_responses_with_sampled_drafts_need_rollouts(oracle, tmp_path):
    base = profile(oracle.with_(limit=2), ProfileOptions(max_steps=2), temperature=1.0)
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps({"id": p.prompt.id, "output_ids": p.continuation[:8]}) + "\n"
                            for p in base.profiled))
    dec = dict(temperature=1.0, accept_rule="vllm-probabilistic")
    with pytest.raises(ConfigError, match="--responses with --accept-rule vllm-probabilistic.*--rollouts M"):
        profile(oracle.with_(limit=2), ProfileOptions(max_steps=2, responses=str(path)), **dec)
    res = profile(oracle.with_(limit=2), ProfileOptions(max_steps=2, responses=str(path), rollouts=2), **dec)
    assert all(len(r["variance"]) == r["num_steps"] for r in res.per_start)


def test_responses_at_temperature_above_zero_are_taken_as_they_are(oracle, tmp_path):
    base = profile(oracle, ProfileOptions(max_steps=3), temperature=1.0)
    given = {}
    for p in base.profiled:
        c = p.continuation[:10]
        c[4] = (c[4] + 7) % 900                         # no sample the target would likely give
        given[p.prompt.id] = c
    path = tmp_path / "responses.jsonl"
    path.write_text("".join(json.dumps({"id": k, "output_ids": v}) + "\n" for k, v in given.items()))
    res = profile(oracle, ProfileOptions(max_steps=3, responses=str(path)), temperature=1.0)
    assert res.report["response_divergences"] == [] and "given (--responses)" in res.report["sampling"]["continuations"]
    for p in res.profiled:
        assert p.continuation[:10] == given[p.prompt.id] and len(p.continuation) == MAX_NEW + 3


def test_seeds_reproduce_runs_byte_for_byte(oracle, tmp_path):
    opts = ProfileOptions(max_steps=3, samples_per_prompt=2)
    dec = dict(temperature=1.1, top_p=0.9)
    a = profile(oracle, opts, tmp_path / "a", **dec)
    b = profile(oracle, opts, tmp_path / "b", **dec)
    for name in ("per_start.jsonl", "samples.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert {r["sample"] for r in a.per_start} == {0, 1}
    conts = {(p.prompt.id, i % 2): p.continuation for i, p in enumerate(a.profiled)}
    assert any(conts[(k, 0)] != conts[(k, 1)] for k, _ in conts)          # (some prompts are near-greedy)
    # other batches (one row each): the same sampled tokens, the same expectations up to float rounding
    c = profile(oracle, ProfileOptions(max_steps=3, batch_tokens=90, samples_per_prompt=2), **dec)
    assert [p.continuation for p in c.profiled] == [p.continuation for p in a.profiled]
    for x, y in zip(a.per_start, c.per_start):
        assert x["p_accept_at_least"] == pytest.approx(y["p_accept_at_least"], abs=1e-5)
    d = profile(oracle, opts, **{**dec, "seed": 1})
    assert [p.continuation for p in d.profiled] != [p.continuation for p in a.profiled]


@pytest.mark.parametrize("rollouts", [0, 2])
def test_sampled_draft_estimates_reproduce_byte_for_byte(oracle, tmp_path, rollouts):
    opts = ProfileOptions(max_steps=3, rollouts=rollouts)
    dec = dict(temperature=1.1, accept_rule="vllm-probabilistic")
    profile(oracle.with_(limit=3), opts, tmp_path / "a", **dec)
    profile(oracle.with_(limit=3), opts, tmp_path / "b", **dec)
    assert (tmp_path / "a" / "per_start.jsonl").read_bytes() == (tmp_path / "b" / "per_start.jsonl").read_bytes()
    other = profile(oracle.with_(limit=3), opts, **dec, seed=1)
    first = [json.loads(line) for line in (tmp_path / "a" / "per_start.jsonl").read_text().splitlines()]
    assert [r["p_accept_at_least"] for r in first] != [r["p_accept_at_least"] for r in other.per_start]


def test_profile_cli_at_temperature_above_zero(tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(main, ["profile", "--temperature", "0.9", "--top-p", "0.9", "--limit", "3",
                                    "--max-new-tokens", "12", "--max-steps", "3", "--output-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "per-context" in res.output and "sampled accept length" in res.output
    rows = [json.loads(x) for x in (out / "per_start.jsonl").read_text().splitlines()]
    assert {r["num_steps"] for r in rows} == {1, 2, 3} and {"prompt_id", "start", "expected_tokens_per_step",
                                                            "p_accept_at_least"} <= set(rows[0])
    report = json.loads((out / "profile.json").read_text())
    assert report["sampling"]["filter_order"].startswith("temperature -> min_p")
    assert "per_start.jsonl" in json.loads((out / "eagle_eval_run.json").read_text())["files"]
    bad = CliRunner().invoke(main, ["profile", "--temperature", "1", "--topk", "2", "--num-draft-tokens", "4",
                                    "--max-steps", "2", "--limit", "1"])
    assert bad.exit_code == 2 and "as a chain (no token tree)" in bad.output


def test_ablate_takes_temperature_as_one_more_axis(oracle):
    """--temperature-grid: one profile per temperature; T = 0 rows are the greedy ablation's, T > 0 rows model
    the speedup from the conditional expectation along the sampled trajectories."""
    from eagle_eval.commands.ablate import ablate
    from eagle_eval.stats.acceptance import speedup
    from eagle_eval.settings import AblateOptions

    options = AblateOptions(max_steps=3, cost_ratio=0.1)
    greedy = ablate(oracle.settings, options, progress=False)
    swept = ablate(oracle.settings, AblateOptions(max_steps=3, cost_ratio=0.1, temperature_grid=(0.0, 1.2)),
                   progress=False)
    assert [r["variant"] for r in swept["rows"]] == ["base T=0"] * 3 + ["base T=1.2"] * 3
    for g, r in zip(greedy["rows"], swept["rows"][:3]):
        assert {k: v for k, v in r.items() if k != "variant"} == {k: v for k, v in g.items() if k != "variant"}
    hot = profile(oracle, ProfileOptions(max_steps=3), temperature=1.2)
    for r in swept["rows"][3:]:
        e = hot.report["by_num_steps"][str(r["num_steps"])]["expected"]["along_trajectories"]
        u = [p["p_accept_at_least"]["value"] for p in e["per_position"]]
        assert r["temperature"] == 1.2 and r["rates"] == "along_trajectories"
        assert r["tau"] == pytest.approx(e["expected_tokens_per_step"]["value"], abs=1e-12)
        assert r["speedup_model"] == pytest.approx(speedup(u, 0.1, 1.0), abs=1e-12)
        assert r["tau_sampled"] == hot.report["by_num_steps"][str(r["num_steps"])]["summary"]["accept_length"]
    assert swept["config"]["temperature_grid"] == [0.0, 1.2]


@pytest.mark.slow
@pytest.mark.parametrize("trees", [[], ["--topk", "3", "--num-draft-tokens", "6"]])
def test_sampling_benchmark_runs_its_gpu_code_tiny_on_the_cpu(tmp_path, trees):
    """benchmarks/bench_sampling_profile.py --random tiny: the --random 8b path (random weights, the ratios
    measured side by side), at tiny shapes, chains and trees; the sampled profile reads the same with its own
    continuations given."""
    import subprocess
    import sys

    from eagle_eval.settings import REPO_ROOT

    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_sampling_profile.py"), "--random", "tiny",
           "--prompts", "3", "--max-new-tokens", "10", "--max-steps", "4", "--reps", "1", "--out", str(tmp_path)]
    subprocess.run(cmd + trees, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "bench_sampling_profile.json").read_text())
    assert result["same_with_responses"] is True and result["ratio_with_generation"] > 0
    assert result["ratio_pass_only"] > 0 and result["topk"] == (3 if trees else 1)
    nodes_per_start = 3 if not trees else 3 * 3     # chains: max_steps - 1; trees: the pool's K parents on 3 levels
    assert 0 < result["branch_tokens"] <= result["prompts"] * 10 * nodes_per_start


@pytest.mark.slow
def test_sampling_benchmark_runs_sampled_drafts_tiny_on_the_cpu(tmp_path):
    """bench_sampling_profile.py --accept-rule vllm-probabilistic: the one-pass weighted estimate against the
    greedy profile (no given-continuations run: given texts need rollouts), per-context figure only."""
    import subprocess
    import sys

    from eagle_eval.settings import REPO_ROOT

    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_sampling_profile.py"), "--random", "tiny",
           "--prompts", "3", "--max-new-tokens", "10", "--max-steps", "4", "--reps", "1",
           "--accept-rule", "vllm-probabilistic", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "bench_sampling_profile.json").read_text())
    assert result["ratio_with_generation"] > 0 and result["ratio_pass_only"] > 0
    assert result["ratio_given_responses"] is None and result["sampled_tau"] is None
    assert result["branch_tokens"] == 0 and 1 <= result["sampled_expected_per_context"] <= 5


@pytest.mark.slow
def test_sampling_benchmark_runs_trees_on_the_bundled_pair(tmp_path):
    """bench_sampling_profile.py --topk 3: the tree profile at T > 0 against the greedy tree profile; SGLang's
    rule by default, the resolved tree shape echoed, and the same report with its own continuations given."""
    import subprocess
    import sys

    from eagle_eval.settings import REPO_ROOT

    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_sampling_profile.py"), "--topk", "3",
           "--num-draft-tokens", "6", "--max-steps", "3", "--max-new-tokens", "8", "--reps", "1", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "bench_sampling_profile.json").read_text())
    assert (result["topk"], result["num_draft_tokens"], result["accept_rule"]) == (3, 6, "sglang")
    assert result["same_with_responses"] is True and result["ratio_with_generation"] > 0
    assert result["ratio_pass_only"] > 0
    assert 1 <= result["sampled_expected_along"] <= 4                       # at most max_steps + 1 per step
