"""Which target tensors feed the draft, and capturing them with forward hooks.

Contract: `resolve_aux_layers` is THE one place where aux-layer ids become tensors (docs/eagle3.md
section 1). Internally everything is an HF index i (`HF[i]` = output_hidden_states[i] = input of
decoder layer i, 0 = embedding output). The conventions ids are written in, and what id k means in each, are
ONE table: settings.py `AUX_CONVENTIONS` (the option's choices and help come from it too).

`boundary` ids (gpt-oss-style, e.g. nvidia/gpt-oss-120b-Eagle3-v3's [24, 30, 36] for 36 blocks) are the
hidden-state boundaries: k < N is HF[k], and k = N is the output of L_{N-1} before the final norm, which
HF's output_hidden_states[N] is not (HF[N] is after it). SGLang PR #32334 reads gpt-oss EAGLE-3 ids this
way; vLLM's `EagleModelMixin._maybe_add_hidden_state` (PR #36063) captures id N as the final pre-norm
state (PR #46788 for DeepSeek). Internally index N means that pre-norm state; only `boundary` ids may
name it. With `boundary` and no explicit ids, the draft config's ids are read as boundaries.

`FeatureCapture` hooks the inputs of the text decoder layers (`Target.layers`: `model.model.layers[i]`,
or a multimodal model's, models/text_decoder.py), and the output of the last layer for index N, so no
modeling code is forked and any decoder stack transformers exposes that way works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.errors import UserError
from eagle_eval.settings import AUX_CONVENTIONS

CONVENTIONS = tuple(AUX_CONVENTIONS)


class AuxLayerError(UserError, ValueError):
    """Aux-layer ids that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class AuxLayers:
    hf: tuple[int, ...]          # HF indices, ascending (the engines concatenate low -> high); N = final pre-norm
    num_layers: int              # N, decoder layers of the target
    source: str                  # where the ids came from, for the report

    @property
    def boundary(self) -> list[int]:
        return list(self.hf)

    @property
    def final_prenorm(self) -> bool:
        """True when the last layer's output before the final norm (boundary N) is tapped."""
        return self.num_layers in self.hf

    @property
    def final_postnorm(self) -> bool:
        """True when the last hidden state after the final norm (index N + 1, a head kind's own tap) is tapped."""
        return self.num_layers + 1 in self.hf

    @property
    def sglang(self) -> list[int]:
        return [i - 1 for i in self.hf]

    @property
    def vllm(self) -> list[int]:
        return list(self.hf)

    def as_dict(self) -> dict:
        out = {"hf": list(self.hf), "sglang": self.sglang, "vllm": self.vllm, "boundary": self.boundary,
               "final_prenorm": self.final_prenorm, "source": self.source}
        if self.final_postnorm:
            out["final_postnorm"] = True
        return out


def to_hf(ids, convention: str) -> list[int]:
    """Convert ids written in `convention` to HF indices."""
    if convention not in CONVENTIONS:
        raise AuxLayerError(f"aux-layer convention must be one of {CONVENTIONS}, got {convention!r}")
    wrong = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if wrong:
        raise AuxLayerError(f"aux layer ids must be integers, got {wrong[0]!r} in {list(ids)}")
    ids = list(ids)
    if convention == "sglang":
        bad = [i for i in ids if i < -1]
        if bad:
            raise AuxLayerError(f"SGLang-style aux ids must be >= -1 (-1 = embedding output), got {bad}")
        return [i + 1 for i in ids]
    bad = [i for i in ids if i < 0]
    if bad:
        raise AuxLayerError(f"{convention}-style aux ids must be >= 0, got {bad}")
    return ids


def default_hf_layers(num_layers: int) -> list[int]:
    """Every engine's default taps: HF[2], HF[N//2], HF[N-3]."""
    return [2, num_layers // 2, num_layers - 3]


def _from_config(config_sglang_ids, config_vllm_ids, boundary: bool) -> tuple[list[int], str]:
    """HF indices and source from the draft config's ids (nested read SGLang-style, top level vLLM-style,
    both must agree; with `boundary`, the ids present are read as boundaries, nested first)."""
    if boundary:
        nested = config_sglang_ids is not None
        ids = config_sglang_ids if nested else config_vllm_ids
        where = "eagle_config" if nested else "top level"
        return to_hf(ids, "boundary"), f"draft config {where} read as boundary ids {list(ids)}"
    from_sglang = to_hf(config_sglang_ids, "sglang") if config_sglang_ids is not None else None
    from_vllm = to_hf(config_vllm_ids, "vllm") if config_vllm_ids is not None else None
    if from_sglang is not None and from_vllm is not None and sorted(from_sglang) != sorted(from_vllm):
        raise AuxLayerError(
            f"draft config disagrees with itself: eagle_config.eagle_aux_hidden_state_layer_ids="
            f"{list(config_sglang_ids)} (SGLang-style, HF {sorted(from_sglang)}) but top-level "
            f"eagle_aux_hidden_state_layer_ids={list(config_vllm_ids)} (vLLM-style, HF {sorted(from_vllm)})")
    if from_sglang is not None:
        return from_sglang, f"draft config eagle_config (sglang ids {list(config_sglang_ids)})"
    return from_vllm, f"draft config top level (vllm ids {list(config_vllm_ids)})"


def resolve_aux_layers(num_layers: int, num_aux: int = 3, cli_ids=None, cli_convention: str = "sglang",
                       config_sglang_ids=None, config_vllm_ids=None,
                       default: tuple[list[int], str] | None = None) -> AuxLayers:
    """Decide which HF indices feed the draft: CLI ids, else the draft config, else the default (the head kind's:
    `default` = (HF indices, in words); every engine's HF[2], HF[N//2], HF[N-3] when not given).

    config_sglang_ids: nested `eagle_config.eagle_aux_hidden_state_layer_ids` (read SGLang-style);
    config_vllm_ids: top-level `eagle_aux_hidden_state_layer_ids` (read vLLM-style). When both are
    present they must name the same tensors. `cli_convention="boundary"` without `cli_ids` reads the
    config's ids as boundaries; only boundary ids may name index N (the final pre-norm state).
    """
    boundary = cli_convention == "boundary"
    if cli_ids is not None:
        hf, source = to_hf(cli_ids, cli_convention), f"command line ({cli_convention} ids {list(cli_ids)})"
    elif config_sglang_ids is not None or config_vllm_ids is not None:
        hf, source = _from_config(config_sglang_ids, config_vllm_ids, boundary)
    else:
        boundary = default is not None and num_layers in default[0]      # a kind's own tap before the final norm
        hf, source = default or (default_hf_layers(num_layers), "default HF[2], HF[N//2], HF[N-3]")
        if default is not None and post_norm_index(num_layers) in hf:    # a kind's own tap after the final norm
            boundary = True
            hf = [i for i in hf if i != post_norm_index(num_layers)]
            if len(hf) + 1 != num_aux or any(not 0 <= i <= num_layers for i in hf):
                raise AuxLayerError(f"aux layers {default[0]} (from {source}) out of range or not {num_aux} for a "
                                    f"target with {num_layers} layers")
            return AuxLayers(hf=tuple(sorted(hf)) + (post_norm_index(num_layers),), num_layers=num_layers,
                             source=source)
    top = num_layers if boundary else num_layers - 1
    out_of_range = [i for i in hf if not 0 <= i <= top]
    if out_of_range:
        raise AuxLayerError(
            f"aux layers {hf} (HF indices, from {source}) out of range for a target with "
            f"{num_layers} layers: valid HF indices are 0..{num_layers - 1} "
            f"(SGLang ids -1..{num_layers - 2}, vLLM ids 0..{num_layers - 1}, boundary ids 0..{num_layers}, "
            f"where boundary {num_layers} is the last layer's output before the final norm: "
            "--aux-convention boundary)")
    if len(set(hf)) != len(hf):
        raise AuxLayerError(f"aux layers {hf} (HF indices, from {source}) collide: each tensor must be "
                            f"distinct (a target with {num_layers} layers is too shallow for these ids)")
    if len(hf) != num_aux:
        raise AuxLayerError(f"aux layers {hf} (from {source}): the draft head fuses {num_aux} "
                            f"feature block(s), got {len(hf)}")
    return AuxLayers(hf=tuple(sorted(hf)), num_layers=num_layers, source=source)


def post_norm_index(num_layers: int) -> int:
    """The internal index of the target's last hidden state AFTER its final norm (what the lm_head reads, and what
    HF's output_hidden_states[N] is): N + 1. Only a head kind's own taps name it (an MTP layer reads it); no id
    convention does."""
    return num_layers + 1


class FeatureCapture:
    """Forward pre-hooks on the decoder layers that keep the inputs at the chosen HF indices; index
    N = len(layers) is a forward hook on the last layer keeping its output (before the final norm), and index
    N + 1 (`post_norm_index`) one on `final_norm` keeping its output (after it).

    Usage: `with FeatureCapture(layers, aux.hf, device) as cap: model(...); feats = cap.pop()`;
    `pop()` returns [B, T, k*H_t] on `device`, blocks in ascending HF order.
    """

    def __init__(self, layers, hf_indices, device, final_norm=None):
        self.layers, self.hf, self.device, self.final_norm = layers, tuple(hf_indices), device, final_norm
        self._store: dict[int, torch.Tensor] = {}
        self._handles = []

    def _hook(self, index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._store[index] = hidden.detach()
        return hook

    def _output_hook(self, index):
        def hook(module, args, output):
            self._store[index] = (output[0] if isinstance(output, (tuple, list)) else output).detach()
        return hook

    def __enter__(self):
        n = len(self.layers)
        for i in self.hf:
            if i == post_norm_index(n):
                if self.final_norm is None:
                    raise RuntimeError("the target's hidden state after its final norm was asked for, but no final "
                                       "norm module was given (Target.capture passes it)")
                handle = self.final_norm.register_forward_hook(self._output_hook(i))
            else:
                handle = (self.layers[n - 1].register_forward_hook(self._output_hook(i)) if i == n else
                          self.layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True))
            self._handles.append(handle)
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def pop(self) -> torch.Tensor:
        missing = [i for i in self.hf if i not in self._store]
        if missing:
            raise RuntimeError(f"no hidden state captured at HF indices {missing}")
        feats = torch.cat([self._store[i].to(self.device) for i in self.hf], dim=-1)
        self._store.clear()
        return feats


# -- what each serving engine taps for a head config (docs/eagle3.md section 1) ----------------------------

TAP_ENGINES = ("sglang", "sglang_before_25454", "vllm_v1", "vllm_v2")
ENGINE_NAMES = {"sglang": "SGLang", "sglang_before_25454": "SGLang before PR #25454",
                "vllm_v1": "vLLM (V1 model runner)", "vllm_v2": "vLLM (V2 model runner)"}
# Targets SGLang runs with models/deepseek_v2.py, whose set_eagle3_layers_to_capture applies the +1 only
# when the first nested id is 1 since PR #25454 (merged 2026-05-18; "drop +1 offset on aux layer ids
# when first id != 1"): ids starting at 2 are read as input-of-layer ids. llama.py and the others keep +1.
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")   # a multimodal wrapper: its text_config


def sglang_deepseek_family(model_config) -> bool:
    """True for a target SGLang serves through its deepseek_v2.py model (DeepSeek-V2/V3, Kimi-K2/K2.5)."""
    types = {getattr(model_config, "model_type", None)}
    text = getattr(model_config, "text_config", None)
    if text is not None:
        types.add(getattr(text, "model_type", None))
    return bool(types & set(DEEPSEEK_FAMILY))


@dataclass(frozen=True)
class EngineTaps:
    engine: str                  # one of TAP_ENGINES
    hf: tuple[int, ...] | None   # HF indices the engine feeds the head, ascending; None: it cannot serve these ids
    reads: str                   # which key (or the default) and how it is read

    @property
    def name(self) -> str:
        return ENGINE_NAMES[self.engine]

    def as_dict(self) -> dict:
        return {"engine": self.engine, "name": self.name,
                "hf": list(self.hf) if self.hf is not None else None, "reads": self.reads}


def _valid(hf: list[int], num_layers: int) -> tuple[int, ...] | None:
    return tuple(sorted(hf)) if all(0 <= i < num_layers for i in hf) and len(set(hf)) == len(hf) else None


def engine_taps(num_layers: int, nested_ids=None, top_ids=None, deepseek_family: bool = False) -> dict[str, EngineTaps]:
    """The target tensors each engine feeds a head whose config.json carries these id keys.

    nested_ids: `eagle_config.eagle_aux_hidden_state_layer_ids`; top_ids: top-level
    `eagle_aux_hidden_state_layer_ids`. SGLang reads only the nested key, as output-of-layer ids
    (sglang `models/llama.py` set_eagle3_layers_to_capture adds 1); for a DeepSeek-family target
    (`deepseek_family`, SGLang's `models/deepseek_v2.py`) only when the first id is 1, since PR #25454,
    and `sglang_before_25454` is the older reading (+1 always), reported for those targets only. vLLM
    reads the top-level key as input-of-layer ids; without it, its V1 model runner
    (`v1/worker/gpu_model_runner.py` _get_eagle3_aux_layers_from_config, which the CPU runner inherits)
    reads the nested ids UNCHANGED, one layer low, while its V2 runner ignores the nested key and taps
    the defaults.

    >>> t = engine_taps(8, nested_ids=[1, 3, 4])
    >>> [(e, t[e].hf) for e in TAP_ENGINES if e in t]
    [('sglang', (2, 4, 5)), ('vllm_v1', (1, 3, 4)), ('vllm_v2', (2, 4, 5))]
    >>> [t.hf for t in engine_taps(8, nested_ids=[1, 3, 4], top_ids=[2, 4, 5]).values()]
    [(2, 4, 5), (2, 4, 5), (2, 4, 5)]
    >>> [(e, t.hf) for e, t in engine_taps(8, nested_ids=[2, 4, 6], deepseek_family=True).items()][:2]
    [('sglang', (2, 4, 6)), ('sglang_before_25454', (3, 5, 7))]
    """
    default = tuple(default_hf_layers(num_layers))
    older = None
    if nested_ids is not None:
        plus_one = EngineTaps("sglang", _valid([k + 1 for k in nested_ids], num_layers),
                              f"eagle_config ids {list(nested_ids)} as output-of-layer ids (+1)")
        if deepseek_family and list(nested_ids)[:1] != [1]:
            sglang = EngineTaps("sglang", _valid(list(nested_ids), num_layers),
                                f"eagle_config ids {list(nested_ids)} unchanged: deepseek_v2.py adds 1 only when the "
                                "first id is 1 (PR #25454)")
        else:
            sglang = plus_one
        if deepseek_family:
            older = EngineTaps("sglang_before_25454", plus_one.hf, plus_one.reads + ", always (deepseek_v2.py before "
                                                                                  "PR #25454, May 2026)")
    else:
        sglang = EngineTaps("sglang", default, "no eagle_config ids: the default HF[2], HF[N//2], HF[N-3]"
                            + (" (it ignores the top-level key)" if top_ids is not None else ""))
    if top_ids is not None:
        top = _valid(list(top_ids), num_layers)
        v1 = EngineTaps("vllm_v1", top, f"top-level ids {list(top_ids)} as input-of-layer ids")
        v2 = EngineTaps("vllm_v2", top, f"top-level ids {list(top_ids)} as input-of-layer ids")
    else:
        v1 = (EngineTaps("vllm_v1", _valid(list(nested_ids), num_layers),
                         f"no top-level ids: eagle_config ids {list(nested_ids)} read unchanged as input-of-layer "
                         "ids (one layer low)") if nested_ids is not None else
              EngineTaps("vllm_v1", default, "no ids: the default HF[2], HF[N//2], HF[N-3]"))
        v2 = EngineTaps("vllm_v2", default, "no top-level ids: the default HF[2], HF[N//2], HF[N-3]"
                        + (" (it ignores eagle_config)" if nested_ids is not None else ""))
    return {t.engine: t for t in (sglang, older, v1, v2) if t is not None}


def consistent_config_lines(hf, deepseek_family: bool = False) -> str:
    """The draft config.json lines that make every engine tap HF `hf` (both keys, consistent). For a
    DeepSeek-family target whose lowest tap is not HF[2], SGLang since PR #25454 reads nested ids
    from 2 up unchanged and older SGLang adds 1: no nested list serves both, and the lines say so.

    >>> consistent_config_lines([2, 4, 5])
    '"eagle_aux_hidden_state_layer_ids": [2, 4, 5], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 3, 4]}'
    >>> consistent_config_lines([3, 5, 7], deepseek_family=True).split("; ")[0]
    '"eagle_aux_hidden_state_layer_ids": [3, 5, 7], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [3, 5, 7]}'
    """
    hf = sorted(hf)
    if not deepseek_family or hf[0] == 2:
        return (f'"eagle_aux_hidden_state_layer_ids": {hf}, '
                f'"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {[i - 1 for i in hf]}}}')
    return (f'"eagle_aux_hidden_state_layer_ids": {hf}, "eagle_config": {{"eagle_aux_hidden_state_layer_ids": {hf}}}'
            f"; for SGLang before PR #25454 the nested ids must be {[i - 1 for i in hf]} instead (it adds 1 to "
            "every id; since the PR, DeepSeek-family targets add 1 only when the first id is 1): no nested list "
            "serves both versions unless the lowest tap is HF[2]")
