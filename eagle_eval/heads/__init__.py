"""Draft heads, one folder per kind (`registry.HEAD_KINDS` names them): `eagle3` (the Llama-style EAGLE-3 layer),
`mla` (the EAGLE-3 layer with DeepSeek multi-head latent attention), `dflash` (block drafters: DFlash and DFlash2,
one non-causal draft forward per cycle; their drafting state for the loop in `dflash/state.py`). A kind is one `kind.HeadKind` record: how to
recognise its checkpoint, read its config, build it, map its weight keys, which target tensors it taps by default,
its load-time checks and its KV bytes for `plan`. `protocol` is the interface the loop and the profile drive;
`io` loads any kind strictly; `checks` the load-time findings common to every kind; `training_metrics` a head's
training-time accuracy.

May import: models (files, capture), findings, records, settings, errors. Never: loop, rules, profile, workload,
results, the commands, diagnose, servers, api, cli.
"""
