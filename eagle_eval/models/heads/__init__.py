"""EAGLE-3 draft heads: the Llama-style layer (`llama`) and the DeepSeek-MLA layer (`mla`), their
configs (`config`, `mla_config`), the checkpoint dialects that load them strictly (`io`) and the audit of
every config.json key (`keys`). Every head kind implements `protocol.DraftHead`, the interface
`speculative/` drives.
"""
