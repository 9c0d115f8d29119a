"""`ablate` with a block drafter (issue 40): the sweep over num_steps is the sweep over block lengths (row S drafts
one block of S + 1 rows, its own draft forward: the loop's acceptance with num_steps = S), each row says its block
beside the trained one and a block of another length is the variant's finding dflash-block-size; a cycle costs ONE
draft forward in the speedup model; trees are refused before any profile; thinking on/off through the chat
template's `enable_thinking` as two variants; and ablation.csv holds each variant's acceptance by context, one row
per bucket, recomputed here by hand from the variant's own profile."""

import csv
import json

import pytest
from dflash_fixtures import dflash_pair

from eagle_eval import api
from eagle_eval.settings import AblateOptions, ConfigError, ProfileOptions, Settings

MAX_NEW = 16
# Qwen3's thinking switch in the tiny word tokenizer's terms: Qwen3's chat template adds '<think>\n\n</think>\n\n'
# after the assistant header when enable_thinking is false (and only then); here the words w88 w89 stand for it
QWEN3_LIKE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
              "{% if add_generation_prompt %}<|assistant|> "
              "{% if enable_thinking is defined and enable_thinking is false %}w88 w89 {% endif %}{% endif %}")
THINK_OFF = [93, 94]               # w88 w89: ids 5 + 88, 5 + 89 of tests/fixtures.py make_tokenizer


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash_ablate")
    out = dflash_pair(root, kinds=("dflash",))
    (root / "qwen3_like.jinja").write_text(QWEN3_LIKE)
    out["template"] = root / "qwen3_like.jinja"
    # chat rows: the words of the token ids the drafter was trained on, so its drafts are still often accepted
    rows = [{"id": f"m{i}", "messages": [{"role": "user", "content": " ".join(f"w{t - 5}" for t in ids[1:])}]}
            for i, ids in enumerate(out["prompt_ids"])]
    out["messages"] = root / "messages.jsonl"
    out["messages"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _settings(pair, **kw):
    return Settings.of(**{"target": str(pair["target"]), "draft": str(pair["dflash"]), "prompts": str(pair["prompts"]),
                          "dtype": "fp32", "max_new_tokens": MAX_NEW, "num_steps": 3, **kw})


def test_the_block_sweep_drafts_each_block_length_and_flags_the_untrained_ones(pair):
    """Rows S = 1..5 of a drafter trained with blocks of 4: each row is the loop run with num_steps = S (its own
    block of S + 1 rows), says its block and the trained one, and the rows S != 3 are findings dflash-block-size of
    the variant naming S; the modelled speedup charges one draft forward per cycle, (1 + sum u_i) / (c + r)."""
    from eagle_eval.results.report import render_ablation

    result = api.ablate(_settings(pair), AblateOptions(max_steps=5, cost_ratio=0.1), progress=False)
    rows = result["rows"]
    assert [r["num_steps"] for r in rows] == [1, 2, 3, 4, 5]
    for r in rows:
        k = r["num_steps"]
        assert (r["block_rows"], r["trained_block_size"], r["matches_trained_block"]) == (k + 1, 4, k == 3)
        u = [r[f"u_{i}"] for i in range(1, k + 1)]
        assert r["speedup_model"] == pytest.approx((1 + sum(u)) / (0.1 + 1.0))      # not k c: one forward
    for k in (2, 4):                   # a shorter and a longer block than the trained one: the loop's own numbers
        loop = api.evaluate(_settings(pair, num_steps=k), progress=False)
        assert rows[k - 1]["tau"] == pytest.approx(loop.report["summary"]["accept_length"], abs=1e-12)
        assert rows[k - 1]["accepted_drafts"] == sum(sum(s.accepted_per_cycle) for s in loop.samples)
    flagged = [f for f in result["variants"][0]["sanity"] if f["code"] == "dflash-block-size"]
    assert sorted(f["detail"]["num_steps"] for f in flagged) == [1, 2, 4, 5]
    assert all(f["severity"] == "warning" and "trained with block_size 4" in f["message"] for f in flagged)
    assert result["block"]["trained_block_size"] == 4 and result["block"]["vllm_num_speculative_tokens"] == 3
    assert result["block"]["sglang_num_draft_tokens"] == 4
    assert result["block"]["num_steps_other_than_trained"] == [1, 2, 4, 5]
    text = render_ablation(result)
    assert "trained block_size 4 (vLLM num_speculative_tokens 3, SGLang --speculative-num-draft-tokens 4)" in text
    marked = [line for line in text.splitlines() if line.startswith("base ") and line.endswith("*")]
    assert len(marked) == 4 and "(num_steps 1, 2, 4, 5): finding dflash-block-size" in text


def test_measured_costs_time_one_draft_forward_per_block_length(pair):
    """Without --cost-ratio the draft cost is timed per block (one forward of S + 1 rows, the block drafter's whole
    draft of a cycle), and each row's speedup follows from those medians: tau T_target / (T_block(S+1) + T_verify)."""
    result = api.ablate(_settings(pair, max_new_tokens=6), AblateOptions(max_steps=2), progress=False)
    times = result["costs"]["times_ms"]
    assert set(times["draft_block"]) == {"2", "3"} and set(times["verify"]) == {"2", "3"}
    for r in result["rows"]:
        n = str(r["num_steps"] + 1)
        expect = r["tau"] * times["target_1_token"] / (times["draft_block"][n] + times["verify"][n])
        assert r["speedup_model"] == pytest.approx(expect)
        assert result["costs"]["block_ratio"][n] == pytest.approx(times["draft_block"][n] / times["target_1_token"])


def test_trees_are_refused_before_any_profile(pair, monkeypatch):
    import eagle_eval.commands.ablate as ablate_module

    def no_profile(*args, **kw):
        raise AssertionError("a variant was profiled before the tree was refused")

    monkeypatch.setattr(ablate_module, "profile_oracle", no_profile)
    with pytest.raises(ConfigError, match=r"--topk-grid 2: --topk 2: a block drafter \(DFlash\) proposes one chain"):
        api.ablate(_settings(pair), AblateOptions(max_steps=3, cost_ratio=0.1, topk_grid=(1, 2),
                                                  draft_tokens_grid=(4,)), progress=False)
    with pytest.raises(ConfigError, match="--vary block_size: .* --max-steps B sweeps the blocks 2..B \\+ 1"):
        api.ablate(_settings(pair), AblateOptions(max_steps=3, vary=("block_size=8",)), progress=False)
    with pytest.raises(ConfigError, match=r"--temperature 0.7 in ablate with a dflash draft: .* not implemented"):
        api.ablate(_settings(pair), AblateOptions(max_steps=3, cost_ratio=0.1, temperature_grid=(0.0, 0.7)),
                   progress=False)


def test_thinking_on_and_off_are_two_variants_and_the_csv_holds_each_ones_acceptance_by_context(pair, tmp_path):
    """--enable-thinking as the base and --vary enable_thinking=false: the off variant's prompts are the on ones
    plus Qwen3's empty think block, each variant's rows are a profile of its own prompts, and ablation.csv's
    `context:LOW-HIGH` rows of a variant are its profile's starts bucketed by hand."""
    base = _settings(pair, prompts=str(pair["messages"]), chat_template=str(pair["template"]), enable_thinking=True,
                     context_buckets=(0, 14, 22), output_dir=str(tmp_path / "abl"))
    result = api.ablate(base, AblateOptions(max_steps=3, cost_ratio=0.1, vary=("enable_thinking=false",)),
                        progress=False)
    on, off = result["variants"]
    assert (on["prompt_format"]["enable_thinking"], off["prompt_format"]["enable_thinking"]) == (True, False)
    assert off["variant"] == "enable_thinking=false"
    oracle = api.load_oracle(base.with_(output_dir=None))
    prompts_on = api.checked_workload(oracle).first_prompts
    prompts_off = api.checked_workload(oracle.with_(enable_thinking=False)).first_prompts
    assert [p.input_ids for p in prompts_off] == [p.input_ids + THINK_OFF for p in prompts_on]

    direct = api.profile(base.with_(enable_thinking=False, output_dir=None), ProfileOptions(max_steps=3),
                         progress=False)
    for r in (r for r in result["rows"] if r["variant"] == "enable_thinking=false"):
        assert r["tau"] == direct.report["by_num_steps"][str(r["num_steps"])]["summary"]["accept_length"]

    with open(tmp_path / "abl" / "ablation.csv", newline="") as f:
        table = list(csv.DictReader(f))
    buckets = [r for r in table if r["group"].startswith("context:")]
    assert {(r["variant"], r["group"]) for r in buckets} == {(v, g) for v in ("base", "enable_thinking=false")
                                                             for g in ("context:0-14", "context:14-22",
                                                                       "context:22-inf")}
    assert len(table) == 6 + len(buckets)                       # 2 variants x 3 num_steps, then the buckets
    # the bucket [14, 22) of the thinking-off variant by hand: the starts of its profile at the base num_steps (3)
    # whose root (context = prompt_len + start - 1) lies in it; the expected accept length is 1 + the mean over them
    # of sum_i P(A >= i), u_i the mean of P(A >= i)
    prompt_len = {s.id: s.prompt_len for s in direct.samples}
    picked = [r["p_accept_at_least"] for r in direct.per_start if r["num_steps"] == 3
              and 14 <= prompt_len[r["prompt_id"]] + r["start"] - 1 < 22]
    row = next(r for r in buckets if r["variant"] == "enable_thinking=false" and r["group"] == "context:14-22")
    assert int(row["starts"]) == len(picked) > 10 and int(row["num_steps"]) == 3
    assert float(row["acceptance_length"]) == pytest.approx(1 + sum(map(sum, picked)) / len(picked), abs=1e-12)
    for i in range(3):
        assert float(row[f"acceptance_at_pos_{i}"]) == pytest.approx(sum(p[i] for p in picked) / len(picked),
                                                                      abs=1e-12)
    assert int(row["prompts"]) == len({r["prompt_id"] for r in direct.per_start if r["num_steps"] == 3
                                       and 14 <= prompt_len[r["prompt_id"]] + r["start"] - 1 < 22})
