"""The oracle: a loaded target + EAGLE-3 head wired as `Settings` say, and every setting it resolved.

Contract: `load_oracle(settings)` loads the weights (`load_models`: the target, its tokenizer, the head
file; done once per `ModelSettings`) and wires them (`wire`): aux layers in every convention and what each
engine taps, the embedding table, the vocab map, the steps/topk/draft tokens really used, the head's
training accuracy, the load-time checks, all in a typed `Resolved`. `oracle.with_(**changes)` is the same
oracle with some settings changed: a change that leaves `settings.model` alone rewires the weights already
loaded (an ablation over aux layers, steps, embeddings or positions loads the target and the head once);
one that touches it loads again. `Oracle.decode` runs the reference loop on one prompt; `checked_workload`
loads the prompts and refuses those the target cannot take.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field

import torch

from eagle_eval.errors import stage
from eagle_eval.heads.io import LoadedHead, load_head
from eagle_eval.heads.wired import HeadInfo, VocabMap  # noqa: F401  (re-exported: parts of Resolved)
from eagle_eval.models.capture import AuxLayers
from eagle_eval.models.target import Target, TargetInfo, load_target
from eagle_eval.records import Prompt, SampleRecord
from eagle_eval.settings import ConfigError, ModelSettings, Settings
from eagle_eval.loop.reference import Speculator, speculative_decode
from eagle_eval.loop.plain import first_divergence, plain_greedy
from eagle_eval.workload.conversations import load_workload

log = logging.getLogger("eagle_eval")

SGLANG_TOPK1_MESSAGE = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")
ACCEPT_LENGTH_DEFINITION = "mean over verify cycles of (accepted drafts + 1), bonus counted"


def resolve_speculative(num_steps: int, topk: int, num_draft_tokens: int | None) -> tuple[int, list[str]]:
    """num_draft_tokens as SGLang would use it, and the warnings SGLang would log."""
    from eagle_eval.loop.tree import pool_size

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


@dataclass(frozen=True)
class Resolved:
    """What the run really used: every setting after resolution, echoed in every report."""
    num_steps: int
    topk: int
    num_draft_tokens: int             # as used (SGLang's topk == 1 adjustment applied)
    num_draft_tokens_given: int | None
    eagle_params: dict | None
    aux: AuxLayers
    engines: dict                     # engine -> capture.EngineTaps: what each engine taps for this head's config
    embedding: str                    # which table embeds the draft's tokens, in words
    vocab_map: VocabMap
    head: HeadInfo
    target: TargetInfo
    draft_device: str
    dtype: str
    position_offset: int
    train_acc: dict | None            # {"acc": [...], "source": ...}
    sanity: tuple = ()                # load-time findings (results.findings.Finding)
    decoding: dict | None = None      # the decode policy: rule, filter order, drafts, seed (rules/base.py)

    @property
    def embedding_table(self) -> str:
        """"target" or "own": the table `embedding` names."""
        return "target" if self.embedding.startswith("target") else "own"

    def as_dict(self) -> dict:
        """The keys report.json holds under `config` beside the settings."""
        return {
            "num_steps": self.num_steps, "topk": self.topk, "num_draft_tokens": self.num_draft_tokens,
            "num_draft_tokens_given": self.num_draft_tokens_given, "eagle_params": self.eagle_params,
            "aux_layers": {**self.aux.as_dict(), "engines": {e: t.as_dict() for e, t in self.engines.items()}},
            "embedding": self.embedding, "vocab_map": self.vocab_map.__dict__.copy(), "head": self.head.as_dict(),
            "target": {**self.target.__dict__, "devices": list(self.target.devices)},
            "draft_device": self.draft_device, "dtype": self.dtype, "position_offset": self.position_offset,
            "accept_length_definition": ACCEPT_LENGTH_DEFINITION, "train_acc": self.train_acc,
            "sanity": [f.as_dict() for f in self.sanity], "decoding": self.decoding,
        }


@dataclass
class Loaded:
    """What loading `model` settings gives: shared by every oracle wired from the same weights."""
    model: ModelSettings
    dtype: str                        # resolved
    target: Target
    tokenizer: object
    head: LoadedHead
    eos_ids: frozenset
    weight_checks: dict = field(default_factory=dict)    # sanity's cache of weight-only findings


def load_models(model: ModelSettings) -> Loaded:
    """Load the target and the head of `model` (any head kind; a kind whose draft lives in the target's checkpoint
    reads it there), the head cast to the target's dtype on the device of its lm_head."""
    dtype = _resolve_dtype(model.dtype)
    target, tokenizer = load_target(model.target, dtype=dtype, device_map=model.device_map,
                                    max_memory=model.max_memory, trust_remote_code=model.trust_remote_code,
                                    fp8_matmul=model.fp8_matmul, revision=model.revision)
    head = load_head(model.draft, allow_unknown_keys=model.allow_unknown_head_keys, revision=model.draft_revision,
                     target=target)
    from eagle_eval.models.quant.info import place

    place(head.head, target.output_device, target.model.dtype)     # a held-quantized head keeps its narrow weights
    return Loaded(model=model, dtype=dtype, target=target, tokenizer=tokenizer, head=head,
                  eos_ids=frozenset(_eos_ids(tokenizer, target.model)))


@dataclass
class Oracle:
    """A loaded target + head with every setting resolved; decodes prompts with the reference loop."""
    settings: Settings
    resolved: Resolved
    speculator: Speculator
    loaded: Loaded
    warnings: list[str] = field(default_factory=list)

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    @property
    def eos_ids(self) -> set[int]:
        return set(self.loaded.eos_ids)

    def with_(self, **changes) -> "Oracle":
        """This oracle with the settings named changed (flat names, as `Settings.with_`); the loaded target
        and head are reused unless a model setting changes."""
        settings = self.settings.with_(**changes)
        if settings.model == self.settings.model:
            return wire(settings, self.loaded)
        return load_oracle(settings)

    def refuse_load_errors(self) -> None:
        """Stop (errors.CheckFailed, exit 1) when a load-time check found an error, unless --allow-load-errors."""
        from eagle_eval.errors import CheckFailed
        from eagle_eval.findings import render_findings

        bad = [f for f in self.resolved.sanity if f.severity == "error"]
        if bad and not self.settings.model.allow_load_errors:
            raise CheckFailed("load-time checks found an error, so the head or target cannot give a meaningful "
                              "number; nothing was decoded (--allow-load-errors measures anyway):\n"
                              + render_findings(bad))

    def limits(self, extra: int | None = None) -> tuple[int, int | None, int, str]:
        """(vocab size, max positions, positions a decode adds past the prompt, what sets the maximum)
        for check_prompts: the least of max_position_embeddings, a longrope target's switch (every pass,
        `profile`'s included: Target.longrope_switch) and, for a decode (`extra` None) of a target with
        sliding-window KV layers, the window less one: such a layer cannot be rolled back once full
        (Target.rollback)."""
        info, r = self.speculator.target.info, self.resolved
        max_new = self.settings.workload.max_new_tokens
        verify = max(r.num_steps, r.num_draft_tokens)     # positions one verify adds
        bounds = [(info.max_positions, "max_position_embeddings")] if info.max_positions is not None else []
        if info.rope_switch is not None:
            bounds.append((info.rope_switch, f"longrope's original_max_position_embeddings {info.rope_switch}: past "
                           "it transformers switches a whole forward to the long factors, so a verify, a batch or a "
                           "teacher-forced pass would rotate by other frequencies than plain decoding"))
        window = info.sliding_window if extra is None else None
        if window is not None:
            bounds.append((window - 1, f"sliding window {window}, less one: the loop cannot roll back a full "
                           "sliding-window KV layer; `profile` has no such limit"))
        positions, bound = min(bounds, key=lambda b: b[0]) if bounds else (None, "max_position_embeddings")
        return info.vocab_size, positions, max_new + verify + 1 if extra is None else extra, bound

    def decode(self, prompt: Prompt, check_lossless: bool = False, sample: int = 0) -> SampleRecord:
        """The reference loop on one prompt; at temperature > 0 every draw comes from the stream of (seed, prompt
        id, `sample`), and `check_lossless` counts the output for the distribution check instead of comparing it
        with plain greedy decoding."""
        from eagle_eval.workload.data import check_length

        r, max_new = self.resolved, self.settings.workload.max_new_tokens
        _, max_positions, extra, bound = self.limits()
        check_length(prompt, max_positions, extra, "the workload", bound)
        with stage([prompt.id], "decode"):
            d = speculative_decode(self.speculator, prompt.input_ids, r.num_steps, max_new, self.eos_ids, r.topk,
                                   r.num_draft_tokens, generator=self._generator(prompt, sample))
        return self._record(prompt, d, check_lossless, sample)

    def _generator(self, prompt: Prompt, sample: int = 0):
        """The prompt's random stream at temperature > 0 (sampling.prompt_generator), None when greedy."""
        decoding = self.settings.decoding
        if decoding.greedy:
            return None
        from eagle_eval.rules.filters import prompt_generator

        return prompt_generator(decoding.seed, prompt.id, sample)

    def loop_mode(self, batch_size: int = 1, cuda_graphs: bool = False) -> dict:
        """Which loop `decode_many` runs: the reference loop, or the batched one (batch_size > 1, or a chain
        whose cycle can be replayed as a CUDA graph), and why graphs are not used when asked for. Every rule runs
        batched (the policy's batched form, loop/policy.py); a rule that draws on the host is not captured."""
        from eagle_eval.loop.graphed import capture_blockers

        reason = "--no-cuda-graphs"
        if cuda_graphs:
            reason = self.speculator.policy.rows(1).capture_blocker or capture_blockers(self.speculator)
            if reason is None and self.resolved.topk > 1:
                reason = "trees (--topk > 1) draft on the host: only chains are captured"
        graphs = cuda_graphs and reason is None
        batched = graphs or batch_size > 1
        return {"batch_size": batch_size, "cuda_graphs": graphs, "cuda_graphs_reason": None if graphs else reason,
                "loop": "batched" if batched else "reference"}

    def decode_many(self, prompts: list[Prompt], batch_size: int = 1, cuda_graphs: bool = False,
                    check_lossless: bool = False) -> list[SampleRecord]:
        """`decode` of every prompt, `batch_size` rows verified in one forward (loop/batched.py), the
        chain cycle replayed as a CUDA graph where `loop_mode` allows; the reference loop when it says so. Each
        prompt draws from its own stream, so the records equal `decode`'s whatever the batch size and order."""
        from eagle_eval.loop.batched import batched_decode
        from eagle_eval.workload.data import check_length

        mode = self.loop_mode(batch_size, cuda_graphs)
        if mode["loop"] == "reference":
            return [self.decode(p, check_lossless) for p in prompts]
        r, max_new = self.resolved, self.settings.workload.max_new_tokens
        _, max_positions, extra, bound = self.limits()
        for prompt in prompts:
            check_length(prompt, max_positions, extra, "the workload", bound)
        with stage([p.id for p in prompts], f"decode (batched, {batch_size} rows)"):
            run = batched_decode(self.speculator, [p.input_ids for p in prompts], r.num_steps, max_new,
                                 self.eos_ids, batch_size, r.topk, r.num_draft_tokens, cuda_graphs=mode["cuda_graphs"],
                                 generators=[self._generator(p) for p in prompts])
        return [self._record(p, d, check_lossless) for p, d in zip(prompts, run.decoded)]

    def _record(self, prompt: Prompt, d, check_lossless: bool, sample: int = 0) -> SampleRecord:
        with stage([prompt.id], "lossless check" if check_lossless else "record"):
            return self._record_of(prompt, d, check_lossless, sample)

    def _record_of(self, prompt: Prompt, d, check_lossless: bool, sample: int) -> SampleRecord:
        r, max_new, decoding = self.resolved, self.settings.workload.max_new_tokens, self.settings.decoding
        rec = SampleRecord(id=prompt.id, category=prompt.category, prompt_len=len(prompt.input_ids),
                           output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                           emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
        if r.topk > 1:
            rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
            rec.extra["tree_shape_per_cycle"] = d.tree_shape_per_cycle
        if not decoding.greedy:
            rec.extra["sample"] = sample
            if check_lossless:
                from eagle_eval.rules.lossless import cell_counts

                counts = cell_counts(self.speculator.target, decoding, prompt.input_ids, d.output_ids)
                rec.extra["distribution_check"] = counts.as_dict()
        elif check_lossless:
            target = self.speculator.target
            greedy = plain_greedy(target, prompt.input_ids, max_new, self.eos_ids)
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


def load_oracle(settings: Settings, like: Oracle | None = None) -> Oracle:
    """Load the weights of `settings.model` and wire them as the rest of `settings` says; `like`: an oracle
    whose loaded weights are reused when its model settings are the same (a test suite's, a caller's)."""
    if like is not None and like.settings.model == settings.model:
        return wire(settings, like.loaded)
    return wire(settings, load_models(settings.model))


def _decode_policy(settings: Settings, lh: LoadedHead, vocab) -> tuple[object, dict]:
    """The loop's decode policy and its echo: GREEDY at temperature 0, else the accept rule's
    (rules/base.py, which refuses what the engine refuses)."""
    from eagle_eval.loop.policy import GREEDY

    if settings.decoding.greedy:
        return GREEDY, {"rule": "greedy", "temperature": 0.0,
                        "filter_order": "none: argmax (temperature 0, the same under every rule)"}
    from eagle_eval.rules.base import describe, policy_for

    topk = settings.speculation.topk
    return (policy_for(settings.decoding, topk, lh.path or "the draft head", vocab.draft_vocab_size,
                       vocab.vocab_size), describe(settings.decoding, topk))


def wire(settings: Settings, loaded: Loaded) -> Oracle:
    """An oracle over already loaded weights: every setting resolved, the head wired by its kind (heads/kind.py
    `HeadKind.wire`: taps, embedding, vocab map, load-time checks), the decode policy chosen."""
    from eagle_eval.heads.kind import kind, refuse_other_kinds_options
    from eagle_eval.loop.draft import DraftState

    spec_s, target, lh = settings.speculation, loaded.target, loaded.head
    refuse_other_kinds_options(settings, lh.kind, lh.path or "(in memory)")
    wired = kind(lh.kind).wire(settings, lh, target, loaded.weight_checks)
    vocab = wired.vocab_map
    if spec_s.topk > vocab.draft_vocab_size:      # a draft step proposes its top-k of the draft vocab
        raise ConfigError(f"--topk {spec_s.topk}: the head {lh.path or '(in memory)'} drafts from "
                          f"{vocab.draft_vocab_size} tokens, so topk <= {vocab.draft_vocab_size}")
    policy, decoding = _decode_policy(settings, lh, vocab)
    num_draft_tokens, notes = resolve_speculative(spec_s.num_steps, spec_s.topk, spec_s.num_draft_tokens)
    notes = list(wired.notes) + notes
    for n in notes:
        warnings.warn(n, stacklevel=3)
    resolved = Resolved(
        num_steps=spec_s.num_steps, topk=spec_s.topk, num_draft_tokens=num_draft_tokens,
        num_draft_tokens_given=spec_s.num_draft_tokens, eagle_params=spec_s.eagle_params, aux=wired.aux,
        engines=wired.engines, embedding=wired.embedding, vocab_map=vocab, head=wired.info, target=target.info,
        draft_device=str(target.output_device), dtype=loaded.dtype, position_offset=spec_s.position_offset,
        train_acc=wired.train_acc, sanity=wired.sanity, decoding=decoding)
    spec = Speculator(target=target, head=wired.head, embed=wired.embed, aux_hf=wired.aux.hf,
                      position_offset=spec_s.position_offset, policy=policy,
                      draft_state=wired.draft_state or DraftState)
    return Oracle(settings=settings, resolved=resolved, speculator=spec, loaded=loaded, warnings=notes)


def oracle_from_models(model, head, settings: Settings | None = None, tokenizer=None) -> Oracle:
    """An oracle over a target model (a transformers causal LM) and a head held in memory, e.g. random weights
    in a benchmark: no files, so no load-time checks of checkpoints. `settings.model` is not loaded."""
    from types import SimpleNamespace

    settings = settings or Settings()
    target = Target(model)
    head.to(device=target.output_device, dtype=target.model.dtype)
    lh = LoadedHead(head=head, kind=head.config.kind, dialect="in memory", path="", weights_file="",
                    own_embedding=head.embed_tokens is not None,
                    aux_ids_sglang=None, aux_ids_vllm=None, d2t_in_checkpoint=True)
    dtype = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(target.model.dtype, "fp32")
    loaded = Loaded(model=settings.model, dtype=dtype, target=target, head=lh,
                    tokenizer=tokenizer or SimpleNamespace(pad_token_id=0, eos_token_id=None),
                    eos_ids=frozenset(_eos_ids(tokenizer, target.model)) if tokenizer else frozenset())
    return wire(settings, loaded)


def checked_workload(oracle: Oracle, extra: int | None = None, workload=None):
    """The oracle's workload (`load_workload` of its settings, unless given), its prompts refused when the
    target cannot take them (token ids outside its vocabulary, more positions than max_position_embeddings
    with `extra` more; default: a decode's)."""
    from eagle_eval.workload.data import check_prompts

    workload = workload or load_workload(oracle.settings.workload, oracle.tokenizer, oracle.limits(extra))
    check_prompts(workload.first_prompts, oracle.limits(extra), workload.resolved["dataset_source"]["path"])
    return workload

