"""The kind record of the block drafters (`registry.HEAD_KINDS["dflash"]`): DFlash and DFlash2 checkpoints in the
z-lab layout (`architectures` DFlashDraftModel / DFlash2DraftModel) and the speculators layout
(`speculators_model_type: dflash`), read strictly (dflash/io.py); its default taps are the config's
target_layer_ids l as HF indices l + 1; its draft KV is the context K/V of every draft layer (the block's own K/V
are never kept); its wiring (dflash/wire.py) hands the loop `BlockDraftState`."""

from __future__ import annotations

from eagle_eval.heads.dflash.config import ARCHITECTURES, DFLASH, SPECULATORS, SPECULATORS_ARCHITECTURES, ZLAB
from eagle_eval.heads.kind import HeadKind

# the loader asks every kind whether a checkpoint is its own (heads/kind.py kind_of), so this record stays light:
# the drafter's modules (torch) are imported when a DFlash checkpoint is loaded or wired


def detect(config: dict) -> str | None:
    """The layout of a DFlash config.json (z-lab or speculators), or None; never raises (dflash/layouts.py
    `detect_layout` refuses what is half one)."""
    archs = config.get("architectures")
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    if config.get("speculators_model_type") == DFLASH or any(a in SPECULATORS_ARCHITECTURES for a in archs):
        return SPECULATORS
    return ZLAB if any(a in ARCHITECTURES for a in archs) else None


def load(folder, config_file, config: dict, dialect: str, allow_unknown_keys: bool):
    from eagle_eval.heads.dflash.io import load_dflash

    return load_dflash(folder, allow_unknown_keys=allow_unknown_keys)


def wire(settings, loaded, target, weight_checks: dict):
    from eagle_eval.heads.dflash.wire import wire_dflash

    return wire_dflash(settings, loaded, target, weight_checks)


def server_variants(settings, resolved, backend: str) -> list:
    from eagle_eval.heads.dflash.wire import server_variants as variants

    return variants(settings, resolved, backend)


def info(cfg) -> dict:
    from eagle_eval.heads.dflash.wire import block_echo

    return {"block": block_echo(cfg)}


def per_num_steps(loaded, num_steps: int) -> tuple[dict, list]:
    """The block a chain of num_steps drafts (num_steps + 1 rows) beside the trained one, and the finding
    dflash-block-size when they differ (dflash/wire.py, as a run reports its own num_steps)."""
    from eagle_eval.heads.dflash.wire import block_size_finding

    cfg, found = loaded.config, block_size_finding(loaded.config, num_steps, loaded.config_file)
    return ({"block_rows": num_steps + 1, "trained_block_size": cfg.block_size,
             "matches_trained_block": num_steps + 1 == cfg.block_size}, [found] if found is not None else [])


def kv_bytes(cfg, size: int) -> int:
    """The context K and V of every draft layer, per verified token (the block's are dropped after each draft)."""
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * size


def meta(config: dict, config_file, dialect: str, names) -> object:
    """The drafter as its checkpoint builds it (an own embedding table only when the file holds one)."""
    from eagle_eval.heads.dflash.layouts import dflash_config_from_json
    from eagle_eval.heads.dflash.model import DFlashDrafter

    cfg, _ = dflash_config_from_json(config, config_file)
    own = cfg.layout == SPECULATORS
    return DFlashDrafter(cfg, own_lm_head=own, with_embedding=own and "embed_tokens.weight" in names)


KIND = HeadKind(
    name="dflash", description="a block drafter (DFlash / DFlash2): one non-causal draft forward per cycle",
    architectures="'DFlashDraftModel' / 'DFlash2DraftModel' (z-lab), speculators_model_type 'dflash' (speculators)",
    detect=detect, load=load, default_taps=lambda num_layers, cfg: list(cfg.aux_hf), kv_bytes=kv_bytes, meta=meta,
    info=info, wire=wire, per_num_steps=per_num_steps, server_variants=server_variants,
    sglang_algorithms=("DFLASH",), options=("dflash_convention",))
