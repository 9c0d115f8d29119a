"""Wiring the MTP layers to their target for one run: the convention (`--mtp-convention`: vLLM's by default), what
it refuses, the one target tensor it reads (the last hidden state after the final norm, internal index N + 1, or
before it, index N: vLLM's MiMo), the target's embedding, lm_head and rotary tables, and the report's echo of what
vLLM, SGLang and transformers would do.

Contract: `wire_mtp(settings, loaded, target, weight_checks) -> heads/wired.py Wired`, its head a heads/mtp/model.py
`MTPDraft`; a convention the engine refuses is a ConfigError in the engine's words. `convention_for(settings, family)`
is the convention a run uses (diagnose swaps single choices through `settings.speculation.mtp_planted`).
"""

from __future__ import annotations

import torch

from eagle_eval.heads.mtp.conventions import CONVENTIONS, ConventionError, check_steps, engines_echo, planted
from eagle_eval.heads.mtp.layouts import LAYOUTS
from eagle_eval.heads.mtp.model import MTPDraft
from eagle_eval.heads.wired import HeadInfo, VocabMap, Wired
from eagle_eval.models.capture import EngineTaps, post_norm_index, resolve_aux_layers
from eagle_eval.models.target import execution_device
from eagle_eval.settings import ConfigError

POSITIONS = ("pair t (the target's state at t, the token at t + 1) runs at RoPE position t, as vLLM and SGLang run it; "
             "transformers runs it at t + 1, a constant shift RoPE attention cannot see")


def convention_for(settings, family: str):
    """The convention of this run: the engine's (`--mtp-convention`), with diagnose's planted choices if any."""
    spec_s = settings.speculation
    conv = CONVENTIONS[family][spec_s.mtp_convention]
    return planted(conv, **parse_planted(spec_s.mtp_planted)) if spec_s.mtp_planted else conv


PLANTABLE = {"input": ("pre", "post"), "chain": ("pre", "post"), "mask_position0": ("true", "false"),
             "hidden_first": ("true", "false")}


def parse_planted(items) -> dict:
    """('input=pre', 'mask_position0=false') -> {'input': 'pre', 'mask_position0': False}.

    >>> parse_planted(("input=pre", "hidden_first=true"))
    {'input': 'pre', 'hidden_first': True}
    """
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in PLANTABLE or value not in PLANTABLE[key]:
            raise ConfigError(f"mtp_planted: {item!r}: expected one of "
                              + ", ".join(f"{k}={'|'.join(v)}" for k, v in PLANTABLE.items()))
        out[key] = value == "true" if value in ("true", "false") else value
    return out


FLIPS = {"input": ("pre", "post"), "chain": ("pre", "post"), "mask_position0": (True, False),
         "hidden_first": (True, False)}
WORDS = {"input": "the target's state {} its final norm as input",
         "chain": "the output {} the MTP output norm handed to the next step",
         "mask_position0": "position-0 embedding masking {}", "hidden_first": "the fusion {}"}


def _flip_words(key: str, value) -> str:
    fill = {"input": {"pre": "before", "post": "after"}, "chain": {"pre": "before", "post": "after"},
            "mask_position0": {True: "on", False: "off"},
            "hidden_first": {True: "hidden first", False: "embedding first"}}[key][value]
    return WORDS[key].format(fill)


def variants(settings, resolved) -> list[tuple[str, str, dict]]:
    """The MTP kind's wiring faults (heads/kind.py `HeadKind.variants`): every other engine's whole convention that
    engine runs for this target and num_steps, then each single choice of the run's convention flipped; a variant
    that is the run's convention, or one listed already, is dropped."""
    from eagle_eval.heads.mtp.conventions import ENGINES, ConventionError

    family, spec_s = resolved.head.extra["mtp"]["family"], settings.speculation
    current = convention_for(settings, family)
    seen, out = [current], []

    def add(name, description, changes):
        conv = convention_for(settings.with_(**changes), family)
        if all(conv.differs(s) for s in seen):
            seen.append(conv)
            out.append((name, description, changes))

    for engine in ENGINES:
        try:
            check_steps(CONVENTIONS[family][engine], family, resolved.head.extra["mtp"]["layers"], spec_s.num_steps,
                        spec_s.topk)
        except ConventionError:
            continue
        add(f"{engine}_convention", f"{engine}'s convention for {family}", {"mtp_convention": engine,
                                                                             "mtp_planted": None})
    base = tuple(spec_s.mtp_planted or ())
    for key, values in FLIPS.items():
        value = next(v for v in values if v != getattr(current, key))
        text = value if isinstance(value, str) else str(value).lower()
        planted_items = tuple(i for i in base if not i.startswith(key + "=")) + (f"{key}={text}",)
        add(f"mtp_{key}_{text}", _flip_words(key, value), {"mtp_planted": planted_items})
    return out


def tap(num_layers: int, convention) -> int:
    """The internal index of the target tensor the MTP layer reads: N + 1 after the final norm, N before it."""
    return post_norm_index(num_layers) if convention.input == "post" else num_layers


def _rotary(target):
    """The target text decoder's own rotary module (the MTP block's positions are the target's)."""
    from eagle_eval.models.text_decoder import find_text_decoder

    stack = find_text_decoder(target.model, target.info.path or type(target.model).__name__, ConfigError).stack
    rotary = getattr(stack, "rotary_emb", None)
    if rotary is None:
        raise ConfigError(f"{target.info.path}: the text decoder ({type(stack).__name__}) has no rotary_emb: the "
                          "MTP block's positions cannot be the target's")
    return rotary


def engine_taps(num_layers: int, family: str) -> dict[str, EngineTaps]:
    """What each engine feeds the MTP layer (models/capture.py EngineTaps, internal indices)."""
    out = {}
    for key, engine in (("sglang", "sglang"), ("vllm_v1", "vllm"), ("vllm_v2", "vllm")):
        conv = CONVENTIONS[family][engine]
        where = "after" if conv.input == "post" else "before"
        out[key] = EngineTaps(key, (tap(num_layers, conv),),
                              f"the target's last hidden state {where} its final norm ({conv.sources[1]})")
    return out


def wire_mtp(settings, loaded, target, weight_checks: dict) -> Wired:
    """The MTP kind's `HeadKind.wire` (module contract)."""
    spec_s, stack = settings.speculation, loaded.head
    cfg = stack.config
    family, n = cfg.family, cfg.num_layers
    if spec_s.aux_layers is not None:
        raise ConfigError(f"--aux-layers {','.join(map(str, spec_s.aux_layers))}: an MTP layer reads the target's last "
                          "hidden state only; whether before or after the final norm is the convention's "
                          "(--mtp-convention)")
    if cfg.hidden_size != target.info.hidden_size or cfg.vocab_size != target.info.vocab_size:
        raise ConfigError(f"{loaded.path}: the MTP layers are for hidden_size {cfg.hidden_size} / vocab {cfg.vocab_size}"
                          f", the target has {target.info.hidden_size} / {target.info.vocab_size}")
    if cfg.block_class != type(target.layers[0]).__name__:
        raise ConfigError(f"{loaded.path}: the MTP layer is a {cfg.block_class} block, the target's layers are "
                          f"{type(target.layers[0]).__name__}: it belongs to another family's target")
    conv = convention_for(settings, family)
    try:
        notes = check_steps(conv, family, n, spec_s.num_steps, spec_s.topk)
    except ConventionError as exc:
        raise ConfigError(f"--mtp-convention {spec_s.mtp_convention}: {exc}") from exc
    hf = tap(target.num_layers, conv)
    where = "after" if conv.input == "post" else "before"
    aux = resolve_aux_layers(target.num_layers, 1, None, spec_s.aux_convention, None, None,
                             default=([hf], f"the MTP layer's input: the target's last hidden state {where} its "
                                            f"final norm ({conv.engine} convention)"))
    head = MTPDraft(stack, conv, target.output_embeddings, _rotary(target))
    draft_device, table = target.output_device, target.input_embeddings
    table_device = execution_device(table, target.model)

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return table(ids.to(table_device)).to(draft_device, head.dtype)

    layout = LAYOUTS[family]
    extra = {"mtp": {
        "family": family, "layout": layout.description, "layers": n, "target_layers": target.num_layers,
        "block": cfg.block_class, "drafting_layer": 0, "convention": conv.as_dict(),
        "engines": engines_echo(family, n, spec_s.num_steps, spec_s.topk), "positions": POSITIONS,
        "embedding_and_head": "the target's (every engine shares them with the MTP layer)",
        "weights": cfg.weights}}
    info = HeadInfo(path=loaded.path, dialect=loaded.dialect, weights=loaded.weights_file, kind="mtp", mla=None,
                    norm_before_residual=None, rope_theta=None, rope_scaling=None, variant={}, keys=None, extra=extra)
    v = cfg.vocab_size
    return Wired(head=head, embed=embed, embedding="target (the target's embed_tokens, as every engine shares it)",
                 aux=aux, engines=engine_taps(target.num_layers, family),
                 vocab_map=VocabMap(v, v, "none (full vocab)", True), info=info,
                 notes=tuple(loaded.key_notes) + tuple(notes))
