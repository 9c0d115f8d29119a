"""eagle_eval.testing (the public name of eagle_eval.servers.testing): the oracle as a server test suite would use it, with readable failures."""

import os
from dataclasses import replace
from pathlib import Path

import pytest
import requests
from fake_servers import Engine, serve
from fixtures import load_prompts
from trained import NEW_TOKENS, NUM_STEPS, trained

from eagle_eval import api
from eagle_eval.settings import Settings
from eagle_eval.testing import (
    EagleOracle,
    assert_accept_length_close,
    assert_histogram_equal,
    assert_mean_accept_length_close,
    assert_same_tokens,
    assert_sglang_response,
    assert_verify_count,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return trained(tmp_path_factory)


@pytest.fixture(scope="module")
def oracle(models):
    return EagleOracle.from_paths(models["target"], models["head"], num_steps=NUM_STEPS, max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def prompts(models, oracle):
    return load_prompts(models["prompts"], oracle.tokenizer)


def test_expected_matches_the_reference_loop(oracle, prompts):
    p = prompts[0]
    exp = oracle.expected(p.input_ids, id=p.id)
    rec = oracle.oracle.decode(p)
    assert exp.output_ids == rec.output_ids and exp.verify_count == rec.verify_count
    assert exp.spec_accept_length == pytest.approx(rec.spec_accept_length)
    assert exp.accept_length == pytest.approx(1 + sum(rec.accepted_per_cycle) / rec.verify_count)
    assert sum(exp.histogram) == exp.verify_count and len(exp.accepted_per_position) == NUM_STEPS
    assert oracle.resolved["num_draft_tokens"] == NUM_STEPS + 1
    shorter = oracle.expected(p.input_ids, max_new_tokens=5)
    assert shorter.output_ids == exp.output_ids[:5]
    text = oracle.expected("w1 w2 w3", id="text")
    assert text.prompt_ids == oracle.tokenizer("w1 w2 w3")["input_ids"] and text.output_ids


def test_same_tokens_failure_names_prompt_position_tokens_and_margin(oracle, prompts):
    exp = oracle.expected(prompts[1].input_ids, id="p1")
    assert_same_tokens(exp, exp.output_ids)
    wrong = list(exp.output_ids)
    wrong[4] = (wrong[4] + 1) % 96
    with pytest.raises(AssertionError) as info:
        assert_same_tokens(exp, wrong)
    msg = str(info.value)
    assert msg.startswith("prompt 'p1': server output differs from the oracle at position 4 of 24: ")
    assert f"server token {wrong[4]} " in msg and f"oracle token {exp.output_ids[4]} " in msg
    assert "target logit margin" in msg and "oracle [1:7]" in msg
    with pytest.raises(AssertionError, match="lengths differ: server 10 tokens, oracle 24"):
        assert_same_tokens(exp, exp.output_ids[:10])
    assert_same_tokens(exp, wrong, tie_margin=1e9)          # everything is a near-tie for a huge margin


def test_acceptance_assertions(oracle, prompts):
    exp = oracle.expected(prompts[2].input_ids, id="p2")
    assert_accept_length_close(exp, exp.spec_accept_length)
    assert_accept_length_close(exp, exp.accept_length * 1.04, definition="accept_length")
    assert_verify_count(exp, exp.verify_count)
    assert_histogram_equal(exp, exp.histogram[:exp.histogram.index(max(exp.histogram)) + 1])   # trailing zeros cut
    with pytest.raises(AssertionError) as info:
        assert_accept_length_close(exp, 1.5)
    msg = str(info.value)
    assert msg.startswith("prompt 'p2': spec_accept_length (SGLang meta_info.spec_accept_length = "
                          "completion_tokens / spec_verify_ct) server 1.5000 vs oracle ")
    assert "relative difference" in msg and f"{exp.verify_count} verify steps" in msg
    with pytest.raises(AssertionError, match=f"server ran {exp.verify_count + 3} verify steps, the oracle "
                                             f"{exp.verify_count}"):
        assert_verify_count(exp, exp.verify_count + 3)
    with pytest.raises(AssertionError, match="steps accepting exactly 0 drafts"):
        assert_histogram_equal(exp, [exp.histogram[0] + 1] + exp.histogram[1:])
    many = oracle.expected_many([p.input_ids for p in prompts[:3]])
    assert_mean_accept_length_close(many, [e.spec_accept_length for e in many])
    with pytest.raises(AssertionError, match="mean spec_accept_length over 3 prompts: .* largest: p"):
        assert_mean_accept_length_close(many, [1.0, 1.0, 1.0])


def test_a_server_test_suite_against_the_oracle_over_sglangs_wire(models, oracle, prompts):
    """How an engine's own CI would use the oracle: send, then assert. The server is a stand-in serving an oracle
    over SGLang's wire (tests/fake_servers.py): this tests the assertions and the wire, not SGLang."""
    cfg = Settings.of(target=str(models["target"]), draft=str(models["head"]), num_steps=NUM_STEPS,
                    max_new_tokens=NEW_TOKENS)
    for wiring, ok in (({}, True), ({"aux_layers": (1, 3, 4), "aux_convention": "hf"}, False)):
        with serve(Engine(api.load_oracle(cfg.with_(**wiring)), "sglang")) as url:
            for p in prompts[:3]:
                exp = oracle.expected(p.input_ids, id=p.id)
                out = requests.post(f"{url}/generate", timeout=30, json={
                    "input_ids": exp.prompt_ids,
                    "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS}}).json()
                if ok:
                    assert_sglang_response(exp, out, rel=0)
                else:
                    assert_same_tokens(exp, out["output_ids"])        # a wiring fault never changes tokens
                    with pytest.raises(AssertionError, match=f"prompt '{p.id}': spec_accept_length"):
                        assert_sglang_response(exp, out)


pytest_plugins = ["pytester"]


def _docstring_example() -> str:
    """The code of eagle_eval.servers.testing's example, as its docstring shows it (indent removed)."""
    import textwrap

    import eagle_eval.servers.testing as module

    doc = module.__doc__
    start = doc.index("    import pytest")
    return textwrap.dedent(doc[start:])


def test_the_docstring_example_runs_as_written_against_the_sglang_stand_in(pytester, monkeypatch):
    """The module's example, unchanged, is a passing test of a server that serves the bundled pair (the SGLang
    stand-in); before, its prompt ids [1, 15043, 29892] were outside the bundled vocabulary (929) and the
    example ended in an IndexError inside the embedding, and it used `requests` without importing it."""
    example = _docstring_example()
    assert "from eagle_eval.testing import" in example and "def test_" in example
    pytester.makepyfile(test_example=example)
    pytester.makeconftest('''
import pytest
from fake_servers import Engine, serve

from eagle_eval import api
from eagle_eval.settings import BUNDLED_DRAFT, BUNDLED_TARGET, Settings


@pytest.fixture(scope="session")
def sglang_url():
    served = api.load_oracle(Settings.of(target=str(BUNDLED_TARGET), draft=str(BUNDLED_DRAFT), num_steps=3,
                                         max_new_tokens=32))
    with serve(Engine(served, "sglang")) as url:
        yield url
''')
    # in a process of its own: an in-process run would unload the torch modules it imported (pytester's
    # sys.modules snapshot), which torch cannot import twice
    here = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here), str(here.parent), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=1)


def test_prompt_ids_outside_the_vocabulary_are_refused_naming_the_prompt_and_token(oracle):
    from eagle_eval.workload.data import DataError

    vocab = oracle.oracle.limits()[0]
    with pytest.raises(DataError, match=rf"prompt id 'hello': token id 15043 is outside the target's vocabulary "
                                        rf"0\.\.{vocab - 1}"):
        oracle.expected([1, 15043, 29892], id="hello")
    with pytest.raises(DataError, match="prompt id 'neg': token id -1"):
        oracle.expected([1, -1], id="neg")
