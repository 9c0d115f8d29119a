"""A tiny stand-in for Kimi-K2.5's remote configuration (moonshotai/Kimi-K2.5 configuration_kimi_k25.py):
a multimodal config whose `text_config` is a DeepSeek-V3 config. Test fixture, loaded with
trust_remote_code from a local folder; written for eagle-eval's tests, not taken from Moonshot's code."""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"
    sub_configs = {"text_config": DeepseekV3Config}

    def __init__(self, text_config=None, vision_hidden_size=16, media_placeholder_token_id=95,
                 expert_layout="fused", **kwargs):
        if isinstance(text_config, dict):
            text_config = DeepseekV3Config(**text_config)
        self.text_config = text_config if text_config is not None else DeepseekV3Config()
        self.vision_hidden_size = vision_hidden_size
        self.media_placeholder_token_id = media_placeholder_token_id
        self.expert_layout = expert_layout      # "fused" (transformers' tensors) or "list" (one module per expert)
        super().__init__(**kwargs)
