"""The EAGLE-3 head with DeepSeek multi-head latent attention (Kimi-K2.x / DeepSeek-V3 heads): its layer (`layer`),
its config.json (`config`), its load-time checks (`checks`) and its kind record (`KIND`, in `kind`)."""
