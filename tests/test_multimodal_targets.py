"""Multimodal targets run on text: transformers' own (LLaVA, Qwen2.5-VL, Qwen3-VL: the text decoder at
model.model.language_model.layers) and a Kimi-K2.5-style remote-code wrapper (a DeepseekV3ForCausalLM as
`language_model`: model.language_model.model.layers). Each holds the weights of a plain tiny causal LM,
so its loop, profile and aux features must equal that plain LM's, token for token and bit for bit.
Gemma3's sliding-window layers cannot be rolled back once full: refused past the window, exact below it."""

import pytest
import torch
from fixtures import load_prompts, make_head, make_target, make_tokenizer, train_head, write_prompts
from vlm_fixtures import TEXT_FAMILY, make_gemma3, make_kimi_style, make_vlm

from eagle_eval import api
from eagle_eval.settings import LoopOptions, ProfileOptions, Settings
from eagle_eval.models.capture import FeatureCapture
from eagle_eval.models.target import Target, TargetError, load_target
from eagle_eval.results.report import render_table
from eagle_eval.loop.plain import plain_greedy
from eagle_eval.workload.data import DataError

KINDS = {**TEXT_FAMILY, "kimi": "deepseek_v3"}      # multimodal kind -> the plain LM family it wraps
# the Kimi-style fixture is written as transformers 4.x remote code is: `past_key_values`, not `cache`
pytestmark = pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")
ARCHITECTURE = {"llava": "LlavaForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                "qwen3_vl": "Qwen3VLForConditionalGeneration", "kimi": "KimiK25ForConditionalGeneration"}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """{kind: (plain LM folder, multimodal folder around it, head trained on the plain LM)} and prompts."""
    root = tmp_path_factory.mktemp("vlm")
    prompts = write_prompts(root / "prompts.jsonl", n=4, seed=2)
    out = {}
    for kind, family in KINDS.items():
        text = make_target(root / family, family=family, seed=4)
        head = train_head(text, root / f"head-{family}", prompts, steps=30, new_tokens=32)
        wrap = make_kimi_style(text, root / kind) if kind == "kimi" else make_vlm(text, root / kind, kind)
        out[kind] = (text, wrap, head)
    return out, prompts


def _cfg(pairs, kind: str, which: int = 1, **kw) -> Settings:
    folders, prompts = pairs
    return Settings.of(target=str(folders[kind][which]), draft=str(folders[kind][2]), prompts=str(prompts),
                     max_new_tokens=24, num_steps=3, dtype="fp32", trust_remote_code=kind == "kimi", **kw)


def _decoder(model, kind: str):
    """Where the text decoder is, written out by hand for each layout."""
    return model.language_model.model if kind == "kimi" else model.model.language_model


@pytest.mark.parametrize("kind", KINDS)
def test_target_finds_the_text_decoder(pairs, kind):
    target, _ = load_target(pairs[0][kind][1], dtype="fp32", trust_remote_code=kind == "kimi")
    model, decoder = target.model, _decoder(target.model, kind)
    assert type(model).__name__ == ARCHITECTURE[kind]
    assert target.layers is decoder.layers and target.num_layers == 8
    assert target.input_embeddings is decoder.embed_tokens
    assert target.output_embeddings is (model.language_model.lm_head if kind == "kimi" else model.lm_head)
    info = target.info
    assert info.decoder == ("model.language_model.model.layers" if kind == "kimi" else "model.model.language_model.layers")
    assert (info.architecture, info.num_layers, info.hidden_size, info.vocab_size) == (ARCHITECTURE[kind], 8, 48, 96)
    assert info.text_architecture == decoder.config.model_type and info.max_positions == 512
    assert target.text_config is model.config.text_config


@pytest.mark.parametrize("kind", KINDS)
def test_aux_features_equal_the_text_decoders_hidden_states(pairs, kind):
    """HF[i] = the plain LM's output_hidden_states[i]; index N = its last layer's output before the final norm."""
    from transformers import AutoModelForCausalLM

    target, _ = load_target(pairs[0][kind][1], dtype="fp32", trust_remote_code=kind == "kimi")
    plain = AutoModelForCausalLM.from_pretrained(pairs[0][kind][0], dtype=torch.float32).eval()
    prenorm = []
    plain.model.norm.register_forward_pre_hook(lambda module, args: prenorm.append(args[0]))
    ids = torch.randint(5, 90, (1, 11), generator=torch.Generator().manual_seed(0))
    hf = (0, 3, 7, 8)
    with torch.no_grad(), FeatureCapture(target.layers, hf, "cpu") as cap:
        own = target.model(input_ids=ids, output_hidden_states=True)
        feats = cap.pop()                                                           # [1, 11, 4 * 48]
        ref = plain(ids, output_hidden_states=True)
    expected = torch.cat([ref.hidden_states[i] for i in hf[:3]] + prenorm, dim=-1)
    assert feats.shape == (1, 11, 4 * 48) and torch.equal(feats, expected)
    assert torch.equal(feats[..., : 3 * 48], torch.cat([own.hidden_states[i] for i in hf[:3]], dim=-1))
    assert torch.equal(own.logits, ref.logits)


@pytest.mark.parametrize("kind", KINDS)
def test_loop_equals_the_plain_lm(pairs, kind):
    """The multimodal run decodes as the plain LM's greedy generate and accepts exactly what the plain
    LM's run accepts (same weights, same head); its own generate agrees (check_lossless)."""
    from transformers import AutoModelForCausalLM

    run = api.evaluate(_cfg(pairs, kind), LoopOptions(check_lossless=True), progress=False)
    plain_run = api.evaluate(_cfg(pairs, kind, which=0), LoopOptions(check_lossless=True), progress=False)
    plain = Target(AutoModelForCausalLM.from_pretrained(pairs[0][kind][0], dtype=torch.float32))
    for s, p in zip(run.samples, load_prompts(pairs[1], make_tokenizer())):
        assert s.lossless is True and s.output_ids == plain_greedy(plain, p.input_ids, 24, {2})
    for key in ("summary", "per_position", "histogram"):
        assert run.report[key] == plain_run.report[key]
    rate = run.report["per_position"][0]["conditional_rate"]
    assert 0.1 < rate < 1.0, rate                                  # the head accepts some drafts, not all
    target = run.report["config"]["target"]
    assert (target["architecture"], target["num_layers"]) == (ARCHITECTURE[kind], 8)
    assert f"{ARCHITECTURE[kind]}, 8 layers in {target['decoder']} ({target['text_architecture']})" in \
        render_table(run.report)


@pytest.mark.parametrize("kind", KINDS)
def test_profile_and_tree_equal_the_loop(pairs, kind):
    cfg = _cfg(pairs, kind)
    loop = api.evaluate(cfg, progress=False)
    profiled = api.profile(cfg, ProfileOptions(max_steps=4), progress=False)
    section = profiled.report["by_num_steps"]["3"]
    assert [s.output_ids for s in profiled.samples] == [s.output_ids for s in loop.samples]
    for key in ("summary", "per_position", "histogram"):
        assert section[key] == loop.report[key]
    tree = api.evaluate(_cfg(pairs, kind, topk=2, num_draft_tokens=6), LoopOptions(check_lossless=True), progress=False)
    assert all(s.lossless for s in tree.samples)
    assert [s.output_ids for s in tree.samples] == [s.output_ids for s in loop.samples]


def test_kimi_style_wrapper_is_deepseek_family_and_needs_trust(pairs):
    """SGLang serves it through deepseek_v2.py (its text_config is DeepSeek-V3): the older-SGLang line
    is reported; its auto_map needs --trust-remote-code."""
    oracle = api.load_oracle(_cfg(pairs, "kimi"))
    assert "sglang_before_25454" in oracle.resolved.as_dict()["aux_layers"]["engines"]
    assert "sglang_before_25454" not in api.load_oracle(_cfg(pairs, "llava")).resolved.as_dict()["aux_layers"]["engines"]
    with pytest.raises(TargetError, match="auto_map.*--trust-remote-code"):
        load_target(pairs[0]["kimi"][1])


def test_unsupported_layout_names_what_was_followed():
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4)])

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Encoder()

    with pytest.raises(TargetError, match=r"odd: no text decoder stack found.*model \(Wrapper\) -> model\.model \(Encoder\).*"
                                          r"model\.model\.language_model\.layers"):
        Target(Wrapper(), "odd")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma3")
    return make_gemma3(root / "gemma3", sliding_window=32), make_head(root / "head", draft_vocab=40), root


def test_sliding_window_target_runs_below_the_window(gemma):
    """Gemma3 (text decoder at model.model.language_model.layers): below its sliding window the loop is
    its own greedy generate; its report names the window."""
    target, head, root = gemma
    prompts = write_prompts(root / "short.jsonl", n=3, length=6)                  # 7..9 tokens
    run = api.evaluate(Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=16,
                                 num_steps=3, dtype="fp32"), LoopOptions(check_lossless=True), progress=False)
    assert all(s.lossless for s in run.samples) and all(len(s.output_ids) == 16 for s in run.samples)
    info = run.report["config"]["target"]
    assert (info["decoder"], info["sliding_window"]) == ("model.model.language_model.layers", 32)


def test_sliding_window_target_is_refused_past_the_window(gemma):
    target, head, root = gemma
    prompts = write_prompts(root / "long.jsonl", n=1, length=12)                  # 13 tokens + 16 + 4 + 1 > 31
    cfg = Settings.of(target=str(target), draft=str(head), prompts=str(prompts), max_new_tokens=16, num_steps=3,
                    dtype="fp32")
    with pytest.raises(DataError, match=r"13 tokens; with 21 more .* past the target's 31 positions "
                                        r"\(sliding window 32, less one"):
        api.evaluate(cfg, progress=False)
    profiled = api.profile(cfg, ProfileOptions(max_steps=3), progress=False)     # no cache rollback: any length
    loaded, _ = load_target(str(target), dtype="fp32")
    prompt = load_prompts(prompts, make_tokenizer())[0].input_ids
    assert profiled.samples[0].output_ids == plain_greedy(loaded, prompt, 16, {2})
    short = Settings.of(**{**cfg.flat(), "prompts": str(write_prompts(root / "s.jsonl", n=1)), "topk": 2,
                         "num_draft_tokens": 4})
    with pytest.raises(TargetError, match=r"tree verification \(--topk > 1\).*sliding-window layers \(window 32\)"):
        api.evaluate(short, progress=False)
    # the rollback itself refuses a full window instead of failing inside transformers
    cache = loaded.new_cache()
    loaded.forward(torch.randint(5, 90, (1, 34)), cache)
    with pytest.raises(TargetError, match=r"34 positions fill a sliding-window KV layer \(window 32\)"):
        Target.rollback(cache, 30)
