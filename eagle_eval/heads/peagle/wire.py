"""What the EAGLE-3 wiring (heads/eagle3/wire.py) adds for a P-EAGLE head: the refusals, the report's echo, the
load-time findings, and the drafting state (`ParallelDraftState`).

Contract: `refuse(settings)` raises a ConfigError naming the option a P-EAGLE head cannot take: a tree (`--topk` >
1: vLLM 0.32 has no token tree; parallel drafting returns one chain) and SGLang's old draft positions
(`--position-offset 1`: SGLang does not serve P-EAGLE; vLLM's slots sit at t, t + 1, ...). `echo(loaded,
num_steps)` -> the report's `config.head.parallel_drafting`: on, how it was detected, the mask token id and the
config key it was read from (vLLM's order), K for this run (= num_steps = vLLM num_speculative_tokens: slot 0 plus
K - 1 mask rows), the depth it was trained for where the checkpoint records it (speculators
proposal_methods[0].speculative_tokens), and vLLM's setting. `findings(loaded, num_steps)`: what was read, and K
past the trained depth (`peagle-depth`): slots deeper than training were never trained.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle_eval.findings import info, warning
from eagle_eval.heads.eagle3.config import PEAGLE, mask_token
from eagle_eval.heads.peagle.slots import TREES_REFUSED
from eagle_eval.settings import ConfigError


def refuse(settings) -> None:
    spec_s = settings.speculation
    if spec_s.topk > 1:
        raise ConfigError(TREES_REFUSED.format(topk=spec_s.topk))
    if spec_s.position_offset:
        raise ConfigError(f"--position-offset {spec_s.position_offset}: SGLang's old EAGLE-3 draft positions; SGLang "
                          "does not serve P-EAGLE, and vLLM runs its slots at t, t + 1, ... (use 0)")


def _raw(loaded) -> tuple[dict, Path]:
    config_file = Path(loaded.path) / "config.json"
    return json.loads(config_file.read_text()), config_file


def trained_depth(raw: dict) -> int | None:
    """speculators_config.proposal_methods[0].speculative_tokens (the depths a speculators P-EAGLE was trained
    with, num_depths; what vLLM serves that folder with), else None (the EAGLE-3 layout records none)."""
    methods = (raw.get("speculators_config") or {}).get("proposal_methods") or [{}]
    tokens = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def echo(loaded, num_steps: int) -> dict:
    cfg = loaded.head.config
    raw, config_file = (_raw(loaded) if loaded.path else ({}, None))
    key = mask_token(raw, config_file, cfg.vocab_size)[1] if raw else None
    depth = trained_depth(raw)
    return {"on": True,
            "detected_by": (f"speculators_model_type {PEAGLE!r}" if raw.get("speculators_model_type") == PEAGLE
                            else f"tensor 'mask_hidden' in {Path(loaded.weights_file).name}"),
            "mask_token_id": cfg.mask_token_id,
            "mask_token_from": f"config.json key {key!r}" if key else "(in memory)",
            "mask_hidden": f"[1, {cfg.num_aux * cfg.target_hidden_size}], fed through fc as the mask rows' features",
            "k": num_steps, "slots": f"1 real pair + {num_steps - 1} mask rows, one causal forward",
            "trained_depth": depth,
            "as_vllm": {"method": "eagle3", "num_speculative_tokens": num_steps, "parallel_drafting": True}}


def findings(loaded, num_steps: int) -> list:
    cfg = loaded.head.config
    out = [info("peagle-checkpoint", f"P-EAGLE head (parallel drafting): mask token {cfg.mask_token_id}, "
                                     f"mask_hidden [1, {cfg.num_aux * cfg.target_hidden_size}]; K = {num_steps} "
                                     "drafts per forward")]
    depth = trained_depth(_raw(loaded)[0]) if loaded.path else None
    if depth is not None and num_steps > depth:
        out.append(warning("peagle-depth",
                           f"--num-steps {num_steps} drafts {num_steps - 1} mask rows, but {loaded.path}/config.json "
                           f"records speculative_tokens {depth} (the depths it was trained with): slots past "
                           f"{depth} were never trained; vLLM does not refuse it", num_steps=num_steps,
                           trained_depth=depth))
    return out
