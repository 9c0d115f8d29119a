import os
import sys
from pathlib import Path

# the tests never reach the Hugging Face hub (there is no network here, and a model id in an odd option value
# must not start a download): set before huggingface_hub is imported, which reads it once (tests/test_hub.py)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from fixtures import make_head, make_target, write_prompts  # noqa: E402
from mtp_fixtures import mtp_targets  # noqa: E402,F401  (session fixture: tiny targets with trained MTP layers)

torch.set_num_threads(1)   # tiny models: threads only add overhead (and CI has 2 cores)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """A random 8-layer Llama target, a SpecForge-layout head with a reduced vocab, and prompts."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": make_target(root / "target"),
        "head": make_head(root / "head", draft_vocab=40),
        "prompts": write_prompts(root / "prompts.jsonl"),
        "root": root,
    }
