"""Wiring a DFlash / DFlash2 drafter to its target for one run: the head bound to the target (dflash/bind.py), the
target tensors it reads, the table that embeds its block, what each engine would tap and serve, the load-time
findings, and the drafting state the loop builds (`BlockDraftState`).

Contract: `wire_dflash(settings, loaded, target, weight_checks) -> heads/wired.py Wired`. Settings a block drafter
cannot take are a ConfigError naming the option: a tree (`--topk` > 1: vLLM `dflash` and SGLang `DFLASH` verify
one chain), SGLang's old draft positions (`--position-offset 1`), `--draft-embedding own` on a checkpoint without
its own table. Everything else runs as asked; in particular `--num-steps S` runs blocks of S + 1 rows whatever the
trained block B (vLLM serves K = num_speculative_tokens as a block of 1 + K rows, SGLang
--speculative-num-draft-tokens as the block, and neither refuses another length than B: notes section 3), and a
block of another length than B is a finding (`dflash-block-size`) naming both, because the block is non-causal:
its drafts are a different computation, not a prefix of the trained one.

Context keys: `--dflash-convention` (dflash/conventions.py): the published math by default, or vLLM 0.32's CPU
build (draft layer 0's k_norm on every layer's context keys, a kernel defect), said by the finding
`dflash-convention` and echoed with every engine's; server-check offers a vLLM server the other one
(`server_variants`).

Taps: the command line's `--aux-layers` (read in `--aux-convention`, as for every head: what diagnose's sweeps
change), else the config's target_layer_ids l as HF indices l + 1 (z-lab `extract_context_feature`; SGLang
`set_dflash_layers_to_capture`; vLLM `get_eagle3_aux_layers_from_config`, unless the config also carries
`eagle_aux_hidden_state_layer_ids`, which vLLM 0.32 takes instead without a word).
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle_eval.findings import info, warning
from eagle_eval.heads.dflash.bind import DFlashHead, bind
from eagle_eval.heads.dflash.config import DFLASH2, SPECULATORS, TREES_REFUSED, DFlashConfig
from eagle_eval.heads.dflash.conventions import CONVENTIONS, PUBLISHED, VLLM_CPU, engines_echo
from eagle_eval.heads.dflash.state import BlockDraftState
from eagle_eval.heads.wired import HeadInfo, VocabMap, Wired
from eagle_eval.models.capture import EngineTaps, resolve_aux_layers
from eagle_eval.settings import ConfigError


def block_echo(cfg: DFlashConfig) -> dict:
    """What a report echoes of the drafter's block, whatever the run: the trained block, the mask, the taps in every
    numbering, and the engine settings that serve the trained block."""
    return {"variant": cfg.kind, "layout": cfg.layout, "block_size": cfg.block_size,
            "mask_token_id": cfg.mask_token_id, "target_layer_ids": cfg.taps(), **cfg.engine_block,
            "draft_layers": cfg.num_hidden_layers,
            "attention": [("causal" if c else "non-causal") + (f", window {cfg.window(i)}" if cfg.window(i) else "")
                          for i, c in enumerate(cfg.causal)],
            **({"dflash2": {k: getattr(cfg, k) for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                           "selector_top_k")}} if cfg.kind == DFLASH2 else {})}


def served_block(cfg: DFlashConfig, num_steps: int) -> dict:
    """The block this run drafts (num_steps + 1 rows) beside the trained one, in each engine's setting."""
    rows = num_steps + 1
    return {"rows": rows, "num_steps": num_steps, "trained_block_size": cfg.block_size,
            "matches_trained_block": rows == cfg.block_size,
            "as_vllm": f"num_speculative_tokens {num_steps} (a block of {rows} rows; the trained block needs "
                       f"{cfg.block_size - 1})",
            "as_sglang": f"--speculative-num-draft-tokens {rows} (the trained block needs {cfg.block_size})",
            "as_zlab": f"dflash_generate(block_size={rows})"}


def block_size_finding(cfg: DFlashConfig, num_steps: int, config_file: str):
    """A block of another length than the trained one, as a finding naming both (None when they agree)."""
    rows = num_steps + 1
    if rows == cfg.block_size:
        return None
    return warning(
        "dflash-block-size",
        f"--num-steps {num_steps} drafts blocks of {rows} rows, but {config_file} was trained with block_size "
        f"{cfg.block_size}: vLLM serves the trained block with num_speculative_tokens {cfg.block_size - 1}, SGLang "
        f"with --speculative-num-draft-tokens {cfg.block_size}; neither refuses another length, and the block is "
        "non-causal, so a block of another length drafts otherwise (not a prefix of the trained block)",
        num_steps=num_steps, rows=rows, trained_block_size=cfg.block_size,
        vllm_num_speculative_tokens=cfg.block_size - 1, sglang_num_draft_tokens=cfg.block_size)


def served_tokens_finding(cfg: DFlashConfig, config_file: str):
    """The speculators layout tells vLLM its K (speculators_config.proposal_methods[0].speculative_tokens, read when
    the folder itself is served: vLLM speculators base.py): a finding when that K serves another block than the
    trained one (None when it agrees or the layout has no such key; the value was type-checked at loading)."""
    if cfg.layout != SPECULATORS:
        return None
    raw = json.loads(Path(config_file).read_text())
    methods = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    if tokens is None or tokens == cfg.block_size - 1:
        return None
    return warning("dflash-served-block",
                   f"{config_file}: speculators_config.proposal_methods[0].speculative_tokens = {tokens}: vLLM serving "
                   f"this folder drafts blocks of {tokens + 1} rows, but it was trained with block_size "
                   f"{cfg.block_size} (num_speculative_tokens {cfg.block_size - 1}); vLLM does not refuse it",
                   speculative_tokens=tokens, rows=tokens + 1, trained_block_size=cfg.block_size)


def engine_taps(cfg: DFlashConfig, num_layers: int) -> dict:
    """What each engine taps for this config: SGLang and both vLLM runners l + 1, vLLM the eagle key when present."""
    hf = tuple(sorted(cfg.aux_hf))
    ok = lambda ids: tuple(sorted(ids)) if all(0 <= i < num_layers for i in ids) else None   # noqa: E731
    ids = list(cfg.target_layer_ids)
    sglang = EngineTaps("sglang", ok(hf), f"target_layer_ids {ids} + 1 (set_dflash_layers_to_capture)")
    if cfg.vllm_aux_ids is not None:
        vllm = [EngineTaps(e, ok(cfg.vllm_aux_ids), f"eagle_aux_hidden_state_layer_ids {list(cfg.vllm_aux_ids)} as "
                           "given (it wins over target_layer_ids: eagle3_utils.get_eagle3_aux_layers_from_config)")
                for e in ("vllm_v1", "vllm_v2")]
    else:
        vllm = [EngineTaps(e, ok(hf), f"target_layer_ids {ids} + 1 (eagle3_utils.get_eagle3_aux_layers_from_config)")
                for e in ("vllm_v1", "vllm_v2")]
    return {t.engine: t for t in (sglang, *vllm)}


def convention_for(settings, cfg: DFlashConfig):
    """The convention this run computes the context keys in (`--dflash-convention`, dflash/conventions.py); vLLM's
    CPU build serves no DFlash2 (its V1 model runner refuses "DFlash candidate-head drafts"), so `vllm-cpu` on a
    DFlash2 drafter is refused."""
    name = settings.speculation.dflash_convention
    if name == VLLM_CPU and cfg.kind == DFLASH2:
        raise ConfigError(f"--dflash-convention {VLLM_CPU}: vLLM's CPU build does not serve DFlash2 (its V1 model "
                          "runner refuses 'DFlash candidate-head drafts', vllm config/vllm.py); use --dflash-convention "
                          f"{PUBLISHED}")
    return CONVENTIONS[name]


def convention_finding(cfg: DFlashConfig, convention):
    """The run computes the context keys as vLLM's CPU build does: said, since it is a kernel defect, not the
    published math (None for the published convention)."""
    if convention.name == PUBLISHED:
        return None
    same = (" (one draft layer: the same computation as the published one)" if cfg.num_hidden_layers == 1 else "")
    return info("dflash-convention",
                f"--dflash-convention {convention.name}: every draft layer's context keys are normed with draft layer "
                f"0's k_norm, as vLLM 0.32's CPU build computes them (its CPU rms_norm reads one row of the stacked "
                f"k_norm weights: a kernel defect, not the published DFlash math){same}",
                convention=convention.name, draft_layers=cfg.num_hidden_layers)


def server_variants(settings, resolved, backend: str) -> list[tuple[str, str, dict]]:
    """How a server may run this drafter otherwise than the oracle (heads/kind.py `HeadKind.server_variants`): for a
    vLLM server, the other context-key convention (dflash/conventions.py), when the draft has more than one layer
    (with one they are the same computation) and is a DFlash (vLLM's CPU build serves no DFlash2)."""
    block = resolved.head.extra.get("block") or {}
    if backend != "vllm" or block.get("draft_layers", 1) < 2 or block.get("variant") == DFLASH2:
        return []
    if settings.speculation.dflash_convention == PUBLISHED:
        return [("vllm_cpu_context_k_norm",
                 "vLLM 0.32's CPU build: draft layer 0's k_norm on every draft layer's context keys (qwen3_dflash.py "
                 "_normalize_context_k through a CPU rms_norm that reads one row of the stacked weights; "
                 "--dflash-convention vllm-cpu)", {"dflash_convention": VLLM_CPU})]
    return [("published_context_k_norm", "the published math (z-lab, SGLang, vLLM on CUDA): each draft layer's own "
             "k_norm on its context keys (--dflash-convention published)", {"dflash_convention": PUBLISHED})]


def _refuse(settings) -> None:
    spec_s = settings.speculation
    if spec_s.topk > 1:
        raise ConfigError(TREES_REFUSED.format(topk=spec_s.topk))
    if spec_s.position_offset:
        raise ConfigError(f"--position-offset {spec_s.position_offset}: SGLang's old EAGLE-3 draft positions; a block "
                          "drafter runs at the verified positions s..s+B-1 in every engine")


def _embedding(choice: str, loaded, target, head: DFlashHead) -> tuple[DFlashHead, str]:
    """The table that embeds the block's rows, following --draft-embedding (auto: the checkpoint's own table if it
    has one, else the target's, as vLLM's DFlashQwen3ForCausalLM.load_weights; target: the target's)."""
    cfg, own = loaded.config, loaded.drafter.embed_tokens
    scale = f" x input_embedding_scale {cfg.input_embedding_scale}" if cfg.input_embedding_scale != 1.0 else ""
    if choice == "own" and own is None:
        raise ConfigError(f"--draft-embedding own: {loaded.weights_file} has no 'embed_tokens.weight' (the "
                          f"{cfg.layout} layout reads the target's embedding table)")
    if choice == "target" and own is not None:
        table = target.input_embeddings.weight
        if table.shape[1] != cfg.hidden_size:
            raise ConfigError(f"--draft-embedding target: the target's embedding table is {list(table.shape)}, the "
                              f"draft's rows are {cfg.hidden_size} wide")
        return DFlashHead(loaded.drafter, table, head.lm_head), f"target (the target's embed_tokens rows{scale})"
    if own is not None:
        return head, f"draft (own embed_tokens in the checkpoint{scale})"
    return head, f"target (the target's embed_tokens rows{scale})"


def load_findings(loaded, settings, aux, convention=None) -> list:
    """The load-time findings of a DFlash drafter: what was read, the taps against the config's, and the block this
    run drafts against the trained one (the notes of reading and binding are the run's warnings)."""
    cfg = loaded.config
    out = [info("dflash-checkpoint",
                f"{cfg.kind} draft, {cfg.layout} layout: {cfg.num_hidden_layers} draft layers, block_size "
                f"{cfg.block_size}, mask token {cfg.mask_token_id}, target_layer_ids {list(cfg.target_layer_ids)} "
                f"(HF {list(cfg.aux_hf)})" + (" (defaulted from num_target_layers)" if cfg.ids_defaulted else ""))]
    if aux.hf != tuple(sorted(cfg.aux_hf)):
        out.append(warning("dflash-aux-override",
                           f"--aux-layers taps HF {list(aux.hf)}; {loaded.config_file} names target_layer_ids "
                           f"{list(cfg.target_layer_ids)} (HF {list(cfg.aux_hf)}), which every engine taps",
                           tapped=list(aux.hf), config_hf=list(cfg.aux_hf)))
    for found in (block_size_finding(cfg, settings.speculation.num_steps, loaded.config_file),
                  served_tokens_finding(cfg, loaded.config_file),
                  convention_finding(cfg, convention) if convention is not None else None):
        if found is not None:
            out.append(found)
    return out


def wire_dflash(settings, loaded, target, weight_checks: dict) -> Wired:
    """The dflash kind's `HeadKind.wire` (module contract)."""
    from eagle_eval.heads.eagle3.wire import train_acc

    _refuse(settings)
    spec_s, cfg = settings.speculation, loaded.config
    convention = convention_for(settings, cfg)
    head, bind_notes = bind(loaded, target)
    head, table_name = _embedding(spec_s.draft_embedding, loaded, target, head)
    head = head.with_convention(convention)
    source = (f"draft config target_layer_ids {list(cfg.target_layer_ids)} (z-lab ids, after layer l: HF l + 1)"
              + (", defaulted from num_target_layers" if cfg.ids_defaulted else ""))
    aux = resolve_aux_layers(target.num_layers, cfg.num_aux, spec_s.aux_layers, spec_s.aux_convention,
                             default=(list(cfg.aux_hf), source))
    notes = list(loaded.key_notes) + bind_notes
    reduced = cfg.draft_vocab_size < cfg.vocab_size
    d2t_identity = bool((head.d2t == 0).all())
    vocab = VocabMap(cfg.draft_vocab_size, cfg.vocab_size,
                     "checkpoint" if cfg.layout == SPECULATORS and reduced else "none (full vocab)", d2t_identity)
    echo = {"block": {**block_echo(cfg), "served": served_block(cfg, spec_s.num_steps),
                      "convention": {**convention.as_dict(), "each_engine": engines_echo()}}}
    info_ = HeadInfo(path=loaded.path, dialect=cfg.layout, weights=loaded.weights_file, kind="dflash", mla=None,
                     norm_before_residual=None, rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling,
                     variant={"kind": cfg.kind, "layer_types": list(cfg.layer_types), "causal": list(cfg.causal)},
                     keys=loaded.key_audit.as_dict(), extra=echo)
    return Wired(head=head, embed=head.embed, embedding=table_name, aux=aux,
                 engines=engine_taps(cfg, target.num_layers), vocab_map=vocab, info=info_,
                 sanity=tuple(load_findings(loaded, settings, aux, convention)), notes=tuple(notes),
                 train_acc=train_acc(settings.model, loaded.path), draft_state=BlockDraftState)

