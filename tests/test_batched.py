"""Many prompts at once (loop/batched.py), the capture fallback (loop/graphed.py) and the
profile's survivor-only drafting (profile/run_lengths.py): each equals its batch-1 / dense reference
exactly in fp32 (tokens, accepted drafts per cycle, emitted tokens per cycle, tree fields)."""

import pytest
import torch
from fixtures import make_head, make_target, write_prompts

from eagle_eval import api
from eagle_eval.settings import Settings
from eagle_eval.models.capture import FeatureCapture
from eagle_eval.loop.rows import block_visible
from eagle_eval.loop.policy import greedy_accept
from eagle_eval.loop import batched, graphed
from eagle_eval.loop.batched import accept_chains, batched_decode
from eagle_eval.loop.reference import speculative_decode
from eagle_eval.profile.unroll import unroll_chains
from eagle_eval.profile.teacher_forced import greedy_continuations, run_lengths_from_predictions
from eagle_eval.profile.run_lengths import SparseChains, chain_run_lengths
from eagle_eval.workload.conversations import load_workload


@pytest.fixture(scope="module")
def bundled():
    """The bundled pair (a trained head: acceptance well between 0 and 1) and 7 prompts of 10..21 tokens."""
    cfg = Settings.of(max_new_tokens=24)
    oracle = api.load_oracle(cfg)
    prompts = [p.input_ids for p in load_workload(cfg.workload, oracle.tokenizer).first_prompts[:7]]
    assert len({len(p) for p in prompts}) >= 5
    return oracle, prompts


def assert_same(reference, decoded):
    for ref, got in zip(reference, decoded, strict=True):
        assert got.output_ids == ref.output_ids
        assert got.accepted_per_cycle == ref.accepted_per_cycle
        assert got.emitted_per_cycle == ref.emitted_per_cycle
        assert got.off_top1_per_cycle == ref.off_top1_per_cycle
        assert got.tree_shape_per_cycle == ref.tree_shape_per_cycle


@pytest.mark.parametrize("num_steps,topk,draft_tokens,batch", [(3, 1, None, 3), (5, 1, None, 7), (1, 1, None, 2),
                                                               (3, 3, 8, 3), (4, 2, 6, 4), (3, 1, None, 16)])
def test_batched_equals_batch_one(bundled, num_steps, topk, draft_tokens, batch):
    """Prompts of different lengths, rows refilled as prompts finish (7 prompts over 2..4 rows), and
    more rows than prompts (16)."""
    oracle, prompts = bundled
    ref = [speculative_decode(oracle.speculator, p, num_steps, 24, oracle.eos_ids, topk, draft_tokens)
           for p in prompts]
    run = batched_decode(oracle.speculator, prompts, num_steps, 24, oracle.eos_ids, batch, topk, draft_tokens)
    assert_same(ref, run.decoded)
    assert sum(sum(d.accepted_per_cycle) for d in ref) > len(prompts)        # the head accepts: not trivial
    assert run.cycles < sum(len(d.accepted_per_cycle) for d in ref)           # rows did share cycles
    assert run.cuda_graphs is False and run.fallback is None


@pytest.mark.parametrize("topk,draft_tokens", [(1, None), (3, 8)])
def test_prompts_ending_early_free_their_row(bundled, topk, draft_tokens):
    """EOS = a token that some prompts emit early: they stop right after it, the next prompt takes the row."""
    oracle, prompts = bundled
    full = speculative_decode(oracle.speculator, prompts[0], 3, 24, set())
    eos = {full.output_ids[4]}
    ref = [speculative_decode(oracle.speculator, p, 3, 24, eos, topk, draft_tokens) for p in prompts]
    assert len(ref[0].output_ids) <= 5 and ref[0].output_ids[-1] in eos
    assert any(len(d.output_ids) == 24 for d in ref)                          # others run to the end
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 24, eos, 3, topk, draft_tokens).decoded)


def test_first_token_eos_and_one_new_token(bundled):
    oracle, prompts = bundled
    first = speculative_decode(oracle.speculator, prompts[1], 3, 1, set()).output_ids
    eos = set(first)
    ref = [speculative_decode(oracle.speculator, p, 3, 12, eos) for p in prompts]
    assert ref[1].output_ids == first and ref[1].accepted_per_cycle == []
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 12, eos, 2).decoded)
    ones = batched_decode(oracle.speculator, prompts, 3, 1, set(), 4).decoded
    assert [d.output_ids for d in ones] == [speculative_decode(oracle.speculator, p, 3, 1, set()).output_ids
                                            for p in prompts]


def test_mla_moe_target_batched_and_its_capture_blocker(tmp_path):
    """A DeepSeek-V3-architecture target (MLA latents in the row cache, MoE): batched equals batch-1,
    and graphs are refused for its experts, with the reason.""" 
    cfg = Settings.of(target=str(make_target(tmp_path / "t", family="deepseek_v3")), draft=str(make_head(tmp_path / "h")),
                    prompts=str(write_prompts(tmp_path / "p.jsonl", n=3)), max_new_tokens=16, num_steps=3)
    oracle = api.load_oracle(cfg)
    prompts = [p.input_ids for p in load_workload(cfg.workload, oracle.tokenizer).first_prompts]
    ref = [speculative_decode(oracle.speculator, p, 3, 16, oracle.eos_ids) for p in prompts]
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 16, oracle.eos_ids, 2).decoded)
    assert oracle.resolved.target.experts["implementation"] == "grouped_mm"
    reason = graphed.capture_blockers(oracle.speculator, cuda=True)
    assert "experts" in reason and "mlp" in reason and "'grouped_mm'" in reason


def test_capture_fallback_runs_eager_with_a_reason(bundled, monkeypatch):
    """Graphs asked for where none can be captured: the loop runs eager, says why in one line, and its
    tokens are the eager ones. Both ways there: a blocker found up front (no CUDA device here), and a
    capture that fails (a host read inside the forward)."""
    oracle, prompts = bundled
    ref = [speculative_decode(oracle.speculator, p, 3, 16, oracle.eos_ids) for p in prompts[:3]]
    run = batched_decode(oracle.speculator, prompts[:3], 3, 16, oracle.eos_ids, 1, cuda_graphs=True)
    assert_same(ref, run.decoded)
    if not torch.cuda.is_available():
        assert run.cuda_graphs is False and run.fallback.startswith("no CUDA device")

    def fails(fn, state, warmups=2):
        for _ in range(warmups):                 # the warm-ups run and their state change is put back
            saved = [t.clone() for t in state]
            fn()
            for t, s in zip(state, saved):
                t.copy_(s)
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")
    monkeypatch.setattr(graphed, "capture_blockers", lambda spec, cuda=None: None)
    monkeypatch.setattr(graphed, "capture", fails)
    monkeypatch.setattr(graphed.torch.cuda, "synchronize", lambda: None)
    run = batched_decode(oracle.speculator, prompts[:3], 3, 16, oracle.eos_ids, 2, cuda_graphs=True)
    assert run.cuda_graphs is False and "\n" not in run.fallback
    assert run.fallback.startswith("CUDA graph capture failed (operation not permitted when stream is capturing)")
    assert_same(ref, run.decoded)


@pytest.mark.parametrize("topk,draft_tokens", [(1, None), (3, 8)])
def test_prefills_are_batched_within_the_token_budget(bundled, monkeypatch, topk, draft_tokens):
    """All rows are prefilled together at the start (padded to the longest prompt), groups stay within
    the padded-token budget, and rows that are not adjacent (an index, not a slice: here every group
    is handed over reversed) prefill into the right rows: the tokens are batch-1's."""
    oracle, prompts = bundled
    ref = [speculative_decode(oracle.speculator, p, 3, 24, oracle.eos_ids, topk, draft_tokens) for p in prompts]
    groups = []
    admit = batched.admit

    def reversed_admit(spec, rows, capture, group, group_prompts, *args):
        groups.append((list(group), [len(p) for p in group_prompts]))
        return admit(spec, rows, capture, group[::-1], group_prompts[::-1], *args)[::-1]

    monkeypatch.setattr(batched, "admit", reversed_admit)
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 24, oracle.eos_ids, 4, topk, draft_tokens).decoded)
    assert groups[0][0] == [0, 1, 2, 3]                                      # the first fill: one forward
    assert sum(len(g) for g, _ in groups) == len(prompts)
    monkeypatch.setattr(batched, "PREFILL_TOKENS", 40)                      # prompts of 10..21 tokens
    groups.clear()
    assert_same(ref, batched_decode(oracle.speculator, prompts, 3, 24, oracle.eos_ids, 7, topk, draft_tokens).decoded)
    assert sorted(len(g) for g, _ in groups) != [7] and sum(len(g) for g, _ in groups) == len(prompts)
    assert any(len(g) > 1 for g, _ in groups)
    assert all(len(g) == 1 or len(g) * max(lens) <= 40 for g, lens in groups)


def test_prefill_groups_by_hand():
    assert batched.prefill_groups([100, 3000, 900, 50, 4000, 10], 4096) == [1, 1, 2, 1, 1]
    assert batched.prefill_groups([10, 50, 900, 1100], 4096) == [3, 1]
    assert batched.prefill_groups([5000], 4096) == [1] and batched.prefill_groups([], 4096) == []


def test_accept_chains_is_greedy_accept_per_row():
    g = torch.Generator().manual_seed(0)
    drafts = torch.randint(0, 3, (64, 5), generator=g)
    argmax = torch.randint(0, 3, (64, 6), generator=g)
    assert accept_chains(drafts, argmax).tolist() == [greedy_accept(d, a) for d, a in
                                                      zip(drafts.tolist(), argmax.tolist())]


def test_block_visibility_by_hand():
    """Row 0 holds 2 slots, row 1 holds 0; a causal block of 2 and a tree block (node 2 under node 0)."""
    vis = block_visible(torch.tensor([2, 0]), 2, 5, None)[:, 0].int().tolist()
    assert vis == [[[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]]
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    vis = block_visible(torch.tensor([1]), 3, 5, tree)[0, 0].int().tolist()
    assert vis == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]]


def pair_features(spec, seqs):
    """Right-padded ids [B, W] of seqs, the target features of x_0..x_{W-2} and the embeddings of x_1..x_{W-1}."""
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, s in enumerate(seqs):
        ids[r, : len(s)], mask[r, : len(s)] = torch.tensor(s), 1
    with FeatureCapture(spec.target.layers, spec.aux_hf, spec.draft_device) as cap:
        spec.target.forward(ids, None, attention_mask=mask)
        aux = cap.pop()[:, :-1]
    return ids, aux, spec.embed(ids[:, 1:])


@pytest.mark.parametrize("position_offset", [0, 1])
def test_survivor_run_lengths_equal_the_dense_unroll(bundled, position_offset):
    """chain_run_lengths (draft steps for surviving chains only) = run lengths of the dense all-starts
    unroll, on greedy continuations (long runs) of rows of different lengths (right padding)."""
    oracle, prompts = bundled
    spec = oracle.speculator
    conts = greedy_continuations(spec, prompts, 30, 0, 1 << 30)
    seqs = [p + c[: 12 + 3 * i] for i, (p, c) in enumerate(zip(prompts, conts))]
    ids, aux, embeds = pair_features(spec, seqs)
    for steps in (1, 3, 8):
        dense = torch.stack(unroll_chains(spec.head, aux, embeds, steps, position_offset, argmax_only=True), dim=1)
        runs = chain_run_lengths(spec.head, aux, embeds, ids, torch.tensor([len(s) for s in seqs]), steps,
                                 position_offset)
        for r, s in enumerate(seqs):
            expected = run_lengths_from_predictions(dense[r, :, : len(s) - 1], ids[r, : len(s)])
            assert runs[r, : len(s) - 1].tolist() == expected.tolist()
        if steps == 8:
            assert runs.max() >= 4                                   # long chains survived several steps


def free_running(head, embed):
    """A `feed` for `unroll_chains`: step j at position q takes the draft of step j-1 at q - 1, i.e. the chain
    started at q - j continues from its own argmax draft (the loop's chain, right or wrong)."""
    def feed(j: int, logits: torch.Tensor) -> torch.Tensor:
        drafted = head.to_target_ids(logits.argmax(-1))                                # [B, T]
        return embed(torch.cat([drafted[:, :1], drafted[:, :-1]], dim=1))           # column 0: never a chain
    return feed


@pytest.mark.parametrize("position_offset", [0, 1])
def test_sparse_free_running_chains_equal_the_dense_unroll(bundled, position_offset):
    """SparseChains stepping chains from their own drafts (the loop's chain past a wrong draft) = the dense
    all-starts unroll with `free_running`, at every chain when all run, and at the chains asked for when a
    step runs only some (each chain run at step j ran at every step before it, in any order of calls)."""
    oracle, prompts = bundled
    spec = oracle.speculator
    seqs = [p + [5 + i, 9, 11 + i] for i, p in enumerate(prompts)]            # not the greedy text: chains leave it
    ids, aux, embeds = pair_features(spec, seqs)
    steps = 6
    dense = torch.stack(unroll_chains(spec.head, aux, embeds, steps, position_offset, argmax_only=True,
                                      feed=free_running(spec.head, spec.embed)), dim=1)       # [B, K, T]
    b, t = ids.shape[0], ids.shape[1] - 1
    gen = torch.Generator().manual_seed(0)
    chosen = torch.rand(b, t, generator=gen) < 0.4                 # the chains the second drafter follows
    every, some = (SparseChains(spec.head, aux, embeds, position_offset) for _ in range(2))
    assert torch.equal(every.first, dense[:, 0]) and torch.equal(some.first, dense[:, 0])
    drafts = {0: dense[:, 0]}
    for j in range(1, steps):
        bi, qi = (torch.arange(t)[None] >= j).expand(b, t).nonzero(as_tuple=True)
        got = every.step(j, bi, qi, spec.embed(drafts[j - 1][bi, qi - 1][None])[0])
        assert got.tolist() == dense[bi, j, qi].tolist(), j
        drafts[j] = torch.zeros_like(dense[:, 0])
        drafts[j][bi, qi] = got
    checked = 0
    for j in range(1, steps):                                       # chains started at q - j, where chosen
        bi, qi = (torch.arange(t)[None] >= j).expand(b, t).nonzero(as_tuple=True)
        bi, qi = bi[chosen[bi, qi - j]], qi[chosen[bi, qi - j]]
        for half in (qi % 2 == 1, qi % 2 == 0):                     # step j in two calls
            got = some.step(j, bi[half], qi[half], spec.embed(dense[bi[half], j - 1, qi[half] - 1][None])[0])
            assert got.tolist() == dense[bi[half], j, qi[half]].tolist(), j
            checked += int(half.sum())
    assert checked > 100


def test_run_with_batch_size_equals_batch_one(tmp_path):
    """`eagle-eval run --batch-size 3` (api.evaluate): the same samples and report as batch 1; the report
    says which loop ran and why graphs did not (no CUDA device here)."""
    from click.testing import CliRunner

    from eagle_eval.cli import main

    one = api.evaluate(Settings.of(max_new_tokens=16, limit=7), progress=False)
    res = CliRunner().invoke(main, ["run", "--batch-size", "3", "--max-new-tokens", "16", "--limit", "7",
                                    "--output-dir", str(tmp_path / "b3")])
    assert res.exit_code == 0, res.output
    import json
    rows = [json.loads(line) for line in (tmp_path / "b3" / "samples.jsonl").read_text().splitlines()]
    assert [(r["id"], r["output_ids"], r["accepted_per_cycle"]) for r in rows] == \
        [(s.id, s.output_ids, s.accepted_per_cycle) for s in one.samples]
    report = json.loads((tmp_path / "b3" / "report.json").read_text())
    assert report["summary"]["accept_length"] == one.report["summary"]["accept_length"]
    loop = report["config"]["loop"]
    assert loop["batch_size"] == 3 and loop["loop"] == "batched"
    if not torch.cuda.is_available():
        assert loop["cuda_graphs"] is False and loop["cuda_graphs_reason"].startswith("no CUDA device")


def test_moe_experts_fall_back_to_eager_when_the_fast_kernel_fails(tmp_path, monkeypatch):
    """The experts' fast path failing on this machine (as transformers' grouped_mm does on the lent H100 with torch
    2.11: "cutlass cannot initialize") is found by a one-token probe at load: the experts switch to eager, the report
    says why, and the run decodes the tokens of a target whose experts were eager from the start."""
    from transformers.integrations import moe

    def fails(*args, **kwargs):
        raise RuntimeError("cutlass cannot initialize\nmore")

    cfg = Settings.of(target=str(make_target(tmp_path / "t", family="deepseek_v3")), draft=str(make_head(tmp_path / "h")),
                      prompts=str(write_prompts(tmp_path / "p.jsonl", n=2)), max_new_tokens=12, num_steps=3)
    fast = api.load_oracle(cfg)
    assert fast.resolved.target.experts["implementation"] == "grouped_mm"
    assert fast.resolved.target.experts["fallback"] is None
    prompts = load_workload(cfg.workload, fast.tokenizer).first_prompts
    eager = api.load_oracle(cfg)
    eager.speculator.target.model.set_experts_implementation("eager")          # eager from the start
    expected = [eager.decode(p).output_ids for p in prompts]

    monkeypatch.setitem(moe.ALL_EXPERTS_FUNCTIONS._global_mapping, "grouped_mm", fails)
    with pytest.raises(Exception, match="RuntimeError: cutlass cannot initialize"):   # a run met it before the probe
        fast.decode(prompts[0])
    slow = api.load_oracle(cfg)
    experts = slow.resolved.target.experts
    assert experts["implementation"] == "eager" and experts["requested"] == {"": "grouped_mm"}
    assert experts["fallback"].startswith("experts_implementation 'grouped_mm' failed on a one-token probe forward "
                                          "(RuntimeError: cutlass cannot initialize)")
    assert [slow.decode(p).output_ids for p in prompts] == expected
    assert slow.resolved.as_dict()["target"]["experts"] == experts               # echoed in report.json's config
    reason = graphed.capture_blockers(slow.speculator, cuda=True)
    assert "experts" in reason and "'eager'" in reason
