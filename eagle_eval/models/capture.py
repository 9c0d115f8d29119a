"""Which target tensors feed the draft, and capturing them with forward hooks.

Contract: `resolve_aux_layers` is THE one place where aux-layer ids become tensors (EAGLE3.md
section 1). Internally everything is an HF index i (`HF[i]` = output_hidden_states[i] = input of
decoder layer i, 0 = embedding output). Conventions:

| convention | id k means              | HF index |
|------------|-------------------------|----------|
| `sglang`   | output of layer k       | k + 1 (-1 = embedding output, HF[0]) |
| `vllm`     | input of layer k        | k        |
| `hf`       | output_hidden_states[k] | k        |

`FeatureCapture` hooks the inputs of the decoder layers (`model.model.layers[i]`), so no modeling
code is forked and any decoder stack transformers exposes that way works.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from eagle_eval.errors import UserError

CONVENTIONS = ("sglang", "vllm", "hf")


class AuxLayerError(UserError, ValueError):
    """Aux-layer ids that cannot be used; the message says which and why."""


@dataclass(frozen=True)
class AuxLayers:
    hf: tuple[int, ...]          # HF indices, ascending (the engines concatenate low -> high)
    num_layers: int              # N, decoder layers of the target
    source: str                  # where the ids came from, for the report

    @property
    def sglang(self) -> list[int]:
        return [i - 1 for i in self.hf]

    @property
    def vllm(self) -> list[int]:
        return list(self.hf)

    def as_dict(self) -> dict:
        return {"hf": list(self.hf), "sglang": self.sglang, "vllm": self.vllm, "source": self.source}


def to_hf(ids, convention: str) -> list[int]:
    """Convert ids written in `convention` to HF indices."""
    if convention not in CONVENTIONS:
        raise AuxLayerError(f"aux-layer convention must be one of {CONVENTIONS}, got {convention!r}")
    ids = [int(i) for i in ids]
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


def resolve_aux_layers(num_layers: int, num_aux: int = 3, cli_ids=None, cli_convention: str = "sglang",
                       config_sglang_ids=None, config_vllm_ids=None) -> AuxLayers:
    """Decide which HF indices feed the draft: CLI ids, else the draft config, else the default.

    config_sglang_ids: nested `eagle_config.eagle_aux_hidden_state_layer_ids` (read SGLang-style);
    config_vllm_ids: top-level `eagle_aux_hidden_state_layer_ids` (read vLLM-style). When both are
    present they must name the same tensors.
    """
    if cli_ids is not None:
        hf, source = to_hf(cli_ids, cli_convention), f"command line ({cli_convention} ids {list(cli_ids)})"
    elif config_sglang_ids is not None or config_vllm_ids is not None:
        from_sglang = to_hf(config_sglang_ids, "sglang") if config_sglang_ids is not None else None
        from_vllm = to_hf(config_vllm_ids, "vllm") if config_vllm_ids is not None else None
        if from_sglang is not None and from_vllm is not None and sorted(from_sglang) != sorted(from_vllm):
            raise AuxLayerError(
                f"draft config disagrees with itself: eagle_config.eagle_aux_hidden_state_layer_ids="
                f"{list(config_sglang_ids)} (SGLang-style, HF {sorted(from_sglang)}) but top-level "
                f"eagle_aux_hidden_state_layer_ids={list(config_vllm_ids)} (vLLM-style, HF {sorted(from_vllm)})")
        if from_sglang is not None:
            hf, source = from_sglang, f"draft config eagle_config (sglang ids {list(config_sglang_ids)})"
        else:
            hf, source = from_vllm, f"draft config top level (vllm ids {list(config_vllm_ids)})"
    else:
        hf, source = default_hf_layers(num_layers), "default HF[2], HF[N//2], HF[N-3]"
    out_of_range = [i for i in hf if not 0 <= i < num_layers]
    if out_of_range:
        raise AuxLayerError(
            f"aux layers {hf} (HF indices, from {source}) out of range for a target with "
            f"{num_layers} layers: valid HF indices are 0..{num_layers - 1} "
            f"(SGLang ids -1..{num_layers - 2}, vLLM ids 0..{num_layers - 1})")
    if len(set(hf)) != len(hf):
        raise AuxLayerError(f"aux layers {hf} (HF indices, from {source}) collide: each tensor must be "
                            f"distinct (a target with {num_layers} layers is too shallow for these ids)")
    if len(hf) != num_aux:
        raise AuxLayerError(f"aux layers {hf} (from {source}): the draft head fuses {num_aux} "
                            f"feature block(s), got {len(hf)}")
    return AuxLayers(hf=tuple(sorted(hf)), num_layers=num_layers, source=source)


class FeatureCapture:
    """Forward pre-hooks on the decoder layers that keep the inputs at the chosen HF indices.

    Usage: `with FeatureCapture(layers, aux.hf, device) as cap: model(...); feats = cap.pop()`;
    `pop()` returns [B, T, k*H_t] on `device`, blocks in ascending HF order.
    """

    def __init__(self, layers, hf_indices, device):
        self.layers, self.hf, self.device = layers, tuple(hf_indices), device
        self._store: dict[int, torch.Tensor] = {}
        self._handles = []

    def _hook(self, index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            self._store[index] = hidden.detach()
        return hook

    def __enter__(self):
        for i in self.hf:
            self._handles.append(self.layers[i].register_forward_pre_hook(self._hook(i), with_kwargs=True))
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
