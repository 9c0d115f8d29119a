"""Checkpoint keys <-> the MTPStack's tensor names (`--draft mtp`), and the writer back (no file read here).

Contract: `KeyMap(family, decoder, N, n)` maps each checkpoint key of the n MTP layers (heads/mtp/layouts.py) to the
stack tensor it is read into (`parameter`) and back (`checkpoint_name`); a quantized module's tensors
(`weight_scale_inv`; `weight_packed`, `weight_scale`, `weight_shape`) map as its `weight` does. `stack_experts`
stacks routed experts stored one per key (the hub form: `mlp.experts.{e}.gate_proj/up_proj/down_proj.weight`, and
held FP8 their `weight_scale_inv`) into the fused tensors of the family's experts module (`gate_up_proj` [E, 2I, H],
`down_proj` [E, H, I]), as transformers' own conversion does; experts the block holds one per key (INT4 packed) are
left as they are. `checkpoint_tensors(stack)` is the writer: the stack's tensors under the names they are read from.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

from eagle_eval.heads.eagle3.config import CheckpointError
from eagle_eval.heads.mtp.layouts import LAYOUTS
from eagle_eval.heads.mtp.model import MTPStack
from eagle_eval.heads.mtp.quant import QUANTIZED_SUFFIXES

EXPERT = re.compile(r"^(?P<head>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\."
                    r"(?P<tensor>weight|weight_scale_inv)$")
# a per-expert tensor -> the fused parameter of transformers' experts module (FP8Experts: its scales alike)
FUSED = {("gate_proj", "weight"): "gate_up_proj", ("up_proj", "weight"): "gate_up_proj",
         ("down_proj", "weight"): "down_proj", ("gate_proj", "weight_scale_inv"): "gate_up_proj_scale_inv",
         ("up_proj", "weight_scale_inv"): "gate_up_proj_scale_inv", ("down_proj", "weight_scale_inv"):
         "down_proj_scale_inv"}


class KeyMap:
    """Checkpoint key <-> MTPStack parameter name for one target (module contract). A quantized module's tensors
    (`weight_scale_inv`; `weight_packed`, `weight_scale`, `weight_shape`) map as its `weight` does."""

    def __init__(self, family: str, decoder: str, num_target_layers: int, n: int):
        self.layout, self.decoder, self.big_n, self.n = LAYOUTS[family], decoder, num_target_layers, n
        self.prefixes = [self.layout.block(decoder, num_target_layers, i) for i in range(n)]
        self._fixed = self._fixed_keys()
        self._inverse = {v: k for k, v in self._fixed.items()}

    def _fixed_keys(self) -> dict[str, str]:
        out, lay = {}, self.layout
        for i in range(1 if lay.shared else self.n):
            where = lay.fusion_prefix or self.prefixes[i]
            for stem, name in zip(lay.fusion, ("emb_norm", "hidden_norm", "proj")):
                out[f"{where}{stem}.weight"] = f"fusions.{i}.{name}.weight"
            out[f"{where}{lay.out_norm}.weight"] = f"out_norms.{i}.weight"
        return out

    def fixed(self) -> dict[str, str]:
        """The fusion and output-norm tensors: checkpoint key -> parameter name."""
        return dict(self._fixed)

    def parameter(self, key: str) -> str | None:
        """The stack tensor a checkpoint key is read into, or None (not an MTP block's or fusion's key)."""
        if key in self._fixed:
            return self._fixed[key]
        module, _, tensor = key.rpartition(".")
        if tensor in QUANTIZED_SUFFIXES and f"{module}.weight" in self._fixed:
            return self._fixed[f"{module}.weight"].removesuffix("weight") + tensor
        i = self.owner(key)
        return None if i is None else f"blocks.{i}.{key[len(self.prefixes[i]):]}"

    def unused(self) -> dict[str, int]:
        """A layer's own embedding / head (no engine uses them): checkpoint key -> layer."""
        return {f"{p}{stem}.weight": i for i, p in enumerate(self.prefixes) for stem in self.layout.unused}

    def owner(self, key: str) -> int | None:
        """The MTP layer a block key belongs to, or None."""
        return next((i for i, p in enumerate(self.prefixes) if key.startswith(p)), None)

    def in_mtp_space(self, key: str) -> bool:
        """Keys of an MTP layer this config does not count (a layer index >= n) or of the shared `mtp.` tree."""
        lay = self.layout
        if lay.shared:
            return key.startswith(lay.fusion_prefix)
        base = lay.block_prefix.split("{")[0].format()
        if lay.block_prefix.startswith("{decoder}"):
            m = re.match(re.escape(self.decoder) + r"\.(\d+)\.", key)
            return m is not None and int(m.group(1)) >= self.big_n
        return key.startswith(base)

    def checkpoint_name(self, name: str, expert: int = 0, proj: str | None = None) -> str:
        """The checkpoint key a parameter is read from (fused experts: expert `expert`'s `proj`, by default its
        gate_proj / down_proj; their FP8 scales alike)."""
        if name in self._inverse:
            return self._inverse[name]
        module, _, tensor = name.rpartition(".")
        if tensor in QUANTIZED_SUFFIXES and f"{module}.weight" in self._inverse:
            return self._inverse[f"{module}.weight"].removesuffix("weight") + tensor
        _, i, rest = name.split(".", 2)
        for fused, first, tensor in ((".experts.gate_up_proj", "gate_proj", "weight"),
                                     (".experts.down_proj", "down_proj", "weight"),
                                     (".experts.gate_up_proj_scale_inv", "gate_proj", "weight_scale_inv"),
                                     (".experts.down_proj_scale_inv", "down_proj", "weight_scale_inv")):
            if rest.endswith(fused):
                return f"{self.prefixes[int(i)]}{rest[: -len(fused)]}.experts.{expert}.{proj or first}.{tensor}"
        return self.prefixes[int(i)] + rest

    def in_checkpoint_words(self, text: str) -> str:
        """`text` with the stack's module and tensor names (blocks.0.mlp..., fusions.0.proj...) as the checkpoint
        names them (a message of the INT4 loader, which speaks of the modules it swaps)."""
        def name(m: re.Match) -> str:
            found = m.group(0)
            for stack_name, key in self._inverse.items():
                module = stack_name.removesuffix(".weight")
                if found == module or found.startswith(module + "."):
                    return key.removesuffix(".weight") + found[len(module):]
            i, rest = m.group(1), found.split(".", 2)[2]
            return self.prefixes[int(i)] + rest if found.startswith("blocks.") else found
        return re.sub(r"\b(?:blocks|fusions|out_norms)\.(\d+)\.[\w.]*\w", name, text)


def checkpoint_tensors(stack: MTPStack, decoder: str = "model.layers") -> dict[str, torch.Tensor]:
    """The writer: an MTPStack's tensors under the checkpoint names they are read from (experts one per key, the
    hub form; a held-quantized stack's tensors as the checkpoint stores them), so that `read_stack` of them gives
    the stack back."""
    cfg = stack.config
    keys = KeyMap(cfg.family, decoder, cfg.target_layers, cfg.num_layers)
    out = {}
    for name, t in stack.state_dict().items():
        t = t.detach()
        if name.endswith((".experts.gate_up_proj", ".experts.gate_up_proj_scale_inv")):
            for e in range(t.shape[0]):
                gate, up = t[e].chunk(2, dim=0)
                out[keys.checkpoint_name(name, e, "gate_proj")] = gate
                out[keys.checkpoint_name(name, e, "up_proj")] = up
        elif name.endswith((".experts.down_proj", ".experts.down_proj_scale_inv")):
            for e in range(t.shape[0]):
                out[keys.checkpoint_name(name, e)] = t[e]
        else:
            out[keys.checkpoint_name(name)] = t
    return {k: v.contiguous().clone() for k, v in out.items()}


def stack_experts(state: dict[str, torch.Tensor], origin: dict[str, str], expected: dict) -> None:
    """Per-expert checkpoint tensors -> the fused parameters the family's experts module holds (in place; held FP8:
    their weight_scale_inv too, gate's scale rows above up's). Experts the block holds one per key (INT4 packed:
    models/quant/int4.py PackedInt4Experts) are left as they are."""
    groups = defaultdict(dict)
    for name in [n for n in state if EXPERT.match(n) and n not in expected]:
        m = EXPERT.match(name)
        groups[(m["head"], m["tensor"])].setdefault(m["proj"], {})[int(m["e"])] = (state.pop(name), origin.pop(name))
    for (head, tensor), projs in sorted(groups.items(), key=lambda g: g[0][1] != "weight"):     # weights first
        gate_up, down = (f"{head}.{FUSED[(p, tensor)]}" for p in ("gate_proj", "down_proj"))
        sample = next(iter(next(iter(projs.values())).values()))[1]
        if gate_up not in expected:
            raise CheckpointError(f"{sample}: per-expert tensor, but the block's experts module has no fused "
                                  f"{gate_up.rsplit('.', 1)[-1]} ({head}): an unexpected tensor for this family")
        count = expected[gate_up][0]
        where = sample.rsplit(".", 3)[0]                      # the checkpoint's "...mlp.experts"
        if gate_up in state or down in state:
            raise CheckpointError(f"{where}: the experts are stored both fused ({where}.gate_up_proj) and one per "
                                  f"key ({sample}): which to read is ambiguous")
        for proj in ("gate_proj", "up_proj", "down_proj"):
            got = projs.get(proj, {})
            missing = [e for e in range(count) if e not in got]
            extra = [e for e in got if e >= count]
            if missing:
                raise CheckpointError(f"missing MTP tensor '{where}.{missing[0]}.{proj}.{tensor}' (experts "
                                      f"{missing[:4]} of {proj} absent; the config has {count} routed experts)")
            if extra:
                raise CheckpointError(f"unexpected MTP tensor '{where}.{extra[0]}.{proj}.{tensor}': the config has "
                                      f"{count} routed experts")
        first = projs["gate_proj"][0][0].dtype
        odd = next((key for p in projs.values() for t, key in p.values() if t.dtype != first), None)
        if odd is not None:
            dtype = next(t.dtype for p in projs.values() for t, key in p.values() if key == odd)
            raise CheckpointError(f"MTP tensor {odd!r} is {str(dtype).removeprefix('torch.')}, the other experts of "
                                  f"{where} {str(first).removeprefix('torch.')}: one experts module holds them in "
                                  "one dtype (experts quantized in part are not held as the target's)")
        fused = [torch.cat([projs["gate_proj"][e][0], projs["up_proj"][e][0]], dim=0) for e in range(count)]
        if len({tuple(t.shape) for t in fused + [projs["down_proj"][e][0] for e in range(count)]}) > 2:
            shapes = sorted({tuple(projs[p][e][0].shape) for p in projs for e in range(count)})
            raise CheckpointError(f"{projs['gate_proj'][0][1]}: the experts' tensors disagree in shape ({shapes})")
        state[gate_up] = torch.stack(fused)
        state[down] = torch.stack([projs["down_proj"][e][0] for e in range(count)])
        origin[gate_up], origin[down] = projs["gate_proj"][0][1], projs["down_proj"][0][1]


def per_expert(name: str, shape: tuple) -> tuple:
    """A fused experts shape as the checkpoint's one-expert tensor shows it (gate_up: [2I, H] -> gate [I, H])."""
    if name.endswith(".experts.gate_up_proj") and len(shape) == 3:
        return (shape[1] // 2, shape[2])
    if name.endswith(".experts.down_proj") and len(shape) == 3:
        return tuple(shape[1:])
    return shape
