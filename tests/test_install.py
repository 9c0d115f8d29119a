"""Installed like a library: the bundled checkpoints, prompts and plan configs are package data
(eagle_eval/bundled/ links to the repository's checkpoints/ and data/; a wheel holds the files), so a
non-editable install runs the main job from any folder, and a missing bundled file says why.

The wheel test builds the wheel, installs it with its dependencies in a fresh `python -m venv` (torch 2.13.0
first, from the local wheel folder) and runs the main job from a folder outside the repository: marked
`wheel` (and `slow`) for its cost, `-m "not wheel"` leaves it out (setup.cfg says what it costs)."""

import fnmatch
import os
import shutil
import subprocess
import sys
import time
from configparser import ConfigParser
from pathlib import Path

import pytest

from eagle_eval.settings import BUNDLED, BUNDLED_DRAFT, BUNDLED_PROMPTS, BUNDLED_TARGET, REPO_ROOT, ConfigError

# what a source needs to build the wheel (setup.cfg's long_description reads README.md)
SOURCE = ("setup.cfg", "pyproject.toml", "README.md", "eagle_eval", "checkpoints", "data")


def _package_data_globs() -> list[str]:
    cfg = ConfigParser()
    cfg.read(REPO_ROOT / "setup.cfg")
    return [g.strip() for g in cfg["options.package_data"]["eagle_eval"].split(",")]


def test_every_bundled_file_is_package_data():
    """Each file under checkpoints/ and data/ matches a package_data glob (as setuptools matches them, relative
    to the package), so a new bundled file cannot be left out of the wheel."""
    globs = _package_data_globs()
    files = [f for top in ("checkpoints", "data") for f in (BUNDLED / top).rglob("*") if f.is_file()]
    assert len(files) >= 18                        # the four checkpoints, the prompts, the plan configs
    for f in files:
        rel = "bundled/" + f.relative_to(BUNDLED).as_posix()
        assert any(fnmatch.fnmatchcase(rel, g) and rel.count("/") == g.count("/") for g in globs), rel


def test_the_defaults_are_the_packages_own_and_the_repository_layout_still_works():
    package = Path(__import__("eagle_eval").__file__).resolve().parent
    for path in (BUNDLED_TARGET, BUNDLED_DRAFT, BUNDLED_PROMPTS):
        assert path.exists() and package / "bundled" in path.parents
    # in a checkout, the package's bundled/ leads to the repository's folders (scripts/build_bundled.py writes
    # checkpoints/, tests read them there)
    assert BUNDLED_TARGET.resolve() == (REPO_ROOT / "checkpoints" / "target").resolve()
    assert (BUNDLED / "data" / "plan" / "kimi-k2.5" / "config.json").is_file()


def test_a_missing_bundled_default_says_why(tmp_path):
    from eagle_eval.models.hub import model_folder
    from eagle_eval.workload.conversations import _existing
    from eagle_eval.workload.data import DataError

    with pytest.raises(ConfigError, match=r"--target: .*bundled/checkpoints/gone is bundled with eagle-eval "
                                          r"\(package data\) but missing from this install: it was installed without "
                                          r"its package data"):
        model_folder(str(BUNDLED / "checkpoints" / "gone"), None, "--target")
    with pytest.raises(DataError, match=r"--prompts: .* is bundled with eagle-eval \(package data\) but missing"):
        _existing(str(BUNDLED / "data" / "gone.jsonl"))


def _clean_env(**extra) -> dict:
    """This process's environment without what would let the installed package see the repository."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def _run(cmd, cwd, timeout=600):
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
@pytest.mark.wheel
def test_the_wheel_in_a_fresh_venv_runs_the_main_job_from_any_folder(tmp_path):
    timings = {}
    t = time.perf_counter()
    src = tmp_path / "src"              # a copy of what the build reads: the checkout is not touched (build/)
    src.mkdir()
    for name in SOURCE:
        (shutil.copytree if (REPO_ROOT / name).is_dir() else shutil.copy2)(
            REPO_ROOT / name, src / name, **({"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")}
                                             if (REPO_ROOT / name).is_dir() else {}))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
          src], tmp_path)
    (wheel,) = (tmp_path / "dist").glob("eagle_eval-*.whl")
    timings["build"] = time.perf_counter() - t

    t = time.perf_counter()
    venv = tmp_path / "venv"
    # a fresh venv, filled by this interpreter's pip (`--python`: no pip of its own to bootstrap) as the README
    # says, torch 2.13.0 first (the CPU build, from local disk); --no-compile skips writing .pyc files for the
    # ~1 GB of dependencies, a third of the install's CPU time
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    py = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-compile"]
    _run([*pip, "torch==2.13.0"], tmp_path)
    _run([*pip, wheel], tmp_path)
    timings["install"] = time.perf_counter() - t

    t = time.perf_counter()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = _run([py, "-c", "import eagle_eval.settings as s; print(s.BUNDLED_TARGET); "
                  "print(sorted(p.parent.name for p in (s.BUNDLED / 'data' / 'plan').glob('*/config.json')))"],
                 elsewhere).stdout.splitlines()
    installed = Path(where[0])
    assert venv in installed.parents and not any(p.is_symlink() for p in (installed, *installed.parents))
    assert where[1] == "['deepseek-v3', 'kimi-k2.5']"       # plan --bundled-config's files (its own test: README)
    version = _run([venv / "bin" / "eagle-eval", "--version"], elsewhere).stdout
    assert version.startswith("eagle-eval 0.1.0 (torch 2.13.0")
    run = _run([venv / "bin" / "eagle-eval", "run", "--check-lossless", "--limit", "2", "--max-new-tokens", "8",
                "--output-dir", "out"], elsewhere)
    assert "lossless" in run.stdout and (elsewhere / "out" / "report.json").is_file()
    import json
    summary = json.loads((elsewhere / "out" / "report.json").read_text())["summary"]
    assert summary["prompts"] == 2 and summary["lossless"] is True
    timings["run"] = time.perf_counter() - t

    # an install whose bundled target is gone says so, in one line (exit 2)
    shutil.rmtree(installed)
    gone = subprocess.run([str(venv / "bin" / "eagle-eval"), "run", "--limit", "1"], cwd=elsewhere, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert gone.returncode == 2 and gone.stderr.strip().splitlines()[-1] == (
        f"eagle-eval: error: --target: {installed} is bundled with eagle-eval (package data) but missing from this "
        "install: it was installed without its package data (from a source without eagle_eval/bundled's files, or "
        "a checkout made without symbolic links); reinstall from a complete source or wheel, or name your own")
    print("wheel test seconds:", {k: round(v, 1) for k, v in timings.items()})
