"""A head kind is one record: everything the rest of eagle-eval needs to know of one kind of draft.

Contract: `HeadKind` is what a kind's folder registers (`registry.HEAD_KINDS`, one line each): how its
checkpoint is recognised (`detect`: config.json -> the kind's dialect, or None), loaded strictly (`load`), which
target tensors it taps when its config names none (`default_taps`), its load-time checks of its own (`checks`),
its draft KV bytes per token for `plan` (`kv_bytes`), its head built on the meta device for `plan` (`meta`), what a
report echoes of it (`info`), and how it is wired to a target for one run (`wire`: heads/wired.py Wired, taps,
embedding, vocab map, checks, the loop's drafting state). A kind whose draft lives inside the target's checkpoint
(an MTP layer) is named by a keyword (`--draft mtp`) and read from the loaded target (`load_from_target`). `kind_of(config)` finds the one kind that claims a config.json (two that do
are a bug: refused by name). A new kind is one folder plus one registry line (tests/test_seams.py registers a toy
kind from a test file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.registry import HEAD_KINDS


@dataclass(frozen=True)
class HeadKind:
    name: str                     # the registry name, echoed as the report's head.kind
    description: str              # one line, for messages ("EAGLE-3, a Llama-style layer")
    architectures: str            # the config.json `architectures` it reads, in words (for the refusal message)
    detect: Callable              # (config dict) -> the dialect name of this kind, or None
    load: Callable                # (folder, config_file, config, dialect, allow_unknown_keys) -> io.LoadedHead
    default_taps: Callable        # (target layers N, head config) -> HF indices it taps when no ids are given
    kv_bytes: Callable            # (head config, bytes per element) -> the draft's KV bytes per token
    meta: Callable                # (config, config_file, dialect, tensor names) -> the head on the meta device
    info: Callable                # (head config) -> the kind's own keys of the report's head echo
    wire: Callable                # (settings, loaded head, target, weight-check cache) -> heads/wired.py Wired
    checks: Callable | None = None    # (loaded head, raw config, target text config) -> findings of this kind
    keyword: str | None = None    # `--draft KEYWORD` reads this kind from the TARGET's checkpoint (e.g. "mtp")
    load_from_target: Callable | None = None   # (loaded target, allow_unknown_keys) -> io.LoadedHead, for `keyword`
    # (settings, resolved) -> [(name, description, settings changes)]: the wiring faults of this kind, tried by
    # server-check's hypotheses and diagnose's sweep in place of the aux-layer faults (None: those)
    variants: Callable | None = None
    # (settings, resolved, backend) -> [(name, description, settings changes)]: how a serving engine's build may run
    # this kind otherwise than the oracle (an engine's defect or convention), tried by server-check's hypotheses
    # BESIDE the usual faults; not by diagnose's sweep (they are the server's, not the draft's)
    server_variants: Callable | None = None
    # (target config.json dict, its path, the target's text decoder built on the meta device) -> (head on the meta
    # device, its config, its names: `parameter(checkpoint key)` -> the head's tensor or None,
    # `checkpoint_name(tensor)`, `unused()`): `plan` of a kind read from the target's checkpoint (`keyword`), held as
    # the target's weights are
    meta_from_target: Callable | None = None
    # (loaded head, num_steps) -> (row echo dict, findings): what a chain of num_steps drafts runs with this kind when
    # that depends on num_steps beyond the count (a block drafter: one block of num_steps + 1 rows, against the block
    # it was trained with); `ablate` puts the echo in each row of its sweep and the findings in the variant's sanity
    # (None: nothing to say)
    per_num_steps: Callable | None = None
    # what SGLang's /get_server_info must say it runs for this kind (`speculative_algorithm`, any of them; its
    # arg_groups/speculative_hook.py: EAGLE3 for an EAGLE-3 head, NEXTN (an alias of EAGLE) for MTP, DFLASH)
    sglang_algorithms: tuple[str, ...] = ("EAGLE3",)
    # the SpeculationSettings fields only this kind reads: given (not at their default) with a draft of another kind,
    # they are refused (they would change nothing), as oracle.wire does
    options: tuple[str, ...] = ()


def kind_of(config: dict, config_file: Path) -> tuple[HeadKind, str]:
    """(the kind, its dialect) that claims `config`; refused, naming every kind's architectures, when none does."""
    from eagle_eval.heads.eagle3.config import CheckpointError

    claims = [(k, d) for k in HEAD_KINDS.records() if (d := k.detect(config)) is not None]
    if len(claims) > 1:
        raise CheckpointError(f"{config_file}: claimed by head kinds {', '.join(k.name for k, _ in claims)}: "
                              "a config.json must be one kind's")
    if not claims:
        archs = config.get("architectures")
        raise CheckpointError(f"{config_file}: key 'architectures' = {archs!r}; expected one of "
                              + "; ".join(k.architectures for k in HEAD_KINDS.records()))
    return claims[0]


def keyword_kind(draft: str) -> HeadKind | None:
    """The kind that `--draft DRAFT` names by keyword (it reads the target's own checkpoint), or None."""
    return next((k for k in HEAD_KINDS.records() if k.keyword is not None and k.keyword == draft), None)


def kind(name: str) -> HeadKind:
    """The kind registered as `name`."""
    return HEAD_KINDS.get(name)


def refuse_other_kinds_options(settings, head_kind: str, draft: str) -> None:
    """A kind's own options (HeadKind.options) given for a draft of another kind change nothing: refused, naming
    the option, the draft and its kind."""
    from dataclasses import fields

    from eagle_eval.settings import ConfigError, flag_name

    spec = settings.speculation
    defaults = {f.name: f for f in fields(type(spec))}
    for record in HEAD_KINDS.records():
        if record.name == head_kind:
            continue
        for name in record.options:
            f = defaults[name]
            value = getattr(spec, name)
            if value != f.default:
                raise ConfigError(f"{flag_name(f)} {value}: the draft {draft} is a {kind(head_kind).description} "
                                  f"(kind {head_kind!r}); that option is read only with a {record.description} "
                                  f"(kind {record.name!r}), so it would change nothing")
