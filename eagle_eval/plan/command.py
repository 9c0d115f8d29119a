"""`eagle-eval plan`: does a target (and its head) fit these GPUs, where, and with what room for the KV
cache? Answered before renting them: no weight is read; a folder holding config.json (and its safetensors
index, if any) is enough.

Contract: `make_plan(PlanRequest)` -> Plan, a JSON-ready record; `render_plan(plan)` the terminal text;
`plan.fits` the verdict (the CLI's exit 0, else 1). What is counted:
- every tensor of the target as held (plan/model.py: bf16, FP8 blocks with their scales, INT4 packed
  words with their scales), by part (embeddings, attention, dense MLP, routed and shared experts, router,
  norms, lm_head, other), and the head (built on the meta device, in the target's dtype) on the GPU that
  holds the lm_head, as oracle.py places it; a head read from the target's checkpoint (`--draft mtp`) held as
  the target's weights are, per module (plan/model.py `hold_like_target`: INT4 packed, FP8 with its scales,
  the rest in the dtype), its record saying how (`weights`) with its parts;
- the KV cache per token as transformers stores it: MLA targets (DeepSeek family) the latent
  (kv_lora_rank + qk_rope_head_dim per layer) when the installed transformers caches it
  (`DeepseekV3Attention.expand_kv`, transformers >= the version with #47761: 5.24 does), else the expanded
  K and V; other targets 2 x kv_heads x head_dim (a sliding-window layer at most its window); the head's
  own cache (one layer: K and V per head, expanded for an MLA head). Each layer's cache goes with the
  layer: it rides on the layer as a meta tensor while accelerate places the layers;
- per GPU, a reserve (`--reserve`, the CUDA context and activations) plus one layer's attention working
  set at the full context (MLA expands the latent into per-head K and V for the layer it computes);
- the placement accelerate chooses (models/placement.py) over `gpus` x `gpu_memory` minus those.
The verdict: fits with the least room left on any GPU, or does not fit, with what would: the fewest GPUs
of this size that fit, the bytes a CPU offload would hold, the longest context that fits. Every size the
advice names is positive and read back by `units.parse_size`, which reads the sizes given too. Refused as
bad input (PlanError): a config whose sizes are out of range or left to transformers' defaults
(plan/model.py), a --reserve that leaves nothing of a GPU, a --json that cannot be written.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from eagle_eval.models.files import read_json_file
from eagle_eval.plan.model import PlanError, head_meta, held_meta_model, hold_like_target
from eagle_eval.models.placement import infer_placement, quiet_accelerate
from eagle_eval.settings import PLAN_LIMITS
from eagle_eval.units import parse_size, spell_size

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
KV, HEAD = "_plan_kv", "_plan_head"           # the meta tensors that carry a layer's cache and the head
MAX_GPUS = PLAN_LIMITS["gpus"][1]
PARTS = (("routed experts", ".mlp.experts."), ("shared experts", ".shared_experts."), ("router", ".mlp.gate."),
         ("attention", ".self_attn."), ("dense MLP", ".mlp."), ("embeddings", "embed_tokens."),
         ("lm_head", "lm_head."))


from eagle_eval.settings import PlanOptions as PlanRequest  # noqa: E402  (the plan's settings, declared once)


@dataclass
class Plan:
    target: dict
    parts: list[dict]
    head: dict | None
    kv: dict
    gpus: list[dict]
    fits: bool
    verdict: str
    offloaded_bytes: int = 0
    suggestions: list[str] = field(default_factory=list)
    checkpoint: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _gpus(req: PlanRequest) -> tuple[int, int]:
    """(GPU count, bytes per GPU): as given, else what this machine has."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    count = req.gpus if req.gpus is not None else visible
    if count == 0:
        raise PlanError("no GPU is visible here: give --gpus N and --gpu-memory SIZE "
                        "(e.g. --gpus 8 --gpu-memory 141GB)")
    if req.gpu_memory is not None:
        return count, parse_size(req.gpu_memory, "--gpu-memory", PlanError)
    if visible == 0:
        raise PlanError("--gpu-memory is needed: no GPU is visible here to read it from")
    return count, min(torch.cuda.get_device_properties(i).total_memory for i in range(visible))


def _part(name: str, tensor) -> str:
    if name.endswith(KV) or name.endswith(HEAD):
        return ""
    padded = "." + name
    for part, key in PARTS:
        if key in padded:
            return part
    return "norms" if tensor.dim() == 1 and "norm" in name else "other"


def _format(named: list) -> str:
    """A part's storage: 'int4 packed + scales', 'fp8 + block scales', else its weights' dtypes."""
    tensors = [t for n, t in named if not n.endswith("_shape")]
    kinds = sorted({str(t.dtype).removeprefix("torch.") for t in tensors if t.dim() >= 2})
    if "int32" in kinds:
        return "int4 packed + scales" + ("" if kinds == ["bfloat16", "int32"] else f" ({', '.join(kinds)})")
    if "float8_e4m3fn" in kinds:
        return "fp8 + block scales" + (f" ({', '.join(k for k in kinds if k not in ('float8_e4m3fn', 'float32'))})"
                                       if set(kinds) - {"float8_e4m3fn", "float32"} else "")
    return ", ".join(kinds) or ", ".join(sorted({str(t.dtype).removeprefix("torch.") for t in tensors}))


def _tensors(model):
    """(name, tensor) for every parameter and buffer once (a tied tensor once)."""
    seen = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            yield name, t


def _values(name: str, t) -> int:
    """The weights a tensor stands for: 8 per packed int32 word, none for a scale or a shape."""
    if name.endswith("_packed"):
        return t.numel() * 8
    return 0 if name.endswith(("_scale", "_scale_inv", "_shape")) else t.numel()


def parts_of(model) -> list[dict]:
    """The model's checkpoint tensors (parameters, persistent buffers; not RoPE tables) by part: format,
    weights (a packed int32 word counts its 8 values; scales none) and bytes as held."""
    groups: dict[str, list] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if (part := _part(name, t)):
            groups.setdefault(part, []).append((name, t))
    order = [p for p, _ in PARTS] + ["norms", "other"]
    return [{"part": p, "format": _format(groups[p]),
             "parameters": sum(_values(n, t) for n, t in groups[p]),
             "bytes": sum(t.numel() * t.element_size() for _, t in groups[p])} for p in order if p in groups]


def _kv_layer_bytes(model, decoder, dtype: torch.dtype) -> tuple[list[tuple[int, int | None]], str, int]:
    """Per decoder layer (bytes per token, sliding window or None); how it is stored; and the per-token
    bytes of one layer's attention working set (K and V as attention reads them)."""
    cfg = decoder.config
    size = torch.tensor([], dtype=dtype).element_size()
    heads = cfg.num_attention_heads
    if getattr(cfg, "kv_lora_rank", None):
        qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        expanded = heads * (qk + cfg.v_head_dim) * size
        attn = decoder.layers[0].self_attn
        if hasattr(type(attn), "expand_kv"):
            per, how = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * size, (
                f"MLA latent: kv_lora_rank {cfg.kv_lora_rank} + qk_rope_head_dim {cfg.qk_rope_head_dim} per layer "
                f"(transformers caches the latent and expands it per forward)")
        else:
            per, how = expanded, f"MLA expanded K and V: {heads} heads x ({qk} + {cfg.v_head_dim}) per layer"
        return [(per, None)] * len(decoder.layers), how, expanded
    from transformers import DynamicCache

    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    per = 2 * kv_heads * head_dim * size
    layers = DynamicCache(config=cfg).layers
    windows = [getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
               for layer in layers] if len(layers) == len(decoder.layers) else [None] * len(decoder.layers)
    how = f"K and V: 2 x {kv_heads} kv heads x {head_dim} per layer"
    return [(per, w) for w in windows], how, 2 * heads * head_dim * size


def _head_bytes(req: PlanRequest, dtype, folder, decoder, held) -> tuple[dict | None, int, int]:
    """(the head's record, its bytes, its KV bytes per token); a kind named by keyword (`--draft mtp`) is built from
    the target's config.json and text decoder (`HeadKind.meta_from_target`) and held as the target's weights are
    (plan/model.py `hold_like_target`: its record's `weights` says how)."""
    if not req.draft:
        return None, 0, 0
    from eagle_eval.heads.kind import keyword_kind, kind
    from eagle_eval.models.hub import HEAD_FILES, model_folder

    by_keyword = keyword_kind(req.draft)
    if by_keyword is not None:
        config_file = folder / "config.json"
        with torch.device("meta"):
            head, cfg, names = by_keyword.meta_from_target(read_json_file(config_file, PlanError), config_file,
                                                           decoder)
        head, kind_name = head.to(dtype), by_keyword.name
        how = hold_like_target(head, held, folder, dtype, req.quantized == "held", names)
    else:       # a head's weights are small and their header tells whether it ships its own embedding table
        head, cfg, kind_name = head_meta(model_folder(req.draft, req.draft_revision, "--draft", HEAD_FILES), dtype)
    size = torch.tensor([], dtype=dtype).element_size()
    weights = sum(t.numel() * t.element_size() for t in head.state_dict(keep_vars=True).values())   # as parts_of
    per = kind(kind_name).kv_bytes(cfg, size)               # the head kind's draft KV (heads/kind.py)
    record = {"path": req.draft, "kind": kind_name, "bytes": weights, "kv_per_token": per}
    if by_keyword is not None:
        record.update(weights=how, parts=parts_of(head))
    return record, weights, per


def _attach(model, decoder_path: str, layer_kv: list[int], head_total: int, lm_head: str) -> None:
    """Each layer's KV bytes (and the head's bytes + KV) as meta tensors on the modules they go with."""
    def meta(nbytes: int):        # a parameter, not a buffer: accelerate keeps buffers on the GPU when offloading
        return torch.nn.Parameter(torch.empty(nbytes, dtype=torch.uint8, device="meta"), requires_grad=False)

    layers = model.get_submodule(decoder_path).layers
    for layer, nbytes in zip(layers, layer_kv):
        layer.register_parameter(KV, meta(nbytes))
    if head_total:
        model.get_submodule(lm_head).register_parameter(HEAD, meta(head_total))


def _owner(name: str, device_map: dict):
    """The device of the device_map entry that owns tensor `name` (its longest prefix), or None."""
    while name not in device_map:
        if not name:
            return None
        name = name.rpartition(".")[0]
    return device_map[name]


def _per_device(model, device_map: dict) -> dict:
    """device -> {"weights", "kv", "head"} bytes."""
    out: dict = {}
    for name, t in _tensors(model):
        dev = _owner(name, device_map)
        slot = out.setdefault(dev, {"weights": 0, "kv": 0, "head": 0})
        what = "kv" if name.endswith(KV) else "head" if name.endswith(HEAD) else "weights"
        slot[what] += t.numel() * t.element_size()
    return out


class _Sizer:
    """The meta model with its cache riding on the layers, re-sized for a context and placed."""

    def __init__(self, model, decoder, lm_head: str, kv_layers, head_bytes: int, head_kv: int, batch: int):
        self.model, self.decoder, self.lm_head, self.batch = model, decoder, lm_head, batch
        self.kv_layers, self.head_bytes, self.head_kv = kv_layers, head_bytes, head_kv
        self.path = decoder.path.partition(".")[2]

    def place(self, context: int, gpus: int, per_gpu: int, working: int, cpu: int | None = None):
        kv = [per * min(context, window or context) * self.batch for per, window in self.kv_layers]
        _attach(self.model, self.path, kv, self.head_bytes + self.head_kv * context * self.batch, self.lm_head)
        budget = {i: max(per_gpu - working * context * self.batch, 0) for i in range(gpus)}
        if cpu is not None:
            budget["cpu"] = cpu
        device_map = infer_placement(self.model, budget)
        return device_map, _per_device(self.model, device_map)


def _fits(per_device: dict) -> bool:
    return all(isinstance(d, int) for d in per_device)


def make_plan(req: PlanRequest) -> Plan:
    """The plan for `req` (module contract)."""
    from eagle_eval.models.hub import CONFIG_FILES, model_folder
    from eagle_eval.models.text_decoder import find_text_decoder

    folder = model_folder(req.target_name, req.revision, "--target", CONFIG_FILES)
    if not folder.is_dir():
        raise PlanError(f"{req.target_name}: target folder does not exist (nor a Hugging Face model id: org/name)")
    gpus, gpu_bytes = _gpus(req)
    reserve = parse_size(req.reserve, "--reserve", PlanError, allow_zero=True)
    if reserve >= gpu_bytes:
        raise PlanError(f"--reserve {req.reserve} leaves nothing of each GPU's {human(gpu_bytes)} "
                        f"({'--gpu-memory ' + req.gpu_memory if req.gpu_memory else 'the visible GPUs'})")
    dtype = DTYPES[req.dtype]
    held = held_meta_model(folder, dtype, req.quantized == "held", req.trust_remote_code,
                           context_given=req.max_context is not None)
    model = held.model
    decoder = find_text_decoder(model, str(folder), PlanError)
    context = req.max_context if req.max_context is not None else getattr(decoder.config, "max_position_embeddings",
                                                                           None)
    if not context:
        raise PlanError(f"{folder / 'config.json'}: no max_position_embeddings; give --max-context N")
    head, head_bytes, head_kv = _head_bytes(req, dtype, folder, decoder, held)
    kv_layers, kv_how, working = _kv_layer_bytes(model, decoder, dtype)
    lm_head = next(n for n, m in model.named_modules() if m is decoder.output_embeddings)
    parts = parts_of(model)
    sizer = _Sizer(model, decoder, lm_head, kv_layers, head_bytes, head_kv, req.batch)
    per_gpu = gpu_bytes - reserve
    with quiet_accelerate():
        device_map, used = sizer.place(context, gpus, per_gpu, working)
    rows = [{"gpu": i, "capacity": gpu_bytes, "reserve": reserve, "working_set": working * context * req.batch,
             **used.get(i, {"weights": 0, "kv": 0, "head": 0})} for i in range(gpus)]
    for r in rows:
        r["left"] = r["capacity"] - r["reserve"] - r["working_set"] - r["weights"] - r["kv"] - r["head"]
    fits = _fits(used)
    total_kv = sum(per * min(context, w or context) for per, w in kv_layers) * req.batch
    plan = Plan(
        target={"path": str(folder), "built": held.built, "dtype": req.dtype, "quantized": req.quantized,
                "formats": held.formats, "notes": held.notes, "layers": len(decoder.layers),
                "bytes": sum(p["bytes"] for p in parts), "device_map": {k: v for k, v in device_map.items()}},
        parts=parts, head=head, checkpoint=held.checkpoint,
        kv={"how": kv_how, "per_token": sum(p for p, _ in kv_layers), "head_per_token": head_kv,
            "context": context, "batch": req.batch, "total": total_kv + head_kv * context * req.batch,
            "working_set_per_token": working},
        gpus=rows, fits=fits, verdict="",
        offloaded_bytes=sum(v["weights"] + v["kv"] + v["head"] for d, v in used.items() if not isinstance(d, int)))
    if fits:
        left = min(r["left"] for r in rows)
        plan.verdict = (f"fits: {gpus} x {human(gpu_bytes)}, {human(left)} left on the fullest GPU "
                        f"(context {context} x batch {req.batch})")
    else:
        plan.verdict = (f"does not fit {gpus} x {human(gpu_bytes)}: {human(plan.offloaded_bytes)} would not "
                        f"be placed on a GPU (context {context} x batch {req.batch})")
        with quiet_accelerate():
            plan.suggestions = _suggestions(sizer, context, gpus, per_gpu, working, plan)
    return plan


def _suggestions(sizer: _Sizer, context: int, gpus: int, per_gpu: int, working: int, plan: Plan) -> list[str]:
    """What would fit: more GPUs of this size, a CPU offload, a shorter context."""
    out = []
    need = plan.target["bytes"] + plan.kv["total"] + (plan.head or {}).get("bytes", 0)
    room = per_gpu - working * context * sizer.batch
    if room <= 0:
        out.append(f"no number of GPUs of this size: one layer's attention working set at context {context} "
                   f"({human(working * context * sizer.batch)}) and the reserve take a whole GPU")
    else:
        n = max(gpus + 1, math.ceil(need / room))                                   # a lower bound
        while n <= MAX_GPUS and not _fits(sizer.place(context, n, per_gpu, working)[1]):
            n += 1
        out.append(f"{n} GPUs of this size" if n <= MAX_GPUS else f"more than {MAX_GPUS} GPUs of this size")
    out.append(_offload(sizer, context, gpus, per_gpu, working))
    _, empty = sizer.place(1, gpus, per_gpu, 0)
    if _fits(empty):
        low, high = 1, context
        while high - low > max(1, context // 256):          # the longest context that still fits, to 1/256
            mid = (low + high) // 2
            low, high = (mid, high) if _fits(sizer.place(mid, gpus, per_gpu, working)[1]) else (low, mid)
        out.append(f"a context of at most {low} tokens (x batch {sizer.batch}) on {gpus} GPUs")
    else:
        out.append(f"no context fits {gpus} GPUs: the weights alone need more")
    return out


def _offload(sizer: _Sizer, context: int, gpus: int, per_gpu: int, working: int) -> str:
    """The CPU offload that would hold the rest: `--max-memory` with the target's weights that placement puts
    on each GPU and on the CPU (sizes rounded up, as `units.parse_size` reads them; a GPU given nothing is
    left out, since --max-memory takes no zero)."""
    if per_gpu - working * context * sizer.batch <= 0:
        return "no CPU offload: the attention working set and the reserve take a whole GPU"
    _, used = sizer.place(context, gpus, per_gpu, working, cpu=1 << 60)
    weights = {d: v["weights"] for d, v in used.items() if v["weights"] > 0}
    on_cpu = sum(v["weights"] + v["kv"] + v["head"] for d, v in used.items() if d == "cpu")
    if "cpu" not in weights:
        return "no CPU offload: what does not fit is not the target's weights"
    budget = ",".join(f"{d}={spell_size(weights[d], up=True)}" for d in [*range(gpus), "cpu"] if d in weights)
    return (f"CPU offload: --max-memory {budget} (the target's weights where that placement puts them) holds "
            f"{human(on_cpu)} on the CPU, copied to a GPU at every forward (docs/quantized.md: the cost per cycle)")


def check_json_path(path: str) -> None:
    """`--json PATH` can be written: its folder exists and PATH is not a folder (checked before the plan)."""
    p = Path(path)
    if p.is_dir():
        raise PlanError(f"--json {path}: is a folder; give a file name")
    if not p.parent.is_dir():
        what = "is a file, not a folder" if p.parent.exists() else "does not exist"
        raise PlanError(f"--json {path}: {p.parent} {what}")


def write_plan_json(plan: Plan, path: str) -> None:
    """The plan as JSON at `path`, whole or not at all (a temporary file renamed); a PlanError when it cannot
    be written."""
    import json
    import os

    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps(plan.as_dict(), indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise PlanError(f"--json {path}: cannot be written ({exc.strerror or exc})") from None


def gib(n: int) -> float:
    return round(n / 2**30, 1)


def human(n: int) -> str:
    """Bytes for a reader: '131.3 GiB', '600.0 KiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def render_plan(plan: Plan) -> str:
    t = plan.target
    lines = [f"target  {t['path']}: {t['built']}, {t['layers']} layers, {t['dtype']}, "
             f"quantized weights {t['quantized']}"]
    if t["formats"]:
        f = t["formats"]
        lines.append(f"quant   {f['method']}: {f['held']} (from {f['source']})")
    lines.append("")
    lines.append(f"{'part':<16}{'format':<30}{'weights':>18}{'held':>12}")
    for p in plan.parts:
        lines.append(f"{p['part']:<16}{p['format']:<30}{p['parameters']:>18,}{human(p['bytes']):>12}")
    lines.append(f"{'target total':<46}{sum(p['parameters'] for p in plan.parts):>18,}{human(t['bytes']):>12}")
    if plan.head:
        lines.append(f"{'head (' + plan.head['kind'] + ')':<64}{human(plan.head['bytes']):>12}")
        if plan.head.get("weights"):
            lines.append(f"  weights {plan.head['weights']}")
    kv = plan.kv
    lines += ["", f"KV cache  {kv['per_token']:,} bytes per token ({kv['how']})"
              + (f" + head {kv['head_per_token']:,}" if kv["head_per_token"] else "")
              + f"; context {kv['context']} x batch {kv['batch']}: {human(kv['total'])}"]
    cols = ("capacity", "reserve", "working_set", "weights", "kv", "head", "left")
    lines += ["", f"{'gpu':<5}" + "".join(f"{c.replace('working_set', 'attn ws'):>11}" for c in cols)]
    for r in plan.gpus:
        lines.append(f"{r['gpu']:<5}" + "".join(f"{human(r[c]):>11}" for c in cols))
    if plan.checkpoint and plan.checkpoint["not_held"]:
        held = ", ".join(f"{k} ({n} tensors)" for k, n in plan.checkpoint["not_held"].items())
        lines += ["", f"in the checkpoint, not held: {held}"]
    lines += ["", ("FITS  " if plan.fits else "DOES NOT FIT  ") + plan.verdict]
    lines += [f"  would fit: {s}" for s in plan.suggestions]
    return "\n".join(lines)
