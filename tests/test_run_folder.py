"""An output folder belongs to one run: nothing lost, nothing mixed (results/run_folder.py + the commands)."""

import json
import multiprocessing as mp
import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from eagle_eval.cli import main
from eagle_eval.settings import BUNDLED_DRAFT
from eagle_eval.results import run_folder as rf

RUN = ["run", "--limit", "2", "--max-new-tokens", "4"]


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=True)


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _error(result) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit)
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith("eagle-eval: error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    result = _invoke(RUN + ["--output-dir", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("args", [
    ["profile", "--limit", "2", "--max-new-tokens", "4", "--max-steps", "2"],
    ["diagnose", "--limit", "1", "--max-new-tokens", "4", "--no-sweep", "--no-template-check"],
    ["ablate", "--limit", "1", "--max-new-tokens", "4", "--max-steps", "2", "--cost-ratio", "0.1"],
    RUN,                                             # the same command without --resume
    RUN[:-1] + ["8", "--resume"],                    # --resume with another configuration
])
def test_another_command_leaves_a_finished_folder_byte_identical(finished_run, args):
    before = _snapshot(finished_run)
    line = _error(_invoke(args + ["--output-dir", str(finished_run)]))
    assert str(finished_run) in line
    assert _snapshot(finished_run) == before


def test_a_command_does_not_overwrite_its_own_folder_without_overwrite(tmp_path):
    args = ["profile", "--limit", "1", "--max-new-tokens", "4", "--max-steps", "2", "--output-dir", str(tmp_path / "p")]
    assert _invoke(args).exit_code == 0
    before = _snapshot(tmp_path / "p")
    assert "--overwrite" in _error(_invoke(args))
    assert _snapshot(tmp_path / "p") == before
    assert _invoke(args + ["--overwrite"]).exit_code == 0
    owner = json.loads((tmp_path / "p" / rf.OWNER_FILE).read_text())
    assert owner["command"] == "profile" and owner["status"] == "finished"


def test_overwrite_replaces_another_commands_folder_but_never_foreign_files(tmp_path, finished_run):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    res = _invoke(["profile", "--limit", "1", "--max-new-tokens", "4", "--max-steps", "2", "--output-dir", str(out),
                   "--overwrite"])
    assert res.exit_code == 0, res.output
    assert not (out / "report.json").exists() and (out / "profile.json").is_file()
    (out / "mine.txt").write_text("keep me")
    line = _error(_invoke(RUN + ["--output-dir", str(out), "--overwrite"]))
    assert "mine.txt" in line and (out / "mine.txt").read_text() == "keep me"


def test_resume_after_the_heads_weights_changed_in_place_is_refused(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(BUNDLED_DRAFT, draft)
    args = RUN + ["--draft", str(draft), "--output-dir", str(tmp_path / "out")]
    assert _invoke(args).exit_code == 0
    tensors = load_file(str(draft / "model.safetensors"))
    tensors["fc.weight"] = tensors["fc.weight"] * 1.01
    save_file(tensors, str(draft / "model.safetensors"))
    line = _error(_invoke(args + ["--resume"]))
    assert "--draft" in line and str(draft) in line and "contents differ" in line


def test_resume_with_the_same_contents_spelled_differently_proceeds(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(BUNDLED_DRAFT, draft)
    out = tmp_path / "out"
    full = _invoke(RUN + ["--draft", str(draft), "--output-dir", str(tmp_path / "full")])
    assert full.exit_code == 0
    first = _invoke(RUN[:2] + ["1"] + RUN[3:] + ["--draft", str(draft), "--output-dir", str(out)])
    assert first.exit_code == 0
    other = tmp_path / "elsewhere"
    shutil.copytree(draft, other)             # same bytes, another path, plus a trailing slash on the folder
    resumed = _invoke(RUN + ["--draft", str(other) + "/", "--output-dir", str(out) + "/", "--resume"])
    assert resumed.exit_code == 0, resumed.output
    rows = [json.loads(ln) for ln in (out / "samples.jsonl").read_text().splitlines()]
    want = [json.loads(ln) for ln in (tmp_path / "full" / "samples.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in want]
    assert rows == want


def _write_rows(folder: str, n: int, queue, resume: bool):
    try:
        with rf.open_run_folder(folder, "run", {"x": 1}, {}, resume=resume) as f:
            queue.put("locked")
            for i in range(n):
                f.append_row("samples.jsonl", {"id": i})
        queue.put("done")
    except rf.RunFolderError as exc:
        queue.put(f"refused: {exc}")


@pytest.mark.parametrize("resume", [False, True])
def test_two_concurrent_writers_never_duplicate_a_row(tmp_path, resume):
    out = str(tmp_path / "out")
    held = rf.open_run_folder(out, "run", {"x": 1}, {})
    queue = mp.get_context("fork").Queue()
    other = mp.get_context("fork").Process(target=_write_rows, args=(out, 5, queue, resume))
    other.start()
    other.join(30)
    msg = queue.get(timeout=5)
    assert msg.startswith("refused:") and "another eagle-eval is writing there" in msg
    for i in range(3):
        held.append_row("samples.jsonl", {"id": i})
    held.finish()
    held.close()
    ids = [json.loads(ln)["id"] for ln in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    assert ids == [0, 1, 2]


def test_corrupt_owner_file_is_one_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / rf.OWNER_FILE).write_text("{half")
    line = _error(_invoke(RUN + ["--output-dir", str(out), "--resume"]))
    assert rf.OWNER_FILE in line


def test_corrupt_samples_on_resume_is_one_line(tmp_path):
    out = tmp_path / "out"
    assert _invoke(RUN + ["--output-dir", str(out)]).exit_code == 0
    rows = (out / "samples.jsonl").read_text().splitlines()
    (out / "samples.jsonl").write_text("{broken\n" + "\n".join(rows) + "\n")
    assert "samples.jsonl" in _error(_invoke(RUN + ["--output-dir", str(out), "--resume"]))


def test_a_cut_last_row_is_dropped_and_decoded_again(tmp_path):
    out, full = tmp_path / "out", tmp_path / "full"
    assert _invoke(RUN + ["--output-dir", str(full)]).exit_code == 0
    shutil.copytree(full, out)
    text = (out / "samples.jsonl").read_text()
    (out / "samples.jsonl").write_text(text[: len(text) - 20])
    assert _invoke(RUN + ["--output-dir", str(out), "--resume"]).exit_code == 0
    assert (out / "samples.jsonl").read_text() == (full / "samples.jsonl").read_text()
    assert json.loads((out / "report.json").read_text())["summary"] == \
        json.loads((full / "report.json").read_text())["summary"]


def test_whole_files_are_atomic_with_ordinary_permissions(tmp_path):
    old = os.umask(0o022)
    try:
        rf.write_json_atomic(tmp_path / "a.json", {"k": 1})
        (tmp_path / "b.json").write_text("{}")
    finally:
        os.umask(old)
    mode = stat.S_IMODE((tmp_path / "a.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o644
    assert json.loads((tmp_path / "a.json").read_text()) == {"k": 1}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_fingerprints_follow_contents_not_spelling(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"x" * 100)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert rf.fingerprint(tmp_path / "a") == rf.fingerprint(str(tmp_path / "b") + "/")
    (tmp_path / "b" / "w.bin").write_bytes(b"y" * 100)
    assert rf.fingerprint(tmp_path / "a") != rf.fingerprint(tmp_path / "b")


# --overwrite deletes only what eagle-eval wrote: planted and edited owner files (issue: trustworthy in careless hands)

def _planted(tmp_path, files: dict) -> Path:
    """A folder whose owner file (copied from elsewhere or edited) lists `files`."""
    out = tmp_path / "out"
    out.mkdir()
    owner = {"schema_version": rf.OWNER_SCHEMA, "command": "run", "status": "finished", "config": {}, "inputs": {},
             "files": files}
    (out / rf.OWNER_FILE).write_text(json.dumps(owner))
    return out


def _fp(path: Path) -> dict:
    data = path.read_bytes()
    import hashlib
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _overwrite(out: Path, tmp_path: Path):
    return _invoke(RUN + ["--output-dir", str(out), "--overwrite"])


@pytest.mark.parametrize("how", ["relative", "absolute_file", "absolute_dir"])
def test_overwrite_never_removes_a_listed_path_outside_the_folder(tmp_path, how):
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious.txt"
    victim.write_text("not eagle-eval's")
    name = {"relative": "../victim/precious.txt", "absolute_file": str(victim), "absolute_dir": str(victim_dir)}[how]
    out = _planted(tmp_path, {name: _fp(victim)})       # even with the right fingerprint
    line = _error(_overwrite(out, tmp_path))
    assert "nothing removed" in line and name in line
    assert victim.read_text() == "not eagle-eval's" and (out / rf.OWNER_FILE).is_file()


def test_overwrite_never_follows_a_listed_symlink_out(tmp_path):
    victim = tmp_path / "precious.txt"
    victim.write_text("not eagle-eval's")
    out = _planted(tmp_path, {"report.json": _fp(victim)})
    (out / "report.json").symlink_to(victim)
    line = _error(_overwrite(out, tmp_path))
    assert "report.json (a symbolic link)" in line
    assert victim.read_text() == "not eagle-eval's" and (out / "report.json").is_symlink()


def test_overwrite_leaves_a_file_changed_since_it_was_written(tmp_path, finished_run):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "report.json").write_text((out / "report.json").read_text().replace("accept_length", "my_notes"))
    before = _snapshot(out)
    line = _error(_overwrite(out, tmp_path))
    assert "report.json (changed since eagle-eval wrote it)" in line
    assert _snapshot(out) == before                     # nothing removed, not even the unchanged files


def test_overwrite_leaves_files_an_owner_lists_without_fingerprints(tmp_path, finished_run):
    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    owner = json.loads((out / rf.OWNER_FILE).read_text())
    owner["files"] = list(owner["files"])               # an older owner file: names only
    (out / rf.OWNER_FILE).write_text(json.dumps(owner))
    before = _snapshot(out)
    assert "without a fingerprint" in _error(_overwrite(out, tmp_path))
    assert _snapshot(out) == before


def test_overwrite_never_removes_a_listed_folder_or_the_lock(tmp_path):
    out = _planted(tmp_path, {"sub": {"sha256": "0" * 64, "size": 0}, rf.LOCK_FILE: _fp(Path(os.devnull))})
    (out / "sub").mkdir()
    (out / "sub" / "keep.txt").write_text("x")
    line = _error(_overwrite(out, tmp_path))
    assert "sub (not a regular file)" in line and (out / "sub" / "keep.txt").is_file()


def test_owner_fingerprints_follow_every_write_and_a_crash_row_is_accepted(tmp_path):
    out = tmp_path / "out"
    with rf.open_run_folder(out, "run", {"x": 1}, {}) as f:
        f.append_row("samples.jsonl", {"id": 0})
        f.append_row("samples.jsonl", {"id": 1})
        f.write_json("report.json", {"k": 1})
        f.write_with("a.csv", lambda p: p.write_text("a,b\n"))
        f.finish()
    owner = json.loads((out / rf.OWNER_FILE).read_text())
    assert {n: _fp(out / n) for n in ("samples.jsonl", "report.json", "a.csv")} == owner["files"]
    # kill -9 between an append and the owner file's update: one whole row more than recorded
    with open(out / "samples.jsonl", "a") as fh:
        fh.write(json.dumps({"id": 2}) + "\n")
    assert rf._removable(out, "samples.jsonl", owner["files"]["samples.jsonl"]) is None
    with open(out / "samples.jsonl", "a") as fh:
        fh.write("{not json\n")
    assert rf._removable(out, "samples.jsonl", owner["files"]["samples.jsonl"]) == "changed since eagle-eval wrote it"
