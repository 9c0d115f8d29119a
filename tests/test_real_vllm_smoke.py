"""A real vLLM (CPU build, fp32) serving the bundled target + head agrees with `server-check`.

The head is served from a copy whose config.json also carries vLLM's top-level
`eagle_aux_hidden_state_layer_ids` = [k + 1 for k in the nested SGLang-style ids] (EAGLE3.md
section 1). Served as is, vLLM 0.32's V1 runner reads the nested ids raw, one layer low; tokens
still match but the acceptance does not, and server-check exits 1 naming `aux_hf_minus_1`.

Slow (a server start is 1-2 minutes on 2 cores); deselect with `-m "not real_vllm"` or
EAGLE_EVAL_SKIP_REAL_VLLM=1.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from real_vllm import REPO, real_vllm_servers  # noqa: F401  (the fixture)

NUM_STEPS = 5


def vllm_wired_copy(draft, folder):
    """A copy of `draft` with the top-level key vLLM reads, consistent with the nested ids."""
    shutil.copytree(draft, folder)
    config = json.loads((folder / "config.json").read_text())
    nested = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    config["eagle_aux_hidden_state_layer_ids"] = [k + 1 for k in nested]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


@pytest.mark.real_vllm
@pytest.mark.slow
def test_bundled_pair_server_check_agrees(real_vllm_servers, tmp_path):
    target, draft = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
    served = vllm_wired_copy(draft, tmp_path / "draft-vllm")
    server = real_vllm_servers(target, served, {"num_speculative_tokens": NUM_STEPS})
    cmd = [sys.executable, "-m", "eagle_eval.cli", "server-check", "--backend", "vllm",
           "--url", server.url, "--target", str(target), "--draft", str(draft),
           "--num-steps", str(NUM_STEPS), "--dtype", "fp32", "--output-dir", str(tmp_path / "check")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"server-check exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    tokens = json.loads((tmp_path / "check" / "server_check.json").read_text())["tokens"]
    assert tokens["requests"] > 0
    assert tokens["equal"] == tokens["requests"], tokens
