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
