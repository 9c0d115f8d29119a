"""`server-check`'s own options, declared like every setting (eagle_eval/settings.py `opt`), so the CLI, a
--config file and docs/cli.md read them from one place."""

from __future__ import annotations

from dataclasses import dataclass

from eagle_eval.registry import ENGINES
from eagle_eval.servers.judge import MODES
from eagle_eval.servers.vllm import METRICS_SOURCES
from eagle_eval.settings import ConfigError, Group, opt


@dataclass(frozen=True)
class ServerCheckOptions(Group):
    backend: str | None = opt(None, "The server's engine (required).", choices=ENGINES.names())
    url: str | None = opt(None, "The running server, http://HOST:PORT (none: only --sglang-log is compared).")
    mode: str = opt("exact", "exact: every request's tokens and counts must equal the oracle's (a faithful fp32 "
                    "engine); tolerance: a 95% interval of per-request acceptance differences within --tolerance "
                    "(servers with bf16 kernels).", choices=MODES)
    tolerance: float = opt(0.05, "Relative tolerance: per-request interval in --mode tolerance, the SGLang log, and "
                           "at temperature > 0 the accept length against a faithful engine's expectation.")
    tie_margin: float = opt(0.1, "A divergence where the target's logit margin is below this is numerics, not a bug.")
    timeout: float = opt(300.0, "Seconds one HTTP request may take, whole: connect, send, status line, headers and "
                         "body (a server that trickles bytes is cut here).")
    retries: int = opt(2, "Retries of a request on connection errors and HTTP 502/503/504 (never after the server may "
                       "have run it), 0.2 s apart doubling to 2 s, within --retry-budget.")
    retry_budget: float = opt(60.0, "Seconds for the attempts of one request: no retry starts after them, and one that "
                              "starts ends by then.")
    served_model_name: str | None = opt(None, "vLLM: the `model` field (default: first of /v1/models).")
    metrics_settle: float = opt(0.2, "vLLM: seconds between /metrics reads until two agree.")
    vllm_metrics: str = opt("auto", "vLLM: where each request's acceptance is read. auto: the answer's per-request "
                            "metrics when the server offers them (vllm serve --per-request-spec-decode-metrics "
                            "detailed), else deltas of the server-wide /metrics counters (quiet server only); "
                            "per-request: never counter deltas; counters: always counter deltas (compared with the "
                            "per-request metrics when present).", choices=METRICS_SOURCES)
    sglang_log: str | None = opt(None, "SGLang server log covering this workload: compare its accept len.",
                                 input_path=True)
    rollouts: int = opt(32, "Temperature > 0, sampled drafts (vllm-probabilistic, sglang-rs): draft paths per cycle "
                        "root for the expected acceptance along the server's answers (refused where no draft is "
                        "sampled: temperature 0, one-hot rules).")
    hypotheses: bool = opt(True, "When acceptance disagrees, rank the usual wiring faults by how well each "
                           "reproduces it.", flag="--hypotheses", secondary="--no-hypotheses")

    def validate(self):
        if self.backend is None:
            raise ConfigError("--backend is required (one of " + ", ".join(ENGINES.names()) + ")")
        if self.url is None and self.sglang_log is None:
            raise ConfigError("--url is required (or --sglang-log alone, to compare a log with the oracle)")
        if self.url is not None:
            _check_url(self.url)
        engine = ENGINES.get(self.backend)
        if self.sglang_log is not None and engine.compare_log is None:
            raise ConfigError(f"--sglang-log needs --backend sglang (an engine that writes that log), not {self.backend}")
        if self.vllm_metrics != "auto" and "vllm_metrics" not in engine.options:
            raise ConfigError(f"--vllm-metrics needs --backend vllm, not {self.backend}")
        if self.tolerance < 0 or self.tie_margin < 0:
            raise ConfigError("--tolerance and --tie-margin must be >= 0")
        if self.rollouts < 1:
            raise ConfigError(f"--rollouts must be >= 1, got {self.rollouts}")
        if self.timeout <= 0 or self.retry_budget <= 0 or self.retries < 0 or self.metrics_settle < 0:
            raise ConfigError("--timeout and --retry-budget must be > 0, --retries and --metrics-settle >= 0")


def _check_url(url: str) -> None:
    import urllib.parse

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must start with http:// or https://, got {url!r}")
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port                                  # noqa: B018  (raises on a port out of range)
    except ValueError as exc:
        raise ConfigError(f"--url {url!r}: {exc}") from None
    if not parts.hostname:
        raise ConfigError(f"--url {url!r} names no host (http://HOST:PORT)")
