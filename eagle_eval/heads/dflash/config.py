"""The block drafter's shape and settings: `DFlashConfig`, frozen and validated (no torch, no file reading here;
dflash/layouts.py reads and writes it as either layout's config.json).

Target layer ids are stored in z-lab's numbering: id l = the residual stream AFTER target decoder layer l
(0-based), which z-lab reads as `hidden_states[l + 1]` (z-lab PyPI 0.1.0 `dflash/model.py`
`extract_context_feature`). `aux_hf` gives the HF `hidden_states` indices l + 1 that the capture hooks
(models/capture.py: the input of decoder layer l + 1); `taps()` says what each engine taps (all the same tensors,
except a vLLM `eagle_aux_hidden_state_layer_ids` key, which wins over the DFlash ids in vLLM 0.32
`eagle3_utils.get_eagle3_aux_layers_from_config`).

Attention per draft layer (`causal`, `window`): full-attention layers see [all context rows ; all block rows] with
NO causal mask inside the block; sliding-window layers are causal with the window (z-lab PyPI
`Qwen3DFlashAttention.__init__`: `is_causal` defaults to "the layer is sliding"; vLLM
`qwen3_dflash._resolve_layer_attention`; SGLang `AttentionType.DECODER`); a top-level `is_causal` overrides every
layer in z-lab PyPI and vLLM alike; the speculators layout makes sliding layers non-causal with
`sliding_window_non_causal: true`, full layers never causal (speculators `create_anchor_block_mask_mod`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

ZLAB, SPECULATORS = "z-lab", "speculators"
LAYOUTS = (ZLAB, SPECULATORS)
DFLASH, DFLASH2 = "dflash", "dflash2"
ARCHITECTURES = {"DFlashDraftModel": DFLASH, "DFlash2DraftModel": DFLASH2}
SPECULATORS_ARCHITECTURES = ("DFlashSpeculator",)
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULT_BLOCK_SIZE = 16              # z-lab PyPI DFlashDraftModel.__init__ and SGLang, when block_size is absent
# what `--topk K > 1` is told (state.py, batched.py, wire.py)
TREES_REFUSED = ("--topk {topk}: a block drafter (DFlash) proposes one chain per forward and the engines verify it "
                 "as a chain (vLLM dflash and SGLang DFLASH force topk 1); use --topk 1")


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default ids when a config has none (z-lab `build_target_layer_ids`, the same in SGLang
    `dflash_utils.build_target_layer_ids`): one draft layer taps N // 2; else L ids spread evenly over 1..N-3,
    rounded half to even as Python's round does.

    >>> default_target_layer_ids(36, 5), default_target_layer_ids(6, 1)
    ([1, 9, 17, 25, 33], [3])
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DFlashConfig:
    kind: str                                  # DFLASH or DFLASH2
    layout: str                                # ZLAB or SPECULATORS (the checkpoint's)
    hidden_size: int                           # H (= the target's: context features and, in z-lab, embeddings)
    num_hidden_layers: int                     # L draft layers
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int                            # V, the target vocabulary the config was written for
    block_size: int                            # B trained: [anchor, mask x (B - 1)]
    mask_token_id: int                         # m, a row of the embedding table
    target_layer_ids: tuple[int, ...]          # z-lab numbering: after target layer l (0-based)
    draft_vocab_size: int | None = None        # V_d of an own lm_head (speculators); None = V
    target_hidden_size: int | None = None      # H_t of the tapped states; None = H
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 32768
    hidden_act: str = "silu"
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()          # per draft layer FULL / SLIDING; () = all FULL
    sliding_window: int | None = None          # W of the sliding layers
    causal: tuple[bool, ...] = ()              # per draft layer; () = the default (sliding layers causal)
    num_target_layers: int | None = None       # N the config was written for (only defaults the ids)
    input_embedding_scale: float = 1.0         # z-lab PyPI multiplies the raw embedding rows
    output_multiplier: float = 1.0             # z-lab PyPI `compute_logits`
    final_logit_softcapping: float | None = None
    conv_kernel_size: int | None = None        # DFlash2: taps of the grouped dynamic causal convolution
    conv_group_size: int | None = None         # DFlash2: channels per group
    selector_rank: int | None = None           # DFlash2: rank of the candidate selector's codebooks
    selector_top_k: int | None = None          # DFlash2: candidates per slot
    vllm_aux_ids: tuple[int, ...] | None = None  # a top-level eagle_aux_hidden_state_layer_ids (HF indices)
    ids_defaulted: bool = field(default=False, compare=False)   # target_layer_ids built from num_target_layers

    def __post_init__(self):
        n = self.num_hidden_layers
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL,) * n)
        if not self.causal:
            object.__setattr__(self, "causal", tuple(t == SLIDING for t in self.layer_types))
        for name, value in (("draft_vocab_size", self.vocab_size), ("target_hidden_size", self.hidden_size)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        self._validate()

    def _validate(self) -> None:
        n = self.num_hidden_layers
        if self.kind not in (DFLASH, DFLASH2) or self.layout not in LAYOUTS:
            raise ValueError(f"kind {self.kind!r} / layout {self.layout!r}: expected {DFLASH}/{DFLASH2}, {LAYOUTS}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is odd: RoPE rotates pairs")
        if self.hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act={self.hidden_act!r}: the Qwen3 draft layer is SwiGLU ('silu')")
        if len(self.layer_types) != n or not set(self.layer_types) <= {FULL, SLIDING}:
            raise ValueError(f"layer_types={list(self.layer_types)}: expected {n} entries of {FULL!r} / {SLIDING!r}")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError(f"layer_types names {SLIDING!r} layers but no window is set (sliding_window counts only "
                             "with use_sliding_window: true, transformers Qwen3Config); vLLM refuses such a draft "
                             "(qwen3_dflash._resolve_layer_attention) and z-lab PyPI runs it causal with no window")
        if len(self.causal) != n:
            raise ValueError(f"causal: {len(self.causal)} entries for {n} draft layers")
        if self.block_size < 2:
            raise ValueError(f"block_size={self.block_size}: a block drafts B - 1 tokens, so B >= 2")
        ids = self.target_layer_ids
        if not ids or any(i < 0 for i in ids) or any(b <= a for a, b in zip(ids, ids[1:])):
            raise ValueError(f"target_layer_ids={list(ids)}: expected distinct ids >= 0 in ascending order (z-lab "
                             "concatenates the states in list order, vLLM and SGLang in layer order)")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id={self.mask_token_id} is outside the vocabulary 0..{self.vocab_size - 1}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} > vocab_size={self.vocab_size}")
        for name in ("input_embedding_scale", "output_multiplier"):
            if not math.isfinite(getattr(self, name)) or getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)}: a positive finite number is expected")
        self._validate_dflash2()

    def _validate_dflash2(self) -> None:
        given = {k: getattr(self, k) for k in DFLASH2_KEYS if getattr(self, k) is not None}
        if self.kind == DFLASH:
            if given:
                raise ValueError(f"{sorted(given)}: DFlash2 settings on a DFlash (architectures DFlashDraftModel) "
                                 "draft; z-lab builds no convolution or selector for it")
            return
        missing = [k for k in DFLASH2_KEYS if k not in given]
        if missing:
            raise ValueError(f"a DFlash2 draft needs {missing} (z-lab PyPI DFlash2DraftModel.__init__)")
        if self.layout != ZLAB:
            raise ValueError("DFlash2 in the speculators layout: speculators (c05b95b) has no DFlash2 model, so its "
                             "tensor names are unknown; only z-lab's layout is read")
        if self.hidden_size % self.conv_group_size:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of conv_group_size="
                             f"{self.conv_group_size}")
        if self.selector_top_k > self.vocab_size:
            raise ValueError(f"selector_top_k={self.selector_top_k} > vocab_size={self.vocab_size}")

    # -- what the capture and the engines read ------------------------------------------------------------
    @property
    def num_aux(self) -> int:
        return len(self.target_layer_ids)

    @property
    def aux_hf(self) -> tuple[int, ...]:
        """HF `hidden_states` indices the capture taps: l + 1 for each z-lab id l (models/capture.py)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    def taps(self) -> dict:
        """The tapped tensors in every convention (all HF index l + 1 unless a vLLM eagle key says otherwise)."""
        hf = list(self.aux_hf)
        return {"zlab_target_layer_ids": list(self.target_layer_ids), "hf": hf,
                "vllm_aux_layer_ids": list(self.vllm_aux_ids) if self.vllm_aux_ids is not None else hf,
                "sglang_layers_to_capture": hf, "speculators_aux_hidden_state_layer_ids": hf}

    def window(self, layer: int) -> int | None:
        """The sliding window of draft layer `layer`, None for a full-attention layer."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    @property
    def engine_block(self) -> dict:
        """The engine settings that serve the trained block: vLLM num_speculative_tokens = B - 1 (its block is
        1 + K rows, unchecked against block_size), SGLang --speculative-num-draft-tokens = B."""
        return {"zlab_block_size": self.block_size, "vllm_num_speculative_tokens": self.block_size - 1,
                "sglang_num_draft_tokens": self.block_size}

    def as_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "ids_defaulted"}
        return {**out, "taps": self.taps(), "engine_block": self.engine_block}
