"""The seams the next issues plug into: the decode policy, the DraftHead protocol, the engine registry."""

import torch
from fixtures import make_head

from eagle_eval.heads.io import load_head
from eagle_eval.heads.protocol import DraftAttention, DraftHead
from eagle_eval.registry import ENGINES
from eagle_eval.servers.http import Http
from eagle_eval.servers.options import ServerCheckOptions
from eagle_eval.loop.policy import GREEDY, DecodePolicy
from eagle_eval.loop.tree import Tree


def test_both_head_kinds_implement_the_draft_head_protocol(tmp_path):
    from test_mla_head import mla_config
    from eagle_eval.heads.mla.layer import MLAHead

    llama = load_head(make_head(tmp_path / "h")).head
    mla = MLAHead(mla_config())
    for head in (llama, mla):
        assert isinstance(head, DraftHead) and isinstance(head.attention, DraftAttention)


def test_the_greedy_policy_is_every_engines_temperature_zero_rule():
    assert isinstance(GREEDY, DecodePolicy)
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([5, 7, 2, 9]):
        logits[row, best] = 1.0
    assert GREEDY.accept_chain([5, 7, 9], logits) == (2, 2)          # d_3 = 9 != argmax 2; bonus = argmax after d_2
    assert GREEDY.accept_chain([4, 7, 9], logits) == (0, 5)
    tree = Tree(tokens=[0, 5, 6, 7], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2], ranks=[0, 0, 1, 0])
    assert GREEDY.accept_tree(tree, logits) == ([0, 1, 3], 9)
    assert GREEDY.first_token(logits[1]) == 7 and GREEDY.propose(logits[:2]).tolist() == [5, 7]


def test_every_engine_is_one_complete_record():
    for name, engine in zip(ENGINES.names(), ENGINES.records()):
        assert engine.name == name and engine.taps and engine.num_steps_setting
        opts = ServerCheckOptions(backend=name, url="http://127.0.0.1:1")
        client = engine.make_client(Http("http://127.0.0.1:1", 1.0, 0), opts)
        assert hasattr(client, "generate") and hasattr(client, "settings")
    # each engine's figure is its own (no engine is treated as another)
    assert ENGINES.get("sglang").figure_counts(12, 4, 7) == (12, 4)
    assert ENGINES.get("vllm").figure_counts(12, 4, 7) == (11, 4)


# -- a toy accept rule and a toy head kind, registered from this file alone (issue 38: a rule is one record, a head
# kind one record; nothing in the package names them) -------------------------------------------------------------

import json  # noqa: E402

import pytest  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from eagle_eval import api  # noqa: E402
from eagle_eval.heads.eagle3.layer import Eagle3Head, HeadConfig  # noqa: E402
from eagle_eval.heads.io import LoadedHead  # noqa: E402
from eagle_eval.heads.eagle3.wire import wire_eagle3  # noqa: E402
from eagle_eval.heads.kind import HeadKind  # noqa: E402
from eagle_eval.registry import HEAD_KINDS, RULES  # noqa: E402
from eagle_eval.rules import base  # noqa: E402
from eagle_eval.rules.vllm import probs as vllm_probs  # noqa: E402
from eagle_eval.settings import LoopOptions, ProfileOptions, Settings  # noqa: E402


class FlippedCoin(base.OneHotRule):
    """vLLM's chain rule with the coin read from the other end: accept d iff 1 - u < p(d) (still probability
    p(d), other draws than vllm's)."""

    def node(self, p, children):
        (d,) = children
        if 1.0 - base.coin(self.rng) < float(p[d]):
            return 0, None
        return None, base.without(p, [d])


TOY_RULE = base.Rule(
    name="toy-flip", engine="a test's", policy=FlippedCoin, probs=vllm_probs,
    filter_order="vLLM's (a test's rule)", drafts="the draft's argmax, a chain",
    at_a_node="accept d iff 1 - u < p(d)", residual="p with d removed", source="tests/test_seams.py",
    node=lambda a, valid, decoding: a.double() * valid, chain_only="the toy rule verifies chains")


def _load_toy(folder, config_file, config, dialect, allow_unknown_keys):
    head = Eagle3Head(HeadConfig(**config["toy"]))
    head.load_state_dict(load_file(str(folder / "toy.safetensors")), strict=True)
    return LoadedHead(head=head.eval(), kind="toy", dialect=dialect, path=str(folder),
                      weights_file=str(folder / "toy.safetensors"), own_embedding=False, aux_ids_sglang=None,
                      aux_ids_vllm=None, d2t_in_checkpoint=True)


TOY_KIND = HeadKind(
    name="toy", description="a test's head kind (an EAGLE-3 layer in a layout of its own)",
    architectures="'ToyDraftHead' (tests/test_seams.py)",
    detect=lambda config: "toy" if config.get("architectures") == ["ToyDraftHead"] else None, load=_load_toy,
    default_taps=lambda num_layers, cfg: [1, 2, 3],
    kv_bytes=lambda cfg, size: 2 * cfg.num_key_value_heads * cfg.head_dim * size + 7,
    meta=lambda config, config_file, dialect, names: Eagle3Head(HeadConfig(**config["toy"])),
    info=lambda cfg: {}, wire=wire_eagle3)


@pytest.fixture
def toys(tmp_path):
    """The toy rule and kind registered for one test, and a toy head saved in the toy layout: the bundled head's
    weights under the toy kind's own config.json."""
    RULES.register(TOY_RULE.name, TOY_RULE)
    HEAD_KINDS.register(TOY_KIND.name, TOY_KIND)
    bundled = load_head(Settings().model.draft).head
    folder = tmp_path / "toy-head"
    folder.mkdir()
    cfg = {k: v for k, v in bundled.config.__dict__.items() if k in HeadConfig.__dataclass_fields__}
    (folder / "config.json").write_text(json.dumps({"architectures": ["ToyDraftHead"], "toy": cfg}))
    save_file({k: v.contiguous() for k, v in bundled.state_dict().items()}, str(folder / "toy.safetensors"))
    try:
        yield folder
    finally:
        RULES.unregister(TOY_RULE.name)
        HEAD_KINDS.unregister(TOY_KIND.name)


def test_a_rule_registered_from_a_test_runs_through_run_profile_and_the_distribution_check(toys):
    """The toy rule draws its coins otherwise than vllm but accepts with the same probability p(d): the profile's
    closed form (its record's `node`) gives vllm's per-start numbers exactly, its runs are batched like any rule's,
    and the distribution check runs on its output."""
    base_settings = Settings.of(limit=4, max_new_tokens=24, temperature=0.8, accept_rule="toy-flip")
    one = api.evaluate(base_settings, LoopOptions(check_lossless=True), progress=False)
    assert one.report["config"]["decoding"]["rule"] == "toy-flip"
    assert one.report["config"]["decoding"]["filter_order"] == "vLLM's (a test's rule)"
    check = one.report["summary"]["distribution_check"]
    assert check["verdict"] in ("consistent", "undecided") and check["samples_checked"] == 4, check
    batched = api.evaluate(base_settings, LoopOptions(batch_size=3), progress=False)
    assert [s.output_ids for s in batched.samples] == [s.output_ids for s in one.samples]
    vllm_run = api.evaluate(base_settings.with_(accept_rule="vllm"), progress=False)
    assert [s.output_ids for s in vllm_run.samples] != [s.output_ids for s in one.samples]   # other draws
    toy = api.profile(base_settings, ProfileOptions(max_steps=3), progress=False)
    vllm = api.profile(base_settings.with_(accept_rule="vllm"), ProfileOptions(max_steps=3), progress=False)
    assert [r["p_accept_at_least"] for r in toy.per_start] == [r["p_accept_at_least"] for r in vllm.per_start]
    assert len(toy.per_start) > 10
    with pytest.raises(Exception, match="toy rule verifies chains"):
        api.evaluate(base_settings.with_(topk=2, num_draft_tokens=4), progress=False)


def test_a_head_kind_registered_from_a_test_runs_through_run_profile_and_plan(toys):
    """The toy kind's checkpoint is found by its own detect, loaded by its own loader, tapped where its record
    says when the config names no ids, planned with its own KV bytes; the loop's tokens are the bundled head's
    with the same taps."""
    settings = Settings.of(draft=str(toys), limit=3, max_new_tokens=16)
    run = api.evaluate(settings, progress=False)
    head = run.report["config"]["head"]
    assert head["kind"] == "toy" and head["dialect"] == "toy"
    assert run.report["config"]["aux_layers"]["hf"] == [1, 2, 3]
    assert "toy head kind" in run.report["config"]["aux_layers"]["source"]
    same = api.evaluate(Settings.of(limit=3, max_new_tokens=16, aux_layers=(1, 2, 3), aux_convention="hf"),
                        progress=False)
    assert [s.output_ids for s in run.samples] == [s.output_ids for s in same.samples]
    prof = api.profile(settings, ProfileOptions(max_steps=2), progress=False)
    assert prof.report["config"]["head"]["kind"] == "toy"
    from eagle_eval.plan.command import make_plan
    from eagle_eval.settings import PlanOptions

    plan = make_plan(PlanOptions(target=Settings().model.target, draft=str(toys), gpus=1, gpu_memory="10GiB"))
    cfg = load_head(Settings().model.draft).head.config
    bundled = make_plan(PlanOptions(target=Settings().model.target, gpus=1, gpu_memory="10GiB",
                                    draft=Settings().model.draft))
    assert plan.head["kind"] == "toy" and bundled.head["kind"] == "llama"
    size = bundled.head["kv_per_token"] // (2 * cfg.num_key_value_heads * cfg.head_dim)      # bytes per element
    assert plan.head["kv_per_token"] == bundled.head["kv_per_token"] + 7                      # the toy kind's own


def test_the_cli_and_the_docs_list_the_registered_rules_kinds_and_engines():
    """--accept-rule and --backend offer exactly the registered names, and the docs' tables are generated from
    the records (scripts/registry_tables.py)."""
    import sys
    from pathlib import Path

    from click.testing import CliRunner

    from eagle_eval.cli import main

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))
    import doc_blocks
    import registry_tables

    assert doc_blocks.stale(registry_tables.blocks()) == [], "stale: python scripts/registry_tables.py"
    out = CliRunner().invoke(main, ["run", "--help"]).output
    assert "[" + "|".join(RULES.names()) + "]" in out.replace("\n", "").replace(" ", "")
    out = CliRunner().invoke(main, ["server-check", "--help"]).output
    assert "[" + "|".join(ENGINES.names()) + "]" in out.replace("\n", "").replace(" ", "")
    docs = (root / "docs" / "sampling.md").read_text() + (root / "docs" / "design.md").read_text()
    for name in RULES.names() + HEAD_KINDS.names():
        assert f"| `{name}`" in docs, name


@pytest.mark.parametrize("option,value,owner", [("mtp_convention", "sglang", "mtp"),
                                                ("dflash_convention", "vllm-cpu", "dflash")])
def test_a_kinds_own_option_with_a_draft_of_another_kind_is_refused(option, value, owner):
    """--mtp-convention / --dflash-convention with the bundled EAGLE-3 head would change nothing: refused at wiring,
    naming the option, the head's kind and the kind that reads it; at its default it is no trouble."""
    from eagle_eval.settings import ConfigError

    base = Settings.of(limit=1, max_new_tokens=4)
    with pytest.raises(ConfigError) as err:
        api.load_oracle(base.with_(**{option: value}))
    msg = str(err.value)
    assert msg.startswith(f"--{option.replace('_', '-')} {value}:") and "kind 'llama'" in msg and f"kind '{owner}'" in msg
    assert api.load_oracle(base).resolved.head.kind == "llama"
