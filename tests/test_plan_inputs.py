"""`eagle-eval plan` on inputs a careless hand gives it: a config.json that lacks a size (refused, never
completed from transformers' defaults), sizes that are strings, negative or absurd (refused before anything
is built), an absurd GPU count or context, a --reserve that leaves nothing, an unwritable --json; its
advice never names a zero or negative size; and `plan --config FILE` (one generated command, not a
hand-written one beside it)."""

import json
import re
import time

import pytest
import yaml
from click.testing import CliRunner
from fixtures import make_target

from eagle_eval.cli import main
from eagle_eval.errors import ExitCode
from eagle_eval.plan import model as plan_model
from eagle_eval.plan.command import PlanRequest, make_plan
from eagle_eval.plan.model import PlanError
from eagle_eval.settings import REPO_ROOT

KIMI = REPO_ROOT / "tests" / "data" / "plan" / "kimi-k2.5" / "config.json"
SMALL = ["--gpus", "1", "--gpu-memory", "1GiB", "--reserve", "0", "--dtype", "fp32"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    """A complete config.json, as save_pretrained writes it (every size given)."""
    folder = make_target(tmp_path_factory.mktemp("llama") / "t", family="llama", num_layers=2)
    return json.loads((folder / "config.json").read_text())


def folder_with(tmp_path, config: dict, name: str = "t"):
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(config))
    return tmp_path / name


def plan_cli(*args):
    res = CliRunner().invoke(main, ["plan", *map(str, args)])
    return res.exit_code, res.stdout, res.stderr


def one_line_error(code, out, err) -> str:
    lines = err.strip().splitlines()
    assert code == ExitCode.BAD_INPUT and len(lines) == 1 and lines[0].startswith("eagle-eval: error: "), (out, err)
    assert "Traceback" not in out + err
    return lines[0].removeprefix("eagle-eval: error: ")


# -- a config that lacks a size the plan needs ----------------------------------------------------------------

@pytest.mark.parametrize("key, default", [("vocab_size", 32000), ("hidden_size", 4096), ("num_hidden_layers", 32),
                                          ("intermediate_size", 11008)])
def test_a_missing_size_is_refused_naming_the_file_and_the_key(tmp_path, llama, key, default):
    folder = folder_with(tmp_path, {k: v for k, v in llama.items() if k != key})
    message = one_line_error(*plan_cli("--target", folder, *SMALL))
    assert message == (f"{folder / 'config.json'}: {key} is missing; transformers would fill in its default "
                       f"{default} (LlamaConfig), which is not this model's")


def test_missing_positions_are_refused_unless_the_plan_gives_its_context(tmp_path, llama):
    folder = folder_with(tmp_path, {k: v for k, v in llama.items() if k != "max_position_embeddings"})
    message = one_line_error(*plan_cli("--target", folder, *SMALL))
    assert message.endswith("max_position_embeddings is missing; transformers would fill in its default 2048 "
                            "(LlamaConfig), which is not this model's; give it, or --max-context N")
    plan = make_plan(PlanRequest(target=str(folder), gpus=1, gpu_memory="1GiB", reserve="0", dtype="fp32",
                                 max_context=100))
    assert plan.kv["context"] == 100


def test_a_size_the_architecture_derives_is_the_models_own_and_a_default_is_not(tmp_path, llama):
    """Llama without num_key_value_heads is multi-head (one K and V per attention head: its config's own
    rule); Mixtral's class would fill in 8, a number of its own, so there it is refused."""
    folder = folder_with(tmp_path, {k: v for k, v in llama.items() if k not in ("num_key_value_heads", "head_dim")})
    plan = make_plan(PlanRequest(target=str(folder), gpus=1, gpu_memory="1GiB", reserve="0", dtype="fp32"))
    heads, head_dim = llama["num_attention_heads"], llama["hidden_size"] // llama["num_attention_heads"]
    assert plan.kv["per_token"] == llama["num_hidden_layers"] * 2 * heads * head_dim * 4        # fp32 K and V
    mixtral = {**llama, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 2,
               "num_experts_per_tok": 1, "sliding_window": None}
    del mixtral["num_key_value_heads"]
    message = one_line_error(*plan_cli("--target", folder_with(tmp_path, mixtral, "m"), *SMALL))
    assert message.endswith("num_key_value_heads is missing; transformers would fill in its default 8 "
                            "(MixtralConfig), which is not this model's")


def test_a_wrappers_text_config_is_held_to_the_same(tmp_path):
    """Kimi-K2.5's text model is built from text_config: a size missing there is named with its path."""
    config = json.loads(KIMI.read_text())
    del config["text_config"]["moe_intermediate_size"]
    message = one_line_error(*plan_cli("--target", folder_with(tmp_path, config), "--gpus", "8", "--gpu-memory",
                                       "141GB"))
    assert message.endswith("config.json: text_config.moe_intermediate_size is missing; transformers would fill in "
                            "its default 2048 (DeepseekV3Config), which is not this model's")


# -- sizes that are strings, negative or absurd: refused before anything is built ---------------------------

@pytest.mark.parametrize("key, value, said", [
    ("vocab_size", "96", 'vocab_size is "96"; expected a whole number from 1 to 16,777,216'),
    ("hidden_size", -48, "hidden_size is -48; expected a whole number from 1 to 1,048,576"),
    ("vocab_size", 10**12, "vocab_size is 1000000000000; expected a whole number from 1 to 16,777,216"),
    ("num_hidden_layers", True, "num_hidden_layers is true; expected a whole number from 1 to 16,384"),
    ("max_position_embeddings", 4096.0, "max_position_embeddings is 4096.0; expected a whole number"),
    ("num_attention_heads", None, "num_attention_heads is null; expected a whole number from 1 to 16,384"),
])
def test_a_size_out_of_range_is_refused_before_anything_is_built(tmp_path, llama, monkeypatch, key, value, said):
    def build(*args, **kw):
        raise AssertionError("the model was built")
    monkeypatch.setattr(plan_model, "_build", build)
    folder = folder_with(tmp_path, {**llama, key: value})
    message = one_line_error(*plan_cli("--target", folder, *SMALL))
    assert message.startswith(f"{folder / 'config.json'}: {said}")


def test_an_absurd_vocabulary_in_a_wrappers_text_config_or_the_head(tmp_path, monkeypatch):
    from fixtures import make_head

    monkeypatch.setattr(plan_model, "_build", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    config = json.loads(KIMI.read_text())
    config["text_config"]["vocab_size"] = 10**12
    message = one_line_error(*plan_cli("--target", folder_with(tmp_path, config), "--gpus", "8", "--gpu-memory",
                                       "141GB"))
    assert message.endswith("config.json: text_config.vocab_size is 1000000000000; expected a whole number from 1 "
                            "to 16,777,216")
    monkeypatch.undo()
    head = make_head(tmp_path / "h")
    cfg = json.loads((head / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**cfg, "draft_vocab_size": 10**12}))
    target = make_target(tmp_path / "target", family="llama", num_layers=2)
    message = one_line_error(*plan_cli("--target", target, "--draft", head, *SMALL))
    assert message == (f"{head / 'config.json'}: draft_vocab_size is 1000000000000; expected a whole number from 1 "
                       "to 16,777,216")


def test_a_model_at_the_size_limits_is_planned_without_allocating_it(tmp_path, llama):
    """A 512 GiB embedding (vocabulary 2^24 x hidden 2^14, bf16) is built on the meta device: no tensor is
    ever made in memory, not even for a moment (accelerate's init_empty_weights alone makes each one on the
    CPU first)."""
    config = {**llama, "vocab_size": 2**24, "hidden_size": 2**14, "intermediate_size": 2**14,
              "num_attention_heads": 128, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 1}
    start = time.monotonic()
    plan = make_plan(PlanRequest(target=str(folder_with(tmp_path, config)), gpus=1, gpu_memory="4TiB"))
    assert time.monotonic() - start < 60
    assert next(p for p in plan.parts if p["part"] == "embeddings")["bytes"] == 2**24 * 2**14 * 2
    assert plan.fits


@pytest.mark.parametrize("args, said", [
    (["--gpus", "1000000000"], "--gpus 1000000000: a plan takes at most 512"),
    (["--gpus", "1", "--max-context", str(10**15)], f"--max-context {10**15}: a plan takes at most 134217728"),
    (["--gpus", "1", "--batch", str(10**9)], f"--batch {10**9}: a plan takes at most 65536"),
])
def test_an_absurd_count_is_refused_at_once(tmp_path, llama, args, said):
    start = time.monotonic()
    message = one_line_error(*plan_cli("--target", folder_with(tmp_path, llama), "--gpu-memory", "80GiB", *args))
    assert message.startswith(said) and time.monotonic() - start < 10


# -- the advice, and what it is given --------------------------------------------------------------------------

def test_the_advice_names_only_positive_sizes_that_read_back(tmp_path):
    """GPUs smaller than a GiB: the advice once wrote --max-memory 0=0GiB (and with a reserve larger than the
    GPU, negative sizes). Every size it names now is positive and --max-memory reads it."""
    from eagle_eval.models.target import parse_max_memory

    target = make_target(tmp_path / "t", family="deepseek_v3", num_layers=4)
    plan = make_plan(PlanRequest(target=str(target), gpus=2, gpu_memory="600KB", reserve="0", dtype="fp32"))
    assert not plan.fits
    offload = next(s for s in plan.suggestions if s.startswith("CPU offload"))
    budget = parse_max_memory(re.search(r"--max-memory (\S+)", offload).group(1))
    assert set(budget) <= {0, 1, "cpu"} and "cpu" in budget and all(v > 0 for v in budget.values())
    for line in plan.suggestions:
        assert not re.search(r"(^|[\s=])-?0(\.0)? ?[KMGT]?i?B\b|-\d", line), line
    assert int(re.search(r"(\d+) GPUs of this size", plan.suggestions[0]).group(1)) > 2


@pytest.mark.parametrize("args", [["--gpu-memory", "2GiB", "--reserve", "2GiB"], ["--gpu-memory", "1GB"]])
def test_a_reserve_that_leaves_nothing_is_refused(tmp_path, llama, args):
    message = one_line_error(*plan_cli("--target", folder_with(tmp_path, llama), "--gpus", "1", *args))
    assert re.fullmatch(r"--reserve 2GiB leaves nothing of each GPU's [\d.]+ [GM]iB \(--gpu-memory \w+\)", message)


@pytest.mark.parametrize("where", ["no folder", "a folder", "under a file"])
def test_json_to_an_unwritable_place_is_one_line_before_the_plan(tmp_path, llama, where):
    (tmp_path / "file").write_text("x")
    path = {"no folder": tmp_path / "nowhere" / "plan.json", "a folder": tmp_path,
            "under a file": tmp_path / "file" / "plan.json"}[where]
    code, out, err = plan_cli("--target", folder_with(tmp_path, llama), *SMALL, "--json", path)
    assert one_line_error(code, out, err).startswith(f"--json {path}: ") and out == ""     # the plan not made


def test_json_is_written_whole(tmp_path, llama):
    code, out, _ = plan_cli("--target", folder_with(tmp_path, llama), *SMALL, "--json", tmp_path / "p.json")
    assert code == ExitCode.OK and f"wrote {tmp_path / 'p.json'}" in out
    assert json.loads((tmp_path / "p.json").read_text())["fits"] is True
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


# -- plan --config ---------------------------------------------------------------------------------------------

def test_plan_reads_a_settings_file_and_flags_override_it(tmp_path, llama):
    target = folder_with(tmp_path, llama)
    flags = plan_cli("--target", target, *SMALL)
    assert flags[0] == ExitCode.OK, flags
    flat = tmp_path / "plan.yaml"
    flat.write_text(yaml.safe_dump({"command": "plan", "target": str(target), "gpus": 1, "gpu_memory": "1GiB",
                                    "reserve": "0", "dtype": "fp32"}))
    grouped = tmp_path / "plan.json"
    grouped.write_text(json.dumps({"options": {"target": str(target), "gpus": 1, "gpu_memory": "1GiB",
                                               "reserve": "0", "dtype": "fp32"}}))
    assert plan_cli("--config", flat) == plan_cli("--config", grouped) == flags
    small = plan_cli("--config", flat, "--gpu-memory", "100KiB")           # the flag wins: now it does not fit
    assert small[0] == ExitCode.FAILED and "DOES NOT FIT  does not fit 1 x 100.0 KiB" in small[1]
    flat.write_text(yaml.safe_dump({"command": "run", "target": str(target)}))
    assert "key 'command' is 'run', but this is `eagle-eval plan`" in one_line_error(*plan_cli("--config", flat))
