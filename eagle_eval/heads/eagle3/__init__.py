"""The Llama-style EAGLE-3 head kind: its layer (`layer`), config and variants (`config`), the audit of every
config.json key (`keys`), and its kind record (`KIND`, in `kind`)."""
