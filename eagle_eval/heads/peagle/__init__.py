"""P-EAGLE: an EAGLE-3 head trained to draft K tokens in ONE causal forward (vLLM `eagle3` with
`parallel_drafting: true`; speculators `peagle`). The llama kind's variant (heads/eagle3/kind.py: detected by
`mask_hidden` in the weights or a speculators 'peagle' config, heads/io.py `_parallel_drafting`), not a kind of
its own: the checkpoint is an EAGLE-3 checkpoint, and vLLM serves it as one.

Rooms: `slots` (the K - 1 mask rows: their token, their feature row fc(mask_hidden), their positions), `state`
(`ParallelDraftState`, the loop's drafting contract), `batched` (`ParallelRows`, the batched loop's form),
`all_starts` (every start of a sequence at once: the profile's run lengths) and `wire` (what the EAGLE-3 wiring
adds for it: refusals, the report's echo, the findings).

May import: torch, eagle_eval.heads (the EAGLE-3 head and its cache), eagle_eval.findings, eagle_eval.settings
(ConfigError), eagle_eval.errors. Never: loop (the decode policy comes in as an argument), rules, profile,
workload, diagnose, servers, commands, api, cli.
"""
