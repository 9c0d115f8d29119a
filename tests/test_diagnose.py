"""`eagle-eval diagnose`: shifted aux layers found and named, training dumps matched to HF
indices, untrained weights and bad vocab maps flagged, stable sweep ranking, CLI exit status."""

import json
import re

import pytest
import torch
from click.testing import CliRunner
from fixtures import head_config, make_target, train_head, write_prompts

from eagle_eval import api
from eagle_eval.cli import main
from eagle_eval.settings import Settings
from eagle_eval.diagnose import dumps
from eagle_eval.diagnose.feature_prints import render_fingerprint
from eagle_eval.diagnose.options import DiagnoseOptions
from eagle_eval.diagnose.run import diagnose
from eagle_eval.heads.checks import sanity

TRAINED_HF = (3, 5, 7)                     # = SGLang ids [2, 4, 6]; the default taps are HF[2, 4, 5]


@pytest.fixture(scope="module")
def alt(tmp_path_factory):
    """A tiny 8-layer target and a head trained on HF[3, 5, 7] (not the default taps), with and
    without the ids in its config.json."""
    root = tmp_path_factory.mktemp("diagnose")
    target = make_target(root / "target", seed=3)
    prompts = write_prompts(root / "prompts.jsonl", n=6, seed=1)
    head = train_head(target, root / "head", prompts, aux_hf=TRAINED_HF, steps=40, num_steps=3)
    bare = root / "head-noids"
    bare.mkdir()
    cfg = json.loads((head / "config.json").read_text())
    del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    (bare / "config.json").write_text(json.dumps(cfg))
    (bare / "model.safetensors").write_bytes((head / "model.safetensors").read_bytes())
    return {"target": target, "prompts": prompts, "head": head, "bare": bare, "root": root}


def run_config(alt, draft="head", **kw):
    return Settings.of(**{"target": str(alt["target"]), "draft": str(alt[draft]), "prompts": str(alt["prompts"]),
                        "max_new_tokens": 24, "num_steps": 3, **kw})


FAST = DiagnoseOptions(template_check=False)


@pytest.fixture(scope="module")
def shifted(alt):
    """The head fed HF[2, 4, 6] (every id one below its training layers), config without ids."""
    return diagnose(run_config(alt, "bare", aux_layers=(2, 4, 6), aux_convention="hf"), FAST)


def codes(findings):
    return [f.code for f in findings]


def test_shifted_layers_detected_and_right_layers_named(shifted):
    assert "aux-layer-mismatch" in codes(shifted.findings) and shifted.exit_status == 1
    assert shifted.report["recommended_aux_layers"] == {"hf": [3, 5, 7], "sglang": [2, 4, 6], "vllm": [3, 5, 7]}
    assert shifted.report["configured_aux_layers"]["hf"] == [2, 4, 6]
    top = shifted.report["sweep"]["rows"][0]
    assert top["hf"] == [3, 5, 7] and top["clearly_better"] and top["label"].startswith("every id +1")
    mismatch = next(f for f in shifted.findings if f.code == "aux-layer-mismatch")
    assert '"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 6]}' in mismatch.message
    assert '"eagle_aux_hidden_state_layer_ids": [3, 5, 7]' in mismatch.message


def test_sweep_ranking_is_stable(alt, shifted):
    again = diagnose(run_config(alt, "bare", aux_layers=(2, 4, 6), aux_convention="hf"), FAST)
    first = [(r["hf"], r["tau"]) for r in shifted.report["sweep"]["rows"]]
    assert [(r["hf"], r["tau"]) for r in again.report["sweep"]["rows"]] == first
    assert [r["rank"] for r in again.report["sweep"]["rows"]] == list(range(1, len(first) + 1))


def _hidden_states(target_path, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids]), output_hidden_states=True).hidden_states    # N + 1 x [1, T, H]


@pytest.fixture(scope="module")
def dump_files(alt):
    """The same dump written as a plain safetensors file and in SpecForge's offline layout."""
    from safetensors.torch import save_file

    ids = json.loads(alt["prompts"].read_text().splitlines()[0])["input_ids"] + [7, 8, 9, 10, 11]
    hs = _hidden_states(alt["target"], ids)
    aux = torch.cat([hs[i] for i in TRAINED_HF], dim=-1)                              # [1, T, 3H]
    plain = alt["root"] / "dump.safetensors"
    save_file({"input_ids": torch.tensor(ids), "aux_hidden_states": aux.contiguous()}, str(plain))
    folder = alt["root"] / "specforge" / "rows_0-2000"
    folder.mkdir(parents=True)
    padded = torch.tensor(ids + [0, 0, 0])                 # batch padding kept in input_ids
    for n in (1, 0):
        torch.save({"input_ids": padded, "loss_mask": torch.ones_like(padded), "hidden_state": hs[-1].clone(),
                    "aux_hidden_state": aux.clone()}, folder / f"data_{n}.ckpt")
    return {"plain": plain, "specforge": alt["root"] / "specforge", "ids": ids, "hs": hs}


@pytest.fixture(scope="module")
def target(alt):
    from eagle_eval.models.target import load_target
    return load_target(str(alt["target"]), dtype="fp32", device_map="cpu")[0]


@pytest.mark.parametrize("which", ["plain", "specforge"])
def test_dump_blocks_matched_to_their_hf_indices(target, dump_files, which):
    dump = dumps.read_dump(dump_files[which], hidden_size=48)
    match = dumps.match_dump(target, dump)
    assert match.hf == list(TRAINED_HF) and match.confident
    for b in match.blocks:
        assert b.cosine > 0.9999 and abs(b.norm_ratio - 1) < 1e-3 and b.runner_up_cosine < b.cosine
    if which == "specforge":
        assert dump.format == "specforge" and dump.file.endswith("data_0.ckpt")
        assert match.hidden_state.hf_index == 8                      # the final-norm output, HF[N]
        assert any("compared the first" in n for n in match.notes)   # padded input_ids trimmed
    found = dumps.dump_findings(match, (2, 4, 5), 3)
    assert "dump-layers-mismatch" in codes(found)
    assert "dump block 0 = HF[3] = output of layer 2 (cos 1.0000, norm ratio 1.000" in \
        next(f.message for f in found if f.code == "dump-block")
    assert "dump-layers-match" in codes(dumps.dump_findings(match, TRAINED_HF, 3))


def test_dump_in_other_order_or_of_another_width_is_reported(target, dump_files, tmp_path):
    from safetensors.torch import save_file

    hs = dump_files["hs"]
    file = tmp_path / "reordered.pt"
    torch.save({"input_ids": torch.tensor([dump_files["ids"]]), "aux_hidden_states": [hs[5], hs[3], hs[7]]}, file)
    match = dumps.match_dump(target, dumps.read_dump(file, 48))
    assert match.hf == [5, 3, 7] and "dump-block-order" in codes(dumps.dump_findings(match, TRAINED_HF, 3))
    bad = tmp_path / "bad.safetensors"
    ids = torch.tensor(dump_files["ids"])
    save_file({"input_ids": ids, "aux_hidden_states": torch.zeros(len(ids), 50)}, str(bad))
    with pytest.raises(dumps.DumpError, match="not a multiple of the target's hidden_size 48"):
        dumps.read_dump(bad, 48)


def test_untrained_lm_head_flagged():
    torch.manual_seed(0)
    fresh = torch.nn.Linear(48, 96).weight                                # PyTorch default init
    hf_init = torch.randn(500, 64) * 0.02                                 # Hugging Face init
    assert codes(sanity.matrix_findings("lm_head", fresh, 0.02)) == ["lm_head-untrained"]
    assert codes(sanity.matrix_findings("lm_head", hf_init, 0.02)) == ["lm_head-untrained"]
    assert codes(sanity.matrix_findings("lm_head", torch.ones(96, 48), 0.02)) == ["lm_head-degenerate"]
    collapsed = torch.randn(1, 48).repeat(96, 1) + 0.01 * torch.randn(96, 48)
    assert "lm_head-collapsed" in codes(sanity.matrix_findings("lm_head", collapsed, 0.02))


def test_trained_lm_head_not_flagged(alt):
    from eagle_eval.heads.io import load_head

    found = sanity.matrix_findings("lm_head", load_head(alt["head"]).head.lm_head.weight, 0.02)
    assert all(f.severity == "info" for f in found), found


def test_vocab_map_checks():
    from eagle_eval.heads.io import vocab_map_from_used

    d2t, t2d = vocab_map_from_used(torch.tensor([3, 9, 10, 40, 77]), 96)
    assert codes(sanity.vocab_map_findings(d2t, t2d, True)) == ["vocab-map"]
    assert codes(sanity.vocab_map_findings(torch.zeros(5, dtype=torch.long), t2d, False)) == ["d2t-identity"]
    broken = t2d.clone()
    broken[11] = True
    assert codes(sanity.vocab_map_findings(d2t, broken, True)) == ["t2d-inconsistent"]
    dup = d2t.clone()
    dup[1] -= 6                                                           # draft ids 0 and 1 -> target id 3
    assert "d2t-duplicates" in codes(sanity.vocab_map_findings(dup, t2d, False))


@pytest.fixture(scope="module")
def untrained(alt):
    """A freshly initialised head (never trained) with a reduced vocab and an all-zero d2t."""
    from eagle_eval.heads.io import save_head
    from eagle_eval.heads.eagle3.layer import Eagle3Head

    torch.manual_seed(0)
    path = alt["root"] / "untrained"
    save_head(Eagle3Head(head_config(draft_vocab=40)), path)
    return path


@pytest.mark.filterwarnings("ignore:.*d2t is all zeros")
def test_untrained_head_and_identity_d2t_flagged_at_load_and_by_run(alt, untrained):
    oracle = api.load_oracle(Settings.of(target=str(alt["target"]), draft=str(untrained)))
    found = {f["code"]: f["severity"] for f in oracle.resolved.as_dict()["sanity"]}
    assert found["lm_head-untrained"] == "error" and found["d2t-identity"] == "error"
    args = ["run", "--target", str(alt["target"]), "--draft", str(untrained), "--prompts", str(alt["prompts"]),
            "--max-new-tokens", "4", "--limit", "1"]
    out = CliRunner().invoke(main, args)                 # a head that cannot give a meaningful number fails the run
    assert out.exit_code == 1, out.output
    assert "load-time checks found an error" in out.stderr and "nothing was decoded" in out.stderr
    assert "lm_head-untrained" in out.stderr and "d2t-identity" in out.stderr and "accept length" not in out.stdout
    anyway = CliRunner().invoke(main, args + ["--allow-load-errors"])
    assert anyway.exit_code == 0, anyway.output
    assert "load-time checks" in anyway.output and "lm_head-untrained" in anyway.output and "d2t-identity" in anyway.output


def _cli(alt, *args):
    return CliRunner().invoke(main, ["diagnose", "--target", str(alt["target"]), "--prompts", str(alt["prompts"]),
                                     "--max-new-tokens", "24", "--num-steps", "3", "--no-template-check", *args])


def test_cli_exit_status_and_diagnosis_json(alt, dump_files, tmp_path):
    wrong = _cli(alt, "--draft", str(alt["head"]), "--aux-layers", "1,3,4", "--train-dump", str(dump_files["plain"]),
                 "--output-dir", str(tmp_path / "wrong"))
    assert wrong.exit_code == 1, wrong.output
    report = json.loads((tmp_path / "wrong" / "diagnosis.json").read_text())
    assert report["configured_aux_layers"] == {"hf": [2, 4, 5], "sglang": [1, 3, 4], "vllm": [2, 4, 5]}
    assert report["recommended_aux_layers"] == {"hf": [3, 5, 7], "sglang": [2, 4, 6], "vllm": [3, 5, 7]}
    assert [(b["block"], b["hf_index"]) for b in report["dump_blocks"]] == [(0, 3), (1, 5), (2, 7)]
    assert {"aux-layer-mismatch", "dump-layers-mismatch", "aux-layers-override"} <= \
        {f["code"] for f in report["findings"]}
    assert all({"severity", "code", "message"} <= set(f) for f in report["findings"])
    assert report["sweep"]["rows"][0]["hf"] == [3, 5, 7]

    right = _cli(alt, "--draft", str(alt["head"]), "--train-dump", str(dump_files["specforge"]))
    assert right.exit_code == 0, right.output
    assert "aux-layers-consistent" in right.output and "dump-layers-match" in right.output

    missing = _cli(alt, "--draft", str(alt["head"]), "--train-dump", str(tmp_path / "nope.ckpt"), "--no-sweep")
    assert missing.exit_code == 2 and "no such file or folder" in missing.output


def test_fingerprint_values_and_stable_format(alt):
    res = diagnose(run_config(alt), DiagnoseOptions(fingerprint=True, sweep=False, template_check=False))
    fp = res.report["fingerprint"]
    ids = json.loads(alt["prompts"].read_text().splitlines()[0])["input_ids"]
    hs = _hidden_states(alt["target"], ids)
    assert [b["hf"] for b in fp["blocks"]] == list(TRAINED_HF)
    for b in fp["blocks"]:
        for r in b["rows"]:
            ref = hs[b["hf"]][0, r["position"]]
            assert r["token"] == ids[r["position"]]
            assert r["values"] == pytest.approx(ref[:5].tolist(), abs=1e-5)
            assert r["norm"] == pytest.approx(float(ref.norm()), rel=1e-5)
    text = render_fingerprint(fp)
    assert text == render_fingerprint(json.loads(json.dumps(fp)))
    assert re.search(r"^  t=0   token=1       norm=\d\.\d{5}e[+-]\d\d  first=\[[+-]\d\.\d{5}e[+-]\d\d, ", text, re.M)


def test_chat_template_check(alt, tmp_path):
    prompts = tmp_path / "chat.jsonl"
    rows = [{"id": f"c{i}", "messages": [{"role": "user", "content": f"w{i} w{i + 7} w3"}]} for i in range(4)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = Settings.of(**{**run_config(alt).flat(), "prompts": str(prompts), "aux_layers": None})
    res = diagnose(cfg, DiagnoseOptions(sweep=False))
    rows = res.report["template_check"]
    assert [r["variant"] for r in rows] == ["the tokenizer's chat template (configured)",
                                            "raw prompts (--no-chat-template)"]
    assert all(r["tau"] >= 1 for r in rows) and "delta_vs_configured" in rows[1]
    verdicts = {"chat-template-consistent", "chat-template-mismatch", "chat-template-inconclusive"}
    assert len(verdicts & set(codes(res.findings))) == 1                # exactly one of the three outcomes
    assert "chat-template-not-applicable" not in codes(res.findings)


def test_own_embedding_table_compared_with_the_targets():
    table = torch.randn(96, 48)
    assert codes(sanity.own_table_findings(table.clone(), table, "draft")) == ["embed-tokens-same"]
    assert codes(sanity.own_table_findings(torch.randn(96, 48), table, "draft")) == ["embed-tokens-differs"]


def test_engine_specific_aux_id_keys(alt):
    from eagle_eval.models.capture import resolve_aux_layers

    nested_only = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 6]}}
    aux = resolve_aux_layers(8, 3, None, "sglang", [2, 4, 6], None)
    # vLLM V1 reads the nested ids unchanged (HF [2, 4, 6], one low); V2 ignores them (defaults HF [2, 4, 5])
    found = sanity.aux_id_findings(nested_only, 8, aux, None)
    assert codes(found) == ["vllm-v1-taps-differ", "vllm-v2-taps-differ"]
    assert [f.detail["engine_hf"] for f in found] == [[2, 4, 6], [2, 4, 5]]
    assert all('"eagle_aux_hidden_state_layer_ids": [3, 5, 7]' in f.message for f in found)
    top_only = {"eagle_aux_hidden_state_layer_ids": [3, 5, 7]}
    assert codes(sanity.aux_id_findings(top_only, 8, aux, None)) == ["sglang-taps-differ"]
    # nested ids equal to the defaults: V2 agrees by luck, V1 still reads them one low (the bundled head's case)
    default_nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}}
    default_aux = resolve_aux_layers(8, 3, None, "sglang", [1, 3, 4], None)
    assert codes(sanity.aux_id_findings(default_nested, 8, default_aux, None)) == ["vllm-v1-taps-differ"]
    both = {**nested_only, **top_only}
    assert codes(sanity.aux_id_findings(both, 8, aux, None)) == []
    shifted = resolve_aux_layers(8, 3, (1, 3, 4), "sglang", [2, 4, 6], None)
    assert codes(sanity.aux_id_findings(both, 8, shifted, (1, 3, 4))) == ["aux-layers-override"]


def _match(blocks):
    dump = dumps.Dump(file="d.pt", format="plain", input_ids=torch.zeros(4, dtype=torch.long),
                      aux=torch.zeros(4, 3 * 48), hidden_state=None)
    return dumps.DumpMatch(dump=dump, tokens=4, num_layers=8,
                           blocks=[dumps.BlockMatch(i, hf, cos, 1.0, second, cos2)
                                   for i, (hf, cos, second, cos2) in enumerate(blocks)])


def test_dump_match_three_ways_when_layers_are_close():
    """A block two HF indices fit equally well neither confirms nor contradicts the fed tensor: inconclusive
    (a warning when the sweep decides, undecided without it), never dump-layers-match."""
    sure = [(3, 1.0, 4, 0.9), (5, 1.0, 6, 0.9), (7, 1.0, 6, 0.9)]
    close = [(3, 1.0, 4, 0.9), (5, 1.0, 4, 0.9995), (7, 1.0, 6, 0.9)]
    weak = [(3, 1.0, 4, 0.9), (5, 0.8, 4, 0.7), (7, 1.0, 6, 0.9)]

    def last(blocks, fed, sweep=True):
        f = dumps.dump_findings(_match(blocks), fed, 3, sweep)[-1]
        return f.severity, f.code

    assert last(sure, (3, 5, 7)) == ("info", "dump-layers-match")
    assert last(sure, (2, 5, 7)) == ("error", "dump-layers-mismatch")
    assert last(close, (3, 5, 7)) == ("warning", "dump-layers-inconclusive")
    assert last(close, (3, 4, 7)) == ("warning", "dump-layers-inconclusive")      # HF[4] fits block 1 as well
    assert last(close, (3, 5, 7), sweep=False) == ("undecided", "dump-layers-inconclusive")
    assert last(close, (3, 6, 7)) == ("error", "dump-layers-mismatch")            # neither HF[5] nor HF[4]
    assert last(weak, (3, 5, 7)) == ("warning", "dump-layers-inconclusive")
    assert last(weak, (2, 5, 7)) == ("error", "dump-layers-mismatch")             # block 0 is surely HF[3]


def test_boundary_head_keeps_its_configured_taps_in_the_sweep():
    """Boundary ids may name N (the last layer's output before the final norm): the configured set
    HF[2, 4, 8] on the 8-layer bundled target is the sweep's baseline row, beside the alternatives
    (its -1 shift and embedding variants keep index 8; the draft config's HF[2, 4, 5] is tried too)."""
    run = Settings.of(aux_layers=(2, 4, 8), aux_convention="boundary", max_new_tokens=16, limit=8)
    result = diagnose(run, DiagnoseOptions(template_check=False, prompt_budget=8))
    rows = {tuple(r["hf"]): r for r in result.report["sweep"]["rows"]}
    assert result.report["configured_aux_layers"]["hf"] == [2, 4, 8]
    assert rows[(2, 4, 8)]["label"] == "configured" and rows[(2, 4, 8)]["status"] == "configured"
    assert {(1, 3, 7), (0, 4, 8), (2, 4, 5)} <= set(rows) and all(max(hf) <= 8 for hf in rows)
    assert all(r["status"] != "configured" for hf, r in rows.items() if hf != (2, 4, 8))
