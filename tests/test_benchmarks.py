"""The GPU benchmark's own code, run with tiny shapes on the CPU: its comparison must hold there."""

import json
import subprocess
import sys

from eagle_eval.config import REPO_ROOT


def test_gpu_benchmark_profile_section_runs_tiny_and_agrees(tmp_path):
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "bench_gpu.py"), "--tiny", "--sections", "profile",
           "--prompts", "4", "--new-tokens", "12", "--loop-prompts", "2", "--out", str(tmp_path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    prof = json.loads((tmp_path / "bench_gpu.json").read_text())["profile"]
    assert prof["loop_equals_profile"] is True
    assert prof["cycles_in_common_prefix"] == prof["cycles_equal_in_common_prefix"] > 0
    assert prof["tokens_part_at_by_num_steps"] == [12] * 16        # 8 S x 2 prompts, never part
    assert prof["own_generation_numeric_divergences"] == 0
