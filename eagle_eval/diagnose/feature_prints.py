"""Fingerprints of the aux features: first values and norms per token, for comparing with a server by eye.

Contract: `fingerprint` runs the target on the first tokens of one prompt (features at t depend only
on tokens <= t) and keeps, for each aux tap HF[i] the evaluation feeds, the L2 norm and the first
values at every position; `render_fingerprint` prints them in a fixed format (`%+.5e`) that does not
change between runs or versions, so two outputs can be diffed.
"""

from __future__ import annotations

FINGERPRINT_TOKENS = 4
FINGERPRINT_VALUES = 5


def fingerprint(oracle, prompt, tokens: int = FINGERPRINT_TOKENS, values: int = FINGERPRINT_VALUES) -> dict:
    """First values and L2 norms of each aux feature HF[i] at the first prompt tokens."""
    import torch


    spec = oracle.speculator
    target, hf = spec.target, spec.aux_hf
    ids = torch.tensor([prompt.input_ids[:tokens]])
    with torch.no_grad(), target.capture(hf, spec.draft_device) as cap:
        target.forward(ids, None)
        feats = cap.pop()[0].float()                              # [t, k*H_t]
    h = target.info.hidden_size
    blocks = []
    for j, i in enumerate(hf):
        block = feats[:, j * h:(j + 1) * h]
        blocks.append({"hf": i, "sglang": i - 1, "vllm": i, "rows": [
            {"position": t, "token": int(ids[0, t]), "norm": float(block[t].norm()),
             "values": [float(x) for x in block[t, :values]]} for t in range(block.shape[0])]})
    return {"prompt": prompt.id, "prompt_tokens": len(prompt.input_ids), "dtype": target.info.dtype,
            "num_layers": target.num_layers, "blocks": blocks}


def render_fingerprint(fp: dict) -> str:
    from eagle_eval.diagnose.dumps import describe_hf

    lines = [f"fingerprint: prompt {fp['prompt']!r}, first {len(fp['blocks'][0]['rows'])} of {fp['prompt_tokens']} "
             f"tokens, target dtype {fp['dtype']} (pre-norm residual stream, before the draft's fc)"]
    for b in fp["blocks"]:
        lines.append(f"{describe_hf(b['hf'], fp['num_layers'])}  (SGLang id {b['sglang']}, vLLM id {b['vllm']})")
        for r in b["rows"]:
            vals = ", ".join(f"{v:+.5e}" for v in r["values"])
            lines.append(f"  t={r['position']:<3d} token={r['token']:<7d} norm={r['norm']:.5e}  first=[{vals}]")
    return "\n".join(lines)
