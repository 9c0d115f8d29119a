"""Tree drafting (topk > 1): tree building by hand, losslessness, oracle drafts, chain = tree(K=1)."""

import pytest
import torch
from fixtures import load_prompts

from eagle_eval import api
from eagle_eval.settings import ConfigError, Settings
from eagle_eval.loop import reference as chain
from eagle_eval.loop.draft import DraftState
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.loop.tree import Pool, accept_path, pool_size, select_tree, stable_top


def test_hand_built_tree():
    # K = 2, S = 3: level 1 = nodes 0, 1; level 2 = children of 0 (2, 3) and of 1 (4, 5);
    # frontier after level 2 = {2, 4}; level 3 = children of 2 (6, 7) and of 4 (8, 9)
    pool = Pool(tokens=[10, 11, 20, 21, 22, 23, 30, 31, 32, 33],
                scores=[0.6, 0.4, 0.36, 0.18, 0.3, 0.1, 0.18, 0.09, 0.24, 0.06],
                parents=[-1, -1, 0, 0, 1, 1, 2, 2, 4, 4], ranks=[0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    tree = select_tree(pool, root_token=7, num_draft_tokens=7)
    # best 6: 0 (.6), 1 (.4), 2 (.36), 4 (.3), 8 (.24), then 3 and 6 tie at .18 -> lower index 3
    assert tree.tokens == [7, 10, 11, 20, 21, 22, 32]
    assert tree.parents == [-1, 0, 0, 1, 1, 2, 5]
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3]
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(tree.mask(), expected)
    # greedy walk: root argmax 11 -> node 2; its argmax 22 -> node 5; its argmax 32 -> node 6
    path = accept_path(tree, [11, 0, 22, 0, 0, 32, 5])
    assert path == [0, 2, 5, 6] and not tree.on_top1_chain(path)
    assert tree.on_top1_chain(accept_path(tree, [10, 20, 0, 0, 0, 0, 0]))


def test_stable_top_is_the_head_of_a_stable_descending_sort():
    """stable_top (topk, then the full sort only where the n-th value ties outside the n) against the first n
    of torch's stable descending sort, on rows full of ties (values in fifths) and on tie-free rows, 1-D and
    batched."""
    g = torch.Generator().manual_seed(0)
    tied_rows = 0
    for trial in range(200):
        v = int(torch.randint(1, 40, (1,), generator=g))
        n = int(torch.randint(1, v + 1, (1,), generator=g))
        x = torch.rand(5, v, generator=g) if trial % 3 == 0 else torch.randint(0, 6, (5, v), generator=g) / 5
        want = torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :n]
        assert torch.equal(stable_top(x, n), want), (x, n)
        assert torch.equal(stable_top(x[0], n), want[0])
        tied_rows += int(((x >= x.gather(-1, want[:, -1:])).sum(-1) > n).sum())
    assert tied_rows > 100                              # the fallback ran, not only topk


def test_child_with_probability_one_follows_its_parent():
    pool = Pool(tokens=[1, 2, 3], scores=[0.5, 0.5, 0.5], parents=[-1, -1, 0], ranks=[0, 1, 0])
    assert select_tree(pool, 0, 3).tokens == [0, 1, 2]      # ties -> lower pool index: parents first
    assert select_tree(pool, 0, 4).parents == [-1, 0, 0, 1]


def test_pool_size_and_invalid_combinations(tiny):
    assert pool_size(5, 4) == 4 + 4 * 16
    base = dict(target=str(tiny["target"]), draft=str(tiny["head"]))
    with pytest.raises(ConfigError, match="D <= 7"):
        api.load_oracle(Settings.of(**base, num_steps=2, topk=2, num_draft_tokens=8))
    with pytest.raises(ConfigError, match="needs --num-draft-tokens"):
        api.load_oracle(Settings.of(**base, num_steps=2, topk=2))
    with pytest.raises(ConfigError, match=">= 2"):
        Settings.of(**base, num_steps=2, topk=2, num_draft_tokens=1)


def test_eagle_parameter_names(tiny):
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), eagle_depth=4, eagle_top_k=3,
                    eagle_total_token=12)
    assert (cfg.speculation.num_steps, cfg.speculation.topk, cfg.speculation.num_draft_tokens) == (5, 3, 12)
    oracle = api.load_oracle(cfg)
    assert oracle.resolved.as_dict()["eagle_params"]["conversion"].startswith("num_steps = depth + 1")
    with pytest.raises(ConfigError, match="go together"):
        Settings.of(eagle_depth=4)


@pytest.fixture(scope="module")
def oracle(tiny):
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(tiny["prompts"]))
    o = api.load_oracle(cfg)
    return o, load_prompts(cfg.workload.prompts, o.tokenizer)


@pytest.mark.parametrize("s, k, d", [(2, 2, 3), (3, 2, 6), (4, 3, 10), (3, 4, 21)])
def test_tree_is_lossless(oracle, s, k, d):
    o, prompts = oracle
    for p in prompts[:3]:
        out = chain.speculative_decode(o.speculator, p.input_ids, s, 20, o.eos_ids, topk=k, num_draft_tokens=d)
        assert out.output_ids == plain_greedy(o.speculator.target, p.input_ids, 20, o.eos_ids)
        assert all(0 <= n <= s for n in out.accepted_per_cycle)


def test_tree_with_topk_1_equals_chain(oracle):
    o, prompts = oracle
    for s in (1, 3, 5):
        for p in prompts:
            c = chain.speculative_decode(o.speculator, p.input_ids, s, 24, o.eos_ids)
            t = chain.speculative_decode(o.speculator, p.input_ids, s, 24, o.eos_ids, topk=1, tree=True)
            assert (c.output_ids, c.accepted_per_cycle) == (t.output_ids, t.accepted_per_cycle)
            assert not any(t.off_top1_per_cycle)


@pytest.mark.parametrize("right", [True, False])
def test_oracle_tree_accepts_s_or_nothing(oracle, monkeypatch, right):
    """A pool whose top-1 chain is the greedy continuation (plus wrong siblings): every cycle
    accepts S; with the right tokens only in second rank, the off-top-1 share is 1."""
    o, prompts = oracle
    s, k = 3, 2
    prompt = prompts[1]
    seq = prompt.input_ids + plain_greedy(o.speculator.target, prompt.input_ids, 40, set())
    vocab = o.speculator.head.config.vocab_size

    def propose(self, num_steps, topk):
        nxt = seq[self.real_len + 1: self.real_len + 1 + num_steps]
        good = nxt if right else [(t + 1) % vocab for t in nxt]
        bad = [(t + 2) % vocab for t in nxt]
        tokens, scores, parents, ranks = [good[0], bad[0]], [0.9, 0.05], [-1, -1], [1, 0]
        parent, score = 0, 0.9
        for level in range(1, num_steps):                   # expand only the good node
            first = len(tokens)
            tokens += [good[level], bad[level]]
            scores += [score * 0.9, score * 0.05]
            parents += [parent, parent]
            ranks += [1, 0]
            parent, score = first, score * 0.9
        return Pool(tokens, scores, parents, ranks)

    monkeypatch.setattr(DraftState, "propose_tree", propose)
    out = chain.speculative_decode(o.speculator, prompt.input_ids, s, 24, o.eos_ids, topk=k, num_draft_tokens=2 * s + 1)
    assert out.output_ids == seq[len(prompt.input_ids):][:24]
    if right:
        assert set(out.accepted_per_cycle) == {s} and all(out.off_top1_per_cycle)
    else:
        assert set(out.accepted_per_cycle) == {0} and not any(out.off_top1_per_cycle)


def test_tree_report_fields(tiny):
    cfg = Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]), prompts=str(tiny["prompts"]),
                    num_steps=3, topk=2, num_draft_tokens=5, max_new_tokens=12)
    report = api.evaluate(cfg, progress=False).report
    s = report["summary"]
    assert report["config"]["num_draft_tokens"] == 5 and report["config"]["topk"] == 2
    assert 0 <= s["off_top1_chain_cycles"] <= s["cycles"]
    result = api.evaluate(cfg, progress=False)
    for rec in result.samples:              # every verify tree had D - 1 = 4 drafted nodes
        shapes = rec.extra["tree_shape_per_cycle"]
        assert len(shapes) == rec.verify_count and all(sum(shape) == 4 for shape in shapes)
    assert s["accept_length"] == pytest.approx(1 + sum(p["unconditional_rate"] for p in report["per_position"]))
