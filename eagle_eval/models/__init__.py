"""Models: the target (loaded with accelerate), the EAGLE-3 heads and their checkpoint dialects, the one
function that decides which target tensors feed the head (`capture.resolve_aux_layers`), quantized
weights, and the load-time checks of what was loaded.

Rooms: `hub` (a Hugging Face model id's snapshot), `target`, `text_decoder`, `capture`, `files`, `training_metrics`; `heads/` (the Llama-style and
MLA draft layers, their configs, checkpoint dialects and key audit); `quant/` (what a checkpoint holds
quantized, and the matmuls that run it); `checks/` (load-time findings).

May import: `eagle_eval.settings`, `eagle_eval.errors`, `eagle_eval.findings` (the finding record).
Never: speculative, workload, diagnose, servers, the commands, api, cli.
"""
