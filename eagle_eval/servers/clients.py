"""One client per engine behind one factory; the engine modules import `http`, never this one."""

from __future__ import annotations

from eagle_eval.servers.http import BACKENDS, Http
from eagle_eval.servers.sglang import SGLangClient
from eagle_eval.servers.vllm import VLLMClient


def make_client(backend: str, url: str, timeout: float, retries: int, served_model_name: str | None = None,
                metrics_settle: float = 0.2, vllm_metrics: str = "auto"):
    http = Http(url, timeout, retries)
    if backend == "sglang":
        return SGLangClient(http)
    if backend == "vllm":
        return VLLMClient(http, served_model_name, metrics_settle, vllm_metrics)
    raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
