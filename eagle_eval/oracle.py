"""The oracle: a loaded target + EAGLE-3 head wired as a RunConfig says, and the prompts it can take.

Contract: `load_oracle(config)` loads the target and the head, resolves every setting once (aux
layers in all conventions and what each engine taps, embedding table, vocab map, steps/topk/draft
tokens really used, the head's training accuracy) into `Oracle.resolved`, and runs the load-time
checks; `Oracle.decode` runs the reference loop on one prompt. `checked_workload` loads the prompts
and refuses those the target cannot take. Reached through `eagle_eval.api`.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch

from eagle_eval.config import ConfigError, RunConfig
from eagle_eval.models.capture import engine_taps, resolve_aux_layers, sglang_deepseek_family
from eagle_eval.models.heads.io import load_head
from eagle_eval.results.records import Prompt, SampleRecord
from eagle_eval.speculative.chain import Speculator, speculative_decode
from eagle_eval.speculative.greedy import first_divergence, plain_greedy
from eagle_eval.workload.conversations import load_workload

log = logging.getLogger("eagle_eval")

SGLANG_TOPK1_MESSAGE = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")


def resolve_speculative(num_steps: int, topk: int, num_draft_tokens: int | None) -> tuple[int, list[str]]:
    """num_draft_tokens as SGLang would use it, and the warnings SGLang would log."""
    from eagle_eval.speculative.tree import pool_size

    notes = []
    if topk == 1:
        if num_draft_tokens is not None and num_draft_tokens != num_steps + 1:
            notes.append(f"{SGLANG_TOPK1_MESSAGE}: --num-draft-tokens {num_draft_tokens} -> {num_steps + 1}")
        return num_steps + 1, notes
    if num_draft_tokens is None:
        raise ConfigError(f"--topk {topk} (a tree) needs --num-draft-tokens D: the verify tree's nodes, root "
                          f"included, 2 <= D <= {pool_size(num_steps, topk) + 1} for num_steps {num_steps}")
    if num_draft_tokens - 1 > pool_size(num_steps, topk):
        raise ConfigError(f"--num-draft-tokens {num_draft_tokens}: a tree of num_steps {num_steps} and topk {topk} "
                          f"has only K + (S-1) K^2 = {pool_size(num_steps, topk)} candidates, so D <= "
                          f"{pool_size(num_steps, topk) + 1}")
    return num_draft_tokens, notes


def _resolve_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    return "bf16" if torch.cuda.is_available() else "fp32"


@dataclass
class Oracle:
    """A loaded target + head with every setting resolved; decodes prompts with the reference loop."""
    config: RunConfig
    speculator: Speculator
    tokenizer: object
    eos_ids: set[int]
    resolved: dict
    warnings: list[str] = field(default_factory=list)

    def limits(self, extra: int | None = None) -> tuple[int, int | None, int, str]:
        """(vocab size, max positions, positions a decode adds past the prompt, what sets the maximum)
        for check_prompts. A decode (`extra` None) of a target with sliding-window KV layers stays
        below the window: such a layer cannot be rolled back once full (Target.rollback)."""
        info, cfg = self.speculator.target.info, self.config
        verify = max(cfg.num_steps, self.resolved["num_draft_tokens"])     # positions one verify adds
        window = info.sliding_window if extra is None else None
        if window is not None and (info.max_positions is None or window - 1 < info.max_positions):
            bound = (f"sliding window {window}, less one: the loop cannot roll back a full sliding-window KV layer; "
                     "`profile` has no such limit")
            return info.vocab_size, window - 1, cfg.max_new_tokens + verify + 1, bound
        return (info.vocab_size, info.max_positions, cfg.max_new_tokens + verify + 1 if extra is None else extra,
                "max_position_embeddings")

    def decode(self, prompt: Prompt, check_lossless: bool | None = None) -> SampleRecord:
        from eagle_eval.workload.data import check_length

        cfg = self.config
        _, max_positions, extra, bound = self.limits()
        check_length(prompt, max_positions, extra, "the workload", bound)
        d = speculative_decode(self.speculator, prompt.input_ids, cfg.num_steps, cfg.max_new_tokens,
                               self.eos_ids, cfg.topk, self.resolved["num_draft_tokens"])
        rec = SampleRecord(id=prompt.id, category=prompt.category, prompt_len=len(prompt.input_ids),
                           output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                           emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
        if cfg.topk > 1:
            rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
            rec.extra["tree_shape_per_cycle"] = d.tree_shape_per_cycle
        if cfg.check_lossless if check_lossless is None else check_lossless:
            target = self.speculator.target
            greedy = plain_greedy(target, prompt.input_ids, cfg.max_new_tokens, self.eos_ids)
            rec.divergence = first_divergence(target, prompt.input_ids, d.output_ids, greedy)
            rec.lossless = rec.divergence is None
        return rec


def _eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in (gen_eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(i) for i in e)
    return ids


def _choose_embedding(choice: str, loaded, target) -> tuple[object, str]:
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


def _train_acc(config: RunConfig, head_dir) -> dict | None:
    """The head's training-time per-step accuracy: --train-acc, else the head folder's file, else None."""
    from eagle_eval.models.training_metrics import read_train_acc

    if config.train_acc is not None:
        return {"acc": list(config.train_acc), "source": "--train-acc"}
    found = read_train_acc(head_dir)
    return {"acc": list(found[0]), "source": found[1]} if found else None


def load_oracle(config: RunConfig) -> Oracle:
    from eagle_eval.models.target import execution_device, load_target

    notes = []
    num_draft_tokens, spec_notes = resolve_speculative(config.num_steps, config.topk, config.num_draft_tokens)
    notes += spec_notes
    dtype = _resolve_dtype(config.dtype)
    target, tokenizer = load_target(config.target, dtype=dtype, device_map=config.device_map,
                                    max_memory=config.max_memory, trust_remote_code=config.trust_remote_code,
                                    fp8_matmul=config.fp8_matmul)
    loaded = load_head(config.draft, allow_unknown_keys=config.allow_unknown_head_keys)
    notes += loaded.key_notes
    head = loaded.head
    if head.config.vocab_size != target.info.vocab_size:
        raise ConfigError(f"{loaded.path}/config.json: vocab_size={head.config.vocab_size} but the target "
                          f"{config.target} has {target.info.vocab_size} output logits")
    if head.config.target_hidden_size != target.info.hidden_size:
        raise ConfigError(f"{loaded.path}/config.json: target_hidden_size={head.config.target_hidden_size} "
                          f"but the target's hidden_size is {target.info.hidden_size}")
    aux = resolve_aux_layers(target.num_layers, head.config.num_aux, config.aux_layers, config.aux_convention,
                             loaded.aux_ids_sglang, loaded.aux_ids_vllm)
    draft_device = target.output_device
    head.to(device=draft_device, dtype=target.model.dtype)
    table, table_name = _choose_embedding(config.draft_embedding, loaded, target)
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
    for n in notes:
        warnings.warn(n, stacklevel=2)
    resolved = {
        "num_steps": config.num_steps, "topk": config.topk, "num_draft_tokens": num_draft_tokens,
        "num_draft_tokens_given": config.num_draft_tokens,
        "eagle_params": ({"depth": config.eagle_depth, "top_k": config.eagle_top_k,
                          "total_token": config.eagle_total_token,
                          "conversion": "num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token"}
                         if config.eagle_depth is not None else None),
        "aux_layers": {**aux.as_dict(), "engines": {e: t.as_dict() for e, t in engine_taps(
            target.num_layers, loaded.aux_ids_sglang, loaded.aux_ids_vllm,
            deepseek_family=sglang_deepseek_family(target.model.config)).items()}},
        "embedding": table_name,
        "vocab_map": {"draft_vocab_size": head.config.draft_vocab_size, "vocab_size": head.config.vocab_size,
                      "d2t": "checkpoint" if loaded.d2t_in_checkpoint else "none (full vocab)",
                      "d2t_identity": d2t_identity},
        "head": {"path": loaded.path, "dialect": loaded.dialect, "weights": loaded.weights_file,
                 "kind": head.config.kind, **({"mla": head.config.variant()["mla"]} if head.config.mla else {}),
                 "norm_before_residual": head.config.norm_before_residual,
                 "rope_theta": head.config.rope_theta, "rope_scaling": head.config.rope_scaling,
                 "variant": head.config.variant(), "keys": loaded.key_audit.as_dict()},
        "target": {**target.info.__dict__, "devices": list(target.info.devices)},
        "draft_device": str(draft_device),
        "dtype": dtype,
        "position_offset": config.position_offset,
        "accept_length_definition": "mean over verify cycles of (accepted drafts + 1), bonus counted",
        "train_acc": _train_acc(config, loaded.path),
    }
    from eagle_eval.models.checks.sanity import load_findings  # issue 5: load-time checks, printed by `run`
    resolved["sanity"] = [f.as_dict() for f in load_findings(target, loaded, aux, config, table_name)]
    spec = Speculator(target=target, head=head, embed=embed, aux_hf=aux.hf,
                      position_offset=config.position_offset)
    return Oracle(config=config, speculator=spec, tokenizer=tokenizer,
                  eos_ids=_eos_ids(tokenizer, target.model), resolved=resolved, warnings=notes)


def checked_workload(config: RunConfig, oracle: Oracle, extra: int | None = None):
    """load_workload, then refuse prompts the target cannot take (token ids outside its vocabulary,
    more positions than max_position_embeddings with `extra` more; default: a decode's)."""
    from eagle_eval.workload.data import check_prompts

    workload = load_workload(config, oracle.tokenizer)
    check_prompts(workload.first_prompts, oracle.limits(extra), workload.resolved["dataset_source"]["path"])
    return workload
