"""What server-check needs to know of one serving engine, as one record (no torch).

Each engine module (servers/sglang.py, servers/vllm.py) defines its `ENGINE`; `registry.ENGINES` names them.
A new engine is one module holding its wire format and its `Engine`, plus one line in the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Engine:
    name: str                             # the --backend value
    figure: str                           # the per-request acceptance figure the server reports
    figure_definition: str
    figure_counts: Callable               # (completion_tokens, verify_count, accepted_drafts) -> (num, den) | None
    make_client: Callable                 # (Http, ServerCheckOptions) -> a client (settings(), generate())
    compare_settings: Callable            # (server settings dict, resolved, draft path) -> setting rows
    num_steps_setting: str                # the server setting that holds num_steps
    taps: dict = field(default_factory=dict)   # capture.TAP_ENGINES id -> hypothesis name, for the engine's variants
    extra_taps: Callable | None = None    # resolved -> [(name, description, HF)] more taps this engine may use
    compare_log: Callable | None = None   # (log text, oracle tau, num_draft_tokens, tolerance) -> dict (--sglang-log)
    options: tuple = ()                   # the ServerCheckOptions fields only this engine reads
    server_num_steps: Callable | None = None   # (server settings) -> its drafts per verify, when not num_steps_setting


def setting_row(name, server, oracle, ok, note=None) -> dict:
    """One row of a settings comparison (ok None = not reported / informative)."""
    return {"setting": name, "server": server, "oracle": oracle, "ok": ok, "note": note}


def engine(name: str) -> Engine:
    """The engine registered as `name` (the --backend value)."""
    from eagle_eval.registry import ENGINES
    from eagle_eval.settings import ConfigError

    if name not in ENGINES:
        raise ConfigError(f"--backend must be one of {', '.join(ENGINES.names())}, got {name!r}")
    return ENGINES.get(name)
