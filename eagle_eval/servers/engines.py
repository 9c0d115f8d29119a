"""The serving engines server-check knows, by --backend name (each module's `Engine`, servers/engine.py)."""

from __future__ import annotations

from eagle_eval.servers import sglang, vllm
from eagle_eval.servers.engine import Engine
from eagle_eval.settings import ConfigError

ENGINES: dict[str, Engine] = {m.ENGINE.name: m.ENGINE for m in (sglang, vllm)}


def engine(name: str) -> Engine:
    if name not in ENGINES:
        raise ConfigError(f"--backend must be one of {', '.join(ENGINES)}, got {name!r}")
    return ENGINES[name]
