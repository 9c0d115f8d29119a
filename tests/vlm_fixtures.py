"""Tiny multimodal targets built from configs: transformers' own (the text decoder at
`model.model.language_model.layers`) and a Kimi-K2.5-style remote-code wrapper (at
`model.language_model.model.layers`), each holding the weights of a tiny causal LM from fixtures.py,
so that its text path must decode exactly as that plain causal LM does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from fixtures import VOCAB, save_with_tokenizer

REMOTE_CODE = Path(__file__).parent / "kimi_remote"
TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   image_size=28, patch_size=14)


def _text_lm(text_path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(text_path, dtype=torch.float32).eval()


def _copy_text_weights(text, decoder, lm_head) -> None:
    """The plain LM's decoder and lm_head into the multimodal model's (strict: every key, every shape)."""
    decoder.load_state_dict(text.model.state_dict(), strict=True)
    lm_head.load_state_dict(text.lm_head.state_dict(), strict=True)


def _vlm_config(kind: str, text_config: dict):
    """A transformers multimodal config around `text_config` (a plain LM's), with a tiny vision tower.
    Qwen2.5-VL / Qwen3-VL: 3-D mrope sections over the same head dim; on text alone every section gets
    the same position, so the text path is the plain Qwen2 / Qwen3 one."""
    from transformers import AutoConfig

    if kind == "llava":
        return AutoConfig.for_model("llava", text_config=text_config, tie_word_embeddings=False,
                                    vision_config=dict(model_type="clip_vision_model", **TINY_VISION))
    qwen_vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                       out_hidden_size=text_config["hidden_size"])
    rope = {**(text_config.get("rope_parameters") or {}), "mrope_section": [2, 2, 2]}   # head_dim 12 = 2 x 6
    if kind == "qwen2_5_vl":
        text = {**text_config, "model_type": "qwen2_5_vl_text", "rope_parameters": rope}
        return AutoConfig.for_model("qwen2_5_vl", text_config=text, vision_config=qwen_vision,
                                    tie_word_embeddings=False)
    if kind == "qwen3_vl":
        text = {**text_config, "model_type": "qwen3_vl_text", "rope_parameters": {**rope, "mrope_interleaved": True}}
        return AutoConfig.for_model("qwen3_vl", text_config=text, tie_word_embeddings=False,
                                    vision_config={**qwen_vision, "deepstack_visual_indexes": []})
    raise ValueError(kind)


# the multimodal kinds and the fixtures.make_target family whose weights their text decoder takes
TEXT_FAMILY = {"llava": "llama", "qwen2_5_vl": "qwen2", "qwen3_vl": "qwen3"}


def make_vlm(text_path: Path, path: Path, kind: str) -> Path:
    """A transformers multimodal model (`kind` in TEXT_FAMILY) whose text decoder and lm_head are the
    causal LM at `text_path`: the text decoder at model.model.language_model.layers."""
    from transformers import AutoModelForImageTextToText

    text = _text_lm(text_path)
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(_vlm_config(kind, text.config.to_dict()), dtype=torch.float32)
    _copy_text_weights(text, model.model.language_model, model.lm_head)
    return _save(model, path, text_path)


def make_gemma3(path: Path, sliding_window: int, num_layers: int = 8, seed: int = 0) -> Path:
    """A random Gemma3 (multimodal, text decoder at model.model.language_model.layers) whose text layers
    alternate sliding-window and full attention (every 2nd full)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    text = dict(model_type="gemma3_text", vocab_size=VOCAB, hidden_size=48, intermediate_size=96, head_dim=12,
                num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=512, sliding_window=sliding_window,
                layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)],
                bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg = AutoConfig.for_model("gemma3", text_config=text, tie_word_embeddings=False, mm_tokens_per_image=4,
                               vision_config=dict(model_type="siglip_vision_model", **TINY_VISION))
    torch.manual_seed(seed)
    return save_with_tokenizer(AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32), path)


def _experts_per_module(state: dict) -> dict:
    """transformers' fused expert tensors (experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]) as one
    module per expert (experts.{e}.gate_proj / up_proj / down_proj .weight), the checkpoint's layout."""
    out = {}
    for key, value in state.items():
        stem, _, name = key.rpartition(".")
        if stem.endswith("mlp.experts") and name in ("gate_up_proj", "down_proj"):
            for e, w in enumerate(value):
                halves = {"gate_proj": w[: w.shape[0] // 2], "up_proj": w[w.shape[0] // 2:]} \
                    if name == "gate_up_proj" else {"down_proj": w}
                out.update({f"{stem}.{e}.{proj}.weight": t.clone() for proj, t in halves.items()})
        else:
            out[key] = value
    return out


def make_kimi_style(text_path: Path, path: Path, expert_layout: str = "fused") -> Path:
    """A Kimi-K2.5-style remote-code folder (modeling_kimi_k25.py, configuration_kimi_k25.py, auto_map)
    around the DeepSeek-V3 causal LM at `text_path`: the text decoder at model.language_model.model.layers.
    expert_layout "list": its MoE layers hold one module per routed expert (the original remote code's)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    text = _text_lm(text_path)
    path.mkdir(parents=True, exist_ok=True)
    for file in REMOTE_CODE.glob("*_kimi_k25.py"):
        shutil.copy(file, path / file.name)
    config = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"],
              "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config",
                           "AutoModel": "modeling_kimi_k25.KimiK25ForConditionalGeneration",
                           "AutoModelForCausalLM": "modeling_kimi_k25.KimiK25ForConditionalGeneration"},
              "text_config": text.config.to_dict(), "tie_word_embeddings": False,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "expert_layout": expert_layout}
    (path / "config.json").write_text(json.dumps(config))
    cfg = AutoConfig.from_pretrained(path, trust_remote_code=True, local_files_only=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=True, dtype=torch.float32)
    if expert_layout == "list":
        model.language_model.model.load_state_dict(_experts_per_module(text.model.state_dict()), strict=True)
        model.language_model.lm_head.load_state_dict(text.lm_head.state_dict(), strict=True)
    else:
        _copy_text_weights(text, model.language_model.model, model.language_model.lm_head)
    return _save(model, path, text_path)


def _save(model, path: Path, text_path: Path) -> Path:
    save_with_tokenizer(model, path)
    gen = text_path / "generation_config.json"
    if gen.is_file():
        shutil.copy(gen, path / gen.name)
    return path
