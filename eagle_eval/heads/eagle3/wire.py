"""Wiring an EAGLE-3 head (the Llama-style and MLA kinds) to its target for one run: the target tensors it reads
(models/capture.py `resolve_aux_layers`: the command line's ids, else its config's, else every engine's default), the
embedding table (vLLM's rule for `auto`), the vocab map, what each engine would tap, the load-time checks.

Contract: `wire_eagle3(settings, loaded, target, weight_checks) -> heads/wired.py Wired`; sizes that cannot match
the target are a ConfigError naming the head's config.json, the key and both values. A P-EAGLE head (the config's
`parallel_drafting`, heads/io.py) is wired the same way plus heads/peagle/wire.py: its refusals, its echo and
findings, and `ParallelDraftState` as the loop's drafting state.
"""

from __future__ import annotations

import torch

from eagle_eval.heads.eagle3.config import DEEP_TREES_REFUSED
from eagle_eval.heads.wired import HeadInfo, VocabMap, Wired
from eagle_eval.models.capture import default_hf_layers, engine_taps, resolve_aux_layers, sglang_deepseek_family
from eagle_eval.models.target import execution_device
from eagle_eval.settings import ConfigError


def check_sizes(loaded, target) -> None:
    """The head's vocab and target hidden size against the target's."""
    cfg = loaded.head.config
    if cfg.vocab_size != target.info.vocab_size:
        raise ConfigError(f"{loaded.path}/config.json: vocab_size={cfg.vocab_size} but the target "
                          f"{target.info.path or '(in memory)'} has {target.info.vocab_size} output logits")
    if cfg.target_hidden_size != target.info.hidden_size:
        raise ConfigError(f"{loaded.path}/config.json: target_hidden_size={cfg.target_hidden_size} "
                          f"but the target's hidden_size is {target.info.hidden_size}")


def choose_embedding(choice: str, loaded, target) -> tuple[object, str]:
    """(embedding module, which table) following --draft-embedding (vLLM's rule for `auto`)."""
    head = loaded.head
    target_table = target.input_embeddings
    own = head.embed_tokens
    compatible = tuple(target_table.weight.shape) == (head.config.vocab_size, head.config.hidden_size)
    if choice == "own" or (choice == "auto" and own is not None):
        if own is None:
            raise ConfigError(f"--draft-embedding own: {loaded.weights_file} has no 'embed_tokens.weight'")
        same = compatible and torch.equal(own.weight.detach().cpu().to(target_table.weight.dtype),
                                          target_table.weight.detach().cpu())
        if choice == "own" or not same:
            return own, "draft (own embed_tokens in the checkpoint)"
    if not compatible:
        raise ConfigError(
            f"{loaded.path}: the target's embedding table is {list(target_table.weight.shape)} but the head "
            f"needs [{head.config.vocab_size}, {head.config.hidden_size}] and has no embed_tokens of its own")
    return target_table, "target (the target's embed_tokens)"


def train_acc(model, head_dir) -> dict | None:
    """The head's training-time per-step accuracy: --train-acc, else the head folder's file, else None."""
    from eagle_eval.heads.training_metrics import read_train_acc

    if model.train_acc is not None:
        return {"acc": list(model.train_acc), "source": "--train-acc"}
    found = read_train_acc(head_dir)
    return {"acc": list(found[0]), "source": found[1]} if found else None


def head_info(loaded) -> HeadInfo:
    from eagle_eval.heads.kind import kind

    cfg = loaded.head.config
    return HeadInfo(path=loaded.path, dialect=loaded.dialect, weights=loaded.weights_file, kind=loaded.kind,
                    mla=kind(loaded.kind).info(cfg).get("mla"), norm_before_residual=cfg.norm_before_residual,
                    rope_theta=cfg.rope_theta, rope_scaling=cfg.rope_scaling, variant=cfg.variant(),
                    keys=loaded.key_audit.as_dict() if loaded.key_audit is not None else None)


def wire_eagle3(settings, loaded, target, weight_checks: dict) -> Wired:
    """The EAGLE-3 kinds' `HeadKind.wire` (module contract)."""
    from eagle_eval.heads.checks.sanity import load_findings
    from eagle_eval.heads.kind import kind

    check_sizes(loaded, target)
    spec_s, head = settings.speculation, loaded.head
    parallel = head.config.parallel_drafting          # P-EAGLE (heads/peagle/): loaded only for such a head
    if head.config.num_hidden_layers > 1 and spec_s.topk > 1:
        raise ConfigError(DEEP_TREES_REFUSED.format(topk=spec_s.topk, depth=head.config.num_hidden_layers))
    if parallel:
        from eagle_eval.heads.peagle import wire as peagle

        peagle.refuse(settings)
    notes = list(loaded.key_notes)
    taps = kind(loaded.kind).default_taps(target.num_layers, head.config)     # the head kind's own default taps
    own = None if taps == default_hf_layers(target.num_layers) else \
        (taps, f"the {loaded.kind} head kind's default HF {taps}")
    aux = resolve_aux_layers(target.num_layers, head.config.num_aux, spec_s.aux_layers, spec_s.aux_convention,
                             loaded.aux_ids_sglang, loaded.aux_ids_vllm, default=own)
    draft_device = target.output_device
    table, table_name = choose_embedding(spec_s.draft_embedding, loaded, target)
    table_device = execution_device(table, target.model)     # an offloaded table computes on its hook's device
    dtype_t = head.lm_head.weight.dtype

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return table(ids.to(table_device)).to(draft_device, dtype_t)

    reduced = head.config.draft_vocab_size < head.config.vocab_size
    d2t_identity = bool((head.d2t == 0).all())
    if reduced and d2t_identity:
        notes.append(f"{loaded.weights_file}: d2t is all zeros (identity) on a reduced draft vocab "
                     f"({head.config.draft_vocab_size} < {head.config.vocab_size}): draft ids map to "
                     "the first target ids, which is almost certainly wrong")
    engines = engine_taps(target.num_layers, loaded.aux_ids_sglang, loaded.aux_ids_vllm,
                          deepseek_family=sglang_deepseek_family(target.model.config))
    info = head_info(loaded)
    sanity = list(load_findings(target, loaded, aux, spec_s.aux_layers, table_name, weight_checks)) \
        if loaded.path else []
    draft_state = None
    if parallel:
        from dataclasses import replace

        from eagle_eval.heads.peagle.state import ParallelDraftState

        info = replace(info, extra={**info.extra, "parallel_drafting": peagle.echo(loaded, spec_s.num_steps)})
        sanity += peagle.findings(loaded, spec_s.num_steps)
        draft_state = ParallelDraftState
    return Wired(
        head=head, embed=embed, embedding=table_name, aux=aux, engines=engines,
        vocab_map=VocabMap(head.config.draft_vocab_size, head.config.vocab_size,
                           "checkpoint" if loaded.d2t_in_checkpoint else "none (full vocab)", d2t_identity),
        info=info, sanity=tuple(sanity),
        notes=tuple(notes), train_acc=train_acc(settings.model, loaded.path) if loaded.path else None,
        draft_state=draft_state)
