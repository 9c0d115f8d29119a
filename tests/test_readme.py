"""The README's examples run as they are written: every ```bash block (in order, in one empty folder, each
command must exit 0) and every ```python block. Blocks marked ```text need something the test machine does
not have (a running server) and say so in the README."""

import re
import subprocess
import sys

import pytest

from eagle_eval.settings import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(bash|python)\n(.*?)```", README, flags=re.S)


def test_the_readme_has_examples_of_every_command():
    text = "\n".join(code for kind, code in BLOCKS)
    for command in ("run", "profile", "ablate", "diagnose", "report", "plan"):
        assert f"eagle-eval {command} " in text, command
    assert "--config" in text and any(kind == "python" for kind, _ in BLOCKS)


def test_no_example_needs_the_repository():
    """The README promises every example runs from any folder: none names a path inside the repository
    (the plan example once needed `# from the repository root` for tests/data/plan/kimi-k2.5)."""
    for kind, code in BLOCKS:
        assert "repository root" not in code and "tests/" not in code and "checkpoints/" not in code, code


@pytest.mark.slow
def test_every_readme_example_runs_as_written(tmp_path):
    for kind, code in BLOCKS:
        cmd = ["bash", "-euo", "pipefail", "-c", code] if kind == "bash" else [sys.executable, "-c", code]
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"README block failed:\n{code}\n--- stderr ---\n{out.stderr[-3000:]}"
    assert (tmp_path / "out" / "run" / "settings.yaml").is_file()
    assert (tmp_path / "out" / "ablate" / "ablation.json").is_file()
