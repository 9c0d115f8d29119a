"""A tiny stand-in for Kimi-K2.5's remote modeling code: `KimiK25ForConditionalGeneration` holds a
vision stand-in and a DeepseekV3ForCausalLM as `language_model`, so the text decoder layers sit at
`language_model.model.layers` and the lm_head at `language_model.lm_head` (the layout of the real
checkpoint's weights). The wrapper has no lm_head of its own. Test fixture, not Moonshot's code."""

from torch import nn
from transformers import DeepseekV3ForCausalLM, GenerationMixin, PreTrainedModel

from .configuration_kimi_k25 import KimiK25Config


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
