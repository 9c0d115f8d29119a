"""The batched loop equals the reference loop on generated workloads (issue 41): prompt by prompt, tokens, accepted
drafts per cycle, emitted tokens per cycle and the tree fields, in fp32, greedy and under every sampling rule.

Workloads are drawn by hypothesis (bounded: `EXAMPLES` per test, derandomized so that CI sees the same ones; set
EAGLE_EVAL_EXAMPLES=500 to explore): 1 to 5 prompts of 1 token up to the longest the target allows (the longest
first, last or alone), max_new_tokens 1 to 64, num_steps 1 to 6, chains and trees, batch sizes from 1 to more than
the prompts, an EOS that ends a prompt at its first token or mid-cycle, on three pairs whose acceptance spans the
range: `copy` (a bigram target and a head that copies its prediction: every draft accepted, so rows reach their
capacity fastest), `bundled` (the bundled trained pair: in between), `random` (a random head: next to nothing); and
two block drafters (issue 40), `dflash` and `dflash2`, trained a few seconds on a tiny Qwen3's own text
(tests/dflash_fixtures.py), which verify chains only: their prompts are prefixes of that text (`known`), where they
draft well (in between), but for the longest prompt, random as for every pair.
Counterexamples found are kept below as fixed cases (`test_regression_*`).
"""

from __future__ import annotations

import os

import pytest
import torch
from dflash_fixtures import dflash_pair
from fixtures import VOCAB, make_head, make_target
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from eagle_eval import api
from eagle_eval.heads.eagle3.layer import Eagle3Head
from eagle_eval.oracle import oracle_from_models
from eagle_eval.settings import Settings
from eagle_eval.loop.batched import batched_decode
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.loop.reference import speculative_decode
from eagle_eval.rules.filters import prompt_generator
from eagle_eval.loop.tree import pool_size

EXAMPLES = int(os.environ.get("EAGLE_EVAL_EXAMPLES", "12"))
GENERATED = settings(max_examples=EXAMPLES, deadline=None, derandomize="EAGLE_EVAL_EXAMPLES" not in os.environ,
                     database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_POSITIONS = 160          # the tiny targets' max_position_embeddings: the longest prompt stays cheap
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"     # the file's pairs live there (fp32 everywhere)
BLOCK = ("dflash", "dflash2")      # block drafters: chains only (vLLM dflash and SGLang DFLASH verify chains)


class CopyHead(Eagle3Head):
    """A head that drafts exactly what a bigram target predicts: its layer's output is the embedding of the token it
    was given (`attention_input` makes it the residual, `finish` returns it; the attention still runs and writes the
    cache), and its logits are one-hot on `successor[token]`, the target's argmax after that token."""

    def __init__(self, cfg, table: torch.Tensor, successor: torch.Tensor):
        super().__init__(cfg)
        self.register_buffer("table", table.clone())              # [V, H] the target's embedding table
        self.register_buffer("successor", successor.clone())      # [V] the target's argmax after each token

    def attention_input(self, embeds, hidden, positions=None):
        u, _ = super().attention_input(embeds, hidden, positions)
        return u, embeds

    def finish(self, residual, attn_out):
        return residual

    def lm(self, out):
        token = ((out[..., None, :] - self.table.to(out.dtype)) ** 2).sum(-1).argmin(-1)   # [B, T]: whose embedding
        return F.one_hot(self.successor[token], self.config.vocab_size).to(out.dtype) * 30.0


def bigram_target(tmp_path):
    """A Qwen3-architecture target whose layers add nothing (o_proj and down_proj zero): its next token depends on the
    last token alone. lm_head scaled so that sampling at T <= 1 mostly follows the argmax too."""
    from transformers import AutoModelForCausalLM

    path = make_target(tmp_path / "bigram", family="qwen3", seed=3, overrides={"max_position_embeddings": MAX_POSITIONS})
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.mul_(8.0)
        successor = model(torch.arange(VOCAB)[:, None]).logits[:, -1].argmax(-1)        # [V]
    return model, successor


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """name -> an fp32 oracle; acceptance from always (copy) to next to nothing (random)."""
    from fixtures import head_config

    root = tmp_path_factory.mktemp("generated")
    model, successor = bigram_target(root)
    copy = CopyHead(head_config(), model.get_input_embeddings().weight.detach(), successor)
    model = model.to(DEVICE)
    random_target = make_target(root / "random", family="qwen3", seed=5,
                                overrides={"max_position_embeddings": MAX_POSITIONS})
    base = Settings.of(dtype="fp32")
    block = dflash_pair(root / "block", kinds=BLOCK, max_positions=MAX_POSITIONS)
    out = {
        "copy": oracle_from_models(model, copy, base),
        "bundled": api.load_oracle(Settings.of(dtype="fp32")),
        "random": api.load_oracle(Settings.of(target=str(random_target), draft=str(make_head(root / "h", seed=7)),
                                              dtype="fp32")),
        **{kind: api.load_oracle(Settings.of(target=str(block["target"]), draft=str(block[kind]), dtype="fp32"))
           for kind in BLOCK},
    }
    text = [p + plain_greedy(out["dflash"].speculator.target, p, 40, set()) for p in block["prompt_ids"]]
    out["known"] = dict.fromkeys(BLOCK, text)       # the block pairs' prompts are prefixes of the text they know
    return out


def _same(reference, batched):
    """Prompt by prompt: every field the reference loop returns."""
    for i, (ref, got) in enumerate(zip(reference, batched, strict=True)):
        assert got.output_ids == ref.output_ids, f"prompt {i}: tokens"
        assert got.accepted_per_cycle == ref.accepted_per_cycle, f"prompt {i}: accepted per cycle"
        assert got.emitted_per_cycle == ref.emitted_per_cycle, f"prompt {i}: emitted per cycle"
        assert got.off_top1_per_cycle == ref.off_top1_per_cycle, f"prompt {i}: off top-1"
        assert got.tree_shape_per_cycle == ref.tree_shape_per_cycle, f"prompt {i}: tree shapes"


@st.composite
def workloads(draw, trees: bool = True):
    """(pair, num_steps, topk, num_draft_tokens, max_new_tokens, prompt lengths, prompt seed, batch size, eos pick)."""
    pair = draw(st.sampled_from(["copy", "bundled", "random", *BLOCK]))
    num_steps = draw(st.integers(1, 6))
    topk, draft_tokens = 1, None
    if trees and pair not in BLOCK and draw(st.booleans()):
        topk = draw(st.integers(2, 3))
        draft_tokens = draw(st.integers(2, min(pool_size(num_steps, topk) + 1, 10)))
    max_new = draw(st.integers(1, 64))
    n = draw(st.integers(1, 5))
    lengths = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    longest = draw(st.sampled_from(["none", "first", "last", "alone"]))
    batch = draw(st.integers(1, n + 2))
    eos = draw(st.sampled_from(["none", "first token", "mid"]))
    eos_at = draw(st.tuples(st.integers(0, 4), st.integers(1, 63)))
    return pair, num_steps, topk, draft_tokens, max_new, lengths, longest, draw(st.integers(0, 2 ** 16)), batch, \
        (eos, eos_at)


def _prompts(oracle, lengths, longest, seed, max_new, verify, known=None):
    """Prompts of the lengths drawn; `longest`: one of them (or the only one) as long as the target allows. known:
    token sequences the prompts are prefixes of (cut to the length drawn, at most the sequence's), but the longest."""
    _, positions, _, _ = oracle.limits(max_new + verify + 1)
    most = positions - (max_new + verify + 1)
    lengths = list(lengths)
    if longest == "alone":
        lengths = [most]
    elif longest in ("first", "last"):
        lengths[0 if longest == "first" else -1] = most
    g = torch.Generator().manual_seed(seed)
    vocab = oracle.speculator.target.info.vocab_size
    if known:
        return [known[int(torch.randint(len(known), (1,), generator=g))][:n] if n != most else
                torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def _eos(reference, pick):
    """An EOS set that ends one prompt at its first token or mid-run (a token it emits), from a run without EOS."""
    kind, (i, k) = pick
    if kind == "none":
        return set()
    out = reference[i % len(reference)].output_ids
    return {out[0] if kind == "first token" else out[min(k, len(out) - 1)]}


def _decode_both(oracle, work, generators=None, known=None):
    pair, num_steps, topk, draft_tokens, max_new, lengths, longest, seed, batch, eos_pick = work
    spec = oracle.speculator
    verify = max(num_steps, draft_tokens or 0) + 1
    prompts = _prompts(oracle, lengths, longest, seed, max_new, verify, known)
    gens = (lambda: [generators(i) for i in range(len(prompts))]) if generators else (lambda: [None] * len(prompts))

    def reference(eos):
        return [speculative_decode(spec, p, num_steps, max_new, eos, topk, draft_tokens, generator=g)
                for p, g in zip(prompts, gens())]

    eos = _eos(reference(set()), eos_pick)
    ref = reference(eos)
    run = batched_decode(spec, prompts, num_steps, max_new, eos, batch, topk, draft_tokens, generators=gens())
    return ref, run


# The counterexample of issue 41 (a longest prompt whose row finishes with the last cycle's tokens past
# max_new_tokens while other rows still run: it wrote a block past its capacity): prompts of 13, 7, 54, 1, 21 and 17
# tokens, S = 3, batch 4 and 5, with a head that accepts every draft.
@example(work=("copy", 3, 1, None, 46, [13, 7, 54, 1, 21], "none", 0, 4, ("none", (0, 1))))
@example(work=("copy", 3, 1, None, 42, [13, 7, 54, 1, 21], "none", 1, 5, ("none", (0, 1))))
@GENERATED
@given(work=workloads())
def test_batched_equals_the_reference_greedy(pairs, work):
    ref, run = _decode_both(pairs[work[0]], work, known=pairs["known"].get(work[0]))
    _same(ref, run.decoded)


RULES = [("vllm", {}), ("vllm-probabilistic", {}), ("sglang", {}), ("eagle", {}), ("sglang-rs", {}),
         ("sglang", {"accept_threshold_single": 0.6, "accept_threshold_acc": 0.5})]


@GENERATED
@given(work=workloads(), rule=st.sampled_from(RULES), temperature=st.sampled_from([0.6, 1.0]),
       top_p=st.sampled_from([1.0, 0.9]), top_k=st.sampled_from([0, 5]), seed=st.integers(0, 2 ** 32))
def test_batched_equals_the_reference_sampling(pairs, work, rule, temperature, top_p, top_k, seed):
    """Every rule at T > 0: each prompt draws from its own stream, so the batched run equals each prompt decoded
    alone, draws included, whatever the batch size and which rows share a cycle."""
    name, thresholds = rule
    oracle = pairs[work[0]]
    tree = work[2] > 1
    if tree and name not in ("sglang", "eagle"):
        name = "sglang"                                   # the rules that verify trees
    if name == "sglang-rs" and oracle.speculator.head.config.draft_vocab_size != oracle.speculator.head.config.vocab_size:
        name = "vllm-probabilistic"                      # SGLang's rejection sampling needs the full vocab
    if name != "sglang":
        thresholds = {}
    sampled = oracle.with_(temperature=temperature, top_p=top_p, top_k=top_k, accept_rule=name, seed=seed,
                           topk=work[2], num_draft_tokens=work[3], num_steps=work[1], **thresholds)
    ref, run = _decode_both(sampled, work, lambda i: prompt_generator(seed, f"p{i}"), known=pairs["known"].get(work[0]))
    _same(ref, run.decoded)


def test_the_copy_pair_accepts_every_draft_and_the_random_one_next_to_none(pairs):
    """What the generated tests rely on: the pairs span acceptance from always to next to never."""
    prompts = [[5, 9, 11], list(range(10, 40))]
    rates = {}
    for name in ("copy", "bundled", "random", *BLOCK):
        oracle = pairs[name]
        mine, steps, new = prompts, 4, 40
        if name in BLOCK:        # a block drafter on the text it was trained on, drafting its trained block of 4
            mine, steps, new = [t[:n] for t, n in zip(pairs["known"][name], (10, 12, 20))], 3, 20
        ref = [speculative_decode(oracle.speculator, p, steps, new, set()) for p in mine]
        cycles = sum(len(d.accepted_per_cycle) for d in ref)
        rates[name] = sum(sum(d.accepted_per_cycle) for d in ref) / (steps * cycles)
    assert rates["copy"] == 1.0
    assert 0.1 < rates["bundled"] < 0.95
    assert rates["random"] < 0.1
    assert all(0.1 < rates[kind] < 0.95 for kind in BLOCK), rates


def test_regression_a_finished_longest_row_stays_inside_its_rows(pairs):
    """Issue 41's crash, kept: with every draft accepted and max_new_tokens = 2 mod (S + 1), the row of the longest
    prompt finishes with its length at its most; it used to keep writing blocks there while the other rows ran
    ("index 107 is out of bounds for dimension 2 with size 107"). Every batch size gives the reference's records."""
    oracle = pairs["copy"]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (13, 7, 54, 1, 21, 17)]
    ref = [speculative_decode(oracle.speculator, p, 3, 46, set()) for p in prompts]
    for batch in range(1, 8):
        _same(ref, batched_decode(oracle.speculator, prompts, 3, 46, set(), batch).decoded)


def test_room_is_checked_on_the_host_before_a_forward(pairs, monkeypatch):
    """A row that would write past its capacity stops the loop on the host, naming the row, before any write."""
    from eagle_eval.loop import batched

    oracle = pairs["copy"]
    monkeypatch.setattr(batched, "capacity_for", lambda *a: 12)          # rows too short for this workload
    with pytest.raises(AssertionError, match=r"row \d+ at length \d+ would write 4 slots past its capacity 12"):
        batched_decode(oracle.speculator, [[5, 6, 7]], 3, 20, set(), 1)


def test_run_batch_64_at_temperature_equals_batch_1_byte_for_byte(tmp_path):
    """`eagle-eval run --batch-size 64 --temperature 0.7` on the bundled default (32 prompts): samples.jsonl is batch
    1's byte for byte, and so is the report but for the loop it names (and the folder it was written to)."""
    import json

    from click.testing import CliRunner

    from eagle_eval.cli import main

    def run(batch):
        out = tmp_path / f"b{batch}"
        res = CliRunner().invoke(main, ["run", "--temperature", "0.7", "--batch-size", str(batch), "--dtype", "fp32",
                                        "--output-dir", str(out)])
        assert res.exit_code == 0, res.output
        report = json.loads((out / "report.json").read_text())
        loop = report["config"].pop("loop")
        for key in ("batch_size", "output_dir"):
            report["config"].pop(key, None)
        report.pop("provenance")
        return (out / "samples.jsonl").read_bytes(), report, loop

    one, one_report, one_loop = run(1)
    many, many_report, many_loop = run(64)
    assert one_loop["loop"] == "reference" and many_loop["loop"] == "batched"
    assert many == one
    assert many_report == one_report
    rows = [json.loads(line) for line in one.splitlines()]
    assert len(rows) == 32 and len({tuple(r["output_ids"]) for r in rows}) == 32


@pytest.mark.gpu
@GENERATED
@given(work=workloads(trees=False))
def test_graphed_cycle_equals_the_reference(pairs, work):
    """On a GPU, the chain cycle replayed as a CUDA graph gives the reference loop's records on the same generated
    workloads (greedy: the decision is device work only, so the graph holds the whole cycle)."""
    pair, num_steps, topk, draft_tokens, max_new, lengths, longest, seed, batch, eos_pick = work
    oracle = pairs[pair]
    spec = oracle.speculator
    prompts = _prompts(oracle, lengths, longest, seed, max_new, num_steps + 2, pairs["known"].get(pair))
    eos = _eos([speculative_decode(spec, p, num_steps, max_new, set()) for p in prompts], eos_pick)
    ref = [speculative_decode(spec, p, num_steps, max_new, eos) for p in prompts]
    run = batched_decode(spec, prompts, num_steps, max_new, eos, batch, cuda_graphs=True)
    if pair in BLOCK:                                                # refused, the reason said (loop/graphed.py)
        assert not run.cuda_graphs and (run.cycles == 0 or "block drafter" in run.fallback), run.fallback
    else:
        assert run.cuda_graphs or run.cycles == 0, run.fallback      # no cycle (every prompt done at its prefill)
    _same(ref, run.decoded)


@pytest.mark.parametrize("kind", BLOCK)
def test_block_drafters_batched_equal_the_reference_where_they_draft_well(pairs, kind):
    """The block drafters on the text they were trained on, with their trained block (num_steps 3): many drafts
    accepted and many rejected, rows of different lengths, at batch sizes 2, 4 and 6, greedy and at T = 0.8 under a
    rule that samples the drafts (vllm-probabilistic) and one that takes their argmax (vllm)."""
    oracle = pairs[kind]
    prompts = [t[:n] for t, n in zip(pairs["known"][kind], (9, 14, 8, 20, 11, 10))]
    accepted = []
    for variant in (oracle, oracle.with_(temperature=0.8, accept_rule="vllm-probabilistic", seed=3),
                    oracle.with_(temperature=0.8, accept_rule="vllm", seed=4)):
        spec, seed = variant.speculator, variant.settings.decoding.seed
        gens = lambda: [None if variant.settings.decoding.greedy else prompt_generator(seed, f"p{i}")  # noqa: E731
                        for i in range(len(prompts))]
        ref = [speculative_decode(spec, p, 3, 24, set(), generator=g) for p, g in zip(prompts, gens())]
        for batch in (2, 4, 6):
            _same(ref, batched_decode(spec, prompts, 3, 24, set(), batch, generators=gens()).decoded)
        accepted += [n for d in ref for n in d.accepted_per_cycle]
    assert {0, 1, 2, 3} <= set(accepted), accepted
