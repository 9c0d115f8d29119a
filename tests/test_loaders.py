"""Draft-head checkpoints: each layout loads to the same head; each malformed case is a clear error."""

import json

import pytest
import torch
from fixtures import make_head
from safetensors.torch import load_file, save_file

from eagle_eval.heads.io import CheckpointError, load_head


@pytest.mark.parametrize("dialect", ["specforge", "eagle", "speculators"])
def test_each_layout_round_trips(tmp_path, dialect):
    ref = load_head(make_head(tmp_path / "ref", draft_vocab=40, aux_ids_sglang=[1, 3, 5]))
    path = make_head(tmp_path / dialect, dialect=dialect, draft_vocab=40, aux_ids_sglang=[1, 3, 5])
    loaded = load_head(path)
    assert loaded.dialect == dialect
    for (k, a), (_, b) in zip(ref.head.state_dict().items(), loaded.head.state_dict().items()):
        assert torch.equal(a, b), k
    if dialect == "specforge":
        assert loaded.aux_ids_sglang == (1, 3, 5)
    if dialect == "speculators":
        assert loaded.aux_ids_vllm == (2, 4, 6)      # input-of-layer ids of the same tensors
        assert "layers.0.self_attn.q_proj.weight" in load_file(path / "model.safetensors")
    if dialect == "eagle":
        assert (path / "pytorch_model.bin").is_file()


def test_speculators_dialect_flags(tmp_path):
    path = make_head(tmp_path / "s", dialect="speculators", norm_before_residual=True, fc_bias=True)
    loaded = load_head(path)
    assert loaded.head.config.norm_before_residual and loaded.head.fc.bias is not None
    cfg = json.loads((path / "config.json").read_text())
    cfg["norm_before_fc"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing tensor 'input_norm\.weight'.*sets norm_before_fc: true"):
        load_head(path)          # the flag asks for a norm the checkpoint lacks (test_head_variants.py: the rest)


def test_norm_before_residual_changes_the_math(tmp_path):
    a = load_head(make_head(tmp_path / "a", dialect="speculators")).head
    b = load_head(make_head(tmp_path / "b", dialect="speculators", norm_before_residual=True)).head
    x, g = torch.randn(1, 3, 48), torch.randn(1, 3, 48) * 5
    ua, ra = a.attention_input(x, g)
    ub, rb = b.attention_input(x, g)
    assert torch.equal(ua, ub) and torch.equal(ra, g) and torch.equal(rb, b.midlayer.hidden_norm(g))


def _rewrite(path, fn):
    tensors = load_file(path / "model.safetensors")
    fn(tensors)
    save_file(tensors, str(path / "model.safetensors"))


def test_missing_tensor(tmp_path):
    path = make_head(tmp_path / "h")
    _rewrite(path, lambda t: t.pop("midlayer.self_attn.k_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensor 'midlayer\.self_attn\.k_proj\.weight'"):
        load_head(path)


def test_missing_lm_head(tmp_path):
    path = make_head(tmp_path / "h")
    _rewrite(path, lambda t: t.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="'lm_head.weight'"):
        load_head(path)


def test_unexpected_tensor(tmp_path):
    path = make_head(tmp_path / "h")
    _rewrite(path, lambda t: t.update({"midlayer.extra.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match="unexpected tensor.*midlayer.extra.weight"):
        load_head(path)


def test_misshaped_tensor_names_both_shapes(tmp_path):
    path = make_head(tmp_path / "h")
    _rewrite(path, lambda t: t.update({"fc.weight": torch.zeros(48, 100)}))
    with pytest.raises(CheckpointError, match=r"'fc\.weight' has shape \[48, 100\], expected \[48, 144\]"):
        load_head(path)


def test_reduced_vocab_without_d2t_is_refused(tmp_path):
    path = make_head(tmp_path / "h", draft_vocab=40)
    _rewrite(path, lambda t: (t.pop("d2t"), t.pop("t2d")))
    with pytest.raises(CheckpointError, match="missing tensor 'd2t'.*draft_vocab_size=40 < vocab_size=96"):
        load_head(path)


def test_full_vocab_without_d2t_is_fine(tmp_path):
    path = make_head(tmp_path / "h")
    _rewrite(path, lambda t: (t.pop("d2t"), t.pop("t2d")))
    assert not load_head(path).d2t_in_checkpoint


def test_t2d_is_derived_from_d2t(tmp_path):
    path = make_head(tmp_path / "h", draft_vocab=40)
    t2d = load_file(path / "model.safetensors")["t2d"]
    _rewrite(path, lambda t: t.pop("t2d"))
    assert torch.equal(load_head(path).head.t2d, t2d)


@pytest.mark.parametrize("edit, match", [
    (lambda c: c.pop("hidden_size"), "missing key 'hidden_size'"),
    (lambda c: c.update(architectures=["BertModel"]), "key 'architectures'"),
])
def test_bad_config(tmp_path, edit, match):
    path = make_head(tmp_path / "h")
    cfg = json.loads((path / "config.json").read_text())
    edit(cfg)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match) as err:
        load_head(path)
    assert "config.json" in str(err.value)


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_head(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_head(tmp_path / "empty")
    path = make_head(tmp_path / "h")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights file"):
        load_head(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_head(path)


class _NotATensor:
    pass


def test_bin_pickle_loads_weights_only(tmp_path):
    path = make_head(tmp_path / "h", dialect="eagle")
    state = torch.load(path / "pytorch_model.bin", weights_only=True)
    state["evil"] = _NotATensor()
    torch.save(state, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_head(path)
