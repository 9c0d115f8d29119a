"""Options that would change nothing are refused, naming why: the rule `cli.build` applies to a settings
file's keys (a key the command does not use, at a value other than its default, is refused) applied to what
each option does in the setting asked for.

Contract: `refuse_no_effect(decodings, options, topks, responses)` raises a ConfigError naming every option
given (a value other than its field's default) that has no effect on any of the profiles or decodes the
command will make (`decodings`: the decoding settings of each; `topks`: their tree widths):
- the sampling settings (--top-k, --top-p, --min-p, --accept-rule, the SGLang thresholds, --seed) when every
  decode is greedy (temperature 0: argmax under every rule, nothing drawn);
- --samples-per-prompt when every decode is greedy, or with --responses (one given continuation per prompt);
- --rollouts when no decode samples its drafts (temperature > 0 under vllm-probabilistic or sglang-rs);
- --expectation-floor when no decode is a sampled profile under a one-hot rule (vllm, sglang, eagle);
- --draft-tokens-grid when every profile is a chain (topk 1), or a value of it fits no tree profiled.
`refuse_idle_variants(settings, named, temperatures)` does the same for `ablate --vary`: a value equal to
the base's, a variant given twice, a sampling setting varied where every profile of it is greedy.
Nothing here loads a model: the command refuses before any weight is read or any file written.
"""

from __future__ import annotations

from dataclasses import fields, replace

from eagle_eval.settings import GROUPS, ConfigError, DecodingSettings, Settings, flag_name

# temperature > 0 only: what chooses among the tokens (filters, rule, thresholds) and the random stream
SAMPLING = ("top_k", "top_p", "min_p", "accept_rule", "accept_threshold_single", "accept_threshold_acc", "seed")


def _sampled_drafts(name: str) -> bool:
    """The accept rule samples its drafts (its record, registry.RULES: imported only when the question is asked)."""
    from eagle_eval.registry import RULES

    return name in RULES and RULES.get(name).sampled_drafts


def _field(cls, name: str):
    return next((f for f in fields(cls) if f.name == name), None)


def _given(obj, name: str) -> bool:
    """`obj.name` is set to something other than its field's default."""
    f = _field(type(obj), name)
    return f is not None and getattr(obj, name) != f.default


def _said(obj, name: str) -> str:
    value = getattr(obj, name)
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
    return f"{flag_name(_field(type(obj), name))} {shown}"


def _greedy_reason(decodings: list[DecodingSettings]) -> str:
    return ("temperature 0 is greedy decoding (the argmax under every rule, nothing drawn)" if len(decodings) == 1
            else "every profile is at temperature 0 (greedy: the argmax under every rule, nothing drawn)")


def no_effect(decodings: list[DecodingSettings], options=None, topks: tuple[int, ...] = (1,),
              responses: bool = False) -> list[str]:
    """'--FLAG VALUE ...: why it changes nothing' for each option given that changes nothing (module docstring)."""
    sampled = [d for d in decodings if not d.greedy]
    out = []
    base = decodings[0]
    if not sampled:
        out += [f"{_said(base, n)} has no effect: {_greedy_reason(decodings)}" for n in SAMPLING if _given(base, n)]
    if options is None:
        return out
    if _given(options, "samples_per_prompt"):
        if not sampled:
            out.append(f"{_said(options, 'samples_per_prompt')} has no effect: {_greedy_reason(decodings)}; one "
                       "continuation per prompt")
        elif responses:
            out.append(f"{_said(options, 'samples_per_prompt')} has no effect: --responses gives one continuation "
                       "per prompt")
    rules = sorted({d.accept_rule for d in sampled})
    if _given(options, "rollouts") and not any(_sampled_drafts(d.accept_rule) for d in sampled):
        why = _greedy_reason(decodings) if not sampled else (
            f"--accept-rule {', '.join(rules)} drafts deterministically (the draft's argmax or top-k tree); "
            "rollouts draw sampled drafts, which only vllm-probabilistic and sglang-rs make")
        out.append(f"{_said(options, 'rollouts')} has no effect: {why}")
    if _given(options, "expectation_floor") and not any(not _sampled_drafts(d.accept_rule) for d in sampled):
        why = (_greedy_reason(decodings) + "; the greedy profile is exact" if not sampled else
               f"--accept-rule {', '.join(rules)} samples its drafts; the floor cuts only the one-hot rules' "
               "expansion (vllm, sglang, eagle)")
        out.append(f"{_said(options, 'expectation_floor')} has no effect: {why}")
    if getattr(options, "draft_tokens_grid", None) and all(k == 1 for k in topks):
        out.append(f"{_said(options, 'draft_tokens_grid')} has no effect: every profile is a chain (topk 1), whose "
                   "verify holds num_steps + 1 tokens; the grid sizes trees (--topk > 1, or ablate's --topk-grid)")
    return out


def refuse_no_effect(decodings: list[DecodingSettings], options=None, topks: tuple[int, ...] = (1,),
                     responses: bool = False) -> None:
    """ConfigError naming every option `no_effect` finds (nothing is loaded or written before)."""
    found = no_effect(decodings, options, topks, responses)
    if found:
        raise ConfigError("; ".join(found) + ". Remove " + ("it" if len(found) == 1 else "them"))


def refuse_unfit_grid(topks: tuple[int, ...], options) -> None:
    """Every --draft-tokens-grid value (and, for ablate's trees, some value of it or --num-draft-tokens) must
    fit a tree profiled: D <= K + (S-1) K^2 + 1 for some topk K > 1 of `topks` and num_steps S <= --max-steps."""
    from eagle_eval.loop.tree import pool_size

    trees = [k for k in topks if k > 1]
    grid = options.draft_tokens_grid or ()
    if not trees or not grid:
        return
    most = max(pool_size(options.max_steps, k) + 1 for k in trees)
    unfit = [d for d in grid if d > most]
    if unfit:
        raise ConfigError(f"--draft-tokens-grid {', '.join(map(str, unfit))}: no tree profiled has that many nodes "
                          f"(topk {', '.join(map(str, trees))} and num_steps <= --max-steps {options.max_steps}: "
                          f"at most K + (S-1) K^2 + 1 = {most}); give values <= {most} or raise --max-steps")


def refuse_idle_variants(settings: Settings, named: list[tuple[str, dict]], temperatures: list) -> None:
    """ablate --vary: each variant changes what is profiled (module docstring). named: [(text, overrides)],
    the base ("base", {}) first; temperatures: the --temperature-grid (None: each variant's own)."""
    seen: dict = {}
    for text, overrides in named[1:]:
        key = tuple(sorted((k, repr(v)) for k, v in overrides.items()))
        if key in seen:
            raise ConfigError(f"--vary {text!r} repeats --vary {seen[key]!r}: the same profile twice; give it once")
        seen[key] = text
        same = [k for k, v in overrides.items() if getattr(getattr(settings, _group(k)), k) == v]
        if same:
            raise ConfigError(f"--vary {text!r}: {', '.join(same)} is the base's own value (a variant equal to the "
                              "base changes nothing, so no timing could tell them apart); vary it to another value")
        variant = settings.with_(**overrides)
        decodings = [variant.decoding if t is None else replace(variant.decoding, temperature=t) for t in temperatures]
        if all(d.greedy for d in decodings):
            idle = [k for k in overrides if k in SAMPLING]
            if idle:
                raise ConfigError(f"--vary {text!r}: {', '.join(idle)} has no effect: every profile of this variant "
                                  "is at temperature 0 (greedy: the argmax under every rule, nothing drawn)")


def _group(name: str) -> str:
    return next(g for g, cls in GROUPS.items() if _field(cls, name) is not None)
