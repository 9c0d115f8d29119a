"""The target model: loading with accelerate placement and its forward with an explicit KV cache.

Contract: `Target` wraps a transformers causal LM, or a multimodal model run on text, whose text
decoder `models/text_decoder.py` finds (`model.model.layers`, `model.model.language_model.layers`,
`model.language_model.model.layers`); it exposes `forward(ids, cache)` returning float32 logits and
`rollback(cache, length)`, the one cache operation the speculative loop needs. It knows nothing about
draft heads.
"""

from __future__ import annotations

import inspect
import pickle
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.errors import UserError
from eagle_eval.models.files import check_safetensors, read_json_file, said_by
from eagle_eval.models.text_decoder import find_text_decoder

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SMALL_CPU_MODEL = 100_000_000     # parameters; below this a CPU target runs on one thread


class TargetError(UserError, ValueError):
    """A target that cannot be loaded or used; the message names the path or setting."""


MEMORY_DEVICES = ("cpu", "disk", "mps")     # accelerate's named devices besides GPU indices (get_max_memory)


def parse_max_memory(text: str | None) -> dict | None:
    """'0=70GiB,1=70GiB,cpu=200GiB' -> {0: 70 * 2**30, 1: 70 * 2**30, 'cpu': 200 * 2**30}: bytes per device, each
    size read by `units.parse_size` (the one reading of a size; a lower-case `b`, which accelerate reads as
    bits, and a bare number are refused there) and handed to accelerate as bytes, so that accelerate never
    reads the text its own way. Unknown devices, a device given twice and sizes <= 0 are refused."""
    if text is None:
        return None
    from eagle_eval.units import parse_size

    if not str(text).strip():
        raise TargetError("--max-memory is empty; give DEVICE=SIZE pairs, e.g. 0=70GiB,cpu=100GiB")
    out = {}
    for part in str(text).split(","):
        if "=" not in part:
            raise TargetError(f"--max-memory: {part!r} is not DEVICE=SIZE (e.g. 0=70GiB,cpu=100GiB)")
        dev, size = (s.strip() for s in part.split("=", 1))
        key = int(dev) if dev.isdigit() else dev
        if not isinstance(key, int) and key not in MEMORY_DEVICES:
            hint = f" (write {dev.partition(':')[2]}=...)" if dev.startswith("cuda:") else ""
            raise TargetError(f"--max-memory: device {dev!r} is not a GPU index or one of "
                              f"{', '.join(MEMORY_DEVICES)}{hint}")
        if key in out:
            raise TargetError(f"--max-memory: device {dev!r} is given twice")
        out[key] = parse_size(size, "--max-memory", TargetError, said=f"--max-memory: {dev}={size}")
    return out


def _check_max_memory(max_memory: dict | None, device_map: str) -> None:
    """--max-memory steers accelerate's placement (--device-map auto) over devices that exist; anywhere else
    it would be ignored: refuse rather than drop it. Without a GPU it places over the CPU and the disk."""
    if max_memory is None:
        return
    if device_map != "auto":
        raise TargetError(f"--max-memory applies to --device-map auto (accelerate's placement); with --device-map "
                          f"{device_map} the whole model goes there and the limits would be ignored")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = sorted(k for k in max_memory if isinstance(k, int))
    if gpus and count == 0:
        raise TargetError(f"--max-memory names GPU {gpus[-1]}, but this machine has no CUDA device (give cpu=SIZE: "
                          "the rest is offloaded to the disk)")
    if gpus and gpus[-1] >= count:
        raise TargetError(f"--max-memory names GPU {gpus[-1]}; this machine has GPUs 0..{count - 1}")


def _check_weights(folder: Path) -> None:
    """A target's weights are safetensors: a folder holding only pickles (pytorch_model*.bin) is refused.
    transformers would read them with torch.load(weights_only=True) (modeling_utils.load_state_dict, after
    check_torch_load_is_safe); eagle-eval unpickles no target file at all, and says so in one line."""
    if any(folder.glob("*.safetensors")):
        return
    pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.bin.index.json"))
    if pickles:
        raise TargetError(f"{folder}: holds only pickle weights ({', '.join(pickles[:3])}"
                          f"{', ...' if len(pickles) > 3 else ''}), no .safetensors; eagle-eval never unpickles a "
                          "target: convert it once where you trust the file (transformers: from_pretrained, then "
                          "save_pretrained(..., safe_serialization=True))")


def device_map_arg(device_map: str):
    if device_map == "auto":
        return "auto"
    if device_map == "cpu" or device_map.startswith("cuda"):
        return {"": device_map}
    raise TargetError(f"--device-map must be auto, cpu or cuda:N, got {device_map!r}")


@dataclass(frozen=True)
class TargetInfo:
    path: str
    architecture: str                     # the loaded class (a multimodal wrapper's own name)
    num_layers: int                       # N, layers of the text decoder
    hidden_size: int
    vocab_size: int
    dtype: str
    devices: tuple[str, ...]
    max_positions: int | None = None      # the text config's max_position_embeddings
    quantization: dict | None = None     # models/quant.quantization_info: None for an unquantized checkpoint
    decoder: str = "model.model.layers"   # where the text decoder layers are (models/text_decoder.py)
    text_architecture: str | None = None  # the text config's model_type when it is not the model's own
    sliding_window: int | None = None     # the smallest sliding window among the KV cache's layers
    rope_switch: int | None = None        # longrope's original_max_position_embeddings (longrope_switch)
    experts: dict | None = None           # mixture of experts: transformers' experts implementation (probe_experts)


def longrope_switch(cfg) -> int | None:
    """The position past which a longrope target's frequencies change, or None: transformers'
    `dynamic_rope_update` gives every position of a forward the long factors once the forward's largest
    position passes `original_max_position_embeddings`, the short ones otherwise. Past it a verify (drafts
    ahead of the accepted text), a batch (another row's positions) or a teacher-forced pass picks other
    frequencies than plain decoding does. ("dynamic" RoPE changes only past max_position_embeddings, a
    bound already kept.) Per-layer-type parameters (a dict of dicts) give their smallest switch."""
    params = getattr(cfg, "rope_parameters", None) or {}
    sets = list(params.values()) if params and all(isinstance(v, dict) for v in params.values()) else [params]
    switches = [p.get("original_max_position_embeddings", getattr(cfg, "original_max_position_embeddings", None))
                for p in sets if isinstance(p, dict) and p.get("rope_type") == "longrope"]
    switches = [int(n) for n in switches if n is not None]
    return min(switches) if switches else None


class Target:
    """A loaded target. Supported layouts: a causal LM (`model.model.layers`: Llama, Qwen, DeepSeek,
    ...), a transformers multimodal model run on text (`model.model.language_model.layers`: LLaVA,
    Mistral3, Qwen2.5-VL, Qwen3-VL, ...) and a wrapper holding a causal LM as `language_model`
    (`model.language_model.model.layers`: Kimi-K2.5's remote code). `layers` are the text decoder's
    (aux hooks go there), `text_config` its settings, `input_embeddings` / `output_embeddings` its
    token table and lm_head. Anything else is a `TargetError` naming what was followed."""

    def __init__(self, model, path: str = ""):
        self.model = model.eval()
        text = find_text_decoder(model, path or type(model).__name__, TargetError)
        self.layers, self.text_config = text.layers, text.config
        self.input_embeddings, self.output_embeddings = text.input_embeddings, text.output_embeddings
        self.final_norm = text.final_norm
        self.num_layers = len(self.layers)
        self.input_device = execution_device(self.input_embeddings, model)
        self.output_device = execution_device(self.output_embeddings, model)
        params = inspect.signature(model.forward).parameters
        # transformers renamed past_key_values -> cache (5.2x keeps the old name as deprecated)
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        cfg, own_type = self.text_config, getattr(model.config, "model_type", None)
        windows = [layer.sliding_window for layer in self.new_cache().layers if getattr(layer, "is_sliding", False)]
        self.info = TargetInfo(
            path=path, architecture=type(model).__name__, num_layers=self.num_layers,
            hidden_size=cfg.hidden_size, vocab_size=self.output_embeddings.weight.shape[0],
            dtype=str(model.dtype).replace("torch.", ""),
            devices=placed_devices(model),
            max_positions=getattr(cfg, "max_position_embeddings", None), decoder=f"{text.path}.layers",
            text_architecture=cfg.model_type if cfg is not model.config and cfg.model_type != own_type else None,
            sliding_window=min(windows) if windows else None, rope_switch=longrope_switch(cfg),
            experts=probe_experts(model, self.input_device))

    def capture(self, hf_indices, device):
        """The forward hooks that keep the target's hidden states at `hf_indices` (models/capture.py; index N + 1 =
        after the final norm)."""
        from eagle_eval.models.capture import FeatureCapture

        return FeatureCapture(self.layers, hf_indices, device, self.final_norm)

    def new_cache(self):
        from transformers import DynamicCache
        return DynamicCache(config=self.text_config)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache, position_ids=None, attention_mask=None,
                upcast: bool = True) -> torch.Tensor:
        """ids [B, T] appended after the cache -> logits [B, T, V] (float32 unless `upcast=False`)."""
        kwargs = {self._cache_kw: cache, "use_cache": True}
        if position_ids is not None:
            kwargs["position_ids"] = position_ids.to(self.input_device)
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask.to(self.input_device)
        out = self.model(input_ids=ids.to(self.input_device), **kwargs)
        return out.logits.float() if upcast else out.logits

    @staticmethod
    def cache_len(cache) -> int:
        return cache.get_seq_length()

    @staticmethod
    def rollback(cache, length: int) -> None:
        """Keep the first `length` positions. crop(-n) removes n tokens in transformers 5.17..5.24
        (a positive argument meant 'crop to' in 5.17 and raises in 5.24)."""
        _check_recurrent(cache)
        remove = cache.get_seq_length() - length
        if remove < 0:
            raise ValueError(f"cannot roll the target cache forward ({cache.get_seq_length()} -> {length})")
        if remove:
            _check_window(cache, "roll back")
            cache.crop(-remove)
        if cache.get_seq_length() != length:
            raise RuntimeError(f"target cache rollback to {length} left {cache.get_seq_length()} entries")

    @staticmethod
    def keep(cache, start: int, indices: list[int]) -> None:
        """Keep the first `start` positions plus the entries at start + indices (in that order):
        after a tree verify, the accepted path. Works on the key/value tensors of each layer."""
        total = cache.get_seq_length()
        for layer in cache.layers:
            if getattr(layer, "is_sliding", False):
                raise TargetError(f"tree verification (--topk > 1) needs full-attention KV layers; this target has "
                                  f"sliding-window layers (window {layer.sliding_window}): run it with --topk 1, "
                                  "or `eagle-eval profile` for trees")
            if not hasattr(layer, "keys"):
                raise RuntimeError(f"tree verification needs full-attention KV layers, got {type(layer).__name__}")
            idx = torch.tensor(indices, device=layer.keys.device) + start
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, idx)], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, idx)], dim=-2)
        if cache.get_seq_length() != start + len(indices):
            raise RuntimeError(f"target cache keep left {cache.get_seq_length()} entries, expected "
                               f"{start + len(indices)} (of {total})")

    def tree_mask(self, tree_mask: torch.Tensor, start: int) -> torch.Tensor:
        """[D, D] ancestor mask -> additive [1, 1, D, start + D] mask over cache + tree."""
        d = tree_mask.shape[0]
        allowed = torch.cat([torch.ones(d, start, dtype=torch.bool), tree_mask], dim=1)
        dtype = self.model.dtype
        mask = torch.zeros(1, 1, d, start + d, dtype=dtype)
        return mask.masked_fill(~allowed, torch.finfo(dtype).min)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.input_embeddings(ids.to(self.input_device))


PROBE_ERRORS = (RuntimeError, NotImplementedError, ValueError, TypeError, AssertionError)


def probe_experts(model, device) -> dict | None:
    """A mixture-of-experts target's experts implementation, checked on this machine: transformers runs the experts
    through `experts_implementation` ("grouped_mm" by default in 5.x, `integrations/moe.py`), whose fast kernel can
    fail where the GPU or the build does not support it (on an H100 with torch 2.11: "RuntimeError: cutlass cannot
    initialize" at the first forward). One forward of one token, now: if it fails, the experts switch to "eager"
    (`set_experts_implementation`) and the reason is kept, as the CUDA-graph fallback keeps its own. None for a
    target whose class has no switchable experts."""
    if not getattr(type(model), "_can_set_experts_implementation", lambda: False)():
        return None
    requested = model.get_experts_implementation()
    current = requested.get("") or "eager"
    if current == "eager":
        return {"implementation": "eager", "requested": requested, "fallback": None}

    def probe():
        with torch.no_grad():
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False)

    try:
        probe()
        return {"implementation": current, "requested": requested, "fallback": None}
    except PROBE_ERRORS as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
    model.set_experts_implementation("eager")
    probe()                                        # eager fails only where the model itself cannot run
    return {"implementation": "eager", "requested": requested,
            "fallback": f"experts_implementation {current!r} failed on a one-token probe forward ({reason}); "
                        "the experts run eager"}


def _device(dev) -> torch.device:
    return torch.device(f"cuda:{dev}" if isinstance(dev, int) else dev)


def execution_device(module, model) -> torch.device:
    """Where `module` computes: its accelerate hook's execution device when it has one (an offloaded
    module's weights are on the meta device between forwards), else its weight's device; a meta weight
    without a hook of its own computes on the placement's first GPU (the CPU without one)."""
    hook = getattr(module, "_hf_hook", None)
    if getattr(hook, "execution_device", None) is not None:
        return _device(hook.execution_device)
    if module.weight.device.type != "meta":
        return module.weight.device
    gpus = sorted(d for d in (getattr(model, "hf_device_map", None) or {}).values() if isinstance(d, int))
    return _device(gpus[0] if gpus else "cpu")


def placed_devices(model) -> tuple[str, ...]:
    """The devices the target's weights live on: its accelerate placement ("cpu" and "disk" included) when
    it has one, else its parameters' devices."""
    placement = getattr(model, "hf_device_map", None)
    if placement:
        return tuple(sorted({str(_device(d)) if d != "disk" else "disk" for d in placement.values()}))
    return tuple(sorted({str(p.device) for p in model.parameters()}))


def _check_window(cache, what: str) -> None:
    """A sliding-window KV layer drops its oldest entries once full, after which it cannot be cropped
    (transformers' DynamicSlidingWindowLayer): refuse, naming the window, rather than fail inside it."""
    for layer in cache.layers:
        window = getattr(layer, "sliding_window", None) if getattr(layer, "is_sliding", False) else None
        if window is not None and layer.get_seq_length() >= window and not getattr(layer, "record_past", False):
            raise TargetError(f"cannot {what} the target cache: {layer.get_seq_length()} positions fill a "
                              f"sliding-window KV layer (window {window}); the loop runs such targets only below "
                              "the window (shorter prompts or --max-new-tokens), `profile` at any length")


LINEAR_ATTENTION = "linear_attention"          # a layer type of transformers' hybrid models (Gated DeltaNet)
RECURRENT_REFUSAL = ("linear-attention layers (Gated DeltaNet: Qwen3-Next, Qwen3.5) keep a recurrent state that the "
                     "loop cannot roll back to the accepted prefix; `eagle-eval profile` measures such a target (one "
                     "teacher-forced pass, no rollback)")


def _check_recurrent(cache) -> None:
    if any(type(layer).__name__.startswith("LinearAttention") for layer in cache.layers):
        raise TargetError(f"cannot roll back the target cache: {RECURRENT_REFUSAL}")


def has_recurrent_layers(config) -> bool:
    """True for a text config with linear-attention (recurrent) layers, which the loop cannot roll back."""
    return LINEAR_ATTENTION in (getattr(config, "layer_types", None) or ())


def _check_device(device_map: str) -> None:
    if device_map.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = device_map.partition(":")[2]
        if count == 0:
            raise TargetError(f"--device-map {device_map}: this machine has no CUDA device (use auto or cpu)")
        if index and (not index.isdigit() or int(index) >= count):
            raise TargetError(f"--device-map {device_map}: CUDA devices here are cuda:0..cuda:{count - 1}")


AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModel")


def auto_class_name(config: dict, trust_remote_code: bool) -> str:
    """The transformers Auto class that builds the whole model with its lm_head. AutoModelForCausalLM,
    or AutoModelForImageTextToText for a multimodal model transformers registers only there (LLaVA,
    Mistral3, Qwen2.5-VL, Qwen3-VL; through AutoModelForCausalLM, Gemma3 loads whole and Llama-4 as its
    text-only Llama4ForCausalLM). Remote code: the first of AUTO_CLASSES its `auto_map` names (a
    multimodal wrapper may map only AutoModel)."""
    from transformers.models.auto import modeling_auto

    auto_map = config.get("auto_map") or {}
    if trust_remote_code and any(name in auto_map for name in AUTO_CLASSES):
        return next(name for name in AUTO_CLASSES if name in auto_map)
    kind = config.get("model_type")
    if (kind not in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and kind in modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES):
        return "AutoModelForImageTextToText"
    return "AutoModelForCausalLM"


def _check_files(folder: Path, trust_remote_code: bool) -> dict:
    """config.json and the weights files, read before transformers does (its errors name no file);
    returns config.json."""
    config = read_json_file(folder / "config.json", TargetError, "a Hugging Face model config (a JSON object)")
    if "auto_map" in config and not trust_remote_code:
        raise TargetError(f"{folder / 'config.json'}: key 'auto_map' asks for the folder's own Python code; "
                          "pass --trust-remote-code if you trust it")
    for file in sorted(folder.glob("*.safetensors")):
        check_safetensors(file, TargetError)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = read_json_file(index, TargetError, "a safetensors index").get("weight_map") or {}
        missing = sorted({f for f in shards.values() if not (folder / f).is_file()})
        if missing:
            raise TargetError(f"{index}: key 'weight_map' names {missing[0]}, which is not in {folder}")
    return config


def _check_fp8_blocks(folder: Path) -> None:
    """Refuse a block-FP8 checkpoint with partial blocks where transformers would dequantize it on load
    (no GPU of compute capability >= 8.9 here): its dequantize-on-load infers the block from the grid."""
    from eagle_eval.models.quant.info import partial_fp8_blocks

    if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
        return                                # held in FP8; models/quant/fp8.py uses the configured block
    partial = partial_fp8_blocks(folder)
    if partial:
        raise TargetError(
            f"{folder}: {len(partial)} FP8 weight(s) are not a multiple of quantization_config.weight_block_size, "
            f"first {partial[0]}; transformers dequantizes FP8 on load on this machine (no GPU with FP8) and "
            "takes the block as shape // grid, wrong for a partial last block. Load this target on a GPU "
            "(compute capability >= 8.9), where it stays FP8 and eagle-eval dequantizes with the configured block")


def load_target(path: str, dtype: str = "bf16", device_map: str = "auto", max_memory: str | None = None,
                trust_remote_code: bool = False, fp8_matmul: str = "auto", revision: str | None = None):
    """Load a Hugging Face folder, or a model id from the HF cache (models/hub.py; `revision`), of a causal LM
    or a multimodal model run on text (`auto_class_name`), and its tokenizer -> (Target, tokenizer). A block-FP8
    checkpoint held in FP8 runs its matmuls as `fp8_matmul` says (models/quant/fp8.py)."""
    import transformers
    from transformers import AutoTokenizer

    from eagle_eval.models.hub import model_folder
    from eagle_eval.models.quant.fp8 import resolve_fp8_matmul
    from eagle_eval.models.quant.info import checkpoint_quantization_config

    folder = model_folder(path, revision, "--target")
    if folder.exists() and not folder.is_dir():
        raise TargetError(f"{path}: is a file; the target is a Hugging Face model folder (config.json, weights, "
                          "tokenizer)")
    if not folder.is_dir():
        raise TargetError(f"{path}: target folder does not exist (nor a Hugging Face model id: org/name)")
    if not (folder / "config.json").is_file():
        raise TargetError(f"{folder / 'config.json'}: missing (not a Hugging Face model folder)")
    if dtype not in DTYPES:
        raise TargetError(f"--dtype must be one of {list(DTYPES)}, got {dtype!r}")
    dm = device_map_arg(device_map)
    _check_device(device_map)
    budget = parse_max_memory(max_memory)
    _check_max_memory(budget, device_map)
    if dm == "auto" and not torch.cuda.is_available() and budget is None:
        dm = {"": "cpu"}
    auto_class = auto_class_name(_check_files(folder, trust_remote_code), trust_remote_code)
    _check_weights(folder)
    _check_fp8_blocks(folder)
    quant_config = checkpoint_quantization_config(folder)
    int4 = None
    if quant_config is not None:                 # the INT4 rooms load only for a quantized checkpoint
        from eagle_eval.models.quant.int4 import int4_scheme
        int4 = int4_scheme(quant_config, folder / "config.json")
    offload = offload_folder() if budget is not None else None     # a --max-memory placement may reach "disk"
    try:
        if int4 is not None:                  # held packed: models/quant/int4_load.py, not transformers' bf16 copy
            from eagle_eval.models.quant.int4_load import load_packed_model
            model = load_packed_model(folder, auto_class, int4, DTYPES[dtype], dm, budget, trust_remote_code, offload)
        else:
            model = getattr(transformers, auto_class).from_pretrained(
                str(folder), dtype=DTYPES[dtype], device_map=dm, max_memory=budget, offload_folder=offload,
                trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, ImportError,
            pickle.UnpicklingError) as exc:
        if isinstance(exc, UserError):
            raise
        raise said_by(f"{folder}: transformers ({auto_class}) cannot load the target model", exc, TargetError) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                  trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError, AttributeError, ImportError) as exc:
        raise said_by(f"{folder}: no usable tokenizer (tokenizer.json / tokenizer_config.json expected)", exc,
                      TargetError) from exc
    if tokenizer is None or isinstance(tokenizer, bool):
        raise TargetError(f"{folder}: no tokenizer files (tokenizer.json / tokenizer_config.json expected)")
    if all(p.device.type in ("cpu", "meta") for p in model.parameters()) and model.num_parameters() < SMALL_CPU_MODEL:
        # batch-1 decoding of a small model: intra-op threads only add synchronisation (measured
        # 10 s with one thread vs 2 min with two on a busy 2-core machine, bundled pair, 8 prompts)
        torch.set_num_threads(1)
    fp8 = resolve_fp8_matmul(model, fp8_matmul)
    return with_quantization(Target(model, str(folder)), folder, fp8), tokenizer


def with_quantization(target: Target, folder: Path, fp8_matmul: dict | None = None) -> Target:
    """Record the checkpoint's quantization (method, bits, blocks, what stayed quantized, which FP8 or
    INT4 matmul runs it) in `target.info`."""
    from dataclasses import replace

    from eagle_eval.models.quant.info import checkpoint_quantization_config, quantization_info

    int4_matmul = None
    if checkpoint_quantization_config(folder) is not None:
        from eagle_eval.models.quant.int4_load import int4_matmul_info
        int4_matmul = int4_matmul_info(target.model)
    info = quantization_info(target.model, folder, fp8_matmul, int4_matmul)
    target.info = replace(target.info, quantization=info)
    return target


_OFFLOAD_FOLDERS: list[str] = []


def offload_folder() -> str:
    """A fresh folder for accelerate's disk offload, removed when the process exits."""
    import atexit
    import shutil
    import tempfile

    if not _OFFLOAD_FOLDERS:
        atexit.register(lambda: [shutil.rmtree(f, ignore_errors=True) for f in _OFFLOAD_FOLDERS])
    _OFFLOAD_FOLDERS.append(tempfile.mkdtemp(prefix="eagle-eval-offload-"))
    return _OFFLOAD_FOLDERS[-1]
