"""Reading and writing EAGLE-3 draft checkpoints in the three layouts found in the field.

| dialect     | config.json `architectures`          | weights                               | layer prefix |
|-------------|--------------------------------------|---------------------------------------|--------------|
| specforge   | `LlamaForCausalLMEagle3` (SGLang)    | model.safetensors                     | `midlayer.`  |
| eagle       | `LlamaForCausalLM` (EAGLE official)  | pytorch_model.bin, else safetensors   | `midlayer.`  |
| speculators | `Eagle3Speculator`                   | model.safetensors                     | `layers.0.`  |
| mla         | `Eagle3DeepseekV2ForCausalLM` (MLA)  | model.safetensors                     | either, one  |

The mla dialect is the MLA head kind (heads/mla/layer.py, heads/mla/config.py): vLLM
(`deepseek_eagle3.py` `DeepseekV2Eagle3Model.hf_to_vllm_mapper`) renames `midlayer.` to `layers.0.`,
SGLang (`kimi_k25_eagle3.py` `load_weights`) the other way, so a checkpoint may use either prefix,
but only one.

Each dialect maps checkpoint keys to `Eagle3Head` parameter names through one visible table; loading
is strict: a missing, unexpected or mis-shaped tensor is a `CheckpointError` naming the file, the key
and both shapes (and, for a variant's tensor, the config flag that asks for it or its absence).
Every config.json key is audited first (heads/eagle3/keys.py). `.bin` pickles load with `weights_only=True`.
Each tensor's stored dtype is checked against what it may be (`check_dtype`): weights floating point
(fp16, bf16, fp32, fp64), `d2t` an integer type, `t2d` bool; an integer-typed weight would otherwise be
cast to float in silence and give an accept length near 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.models.files import check_safetensors, read_json_file, said_by
from eagle_eval.heads.eagle3.config import (  # noqa: F401  (CheckpointError, head_config_from_json re-exported)
    EAGLE,
    MASK_HIDDEN_REFUSAL,
    MASK_TOKEN_REFUSAL,
    MLA,
    PEAGLE,
    SPECFORGE,
    SPECULATORS,
    CheckpointError,
    config_section,
    head_config_from_json,
    model_type_note,
    read_key,
)
from eagle_eval.heads.eagle3.keys import KeyAudit, audit_keys, check_keys
from eagle_eval.heads.eagle3.layer import Eagle3Head, HeadConfig
from eagle_eval.heads.mla.config import MLA_ARCHITECTURES, mla_config_from_json, mla_config_json
from eagle_eval.heads.mla.layer import build_head

DIALECTS = (SPECFORGE, EAGLE, SPECULATORS, MLA)
_LAYER_PREFIX = {SPECFORGE: "midlayer.", EAGLE: "midlayer.", SPECULATORS: "layers.0.", MLA: "layers.0."}
_OPTIONAL = ("fc.bias", "embed_tokens.weight", "d2t", "t2d")
# dtypes a head tensor may be stored in: weights are cast to the run's dtype on load, so any float works;
# float8 needs scales this loader does not read (a quantized head is not supported)
FLOAT_WEIGHTS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
# tensors of a variant -> the config flag that asks for them (for the strict-loading messages)
_VARIANT_TENSORS = {"input_norm.": "norm_before_fc", "fc_norm.": "fc_norm"}


@dataclass(frozen=True)
class LoadedHead:
    head: Eagle3Head
    kind: str                         # the head kind's registry name (heads/kind.py)
    dialect: str
    path: str
    weights_file: str
    own_embedding: bool               # the checkpoint carries `embed_tokens.weight`
    aux_ids_sglang: tuple | None      # nested eagle_config.eagle_aux_hidden_state_layer_ids
    aux_ids_vllm: tuple | None        # top-level eagle_aux_hidden_state_layer_ids
    d2t_in_checkpoint: bool
    key_audit: KeyAudit | None = None  # every config.json key: consumed / harmless / engine math / unknown
    key_notes: tuple = ()              # warnings from the audit (unknown keys, allowed engine-math keys)


def eagle3_dialect(config: dict) -> str | None:
    """The EAGLE-3 family's dialect of a config.json (the Llama-style and MLA kinds share these layouts), or None."""
    archs = config.get("architectures") or []
    archs = archs if isinstance(archs, list) else []
    if any(a in MLA_ARCHITECTURES for a in archs):
        return MLA
    if any(a in ("Eagle3Speculator", "PEagleSpeculator") for a in archs) or \
            config.get("speculators_model_type") in ("eagle3", PEAGLE) or (
            "speculators_config" in config and "speculators_model_type" not in config):
        return SPECULATORS
    if any(isinstance(a, str) and a.endswith("Eagle3") for a in archs):
        return SPECFORGE
    if any(isinstance(a, str) and a.endswith("ForCausalLM") for a in archs):
        return EAGLE
    return None


def detect_dialect(config: dict, config_file: Path) -> str:
    """The dialect of a head's config.json, whatever its kind (heads/kind.py `kind_of`)."""
    from eagle_eval.heads.kind import kind_of

    read_key(config, "architectures", config_file, "names", [])
    return kind_of(config, config_file)[1]


def _weights_file(path: Path, dialect: str) -> Path:
    order = (["pytorch_model.bin", "model.safetensors"] if dialect == EAGLE
             else ["model.safetensors", "pytorch_model.bin"])
    for name in order:
        if (path / name).is_file():
            return path / name
    raise CheckpointError(f"{path}: no weights file; expected one of {order}")


def _read_tensors(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file
        check_safetensors(file, CheckpointError)
        try:
            return load_file(str(file))
        except Exception as exc:  # safetensors' own errors: re-said naming the file
            raise said_by(f"{file}: cannot be read as safetensors", exc, CheckpointError) from exc
    try:
        return torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # a pickle that is not plain tensors
        raise CheckpointError(f"{file}: cannot be read with weights_only=True ({exc})") from exc


def key_map(dialect: str, names, prefix: str | None = None) -> dict[str, str]:
    """Head parameter name -> checkpoint key, for the given dialect (`prefix` overrides its layer prefix). The layers
    above the first of a multi-layer head (`later.{j}.`) are `layers.{j+1}.` in every layout (vLLM llama_eagle3.py
    `LlamaModel.hf_to_vllm_mapper` renames only `midlayer.` to `layers.0.`; speculators names them `layers.{i}`)."""
    prefix = prefix or _LAYER_PREFIX[dialect]
    return {n: prefix + n[len("midlayer."):] if n.startswith("midlayer.") else _later_key(n) for n in names}


def _later_key(name: str) -> str:
    if not name.startswith("later."):
        return name
    j, rest = name[len("later."):].split(".", 1)
    return f"layers.{int(j) + 1}.{rest}"


def _read_config(path: Path) -> tuple[Path, dict]:
    config_file = path / "config.json"
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path}: is a file; the draft head is a folder (config.json and weights)")
    if not path.is_dir():
        raise CheckpointError(f"{path}: draft checkpoint folder does not exist (nor a Hugging Face model id: "
                              "org/name)")
    if not config_file.is_file():
        raise CheckpointError(f"{config_file}: missing (an EAGLE-3 head folder needs config.json)")
    return config_file, read_json_file(config_file, CheckpointError, "the head's config (a JSON object)")


def _flag_hint(key: str, cfg: HeadConfig) -> str:
    """For a variant's tensor: the config flag behind it and its value, else ''."""
    for prefix, flag in _VARIANT_TENSORS.items():
        if key.startswith(prefix):
            on = getattr(cfg, flag)
            return (f" (config.json sets {flag}: true, which needs it)" if on else
                    f" (config.json has no {flag}: true; with the flag the engines would apply this norm)")
    return ""


def _layer_prefix(dialect: str, tensors: dict, file: Path, depth: int = 1) -> str:
    """The first decoder layer's key prefix: fixed per dialect for a one-layer head, read from the tensors for mla
    and for a multi-layer head (either, not both: vLLM renames `midlayer.` to `layers.0.`)."""
    if dialect != MLA and depth == 1:
        return _LAYER_PREFIX[dialect]
    used = sorted({p for p in ("midlayer.", "layers.0.") if any(k.startswith(p) for k in tensors)})
    if len(used) > 1:
        raise CheckpointError(f"{file}: tensors named both 'midlayer.*' and 'layers.0.*': the decoder layer must "
                              "use one prefix (vLLM and SGLang rename one into the other)")
    return used[0] if used else _LAYER_PREFIX[dialect]


def _match_tensors(head: Eagle3Head, tensors: dict, dialect: str, file: Path, config_file: Path) -> dict:
    """Head parameter name -> checkpoint tensor, strictly: every expected tensor present (bar the optional
    ones) with its shape, no tensor left over."""
    expected = head.state_dict()
    depth = getattr(head, "depth", 1)
    names = key_map(dialect, expected, _layer_prefix(dialect, tensors, file, depth))
    state = {}
    for name, ref in expected.items():
        key = names[name]
        if key not in tensors:
            if name in _OPTIONAL:
                continue
            layer = (f" (config.json num_hidden_layers = {depth}: layers 0..{depth - 1} each need their tensors)"
                     if depth > 1 and (name.startswith("later.") or name.startswith("midlayer.")) else "")
            raise CheckpointError(f"{file}: missing tensor {key!r} (expected shape {list(ref.shape)})"
                                  + _flag_hint(name, head.config) + layer)
        t = tensors[key]
        if tuple(t.shape) != tuple(ref.shape):
            raise CheckpointError(
                f"{file}: tensor {key!r} has shape {list(t.shape)}, expected {list(ref.shape)} "
                f"(from {config_file.name})")
        check_dtype(name, key, t, file)
        state[name] = t
    unexpected = sorted(set(tensors) - {names[n] for n in state})
    if unexpected:
        hints = "".join(_flag_hint(k, head.config) for k in unexpected[:1])
        raise CheckpointError(f"{file}: unexpected tensor(s) {unexpected[:5]} for dialect {dialect!r}{hints}")
    return state


def check_dtype(name: str, key: str, t: torch.Tensor, file: Path) -> None:
    """A head tensor's stored dtype against what it may be: d2t [V_d] an integer type (the offsets
    target_id - draft_id), t2d [V] bool (SpecForge, EAGLE and speculators register both so), every other
    tensor a floating weight (FLOAT_WEIGHTS)."""
    got = str(t.dtype).replace("torch.", "")
    if name == "d2t":
        ok, want = not t.dtype.is_floating_point and not t.dtype.is_complex and t.dtype != torch.bool, \
            "an integer type (int64 in SpecForge/EAGLE/speculators)"
    elif name == "t2d":
        ok, want = t.dtype == torch.bool, "bool"
    else:
        ok, want = t.dtype in FLOAT_WEIGHTS, "a floating-point weight (fp16, bf16, fp32 or fp64)"
        if t.dtype.is_floating_point and not ok:
            want += "; a quantized head (float8 without scales) is not supported"
    if not ok:
        raise CheckpointError(f"{file}: tensor {key!r} is stored as {got}, expected {want}")


def _build_head(config: dict, dialect: str, config_file: Path, tensors: dict, file: Path | None = None) -> Eagle3Head:
    try:
        cfg = (mla_config_from_json(config, config_file) if dialect == MLA
               else head_config_from_json(config, dialect, config_file))
    except (TypeError, ZeroDivisionError, AttributeError) as exc:   # e.g. a size given as a string
        raise said_by(f"{config_file}: a size or setting has the wrong type", exc, CheckpointError) from exc
    if "fc.bias" in tensors:
        cfg = HeadConfig(**{**cfg.__dict__, "fc_bias": True})
    if dialect != MLA:
        cfg = _parallel_drafting(cfg, tensors, config_file, file)
    try:
        return build_head(cfg, with_embedding="embed_tokens.weight" in tensors)
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as exc:
        raise said_by(f"{config_file}: a size or setting has the wrong type or value", exc, CheckpointError) from exc


def _parallel_drafting(cfg: HeadConfig, tensors: dict, config_file: Path, file: Path | None) -> HeadConfig:
    """P-EAGLE, as vLLM reads it: a speculators 'peagle' config, or an EAGLE-3 checkpoint whose weights hold
    `mask_hidden` (served with parallel_drafting: true), drafts K slots in one forward. Either needs both the mask
    token id and the tensor (each refused with vLLM's reason); `mask_hidden` must hold k*H_t values in a row
    ([k*H_t], [1, k*H_t] or speculators' [1, 1, k*H_t]: vLLM reads it as view(1, -1)) and is kept as [1, k*H_t]."""
    width = cfg.num_aux * cfg.target_hidden_size
    t = tensors.get("mask_hidden")
    if "mask_hidden" not in tensors:
        if cfg.parallel_drafting:
            raise CheckpointError(f"{config_file}: speculators_model_type 'peagle' but the weights hold no tensor "
                                  f"'mask_hidden' (expected [1, {width}]): {MASK_HIDDEN_REFUSAL}")
        return cfg
    if cfg.mask_token_id is None:
        raise CheckpointError(f"{file}: holds tensor 'mask_hidden' (a P-EAGLE head, drafted in parallel) but "
                              f"{config_file.name} names no mask token id: {MASK_TOKEN_REFUSAL}")
    if t is None:                                           # names only (plan's head on the meta device)
        return HeadConfig(**{**cfg.__dict__, "parallel_drafting": True})
    shape = list(t.shape)
    if t.dim() == 0 or t.shape[-1] != width or any(n != 1 for n in shape[:-1]):
        raise CheckpointError(f"{file}: tensor 'mask_hidden' has shape {shape}, expected [1, {width}] "
                              f"(num_aux {cfg.num_aux} x target_hidden_size {cfg.target_hidden_size}: the aux "
                              "features it stands in for, fed through fc like them)")
    tensors["mask_hidden"] = t.reshape(1, width)
    return HeadConfig(**{**cfg.__dict__, "parallel_drafting": True})


def load_head(path: str | Path, allow_unknown_keys: bool = False, revision: str | None = None,
              target=None) -> LoadedHead:
    """Read a draft head checkpoint folder (any kind, any dialect: heads/kind.py), or a model id from the HF cache
    (models/hub.py; `revision`), strictly. Config keys that change the math in an engine but not here are an error
    unless `allow_unknown_keys` (heads/eagle3/keys.py). `target`: the loaded target (models/target.py), for a kind
    whose draft is read from the target's own checkpoint (`HeadKind.keyword`, e.g. `--draft mtp`)."""
    from eagle_eval.heads.kind import kind_of, keyword_kind

    by_keyword = keyword_kind(str(path))
    if by_keyword is not None:
        return by_keyword.load_from_target(target, allow_unknown_keys)
    from eagle_eval.models.hub import HEAD_FILES, model_folder

    path = model_folder(path, revision, "--draft", HEAD_FILES)
    config_file, config = _read_config(path)
    read_key(config, "architectures", config_file, "names", [])
    kind, dialect = kind_of(config, config_file)
    return kind.load(path, config_file, config, dialect, allow_unknown_keys)


def load_eagle3(path: Path, config_file: Path, config: dict, dialect: str, allow_unknown_keys: bool) -> LoadedHead:
    """The EAGLE-3 family's loader (the Llama-style and MLA kinds): strict keys, strict tensors, the vocab map."""
    audit = audit_keys(config, dialect)
    notes = check_keys(audit, config_file, allow_unknown_keys) + model_type_note(config, dialect, config_file)
    file = _weights_file(path, dialect)
    tensors = _read_tensors(file)
    head = _build_head(config, dialect, config_file, tensors, file)
    cfg = head.config
    state = _match_tensors(head, tensors, dialect, file, config_file)
    has_d2t = "d2t" in state
    if has_d2t:
        _check_d2t_range(state["d2t"], cfg.vocab_size, file)
    if cfg.draft_vocab_size < cfg.vocab_size and not has_d2t:
        raise CheckpointError(
            f"{file}: missing tensor 'd2t' but draft_vocab_size={cfg.draft_vocab_size} < "
            f"vocab_size={cfg.vocab_size}: draft ids cannot be mapped to target ids")
    if has_d2t and "t2d" not in state:
        state["t2d"] = t2d_from_d2t(state["d2t"], cfg.vocab_size)
    head.load_state_dict({**head.state_dict(), **{k: v.to(head.state_dict()[k].dtype)
                                                   for k, v in state.items()}}, strict=True)
    sglang_ids, vllm_ids = aux_ids(config, config_file)
    return LoadedHead(head=head.eval(), kind=cfg.kind, dialect=dialect, path=str(path), weights_file=str(file),
                      own_embedding=head.embed_tokens is not None,
                      aux_ids_sglang=tuple(sglang_ids) if sglang_ids is not None else None,
                      aux_ids_vllm=tuple(vllm_ids) if vllm_ids is not None else None,
                      d2t_in_checkpoint=has_d2t, key_audit=audit, key_notes=tuple(notes))


def aux_ids(config: dict, config_file: Path) -> tuple[list | None, list | None]:
    """(nested eagle_config.eagle_aux_hidden_state_layer_ids, top-level eagle_aux_hidden_state_layer_ids),
    each a list of integers or None: `true` is not layer 1, "3" not layer 3."""
    nested = read_key(config_section(config, "eagle_config", config_file), "eagle_aux_hidden_state_layer_ids",
                      config_file, "ids", None, "eagle_config.")
    return nested, read_key(config, "eagle_aux_hidden_state_layer_ids", config_file, "ids", None)


def _check_d2t_range(d2t: torch.Tensor, vocab_size: int, file: Path) -> None:
    """Every draft id must map to a target id in 0..vocab_size-1 (docs/eagle3.md section 2)."""
    target_ids = torch.arange(d2t.numel()) + d2t.long()
    bad = ((target_ids < 0) | (target_ids >= vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise CheckpointError(f"{file}: tensor 'd2t' maps draft id {i} to target id {int(target_ids[i])} (and "
                              f"{bad.numel() - 1} more out of range): target ids are 0..{vocab_size - 1}")


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """t2d [V] bool: True for target ids reachable from the draft vocab (docs/eagle3.md section 2)."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[torch.arange(d2t.numel()) + d2t] = True
    return t2d


def vocab_map_from_used(used: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [V_d], t2d [V]) from the sorted target ids of the draft vocabulary."""
    used = torch.sort(used).values
    d2t = used - torch.arange(used.numel())
    return d2t.long(), t2d_from_d2t(d2t, vocab_size)


def save_head(head: Eagle3Head, path: str | Path, aux_layer_ids_sglang=None,
              dialect: str = SPECFORGE, both_id_keys: bool = False) -> None:
    """Write `head` in one of the four layouts (config.json + weights; an MLA head only as 'mla'). A P-EAGLE head
    (parallel_drafting) writes `mask_token_id` and `mask_hidden`, in the speculators layout as type 'peagle'.

    both_id_keys (SpecForge layout): also write the top-level vLLM-style ids (= nested + 1), so that
    SGLang and both vLLM model runners tap the same tensors (capture.engine_taps).
    """
    from safetensors.torch import save_file

    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {DIALECTS}, got {dialect!r}")
    cfg = head.config
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    layer = {
        "hidden_size": cfg.hidden_size, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling, "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_act": cfg.hidden_act, "num_hidden_layers": cfg.num_hidden_layers, "model_type": "llama",
        "attention_bias": cfg.attention_bias, "mlp_bias": cfg.mlp_bias,
        **({"rope_is_neox_style": False} if cfg.rope_interleaved else {}),
    }
    top = {"draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
           **{f: True for f in ("norm_before_fc", "fc_norm", "norm_output", "norm_before_residual") if getattr(cfg, f)},
           **({"mask_token_id": cfg.mask_token_id} if cfg.parallel_drafting else {})}
    ids = list(aux_layer_ids_sglang) if aux_layer_ids_sglang is not None else None
    if (dialect == MLA) != (cfg.mla is not None):
        raise ValueError(f"an MLA head is written in the 'mla' layout and only there (dialect {dialect!r}, "
                         f"head kind {cfg.kind!r})")
    if dialect == MLA:
        config = {**mla_config_json(cfg), "eagle_config": {
            "use_aux_hidden_state": cfg.num_aux > 1, **({"eagle_aux_hidden_state_layer_ids": ids} if ids else {})}}
        if ids and both_id_keys:
            config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]
    elif dialect == SPECULATORS:
        algorithm = PEAGLE if cfg.parallel_drafting else "eagle3"
        config = {"architectures": ["PEagleSpeculator" if cfg.parallel_drafting else "Eagle3Speculator"],
                  "speculators_model_type": algorithm, "transformer_layer_config": layer, **top,
                  "norm_before_residual": cfg.norm_before_residual,
                  "speculators_config": {"algorithm": algorithm}}
        if ids is not None:      # speculators/vLLM read ids as input-of-layer = HF index
            config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]
    else:
        arch = "LlamaForCausalLMEagle3" if dialect == SPECFORGE else "LlamaForCausalLM"
        config = {"architectures": [arch], **layer, **top}
        if dialect == SPECFORGE:
            config["eagle_config"] = {"use_aux_hidden_state": cfg.num_aux > 1,
                                      **({"eagle_aux_hidden_state_layer_ids": ids} if ids else {})}
            if ids and both_id_keys:
                config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    names = key_map(dialect, head.state_dict())
    tensors = {names[k]: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}
    if dialect == EAGLE:
        torch.save(tensors, path / "pytorch_model.bin")
    else:
        save_file(tensors, str(path / "model.safetensors"))
