"""Reading and writing DFlash / DFlash2 checkpoints, z-lab and speculators layouts, strictly.

| layout | weights | target-owned | own |
|---|---|---|---|
| z-lab | `model.safetensors` (or an index of shards), no prefix | embedding, lm_head (z-lab `dflash_generate`; vLLM `_maybe_share_embeddings` / `_maybe_share_lm_head`; SGLang `DFlashWorker`) | the body; DFlash2's convolutions and selector |
| speculators | `model.safetensors` | the embedding only when `embed_tokens.weight` is absent (vLLM `DFlashQwen3ForCausalLM.load_weights`) | the body, `lm_head.weight` [V_d, H], `d2t` [V_d] when V_d < V, `t2d` [V] (optional), `embed_tokens.weight` [V, H] (optional) |

Contract: `load_dflash(path)` audits every config.json key (dflash/keys.py), builds the `DFlashConfig`, maps every
tensor through `key_map` (checkpoint key -> drafter parameter: the same names, except DFlash2's codebooks, which
z-lab publishes without `.weight` and z-lab's own save_pretrained writes with it: either form, not both), and
refuses a missing, unexpected, mis-shaped or mis-typed tensor with a `CheckpointError` naming the file, the key and
both shapes. Nothing in the folder is imported or run (`auto_map` is read as a harmless key); a
`mask_embedding.pt` (vLLM reads it, z-lab does not) is refused. `save_dflash` writes either layout (tests build
checkpoints with it; z-lab's PyPI `DFlashDraftModel.from_pretrained` reads what it writes in the z-lab layout).
Shapes against a target are checked when the drafter is bound (dflash/bind.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.models.files import check_safetensors, read_json_file, said_by
from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.dflash.config import DFLASH2, SPECULATORS, ZLAB, DFlashConfig
from eagle_eval.heads.dflash.layouts import config_json, detect_layout, dflash_config_from_json
from eagle_eval.heads.dflash.keys import audit_dflash_keys
from eagle_eval.heads.dflash.model import DFlashDrafter
from eagle_eval.heads.io import _check_d2t_range, check_dtype, t2d_from_d2t
from eagle_eval.heads.eagle3.keys import KeyAudit, check_keys

CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")
# what a model id's snapshot brings (models/hub.py): no code (auto_map is never run), mask_embedding.pt so that it is
# refused rather than missed
DFLASH_FILES = ("*.json", "*.safetensors", "mask_embedding.pt")
_OPTIONAL = ("d2t", "t2d", "embed_tokens.weight")        # d2t: required by _vocab_map when V_d < V


@dataclass(frozen=True)
class LoadedDFlash:
    drafter: DFlashDrafter
    config: DFlashConfig
    path: str
    config_file: str
    weights_files: tuple[str, ...]
    key_audit: KeyAudit
    key_notes: tuple[str, ...] = ()

    # what the oracle reads of any loaded head (heads/io.py LoadedHead's names): the module it moves to the target's
    # device and dtype, the head kind's registry name, the layout, the weights
    kind = "dflash"

    @property
    def head(self) -> DFlashDrafter:
        return self.drafter

    @property
    def dialect(self) -> str:
        return self.config.layout

    @property
    def weights_file(self) -> str:
        return ", ".join(self.weights_files)


def _read_config(path: Path) -> tuple[Path, dict]:
    config_file = path / "config.json"
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder; a DFlash draft is a folder (config.json and model.safetensors)")
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing (a DFlash draft folder needs config.json)")
    return config_file, read_json_file(config_file, CheckpointError, "the draft's config (a JSON object)")


def weights_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards a model.safetensors.index.json names (in its order, each once)."""
    single, index = path / "model.safetensors", path / "model.safetensors.index.json"
    if (path / "mask_embedding.pt").exists():
        raise CheckpointError(f"{path / 'mask_embedding.pt'}: a separate mask embedding (vLLM "
                              "DFlashQwen3ForCausalLM._read_mask_embedding reads it, z-lab does not): not supported")
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = read_json_file(index, CheckpointError).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: key 'weight_map' missing or empty")
        return [path / f for f in dict.fromkeys(weight_map.values())]
    raise CheckpointError(f"{path}: no weights: expected model.safetensors or model.safetensors.index.json")


def read_tensors(files: list[Path]) -> dict[str, tuple[torch.Tensor, Path]]:
    """key -> (tensor, the file holding it); a key in two shards is an error."""
    from safetensors.torch import load_file

    out: dict[str, tuple[torch.Tensor, Path]] = {}
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{file}: named by the shard index but missing")
        check_safetensors(file, CheckpointError)
        try:
            tensors = load_file(str(file))
        except Exception as exc:  # safetensors' own errors, re-said naming the file
            raise said_by(f"{file}: cannot be read as safetensors", exc, CheckpointError) from exc
        for key, t in tensors.items():
            if key in out:
                raise CheckpointError(f"{file}: tensor {key!r} is also in {out[key][1]}")
            out[key] = (t, file)
    return out


def key_map(drafter: DFlashDrafter, stored: set[str]) -> dict[str, str]:
    """Drafter parameter name -> checkpoint key: the same name, except a DFlash2 codebook, stored as published
    (bare) or as z-lab's save_pretrained writes it (`.weight`)."""
    names = {n: n for n in drafter.state_dict()}
    for n in CODEBOOKS:
        if n in names and n not in stored and n + ".weight" in stored:
            names[n] = n + ".weight"
    return names


def _match(drafter: DFlashDrafter, tensors: dict, config_file: Path) -> dict[str, torch.Tensor]:
    """Parameter name -> tensor, strictly: each expected tensor present (bar the optional ones) with its shape and a
    dtype it may have, no tensor left over."""
    expected = drafter.state_dict()
    names = key_map(drafter, set(tensors))
    state = {}
    for name, ref in expected.items():
        key = names[name]
        if key not in tensors:
            if name in _OPTIONAL:
                continue
            raise CheckpointError(f"{config_file.parent}: missing tensor {key!r} (expected shape {list(ref.shape)}, "
                                  f"from {config_file.name})")
        t, file = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(f"{file}: tensor {key!r} has shape {list(t.shape)}, expected {list(ref.shape)} "
                                  f"(from {config_file.name})")
        check_dtype(name, key, t, file)
        state[name] = t
    left = sorted(set(tensors) - {names[n] for n in state})
    if left:
        raise CheckpointError(f"{tensors[left[0]][1]}: unexpected tensor(s) {left[:5]} for a "
                              f"{drafter.config.kind} draft in the {drafter.config.layout} layout"
                              + _unexpected_hint(left, drafter.config))
    return state


def _unexpected_hint(keys: list[str], cfg: DFlashConfig) -> str:
    if cfg.layout == ZLAB and any(k in ("embed_tokens.weight", "lm_head.weight") for k in keys):
        return " (the z-lab layout reads the target's embedding and lm_head; an own lm_head is the speculators layout)"
    if cfg.kind != DFLASH2 and any("conv" in k or k.startswith("candidate_selector.") for k in keys):
        return " (DFlash2 tensors: architectures should be ['DFlash2DraftModel'])"
    return ""


def load_dflash(path: str | Path, allow_unknown_keys: bool = False, revision: str | None = None) -> LoadedDFlash:
    """Read a DFlash / DFlash2 draft folder, or a model id from the HF cache (models/hub.py; `revision`), strictly
    (module docstring). Config keys that change the drafts in an engine but not here are an error unless
    `allow_unknown_keys`."""
    from eagle_eval.models.hub import model_folder

    path = model_folder(path, revision, "--draft", DFLASH_FILES)
    config_file, config = _read_config(path)
    layout, _ = detect_layout(config, config_file)
    audit = audit_dflash_keys(config, layout)
    notes = check_keys(audit, config_file, allow_unknown_keys)
    cfg, cfg_notes = dflash_config_from_json(config, config_file)
    files = weights_files(path)
    tensors = read_tensors(files)
    own = cfg.layout == SPECULATORS
    drafter = DFlashDrafter(cfg, own_lm_head=own, with_embedding=own and "embed_tokens.weight" in tensors)
    state = _match(drafter, tensors, config_file)
    if own:
        _vocab_map(cfg, state, config_file)
    drafter.load_state_dict({**drafter.state_dict(), **{k: v.to(drafter.state_dict()[k].dtype)
                                                         for k, v in state.items()}}, strict=True)
    return LoadedDFlash(drafter=drafter.eval(), config=cfg, path=str(path), config_file=str(config_file),
                        weights_files=tuple(str(f) for f in files), key_audit=audit,
                        key_notes=tuple(notes + cfg_notes))


def _vocab_map(cfg: DFlashConfig, state: dict, config_file: Path) -> None:
    """speculators: d2t needed when V_d < V (target id = draft id + d2t), t2d derived when absent."""
    if cfg.draft_vocab_size < cfg.vocab_size and "d2t" not in state:
        raise CheckpointError(f"{config_file.parent}: missing tensor 'd2t' but draft_vocab_size={cfg.draft_vocab_size} "
                              f"< vocab_size={cfg.vocab_size}: draft ids cannot be mapped to target ids")
    if "d2t" not in state:
        state["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
    _check_d2t_range(state["d2t"], cfg.vocab_size, config_file.parent / "model.safetensors")
    if "t2d" not in state:
        state["t2d"] = t2d_from_d2t(state["d2t"].long(), cfg.vocab_size)


def save_dflash(drafter: DFlashDrafter, path: str | Path, layout: str | None = None) -> Path:
    """Write `drafter` as config.json + model.safetensors in `layout` (default: its config's). The z-lab layout
    writes no embedding or lm_head (the target's are read); the speculators layout needs the drafter's own
    lm_head (DFlashDrafter(own_lm_head=True))."""
    from safetensors.torch import save_file

    cfg = drafter.config
    layout = layout or cfg.layout
    if layout == SPECULATORS and drafter.lm_head is None:
        raise ValueError("the speculators layout stores its own lm_head: build the drafter with own_lm_head=True")
    if layout == ZLAB and (drafter.lm_head is not None or drafter.embed_tokens is not None):
        raise ValueError("the z-lab layout stores no embedding or lm_head: the target's are read")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config_json(cfg, layout), indent=2) + "\n")
    tensors = {k: v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}
    if layout == SPECULATORS and cfg.draft_vocab_size == cfg.vocab_size:
        tensors = {k: v for k, v in tensors.items() if k not in ("d2t", "t2d")}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    return path
