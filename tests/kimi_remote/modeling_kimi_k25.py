"""A tiny stand-in for Kimi-K2.5's remote modeling code: `KimiK25ForConditionalGeneration` holds a
vision stand-in and a DeepseekV3ForCausalLM as `language_model`, so the text decoder layers sit at
`language_model.model.layers` and the lm_head at `language_model.lm_head` (the layout of the real
checkpoint's weights). The wrapper has no lm_head of its own. With `expert_layout: "list"` every MoE layer
holds its routed experts as the original remote code does (moonshotai's modeling_deepseek.py `DeepseekV3MoE`:
an nn.ModuleList of MLPs, `mlp.experts.{e}.{gate,up,down}_proj`), run like its `moe_infer`. Test fixture,
not Moonshot's code."""

import torch
from torch import nn
from transformers import DeepseekV3ForCausalLM, GenerationMixin, PreTrainedModel
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP, DeepseekV3MoE, DeepseekV3TopkRouter

from .configuration_kimi_k25 import KimiK25Config


class ListExpertsMoE(nn.Module):
    """A MoE layer with one module per routed expert: each expert runs on the tokens routed to it, and a
    token's outputs are weighted and summed in the routing weights' dtype (fp32), then the shared expert added."""

    def __init__(self, config):
        super().__init__()
        self.experts = nn.ModuleList(DeepseekV3MLP(config, intermediate_size=config.moe_intermediate_size)
                                     for _ in range(config.n_routed_experts))
        self.gate = DeepseekV3TopkRouter(config)
        self.shared_experts = DeepseekV3MLP(config, intermediate_size=config.moe_intermediate_size
                                            * config.n_shared_experts)

    def forward(self, hidden_states):
        shape = hidden_states.shape
        _, weights, index = self.gate(hidden_states)                      # [T, k] each
        x = hidden_states.view(-1, shape[-1])
        out = x.new_zeros(x.shape[0], index.shape[1], shape[-1])         # [T, k, H]
        for expert in torch.unique(index).tolist():
            token, slot = torch.where(index == expert)
            out[token, slot] = self.experts[expert](x[token])
        y = (out.to(weights.dtype) * weights[..., None]).sum(dim=1).to(x.dtype).view(shape)
        return y + self.shared_experts(hidden_states)


class KimiK25PreTrainedModel(PreTrainedModel):
    config_class = KimiK25Config
    base_model_prefix = "language_model"
    _no_split_modules = ["DeepseekV3DecoderLayer"]


class KimiK25ForConditionalGeneration(KimiK25PreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        width = config.vision_hidden_size
        self.vision_tower = nn.Linear(width, width)                        # stands in for MoonViT
        self.mm_projector = nn.Linear(width, config.text_config.hidden_size)
        self.language_model = DeepseekV3ForCausalLM(config.text_config)
        if getattr(config, "expert_layout", "fused") == "list":
            for layer in self.language_model.model.layers:
                if isinstance(layer.mlp, DeepseekV3MoE):
                    layer.mlp = ListExpertsMoE(config.text_config)
        self.post_init()

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def forward(self, input_ids=None, pixel_values=None, attention_mask=None, position_ids=None,
                past_key_values=None, inputs_embeds=None, use_cache=None, output_hidden_states=None, **kwargs):
        if inputs_embeds is None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
        if pixel_values is not None:                                      # media tokens take projected patches
            media = (input_ids == self.config.media_placeholder_token_id)[..., None]
            patches = self.mm_projector(self.vision_tower(pixel_values.to(inputs_embeds.dtype)))
            inputs_embeds = inputs_embeds.masked_scatter(media, patches)
        return self.language_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                   position_ids=position_ids, past_key_values=past_key_values,
                                   use_cache=use_cache, output_hidden_states=output_hidden_states, **kwargs)
