"""How each engine runs a family's MTP layer, as one record per (family, engine), and what each engine refuses
(no torch).

Contract: `Convention` is the five choices that change an MTP draft's numbers: the input (the target's last hidden
state after or before its final norm), position-0 embedding masking, what a draft step hands the next (the layer's
output after or before its output norm), the fusion order, and which layer drafts which step. `CONVENTIONS[family]
[engine]` is what vLLM 0.32, SGLang 0.5.23 and transformers 5.25 do (docs/mtp.md cites each file);
`--mtp-convention` picks the engine (default vLLM). `check_steps` refuses what the engine refuses, with the
engine's own words, and returns the warnings it logs.

What each engine does, per family (the sources, read not copied; vLLM paths under `vllm/`, SGLang's under
`sglang/srt/`, transformers' under `transformers/`):

| family | engine | input | position-0 mask | chain | layers |
|---|---|---|---|---|---|
| DeepSeek | vLLM | post | yes | post | layer 0 every step (V1) |
| GLM | vLLM | post | yes | **pre** | layer 0 every step (V1) |
| Qwen3-Next / 3.5 | vLLM | post | no | post | layer 0 every step |
| MiMo | vLLM | **pre** | yes | post | layer 0 every step |
| all | SGLang | post | MiMo only | post | its one layer every step |
| DeepSeek, GLM | transformers | post | no | post | layer j drafts token j |
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eagle_eval.heads.mtp.layouts import DEEPSEEK, GLM, LAYOUTS, MIMO, QWEN3_5, QWEN3_NEXT

ENGINES = ("vllm", "sglang", "transformers")
FIRST, PER_LAYER = "first", "per-layer"


@dataclass(frozen=True)
class Convention:
    engine: str                   # whose convention ("vllm" | "sglang" | "transformers"), or "planted" (diagnose)
    input: str                    # "post" | "pre": the target's last hidden state after / before its final norm
    mask_position0: bool          # a row at position 0 embeds zeros instead of its token
    chain: str                    # "post" | "pre": a draft step hands the next its output after / before the output norm
    hidden_first: bool            # the fusion concatenates [hidden, embedding] (else [embedding, hidden])
    schedule: str                 # FIRST: layer 0 drafts every step; PER_LAYER: layer j drafts step j (one pass each)
    sources: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {"engine": self.engine, "input": self.input, "mask_position0": self.mask_position0,
                "chain": self.chain, "fusion_order": "hidden first" if self.hidden_first else "embedding first",
                "layers": {FIRST: "layer 0 drafts every step", PER_LAYER: "layer j drafts token j"}[self.schedule],
                "sources": list(self.sources)}

    def differs(self, other: "Convention") -> list[str]:
        """The choices where `other` is not this convention, in words."""
        keys = ("input", "mask_position0", "chain", "hidden_first", "schedule")
        return [k for k in keys if getattr(self, k) != getattr(other, k)]


VLLM_V1 = "v1/spec_decode/llm_base_proposer.py (V1 passes no spec_step_idx: layer 0 every step)"
VLLM_FILES = {DEEPSEEK: "model_executor/models/deepseek_mtp.py", GLM: "model_executor/models/glm4_moe_mtp.py",
              QWEN3_NEXT: "model_executor/models/qwen3_next_mtp.py", QWEN3_5: "model_executor/models/qwen3_5_mtp.py",
              MIMO: "model_executor/models/mimo_mtp.py"}
SGLANG_FILES = {DEEPSEEK: "models/deepseek_nextn.py", GLM: "models/glm4_moe_nextn.py",
                QWEN3_NEXT: "models/qwen3_next_mtp.py", QWEN3_5: "models/qwen3_5_mtp.py", MIMO: "models/mimo_mtp.py"}
SGLANG_CHAIN = "speculative/eagle_worker_v2.py draft_forward (chains the returned post-norm hidden states)"
SGLANG_INPUT = "layers/logits_processor.py _get_hidden_states_to_store (the tensor the lm_head reads: post-norm)"
HF_FILES = ("modeling_layers.py MtpLayer / MtpModel (post_norm output chained, no mask)",
            "generation/candidate_generator.py MTPCandidateGenerator (hidden_states[-1]: post-norm)")


def _vllm(family: str) -> Convention:
    hidden_first = LAYOUTS[family].hidden_first
    own = f"{VLLM_FILES[family]} (forward)"
    if family == MIMO:
        return Convention("vllm", "pre", True, "post", hidden_first, FIRST,
                          (own, "model_executor/models/mimo.py MiMoModel.forward returns the state before its norm",
                           VLLM_V1))
    chain = "pre" if family == GLM else "post"
    return Convention("vllm", "post", family in (DEEPSEEK, GLM), chain, hidden_first, FIRST,
                      (own, "v1/worker/gpu_model_runner.py (the target's output, after its final norm)", VLLM_V1))


def _sglang(family: str) -> Convention:
    return Convention("sglang", "post", family == MIMO, "post", LAYOUTS[family].hidden_first, FIRST,
                      (f"{SGLANG_FILES[family]} (forward)", SGLANG_INPUT, SGLANG_CHAIN))


def _transformers(family: str) -> Convention:
    return Convention("transformers", "post", False, "post", LAYOUTS[family].hidden_first, PER_LAYER, HF_FILES)


CONVENTIONS = {f: {"vllm": _vllm(f), "sglang": _sglang(f), "transformers": _transformers(f)} for f in LAYOUTS}
TRANSFORMERS_FAMILIES = (DEEPSEEK, GLM)      # configs with num_mtp_layers in transformers 5.25


def planted(base: Convention, **changes) -> Convention:
    """`base` with some choices changed: a convention no engine runs as a whole (diagnose's variants)."""
    return replace(base, engine="planted", sources=(), **changes)


class ConventionError(ValueError):
    """What an engine refuses for this MTP target (the message is the engine's reason)."""


def check_steps(convention: Convention, family: str, num_layers: int, num_steps: int, topk: int) -> list[str]:
    """Refuse (ConventionError) what `convention.engine` refuses for n = `num_layers` MTP layers and k = `num_steps`
    drafts; return the warnings it logs.

    >>> c = CONVENTIONS[GLM]
    >>> check_steps(c["vllm"], GLM, 2, 3, 1)
    Traceback (most recent call last):
    ...
    eagle_eval.heads.mtp.conventions.ConventionError: vLLM 0.32 refuses num_speculative_tokens 3 with 2 MTP layers: "num_speculative_tokens:3 must be divisible by n_predict=2" (config/speculative.py)
    >>> check_steps(c["sglang"], GLM, 2, 1, 1)
    Traceback (most recent call last):
    ...
    eagle_eval.heads.mtp.conventions.ConventionError: SGLang 0.5.23 refuses 2 MTP layers for glm4_moe: "Only 1 nextn layer is supported" (models/glm4_moe.py load_weights); it runs one layer
    """
    n, k, engine = num_layers, num_steps, convention.engine
    notes = []
    if engine == "vllm":
        if k > n and k % n != 0:
            raise ConventionError(f"vLLM 0.32 refuses num_speculative_tokens {k} with {n} MTP layers: "
                                  f'"num_speculative_tokens:{k} must be divisible by n_predict={n}" '
                                  "(config/speculative.py)")
        if k > 1:
            notes.append("vLLM 0.32 warns: \"Enabling num_speculative_tokens > 1 will run multiple times of forward "
                         "on same MTP layer, which may result in lower acceptance rate\" (config/speculative.py)")
        if topk > 1:
            raise ConventionError(f"--topk {topk}: vLLM 0.32 drafts MTP chains only (its proposer samples one token "
                                  "per step); trees are SGLang's (--mtp-convention sglang)")
    elif engine == "sglang":
        if n != 1 and family in (DEEPSEEK, GLM):
            where = ("deepseek_weight_loader _initialize_nextn_conf" if family == DEEPSEEK
                     else "models/glm4_moe.py load_weights")
            raise ConventionError(f"SGLang 0.5.23 refuses {n} MTP layers for {family}: \"Only 1 nextn layer is "
                                  f"supported\" ({where}); it runs one layer")
        if n != 1 and family == MIMO:
            raise ConventionError(f"SGLang 0.5.23 maps every model.mtp_layers.{{i}} of MiMo onto its one layer "
                                  f"(models/mimo_mtp.py map_model_name_to_mtp_param_name): with {n} layers the last "
                                  "one read wins, which is no checkpoint's layer 0")
        if n != 1:
            notes.append(f"SGLang 0.5.23 builds only mtp.layers.0 of the {n} MTP layers (num_hidden_layers = 1)")
    elif engine == "transformers":
        if family not in TRANSFORMERS_FAMILIES:
            raise ConventionError(f"transformers 5.25 has no MTP generation for {family}: its config has no "
                                  "num_mtp_layers (generate(use_mtp=True) covers deepseek_v3 and glm4_moe here)")
        if k != n:
            raise ConventionError(f"--num-steps {k}: transformers drafts exactly one token per MTP layer "
                                  f"(MTPCandidateGenerator): num_steps must be {n}")
        if n != 1:
            raise ConventionError(f"{n} MTP layers under transformers' convention (one pass of every layer over the "
                                  "window, each with its own cache) is not implemented here; the oracle runs one "
                                  "layer, chained (--mtp-convention vllm or sglang)")
        if topk > 1:
            raise ConventionError(f"--topk {topk}: transformers drafts a chain (one token per MTP layer)")
    return notes


def engines_echo(family: str, num_layers: int, num_steps: int, topk: int) -> dict:
    """What each engine would do with this target and num_steps (the report's `mtp.engines`)."""
    out = {}
    for engine, conv in CONVENTIONS[family].items():
        try:
            notes = check_steps(conv, family, num_layers, num_steps, topk)
            refused = None
        except ConventionError as exc:
            notes, refused = [], str(exc)
        out[engine] = {**conv.as_dict(), "refuses": refused, "warns": notes}
    if num_layers > 1:
        out["vllm"]["v2_model_runner"] = (f"on GPUs with Triton, vLLM's V2 runner with {num_layers} layers and "
                                         "k > 1 runs the multi-module speculator (layer step % n, one pass per layer "
                                         "over the window: v1/worker/gpu/spec_decode/multi_module_mtp/speculator.py); "
                                         "the CPU build's V1 runner uses layer 0 for every step")
    return out
