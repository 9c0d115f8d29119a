"""Prompt-format options change the rendered prompt as expected, and the report records them."""

import hashlib
from pathlib import Path

import pytest
from fixtures import make_tokenizer

from eagle_eval import api
from eagle_eval.settings import ConfigError, Settings, parse_names
from eagle_eval.workload.data import DataError, tokenize_row
from eagle_eval.workload.templates import NO_TEMPLATE_GIVEN, NO_TEMPLATE_IN_TOKENIZER, PromptFormat

DATA = Path(__file__).parent / "data"
USER = [{"role": "user", "content": "w5 w6"}]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


def test_default_is_the_tokenizers_template(tok):
    fmt = PromptFormat.resolve(tok)
    ids, text = fmt.encode(tok, USER, "q")
    assert fmt.source == "tokenizer" and text == "<|user|> w5 w6 <|assistant|> "
    assert ids == [3, 10, 11, 4]                                       # no extra BOS: the template owns specials
    assert fmt.template_sha256 == hashlib.sha256(tok.chat_template.encode()).hexdigest()


def test_no_chat_template_gives_the_raw_text(tok):
    fmt = PromptFormat.resolve(tok, no_chat_template=True)
    ids, text = fmt.encode(tok, USER, "q")
    assert (fmt.source, fmt.template_sha256, text) == (NO_TEMPLATE_GIVEN, None, "w5 w6")
    assert ids == tok("w5 w6")["input_ids"]


def test_system_prompt(tok):
    assert PromptFormat.resolve(tok, system_prompt="w9").render(tok, USER, "q") == \
        "<|system|> w9 <|user|> w5 w6 <|assistant|> "
    assert PromptFormat.resolve(tok, no_chat_template=True, system_prompt="w9").render(tok, USER, "q") == \
        "w9\n\nw5 w6"
    own = [{"role": "system", "content": "w7"}] + USER                  # a conversation's own system turn wins
    assert PromptFormat.resolve(tok, system_prompt="w9").render(tok, own, "q").startswith("<|system|> w7 ")


def test_template_file_and_thinking_switch(tok):
    path = DATA / "chat_template.jinja"
    base = PromptFormat.resolve(tok, chat_template=str(path))
    assert base.template_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert base.render(tok, USER, "q") == "[user] w5 w6 <|assistant|> "
    on = PromptFormat.resolve(tok, chat_template=str(path), enable_thinking=True)
    off = PromptFormat.resolve(tok, chat_template=str(path), enable_thinking=False)
    assert on.render(tok, USER, "q") == "[user] w5 w6 w88 <|assistant|> "
    assert off.render(tok, USER, "q") == base.render(tok, USER, "q")
    with pytest.raises(ConfigError, match="--chat-template nope.jinja: file does not exist"):
        PromptFormat.resolve(tok, chat_template="nope.jinja")


def test_tokenizer_without_template(tok):
    bare = make_tokenizer()
    bare.chat_template = None
    fmt = PromptFormat.resolve(bare)
    assert fmt.source == NO_TEMPLATE_IN_TOKENIZER and fmt.render(bare, USER, "q") == "w5 w6"
    with pytest.raises(DataError, match="f:3: row has 'messages' but the target tokenizer has no chat template"):
        tokenize_row({"messages": USER}, bare, "f:3", fmt)
    # --no-chat-template on purpose: a `messages` row is rendered as raw text
    ids, text = tokenize_row({"messages": USER}, bare, "f:3", PromptFormat.resolve(bare, no_chat_template=True))
    assert text == "w5 w6"


def test_config_refuses_contradictions():
    with pytest.raises(ConfigError, match="exclude each other"):
        Settings.of(no_chat_template=True, chat_template="t.jinja")
    with pytest.raises(ConfigError, match="need a chat template"):
        Settings.of(no_chat_template=True, enable_thinking=True)
    with pytest.raises(ConfigError, match="--dataset-format needs --dataset"):
        Settings.of(dataset_format="gsm8k")
    assert parse_names("a, b") == ("a", "b")                    # the flag's spelling
    assert Settings.of(categories=["a", "b"]).workload.categories == ("a", "b")   # a list in a settings file
    with pytest.raises(ConfigError, match="--categories: expected a list"):
        Settings.of(categories="a, b")                          # never split silently


def test_report_records_template_hash_and_sample_prompt(tiny):
    cfg = dict(target=str(tiny["target"]), draft=str(tiny["head"]), dataset=str(DATA / "gsm8k_test.jsonl"),
               max_new_tokens=4, limit=1)
    report = api.evaluate(Settings.of(**cfg), progress=False).report
    assert report["config"]["dataset_format"] == "gsm8k" and report["config"]["dataset_format_given"] is None
    assert report["sample_prompt"] == "<|user|> w5 w6 w7 w8 w9 <|assistant|> "
    assert report["config"]["template_sha256"] == hashlib.sha256(make_tokenizer().chat_template.encode()).hexdigest()
    raw = api.evaluate(Settings.of(**cfg, no_chat_template=True), progress=False).report
    assert raw["sample_prompt"] == "w5 w6 w7 w8 w9" and raw["config"]["template_sha256"] is None
    assert raw["config"]["prompt_format"]["chat_template"] == NO_TEMPLATE_GIVEN


def _thinking_workload(tok, enable_thinking, **kw):
    from eagle_eval.workload.conversations import load_workload

    return load_workload(Settings.of(enable_thinking=enable_thinking, **kw).workload, tok)


def test_the_thinking_switch_is_refused_where_no_prompt_reads_it(tok, tmp_path):
    """Rendered both ways (enable_thinking True and False): a switch that changes no prompt is refused by name, so
    thinking on and off never compare the same prompts (what `ablate --vary enable_thinking=false` relies on)."""
    from eagle_eval.workload.templates import ThinkingIgnored

    bench = str(DATA / "mt_bench_question.jsonl")
    reads = str(DATA / "chat_template.jinja")                      # adds w88 with enable_thinking
    on = _thinking_workload(tok, True, dataset=bench, chat_template=reads)
    off = _thinking_workload(tok, False, dataset=bench, chat_template=reads)
    assert [p.input_ids for p in on.first_prompts] != [p.input_ids for p in off.first_prompts]
    assert on.resolved["prompt_format"]["enable_thinking"] is True            # echoed in every report's config
    # the tokenizer's own template here does not read enable_thinking
    with pytest.raises(ThinkingIgnored, match=r"^--disable-thinking: the chat template \(tokenizer\) renders every "
                                              r"prompt of .*mt_bench_question.jsonl the same with enable_thinking=True "
                                              "and False: it does not read the switch"):
        _thinking_workload(tok, False, dataset=bench)
    # rows that no template renders: token ids and plain prompts (the chat row of prompts.jsonl is left out)
    ids_only = tmp_path / "ids.jsonl"
    ids_only.write_text("".join(line + "\n" for line in (DATA / "prompts.jsonl").read_text().splitlines()
                                if "messages" not in line))
    with pytest.raises(ThinkingIgnored, match=r"^--enable-thinking: no prompt of --prompts .*ids.jsonl goes through "
                                              "the chat template"):
        _thinking_workload(tok, True, prompts=str(ids_only), chat_template=reads)
    assert _thinking_workload(tok, True, prompts=str(DATA / "prompts.jsonl"), chat_template=reads).first_prompts
    bare = make_tokenizer()
    bare.chat_template = None
    with pytest.raises(ThinkingIgnored, match="^--enable-thinking: the target's tokenizer has no chat template"):
        _thinking_workload(bare, True, dataset=bench)


def test_the_cli_refuses_an_unread_thinking_switch_in_one_line(tiny):
    from click.testing import CliRunner

    from eagle_eval.cli import main

    res = CliRunner().invoke(main, ["run", "--target", str(tiny["target"]), "--draft", str(tiny["head"]),
                                    "--dataset", str(DATA / "mt_bench_question.jsonl"), "--disable-thinking",
                                    "--max-new-tokens", "4"])
    assert res.exit_code == 2, res.output
    assert "--disable-thinking: the chat template (tokenizer) renders every prompt" in res.output


def test_the_template_check_renders_the_tokenizers_template_without_a_switch_it_does_not_read(tiny):
    """diagnose's chat-template check: configured with a template FILE that reads --disable-thinking, the tokenizer's
    own template (which does not read it) is still rendered and compared, without the switch, and says so."""
    from eagle_eval.diagnose.template_check import _render

    oracle = api.load_oracle(Settings.of(target=str(tiny["target"]), draft=str(tiny["head"]),
                                         dataset=str(DATA / "mt_bench_question.jsonl"), enable_thinking=True,
                                         chat_template=str(DATA / "chat_template.jinja"), max_new_tokens=4))
    rendered = {label: (prompts, err) for label, _, prompts, err in _render(oracle)}
    tokenizers = "the tokenizer's chat template (enable_thinking not read: not passed)"
    assert set(rendered) == {f"--chat-template {DATA / 'chat_template.jinja'} (configured)", tokenizers,
                             "raw prompts (--no-chat-template)"}
    assert rendered[tokenizers][1] is None
    assert rendered[tokenizers][0][0].input_ids == [3, 15, 16, 17, 18, 4]        # <|user|> w10 .. w13 <|assistant|>
