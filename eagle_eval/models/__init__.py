"""Models: the target (loaded with accelerate), the EAGLE-3 head and its checkpoint dialects, the one
function that decides which target tensors feed the head (`capture.resolve_aux_layers`), and the
load-time checks of what was loaded (`sanity`).

May import: `eagle_eval.config`, `eagle_eval.errors`, `eagle_eval.results.findings` (the finding record).
Never: spec, workload, diagnose, servers, api, cli.
"""
