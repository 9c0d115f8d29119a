"""MTP drafts: the multi-token-prediction layers that ship inside the target's own checkpoint (DeepSeek-V3/Kimi,
GLM-4.5, Qwen3-Next / Qwen3.5, MiMo), read from it (`--draft mtp`) and driven through the loop as a draft head:
their checkpoint layouts (`layouts`), each engine's conventions (`conventions`), the layer (`model`), strict
loading (`load`), a quantized target's MTP layers held as its own weights are (`quant`), the wiring to a target (`wire`) and the kind record (`KIND`, in `kind`). docs/mtp.md says what
each engine does, with its file.
"""
