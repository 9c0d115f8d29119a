"""DFlash / DFlash2 checkpoints read strictly (heads/dflash/): both layouts, every config key accounted for,
every tensor mapped and shape-checked, the drafter's shapes and taps checked against the target, and checkpoints
written by z-lab's own PyPI classes read as they are."""

import json

import pytest
import torch
from dflash_fixtures import MASK, TARGET_LAYERS, dflash_config, make_qwen3_target, random_drafter
from fixtures import VOCAB

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.dflash.bind import bind
from eagle_eval.heads.dflash.config import default_target_layer_ids
from eagle_eval.heads.dflash.io import load_dflash, save_dflash
from eagle_eval.heads.dflash.state import BlockDraftState
from eagle_eval.heads.eagle3.keys import HeadKeyError
from eagle_eval.loop.policy import GREEDY


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from eagle_eval.models.target import Target

    path = make_qwen3_target(tmp_path_factory.mktemp("dflash_target") / "target")
    return Target(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), str(path))


def _drafts(head, target, prompt, num_steps=3):
    """One block's drafts after the prompt's prefill (the loop's first cycle), through BlockDraftState."""
    from eagle_eval.models.capture import FeatureCapture

    with FeatureCapture(target.layers, head.config.aux_hf, head.device) as cap:
        logits = target.forward(torch.tensor([prompt]), None)
        aux = cap.pop()
    state = BlockDraftState(head, head.embed, 0, GREEDY)
    state.extend(aux, torch.tensor([prompt[1:] + [int(logits[0, -1].argmax())]]))
    return state.propose_chain(num_steps).tolist()


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        d = cfg[section] if section else cfg
        d.pop(name, None) if value is None else d.__setitem__(name, value)
    (path / "config.json").write_text(json.dumps(cfg))


def _edit_tensors(path, change):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"))


# -- the z-lab layout --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_zlab_checkpoint_round_trips_with_every_key_accounted_for(tmp_path, kind):
    cfg = dflash_config(kind)
    drafter = random_drafter(cfg)
    loaded = load_dflash(save_dflash(drafter, tmp_path / kind))
    assert loaded.config == cfg and loaded.key_notes == ()
    assert not loaded.key_audit.unknown and not loaded.key_audit.engine_math
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.drafter.state_dict()[name], tensor), name
    written = json.loads((tmp_path / kind / "config.json").read_text())
    assert written["dflash_config"]["target_layer_ids"] == [1, 3] and written["block_size"] == 4
    assert not {"embed_tokens.weight", "lm_head.weight"} & set(loaded.drafter.state_dict())
    if kind == "dflash2":                # codebooks stored without .weight, as published
        from safetensors import safe_open
        with safe_open(str(tmp_path / kind / "model.safetensors"), "pt") as f:
            assert "candidate_selector.successor_codebook" in f.keys()


def test_taps_and_engine_settings_in_every_convention():
    cfg = dflash_config(target_layer_ids=(1, 3))
    assert cfg.aux_hf == (2, 4)
    assert cfg.taps() == {"zlab_target_layer_ids": [1, 3], "hf": [2, 4], "vllm_aux_layer_ids": [2, 4],
                          "sglang_layers_to_capture": [2, 4], "speculators_aux_hidden_state_layer_ids": [2, 4]}
    assert cfg.engine_block == {"zlab_block_size": 4, "vllm_num_speculative_tokens": 3, "sglang_num_draft_tokens": 4}
    # z-lab's default list (the Qwen3-8B example of the notes: 36 layers, 5 draft layers)
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]


def test_missing_ids_take_zlab_default_with_a_note(tmp_path):
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    _edit_config(path, **{"dflash_config.target_layer_ids": None})
    loaded = load_dflash(path)
    assert loaded.config.target_layer_ids == (1, 3) == tuple(default_target_layer_ids(TARGET_LAYERS, 2))
    assert any("no target_layer_ids" in n and "vLLM" in n for n in loaded.key_notes)


@pytest.mark.parametrize("changes,message", [
    ({"dflash_config.mask_token_id": None}, "mask_token_id"),
    ({"dflash_config.block_size": 8}, "'block_size' = 4 at the top level but dflash_config.block_size = 8"),
    ({"dflash_config.target_layer_ids": [3, 1]}, "ascending"),
    ({"dflash_config.target_layer_ids": [1, "3"]}, "dflash_config.'target_layer_ids'"),
    ({"head_dim": None}, "missing key 'head_dim'"),
    ({"model_type": "llama"}, "'model_type' = 'llama'"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "no window"),
    ({"architectures": ["Qwen3ForCausalLM"]}, "'architectures'"),
    ({"dflash_config.selector_rank": 8}, "DFlash2 settings on a DFlash"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25}},
     "partial_rotary_factor = 0.25"),
])
def test_bad_configs_are_refused_naming_the_key(tmp_path, changes, message):
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    _edit_config(path, **changes)
    with pytest.raises(CheckpointError, match=message) as err:
        load_dflash(path)
    assert str(path / "config.json") in str(err.value)


def test_engine_math_keys_are_refused_and_unknown_keys_reported(tmp_path):
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    _edit_config(path, **{"dflash_config.use_swa": True, "dflash_config.use_aux_hidden_state": True, "future_key": 1,
                          "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}})
    (path / "dflash.py").write_text("raise SystemExit('remote code ran')\n")     # never imported
    with pytest.raises(HeadKeyError, match="dflash_config.use_swa"):
        load_dflash(path)
    loaded = load_dflash(path, allow_unknown_keys=True)
    assert loaded.key_audit.unknown == ["future_key"] and "auto_map" in loaded.key_audit.harmless
    assert "dflash_config.use_aux_hidden_state" in loaded.key_audit.harmless                # neutral value
    assert any("future_key" in n for n in loaded.key_notes)


def test_engine_disagreements_are_notes(tmp_path):
    """A vLLM eagle key that taps other layers, a dflash_config.causal that vLLM applies to every layer, and a
    logit multiplier vLLM's DFlash ignores: read as z-lab does, each said."""
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    _edit_config(path, **{"eagle_aux_hidden_state_layer_ids": [1, 3], "dflash_config.causal": True,
                          "dflash_config.output_multiplier": 2.0})
    loaded = load_dflash(path)
    notes = " | ".join(loaded.key_notes)
    assert loaded.config.taps()["vllm_aux_layer_ids"] == [1, 3] and loaded.config.aux_hf == (2, 4)
    assert "eagle_aux_hidden_state_layer_ids" in notes and "causal = [True, True] (dflash_config.causal" in notes
    assert "ignores all three" in notes and loaded.config.output_multiplier == 2.0


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.pop("layers.1.self_attn.k_norm.weight"), "missing tensor 'layers.1.self_attn.k_norm.weight' "
                                                          r"\(expected shape \[32\]"),
    (lambda t: t.__setitem__("fc.weight", torch.zeros(64, 192)),
     r"'fc.weight' has shape \[64, 192\], expected \[64, 128\]"),
    (lambda t: t.__setitem__("embed_tokens.weight", torch.zeros(VOCAB, 64)), "reads the target's embedding"),
    (lambda t: t.__setitem__("layers.0.mlp_conv.base_kernel", torch.zeros(2, 3, 64)), "DFlash2DraftModel"),
    (lambda t: t.__setitem__("norm.weight", torch.ones(64, dtype=torch.int32)), "stored as int32"),
])
def test_tensors_are_matched_strictly(tmp_path, edit, message):
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    _edit_tensors(path, edit)
    with pytest.raises(CheckpointError, match=message):
        load_dflash(path)


def test_dflash2_codebooks_in_either_form_but_not_both(tmp_path):
    path = save_dflash(random_drafter(dflash_config("dflash2")), tmp_path / "d")
    ref = load_dflash(path).drafter.state_dict()["candidate_selector.predecessor_codebook"]
    _edit_tensors(path, lambda t: t.__setitem__("candidate_selector.predecessor_codebook.weight",
                                                t.pop("candidate_selector.predecessor_codebook")))
    assert torch.equal(load_dflash(path).drafter.state_dict()["candidate_selector.predecessor_codebook"], ref)
    _edit_tensors(path, lambda t: t.__setitem__("candidate_selector.predecessor_codebook", ref.clone()))
    with pytest.raises(CheckpointError, match="unexpected tensor"):
        load_dflash(path)


def test_a_missing_folder_or_config_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a folder"):
        load_dflash(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_dflash(tmp_path / "empty")


def test_a_separate_mask_embedding_is_refused(tmp_path):
    path = save_dflash(random_drafter(dflash_config()), tmp_path / "d")
    torch.save(torch.zeros(64), path / "mask_embedding.pt")
    with pytest.raises(CheckpointError, match="mask_embedding.pt"):
        load_dflash(path)


# -- against the target --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg_kw,message", [
    (dict(target_layer_ids=(1, TARGET_LAYERS)), "the target has 6 decoder layers"),
    (dict(target_layer_ids=(1, TARGET_LAYERS - 1)), "include the last layer 5"),
    (dict(hidden_size=32, head_dim=16, conv_group_size=16), "hidden states are 64 wide"),
    (dict(vocab_size=VOCAB + 4), "lm_head has 96 rows"),
])
def test_binding_checks_the_drafter_against_the_target(tmp_path, target, cfg_kw, message):
    kind = "dflash2" if "conv_group_size" in cfg_kw else "dflash"
    loaded = load_dflash(save_dflash(random_drafter(dflash_config(kind, **cfg_kw)), tmp_path / "d"))
    with pytest.raises(CheckpointError, match=message) as err:
        bind(loaded, target)
    assert str(tmp_path / "d" / "config.json") in str(err.value)


def test_binding_notes_another_target_depth(tmp_path, target):
    loaded = load_dflash(save_dflash(random_drafter(dflash_config(num_target_layers=36)), tmp_path / "d"))
    head, notes = bind(loaded, target)
    assert head.lm_head is target.output_embeddings and "num_target_layers = 36" in notes[0]


# -- the speculators layout ------------------------------------------------------------------------------------------

def _speculators_copy(drafter, target, path, used=None):
    """The same body in the speculators layout, with the target's tables as its own (lm_head rows `used` only)."""
    from eagle_eval.heads.io import vocab_map_from_used

    cfg = drafter.config
    spec_cfg = dflash_config(layout="speculators", draft_vocab_size=len(used) if used is not None else VOCAB)
    own = random_drafter(spec_cfg, own_lm_head=True, with_embedding=True)
    state = {**drafter.state_dict(), "embed_tokens.weight": target.input_embeddings.weight.detach(),
             "lm_head.weight": target.output_embeddings.weight.detach()[used if used is not None else slice(None)]}
    if used is not None:
        state["d2t"], state["t2d"] = vocab_map_from_used(used, VOCAB)
    own.load_state_dict({**own.state_dict(), **state})
    assert own.config.target_layer_ids == cfg.target_layer_ids
    return save_dflash(own, path)


def test_the_speculators_layout_drafts_what_the_zlab_layout_drafts(tmp_path, target):
    drafter = random_drafter(dflash_config())
    zlab = bind(load_dflash(save_dflash(drafter, tmp_path / "zlab")), target)[0]
    path = _speculators_copy(drafter, target, tmp_path / "spec")
    written = json.loads((path / "config.json").read_text())
    assert written["aux_hidden_state_layer_ids"] == [2, 4] and written["speculators_model_type"] == "dflash"
    loaded = load_dflash(path)
    assert not loaded.key_audit.unknown and not loaded.key_audit.engine_math
    spec = bind(loaded, target)[0]
    prompt = [1, 11, 22, 33, 44, 55, 66]
    assert _drafts(spec, target, prompt, 5) == _drafts(zlab, target, prompt, 5)


def test_a_reduced_draft_vocab_maps_through_d2t(tmp_path, target):
    """lm_head over 40 target ids: each draft is the best of those 40 under the target's lm_head, as a target id."""
    used = torch.sort(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:40]).values
    drafter = random_drafter(dflash_config())
    head = bind(load_dflash(_speculators_copy(drafter, target, tmp_path / "spec", used)), target)[0]
    zlab = bind(load_dflash(save_dflash(drafter, tmp_path / "zlab")), target)[0]
    prompt = [1, 9, 18, 27, 36, 45]
    drafts = _drafts(head, target, prompt, 1)
    assert set(drafts) <= set(used.tolist())

    class Restricted:                               # greedy over the 40 used ids of the full-vocab logits
        def propose(self, logits):
            return used[logits[:, used].argmax(-1)]
    state = BlockDraftState(zlab, zlab.embed, 0, GREEDY)
    from eagle_eval.models.capture import FeatureCapture
    with FeatureCapture(target.layers, zlab.config.aux_hf, zlab.device) as cap:
        logits = target.forward(torch.tensor([prompt]), None)
        aux = cap.pop()
    state.policy = Restricted()
    state.extend(aux, torch.tensor([prompt[1:] + [int(logits[0, -1].argmax())]]))
    assert drafts == state.propose_chain(1).tolist()


@pytest.mark.parametrize("flag,note", [(False, True), (True, False), (None, False)])
def test_speculators_causality_that_vllm_serves_otherwise_is_a_note(tmp_path, target, flag, note):
    """vLLM 0.32 `update_dflash` sets causal = not sliding_window_non_causal (absent: True) on EVERY layer, while
    speculators trains full-attention layers non-causal: the flag as speculators writes it by default (false)
    makes vLLM serve these all-full layers causal."""
    path = _speculators_copy(random_drafter(dflash_config()), target, tmp_path / "spec")
    _edit_config(path, sliding_window_non_causal=flag)
    loaded = load_dflash(path)
    assert loaded.config.causal == (False, False)
    assert [n for n in loaded.key_notes if "causal = [True, True] (update_dflash" in n] == (
        [loaded.key_notes[0]] if note else [])
    assert len(loaded.key_notes) == int(note)


def test_a_served_block_other_than_the_trained_one_is_a_note(tmp_path, target):
    path = _speculators_copy(random_drafter(dflash_config()), target, tmp_path / "spec")
    written = json.loads((path / "config.json").read_text())
    assert written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    written["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = 2
    (path / "config.json").write_text(json.dumps(written))
    assert any("speculative_tokens = 2, block_size = 4" in n for n in load_dflash(path).key_notes)


# -- checkpoints written by z-lab's own code ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zlab_classes():
    import importlib.util

    from scripts_by_path import load_script

    fetch = load_script("fetch_dflash")
    try:
        folder = fetch.ensure_dflash()
    except fetch.FetchError as exc:
        pytest.skip(f"z-lab dflash 0.1.0 not available: {exc}")
    spec = importlib.util.spec_from_file_location("zlab_dflash_model_io", folder / "dflash" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.dflash_ref
@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_a_checkpoint_saved_by_zlab_is_read_as_zlab_reads_it(tmp_path, target, zlab_classes, kind):
    """z-lab's save_pretrained writes the config (every Qwen3Config field) and the weights (DFlash2 codebooks with
    .weight); every key is consumed or harmless, every weight lands, and one block's final-norm rows equal z-lab's
    forward exactly."""
    from transformers import Qwen3Config

    extra = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 5} \
        if kind == "dflash2" else {}
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                      tie_word_embeddings=False, initializer_range=0.3)
    cfg.architectures = ["DFlash2DraftModel" if kind == "dflash2" else "DFlashDraftModel"]
    cfg.block_size, cfg.num_target_layers = 4, TARGET_LAYERS
    cfg.dflash_config = {"mask_token_id": MASK, "target_layer_ids": [1, 3], **extra}
    cls = zlab_classes.DFlash2DraftModel if kind == "dflash2" else zlab_classes.DFlashDraftModel
    torch.manual_seed(4)
    model = cls(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.copy_(1 + 0.2 * torch.randn_like(p))
    model.save_pretrained(tmp_path / "zlab")
    loaded = load_dflash(tmp_path / "zlab")
    assert not loaded.key_audit.unknown and not loaded.key_audit.engine_math, loaded.key_audit.as_dict()
    assert loaded.config.kind == kind and loaded.config.aux_hf == (2, 4)
    ours = loaded.drafter.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(ours[name.removesuffix(".weight") if "codebook" in name else name], tensor), name
    prompt = torch.tensor([[1, 13, 26, 39, 52, 65, 78]])
    with torch.no_grad():
        out = target.model(prompt, output_hidden_states=True)
        aux = torch.cat([out.hidden_states[i + 1] for i in (1, 3)], dim=-1)
        embeds = target.input_embeddings(torch.tensor([[int(out.logits[0, -1].argmax())] + [MASK] * 3]))
        s = prompt.shape[1]
        theirs = model(target_hidden=aux, noise_embedding=embeds, position_ids=torch.arange(s + 4)[None])
        mine = loaded.drafter.block(embeds, torch.tensor([s]), loaded.drafter.context_kv(aux, torch.arange(s)))
    assert torch.equal(mine, theirs)        # fp32, the same operations in the same order: bit for bit
