"""Careless input, third pass (issue 37): an option that would change nothing is refused naming why; a key
given twice in a settings file is refused naming both places; values that used to end in a traceback are one
line and exit 2. Every refusal here comes before any weight is read (seconds), except where a loaded head
is needed to know the bound (topk against the draft vocab)."""

import json

import pytest
from click.testing import CliRunner

from eagle_eval.cli import main
from eagle_eval.commands.effect import no_effect
from eagle_eval.settings import (AblateOptions, ConfigError, DecodingSettings, LoopOptions, ProfileOptions,
                                 read_settings_file)

FAST = ["--limit", "1", "--max-new-tokens", "4"]
PROFILE = ["profile", *FAST, "--max-steps", "2"]
ABLATE = ["ablate", *FAST, "--max-steps", "2", "--cost-ratio", "0.1"]


def _line(args, tmp_path=None) -> str:
    """The one error line of a refused command (exit 2, no traceback, nothing written)."""
    out = None if tmp_path is None else tmp_path / "out"
    res = CliRunner().invoke(main, args + ([] if out is None else ["--output-dir", str(out)]), catch_exceptions=True)
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    assert "Traceback" not in res.output and (res.exception is None or isinstance(res.exception, SystemExit))
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
    assert len(errors) == 1, res.stderr
    if out is not None:
        assert not out.exists(), "a refused command wrote its output folder"
    return errors[0]


# -- options that would change nothing ---------------------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    (PROFILE + ["--rollouts", "4"], "--rollouts 4 has no effect: temperature 0 is greedy"),
    (PROFILE + ["--temperature", "1", "--rollouts", "4"], "--accept-rule vllm drafts deterministically"),
    (PROFILE + ["--temperature", "1", "--accept-rule", "sglang", "--rollouts", "4"],
     "--accept-rule sglang drafts deterministically"),
    (PROFILE + ["--temperature", "1", "--accept-rule", "eagle", "--rollouts", "4"],
     "--accept-rule eagle drafts deterministically"),
    (PROFILE + ["--expectation-floor", "0.01"], "--expectation-floor 0.01 has no effect: temperature 0"),
    (PROFILE + ["--temperature", "1", "--accept-rule", "vllm-probabilistic", "--expectation-floor", "0"],
     "--accept-rule vllm-probabilistic samples its drafts; the floor cuts only the one-hot rules'"),
    (PROFILE + ["--samples-per-prompt", "3"], "--samples-per-prompt 3 has no effect: temperature 0"),
    (PROFILE + ["--draft-tokens-grid", "3,4"], "--draft-tokens-grid 3,4 has no effect: every profile is a chain"),
    (ABLATE + ["--draft-tokens-grid", "3,4"], "--draft-tokens-grid 3,4 has no effect: every profile is a chain"),
    (ABLATE + ["--topk-grid", "1", "--draft-tokens-grid", "3"], "every profile is a chain (topk 1)"),
    (ABLATE + ["--rollouts", "2", "--temperature-grid", "0,0.7"], "--accept-rule vllm drafts deterministically"),
    (["run", *FAST, "--top-p", "0.9"], "--top-p 0.9 has no effect: temperature 0 is greedy decoding"),
    (["run", *FAST, "--accept-rule", "eagle", "--seed", "3"], "--accept-rule eagle has no effect"),
])
def test_an_option_with_no_effect_is_refused_naming_why(args, said, tmp_path):
    line = _line(args, tmp_path)
    assert said in line and "Remove" in line, line


def test_both_refusals_are_said_at_once(tmp_path):
    line = _line(["run", *FAST, "--accept-rule", "eagle", "--seed", "3"], tmp_path)
    assert "--accept-rule eagle has no effect" in line and "--seed 3 has no effect" in line and "Remove them" in line


def test_given_responses_make_samples_per_prompt_idle(tmp_path):
    responses = tmp_path / "r.jsonl"
    responses.write_text(json.dumps({"output_ids": [1, 2, 3]}) + "\n")
    line = _line(PROFILE + ["--temperature", "1", "--samples-per-prompt", "2", "--responses", str(responses)], tmp_path)
    assert "--samples-per-prompt 2 has no effect: --responses gives one continuation per prompt" in line


def test_an_option_with_an_effect_somewhere_is_kept():
    """Not refused: a value at its default (a saved settings file holds every field), and an option that
    changes one profile of several (ablate's --temperature-grid)."""
    greedy, hot = DecodingSettings(), DecodingSettings(temperature=0.7, top_p=0.9)
    assert no_effect([greedy], ProfileOptions(rollouts=0, expectation_floor=1e-4)) == []
    assert no_effect([DecodingSettings(top_p=0.9), hot], AblateOptions()) == []           # T = 0 and 0.7
    assert no_effect([DecodingSettings(temperature=1.0, accept_rule="sglang-rs")], ProfileOptions(rollouts=4)) == []
    assert no_effect([hot], ProfileOptions(expectation_floor=0.0)) == []                    # vllm: one-hot
    assert no_effect([greedy], ProfileOptions(draft_tokens_grid=(4,)), topks=(2,)) == []
    assert no_effect([hot], LoopOptions()) == []
    assert len(no_effect([DecodingSettings(top_k=5, min_p=0.1)])) == 2


@pytest.mark.parametrize("vary, said", [
    (["--vary", "dtype=auto"], "dtype is the base's own value"),
    (["--vary", "aux_convention=sglang;max_new_tokens=8"], "aux_convention is the base's own value"),
    (["--vary", "dtype=fp32", "--vary", "dtype=fp32"], "--vary 'dtype=fp32' repeats --vary 'dtype=fp32'"),
    (["--vary", "top_p=0.9"], "top_p has no effect: every profile of this variant is at temperature 0"),
    (["--vary", "num_steps=3"], "every num_steps <= --max-steps is profiled at once"),
])
def test_a_variant_that_changes_nothing_is_refused(vary, said, tmp_path):
    """Such variants used to be profiled and end in "undecided: time more repetitions"."""
    line = _line(ABLATE + vary, tmp_path)
    assert said in line, line


# -- a key given twice in a settings file ------------------------------------------------------------------

@pytest.mark.parametrize("name, text, said", [
    ("s.yaml", "speculation:\n  num_steps: 3\n  num_steps: 4\n", "key 'num_steps' is given twice in one mapping "
                                                                   "(line 2 and line 3)"),
    ("s.yaml", "{limit: 1, limit: 2}\n", "key 'limit' is given twice in one mapping (line 1 column 2 and line 1 "
                                         "column 12)"),
    ("s.json", '{"workload": {"limit": 1,\n  "max_new_tokens": 4,\n  "limit": 2}}', "key 'limit' is given twice "
                                                                                   "in one mapping (line 1 and line 3)"),
    ("s.json", '{"limit": 1, "limit": 1}', "(line 1 column 2 and line 1 column 14)"),
    ("s.yaml", "num_steps: 3\nspeculation: {num_steps: 4}\n", "key 'num_steps' and key 'speculation.num_steps' "
                                                             "both set num_steps"),
    ("s.json", '{"speculation": {"topk": 1}, "topk": 1}', "key 'speculation.topk' and key 'topk' both set topk"),
])
def test_a_key_given_twice_is_an_error_naming_both_places(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match="give it once") as err:
        read_settings_file(str(path), "run", LoopOptions)
    assert said in str(err.value) and str(path) in str(err.value)


def test_a_key_given_twice_on_the_command_line_file_is_exit_2(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("workload:\n  limit: 1\n  max_new_tokens: 4\n  limit: 2\n")
    assert "key 'limit' is given twice" in _line(["run", "--config", str(path)])


def test_merge_keys_and_distinct_keys_still_read(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("speculation: {<<: {num_steps: 3, topk: 1}, num_steps: 4}\nworkload: {limit: 1}\n")
    assert read_settings_file(str(path), "run", LoopOptions) == {"num_steps": 4, "topk": 1, "limit": 1}
    path = tmp_path / "s.json"
    path.write_text('{"speculation": {"num_steps": 3}, "workload": {"limit": 1, "categories": "a,b"}}')
    assert read_settings_file(str(path), "run", LoopOptions) == {"num_steps": 3, "limit": 1, "categories": ("a", "b")}


# -- values that used to end in a traceback ----------------------------------------------------------------

@pytest.mark.parametrize("args, said", [
    (["run", *FAST, "--temperature", "1", "--seed", str(2 ** 70)], "--seed must be in 0..2^64-1"),
    (["run", *FAST, "--temperature", "1", "--seed", "-1"], "--seed must be in 0..2^64-1"),
    (["run", *FAST, "--temperature", "1e-310"], "--temperature must be 0 (greedy) or >= 1e-06, got 1e-310"),
    (["run", *FAST, "--temperature", "1e-40"], "--temperature must be 0 (greedy) or >= 1e-06"),
    (ABLATE + ["--temperature-grid", "0.7,1e-310"], "--temperature-grid must be 0 (greedy) or >= 1e-06"),
    (PROFILE + ["--temperature", "1", "--accept-rule", "vllm-probabilistic", "--rollouts", str(10 ** 12)],
     "--rollouts 1000000000000: each start's rollouts are drafted in one batch"),
    (ABLATE + ["--topk-grid", "2", "--draft-tokens-grid", "1000"], "--draft-tokens-grid 1000: no tree profiled"),
    (ABLATE + ["--topk-grid", "2,3", "--draft-tokens-grid", "4,500"], "--draft-tokens-grid 500: no tree profiled"),
    (ABLATE + ["--topk-grid", "2", "--num-draft-tokens", "1000"], "--topk-grid 2: a tree of topk 2 and num_steps "
                                                                  "<= --max-steps 2 has at most 7 nodes"),
    (ABLATE + ["--topk-grid", "2,8", "--draft-tokens-grid", "20"], "--topk-grid 2: a tree of topk 2"),
    (ABLATE + ["--vary", "topk=2"], "--vary 'topk': not a variant"),
    (ABLATE + ["--vary", "temperature=0.5", "--temperature-grid", "0,1"], "both set the temperature"),
    (ABLATE + ["--topk-grid", "1,2,2", "--draft-tokens-grid", "3"], "--topk-grid gives 2 twice"),
    (PROFILE + ["--topk", "2", "--num-draft-tokens", "3", "--draft-tokens-grid", "99"],
     "--draft-tokens-grid 99: no tree profiled has that many nodes"),
])
def test_values_that_were_a_traceback_are_one_line(args, said, tmp_path):
    line = _line(args, tmp_path)
    assert said in line, line


def test_a_topk_wider_than_the_draft_vocab_is_one_line():
    """The bundled head drafts from 464 tokens: --topk 465 used to fail inside the tree's expansion."""
    line = _line(["run", *FAST, "--topk", "465", "--num-draft-tokens", "3"])
    assert "--topk 465" in line and "drafts from 464 tokens, so topk <= 464" in line
