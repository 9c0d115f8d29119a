"""Block drafters: DFlash and DFlash2 (z-lab; vLLM method `dflash`, SGLang `DFLASH`), one draft forward per
cycle over [anchor, mask x (B - 1)] whose keys and values also see the target's hidden states.

Rooms: `config` (the frozen `DFlashConfig`: shapes, block, mask id, taps in every convention), `layouts` (either
layout's config.json <-> DFlashConfig), `keys` (the audit of every config.json key), `model` (the drafter's
layers: context features, context K/V, the block forward, one start or many), `dflash2` (the grouped dynamic
causal convolution and the candidate selector), `io` (strict loading and the writer, z-lab and speculators
layouts), `bind` (a drafter bound to a target: the embedding and lm_head it reads through, shapes and taps
checked against the target), `state` (`BlockDraftState`, the loop's drafting contract), `wire` (a drafter
wired to its target for one run: heads/wired.py Wired) and `kind` (the kind record, `registry.HEAD_KINDS["dflash"]`).

May import: torch, transformers, eagle_eval.heads (the EAGLE-3 config helpers, RMSNorm, RoPE tables, the key
audit's tables, io's vocab-map checks, the kind record, the wired record), eagle_eval.models (files, hub, capture),
eagle_eval.findings, eagle_eval.settings (ConfigError), eagle_eval.errors. Never: loop (the decode
policy comes in as an argument), rules, profile, workload, diagnose, servers, commands, api, cli.
"""
