"""Where a target's text decoder sits: its layer stack, its config, its embedding and its lm_head.

Contract: `find_text_decoder(model, where, error)` returns a `TextDecoder` for every layout below and
raises `error` naming what it followed otherwise. The rule is transformers' own accessor, followed
until a decoder stack appears: start at the loaded model and take `get_decoder()` (a module without
it: its `model` attribute) until a module holds `layers`, an `nn.ModuleList`, at most `MAX_HOPS`
times. The text settings are `config.get_text_config(decoder=True)` (the config itself for a causal
LM, `text_config` for a multimodal wrapper); the embedding and lm_head are the model's own
`get_input_embeddings()` / `get_output_embeddings()`, else the first module on the path that has one.

| layout                        | decoder stack                       | e.g. (transformers 5.24)                  |
|-------------------------------|-------------------------------------|-------------------------------------------|
| causal LM                     | `model.model.layers`                | Llama, Qwen2/3, DeepSeek-V3, Llama-4 (loaded as Llama4ForCausalLM) |
| transformers multimodal model | `model.model.language_model.layers` | LLaVA, Mistral3, Qwen2.5-VL, Qwen3-VL, Gemma3 |
| wrapper holding a causal LM   | `model.language_model.model.layers` | Kimi-K2.5's remote code (`KimiK25ForConditionalGeneration`, a DeepseekV3ForCausalLM as `language_model`) |

Only the text path is used: prompts are token ids, no pixels; hooks go on the text decoder's
layers, so capture, loop and profile are those of a plain causal LM.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MAX_HOPS = 4           # causal LM: 1 (model -> model.model); wrapper of a causal LM: 2


@dataclass(frozen=True)
class TextDecoder:
    stack: torch.nn.Module               # the module whose `.layers` are the text decoder layers
    path: str                            # its dotted name, the loaded model being "model": "model.model", ...
    config: object                       # the text config: hidden_size, num_hidden_layers, RoPE, MLA dims
    input_embeddings: torch.nn.Module    # token ids -> [.., H_t]
    output_embeddings: torch.nn.Module   # lm_head [V, H_t]
    final_norm: torch.nn.Module | None = None   # the stack's final norm (`norm`), applied before the lm_head

    @property
    def layers(self) -> torch.nn.ModuleList:
        return self.stack.layers


def _next(module):
    """One hop along the rule: get_decoder(), else the `model` attribute; None where neither leads on."""
    try:
        nxt = module.get_decoder() if callable(getattr(module, "get_decoder", None)) else None
    except (AttributeError, NotImplementedError, ValueError):     # remote code with a bespoke or broken accessor
        nxt = None
    if nxt is None or nxt is module:
        nxt = getattr(module, "model", None)
    return nxt if isinstance(nxt, torch.nn.Module) and nxt is not module else None


def _accessor(path: list, name: str):
    """The first non-None `name()` (get_input_embeddings / get_output_embeddings) along the path."""
    for module in path:
        try:
            found = getattr(module, name)() if callable(getattr(module, name, None)) else None
        except (NotImplementedError, AttributeError):
            found = None
        if found is not None:
            return found
    return None


def find_text_decoder(model, where: str, error: type[Exception]) -> TextDecoder:
    """The text decoder of `model` (see the module docstring); `where` names the target in errors."""
    names = {id(m): "model" + (f".{n}" if n else "") for n, m in model.named_modules()}   # "model" = the loaded one
    path, module = [model], model
    while not isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and len(path) <= MAX_HOPS:
        module = _next(module)
        if module is None:
            break
        path.append(module)
    if module is None or not isinstance(getattr(module, "layers", None), torch.nn.ModuleList):
        followed = " -> ".join(f"{names.get(id(m), '?')} ({type(m).__name__})" for m in path)
        raise error(f"{where}: no text decoder stack found: followed get_decoder() / .model from the model "
                    f"({followed}) and none holds a `layers` ModuleList; eagle-eval supports model.model.layers "
                    "(causal LMs), model.model.language_model.layers (transformers' multimodal models) and "
                    "model.language_model.model.layers (a wrapper holding a causal LM, e.g. Kimi-K2.5)")
    inputs, outputs = _accessor(path, "get_input_embeddings"), _accessor(path, "get_output_embeddings")
    if inputs is None or outputs is None:
        missing = "an input embedding" if inputs is None else "an lm_head (get_output_embeddings)"
        raise error(f"{where}: {type(model).__name__} has no {missing} on the path to its text decoder "
                    f"({names.get(id(module))}): eagle-eval needs a model with a language-model head")
    config = model.config.get_text_config(decoder=True)
    norm = getattr(module, "norm", None)
    return TextDecoder(stack=module, path=names[id(module)], config=config, input_embeddings=inputs,
                       output_embeddings=outputs, final_norm=norm if isinstance(norm, torch.nn.Module) else None)
