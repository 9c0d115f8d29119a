"""Aux-layer resolution (the one function) and hook capture against output_hidden_states."""

import pytest
import torch
from fixtures import make_target

from eagle_eval.models.capture import AuxLayerError, FeatureCapture, resolve_aux_layers, to_hf
from eagle_eval.models.target import Target


def test_conventions_by_hand():
    # N = 61 (DeepSeek-V3): SGLang ids [1, 29, 57] = outputs of layers 1, 29, 57 = HF[2], HF[30], HF[58]
    aux = resolve_aux_layers(61, cli_ids=[1, 29, 57], cli_convention="sglang")
    assert aux.hf == (2, 30, 58) and aux.vllm == [2, 30, 58] and aux.sglang == [1, 29, 57]
    assert resolve_aux_layers(61, cli_ids=[2, 30, 58], cli_convention="vllm").hf == (2, 30, 58)
    assert resolve_aux_layers(61, cli_ids=[2, 30, 58], cli_convention="hf").hf == (2, 30, 58)
    assert resolve_aux_layers(61).hf == (2, 30, 58)       # default HF[2], HF[N//2], HF[N-3]
    assert to_hf([-1, 2], "sglang") == [0, 3]             # -1 = embedding output


def test_config_keys_and_disagreement():
    aux = resolve_aux_layers(8, config_sglang_ids=[1, 3, 5])
    assert aux.hf == (2, 4, 6) and "eagle_config" in aux.source
    aux = resolve_aux_layers(8, config_vllm_ids=[2, 4, 6])
    assert aux.hf == (2, 4, 6) and "top level" in aux.source
    assert resolve_aux_layers(8, config_sglang_ids=[1, 3, 5], config_vllm_ids=[2, 4, 6]).hf == (2, 4, 6)
    with pytest.raises(AuxLayerError, match="disagrees"):
        resolve_aux_layers(8, config_sglang_ids=[1, 3, 5], config_vllm_ids=[1, 3, 5])
    # the command line wins over the config
    assert resolve_aux_layers(8, cli_ids=[0, 1, 2], cli_convention="hf", config_sglang_ids=[1, 3, 5]).hf == (0, 1, 2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(cli_ids=[1, 3, 8], cli_convention="hf"), "out of range"),
    (dict(cli_ids=[1, 3, 7], cli_convention="sglang"), "out of range"),
    (dict(cli_ids=[-2, 3, 4], cli_convention="sglang"), ">= -1"),
    (dict(cli_ids=[-1, 3, 4], cli_convention="vllm"), ">= 0"),
    (dict(cli_ids=[2, 3, 3], cli_convention="hf"), "collide"),
    (dict(cli_ids=[2, 3], cli_convention="hf"), "fuses 3"),
])
def test_bad_ids_are_errors(kwargs, match):
    with pytest.raises(AuxLayerError, match=match):
        resolve_aux_layers(8, **kwargs)


def test_shallow_target_defaults_collide():
    with pytest.raises(AuxLayerError, match="collide"):
        resolve_aux_layers(6)       # {2, 3, 3}


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("ids, convention", [([1, 3, 5], "sglang"), ([-1, 0, 6], "sglang"),
                                             ([2, 4, 7], "vllm"), ([0, 1, 7], "hf")])
def test_capture_equals_output_hidden_states(tmp_path_factory, family, ids, convention):
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.getbasetemp() / f"cap-{family}"
    if not path.exists():
        make_target(path, family=family)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    target = Target(model)
    aux = resolve_aux_layers(target.num_layers, cli_ids=ids, cli_convention=convention)
    ids_in = torch.randint(5, 90, (1, 11))
    with torch.no_grad(), FeatureCapture(target.layers, aux.hf, "cpu") as cap:
        out = model(ids_in, output_hidden_states=True)
        feats = cap.pop()
    expected = torch.cat([out.hidden_states[i] for i in aux.hf], dim=-1)
    assert feats.shape == (1, 11, 3 * model.config.hidden_size)
    assert torch.equal(feats, expected)
