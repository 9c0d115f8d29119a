"""An output folder belongs to one run: its owner file, the inputs' fingerprints, a lock, atomic writes.

Contract: `open_run_folder(path, command, config, inputs, resume=, overwrite=)` returns a `RunFolder`
holding an exclusive `fcntl.flock` on `<folder>/.eagle-eval.lock` for as long as the run writes there
(a second writer gets a `RunFolderError` at once). The owner file `eagle_eval_run.json` records the
command, its configuration and a fingerprint of every input's contents (files, or every file of a
folder; sampled unless `full_fingerprint`, what it covers recorded: results/input_digests.py), never the
inputs' spellings: a resumed run must match the owner in all three, so a head whose weights
were replaced in place is refused and the same folder spelled with a trailing slash is accepted.
A folder owned by another command or configuration is refused without touching a byte of it, unless
resuming (same owner, same fingerprints, an owner file of schema OWNER_SCHEMA: another version is refused,
naming the file and both versions) or `overwrite` (the old run's files are removed first).
The owner file lists every file the run wrote with the sha256 and size of what it wrote; `--overwrite`
removes a listed entry only when it is a plain name inside the folder, a regular file (no link), and
still holds those bytes (`_removable`). Anything else (a name that climbs out or is absolute, a link, a
folder, a file changed since, an entry of an older owner file with no fingerprint) makes the overwrite
refuse with the entries named, before anything is removed. Whole files go through `write_atomic`
(temporary file, then rename, with the permissions an ordinary file would get); rows through
`append_row` (flushed, the fingerprint carried forward). Every OSError of the folder (a read-only or
full file system, a symbolic link loop, no permission) becomes a `RunFolderError` naming the folder
and the cause (`os_cause`); nothing of it is a traceback. This module knows nothing about models;
torch is not imported.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from eagle_eval.errors import UserError
from eagle_eval.results.input_digests import file_digest, fingerprint, same_contents  # noqa: F401 (fingerprint re-exported)

OWNER_FILE = "eagle_eval_run.json"
LOCK_FILE = ".eagle-eval.lock"
OWNER_SCHEMA = 3              # 2: "files" maps each name to the sha256 and size of what was written;
#                               3: each input's fingerprint says its method and what it covers (input_digests.py)
# names older eagle-eval versions wrote: such a folder is recognised as eagle-eval's (never resumed)
KNOWN_FILES = frozenset({"report.json", "samples.jsonl", "run_config.json", "acceptance.csv", "profile.json",
                         "ablation.json", "ablation.csv", "ablation.png", "diagnosis.json", "server_check.json"})
_CHUNK = 16 << 20


class RunFolderError(UserError, ValueError):
    """An output folder that this run may not write to; the message names the folder and what to do."""


# the causes a user can fix, in words (the others: the system's own strerror)
_CAUSES = {errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on device",
           errno.EDQUOT: "disk quota exceeded", errno.ELOOP: "too many levels of symbolic links (a link loop?)",
           errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
           errno.ENOTDIR: "a part of the path is a file, not a folder", errno.ENAMETOOLONG: "file name too long",
           errno.EISDIR: "is a folder"}


def os_cause(exc: OSError) -> str:
    """'no space left on device at /out/samples.jsonl': what the system said, in words, and where."""
    said = _CAUSES.get(exc.errno) or exc.strerror or type(exc).__name__
    return f"{said} at {exc.filename}" if exc.filename else said


@contextmanager
def _os_errors(prefix: str, hint: str = ""):
    """OSError -> RunFolderError(f"{prefix} ({cause}){hint}"); our own errors pass through."""
    try:
        yield
    except RunFolderError:
        raise
    except OSError as exc:
        raise RunFolderError(f"{prefix} ({os_cause(exc)}){hint}") from exc


def file_sha256(path: Path) -> str:
    """sha256 of every byte of a file (fingerprints.file_digest, full; cached per process)."""
    return file_digest(Path(path), full=True)


def _input_fingerprint(name: str, path, full: bool = False) -> dict:
    """fingerprint(path) (sampled unless `full`, results/input_digests.py), an unreadable input said as one
    line naming its option."""
    with _os_errors(f"--{name.replace('_', '-')} {path}: cannot be read"):
        return fingerprint(path, full=full)


def fingerprint_value(value) -> str:
    """sha256 of a JSON-serialisable value (e.g. the resolved workload's token ids)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomic(path: str | Path, text: str | bytes) -> None:
    """Write a whole file (text or bytes): temporary file in the same folder, then rename; a crash never
    leaves half of it."""
    path = Path(path)
    with _os_errors(f"{path}: cannot be written"):
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, _file_mode())             # mkstemp makes 0600; match the folder's other files
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def write_json_atomic(path: str | Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=2) + "\n")


def _input_same(name: str, before: dict | None, now: dict) -> bool:
    with _os_errors(f"--{name.replace('_', '-')} {now['path']}: cannot be read"):
        return same_contents(before, now["path"], now["fingerprint"])


def _differences(owner: dict, command: str, config: dict, inputs: dict, ignore: tuple) -> list[str]:
    """What differs between the folder's owner and this run, in words; [] = the same run."""
    if owner.get("command") != command:
        return [f"it was written by `eagle-eval {owner.get('command')}`, not `eagle-eval {command}`"]
    saved = owner.get("config") or {}
    out = [f"option {k}: {saved.get(k)!r} -> {v!r}" for k, v in config.items()
           if k not in ignore and k not in inputs and saved.get(k) != v]
    for name, now in inputs.items():
        before = (owner.get("inputs") or {}).get(name)
        if before is None or not _input_same(name, before.get("fingerprint"), now):
            out.append(f"--{name.replace('_', '-')} {now['path']}: its contents differ from those the run "
                       f"started with ({(before or {}).get('path')})")
    return out


class RunFolder:
    """An output folder held by this run (see the module docstring); use as a context manager."""

    def __init__(self, path: Path, lock_fd: int, owner: dict):
        self.path, self._lock_fd, self.owner = path, lock_fd, owner
        self._appending: dict[str, object] = {}      # name -> running sha256 of an appended file

    def file(self, name: str) -> Path:
        return self.path / name

    def write_json(self, name: str, obj) -> None:
        self.write_text(name, json.dumps(obj, indent=2) + "\n")

    def write_text(self, name: str, text: str | bytes) -> None:
        self._appending.pop(name, None)
        write_atomic(self.path / name, text)
        self._record(name, _content_fingerprint(text.encode() if isinstance(text, str) else text))

    def write_with(self, name: str, writer) -> None:
        """A file made by another writer (a CSV, a plot): `writer(path)` writes a temporary file in the
        folder, which is then renamed into place and fingerprinted as this run's."""
        with _os_errors(f"--output-dir {self.path}: cannot write {name}"):
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{name}-", suffix=".tmp")
            os.close(fd)
            try:
                writer(Path(tmp))
                os.chmod(tmp, _file_mode())
                os.replace(tmp, self.path / name)
            finally:
                Path(tmp).unlink(missing_ok=True)
            self._appending.pop(name, None)
            self._record(name, _file_fingerprint(self.path / name))

    def append_row(self, name: str, row: dict) -> None:
        """Append one JSONL row and flush it, so an interrupted run keeps every finished row; the owner
        file then records the longer file's fingerprint (a crash in between leaves one unrecorded row,
        which `_removable` accepts)."""
        line = (json.dumps(row) + "\n").encode()
        with _os_errors(f"--output-dir {self.path}: cannot append to {name}",
                        "; the rows written before are kept: free the cause, then continue with --resume"):
            if name not in self._appending:
                self._appending[name] = _running_hash(self.path / name, self.owner["files"].get(name))
            h = self._appending[name]
            with open(self.path / name, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        h.update(line)
        size = (self.owner["files"].get(name) or {}).get("size", 0) + len(line)
        self._record(name, {"sha256": h.hexdigest(), "size": size})

    def remove(self, name: str) -> None:
        """Remove a file this run wrote there; its entry leaves the owner file."""
        with _os_errors(f"--output-dir {self.path}: cannot remove {name}"):
            (self.path / name).unlink(missing_ok=True)
        self._appending.pop(name, None)
        self.owner["files"].pop(name, None)
        self._save()

    def record_workload(self, digests: dict[str, str], resume: bool) -> None:
        """{prompt id: sha256 of its token ids}: known only after loading; on resume every id already
        recorded must have the same tokens (same files, same tokenization and template)."""
        before = self.owner.setdefault("workload", {})
        changed = sorted(k for k in digests if k in before and before[k] != digests[k])
        if resume and changed:
            raise RunFolderError(f"--resume: {self.path}: prompt {changed[0]!r} renders to other token ids than when "
                                 "the run started (tokenizer, template or prompt options changed)")
        before.update(digests)
        self._save()

    def finish(self) -> None:
        self.owner["status"] = "finished"
        self.owner["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self._save()

    def close(self) -> None:
        if self._lock_fd >= 0:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _record(self, name: str, fp: dict) -> None:
        self.owner["files"][name] = fp
        self._save()

    def _save(self) -> None:
        with _os_errors(f"--output-dir {self.path}: cannot write {OWNER_FILE}"):
            write_json_atomic(self.path / OWNER_FILE, self.owner)


def _content_fingerprint(data: bytes) -> dict:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def _file_fingerprint(path: Path) -> dict:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
            size += len(chunk)
    return {"sha256": h.hexdigest(), "size": size}


def _running_hash(path: Path, recorded: dict | None):
    """sha256 object over a file's current bytes, to carry forward while rows are appended. The file
    must hold what the owner recorded (resume rewrites it first): anything else is not this run's."""
    h = hashlib.sha256()
    if path.exists():
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                h.update(chunk)
    if recorded is not None and h.hexdigest() != recorded.get("sha256"):
        raise RunFolderError(f"{path}: changed since this run wrote it (its sha256 is not the one "
                             f"{OWNER_FILE} records); pass --overwrite to start afresh or choose another --output-dir")
    return h


def _read_owner(folder: Path) -> dict | None:
    """The folder's owner file, its "files" as {name: fingerprint or None} (an older owner file listed
    names without fingerprints)."""
    file = folder / OWNER_FILE
    if not file.is_file():
        return None
    try:
        owner = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"{file}: not valid JSON ({exc}); the folder's state is unknown: choose another "
                             "--output-dir (--overwrite removes only files an intact owner file lists)") from exc
    files = owner.get("files") if isinstance(owner, dict) else None
    if not isinstance(files, (list, dict)) or "command" not in owner:
        raise RunFolderError(f"{file}: not an eagle-eval owner file (keys 'command' and 'files' expected); "
                             "choose another --output-dir (--overwrite removes only files an intact owner file lists)")
    if isinstance(files, list):
        owner["files"] = {str(n): None for n in files}
    else:
        owner["files"] = {str(n): fp if isinstance(fp, dict) else None for n, fp in files.items()}
    return owner


def _foreign(folder: Path, owner: dict | None) -> list[str]:
    """Entries of the folder that no eagle-eval run wrote."""
    ours = KNOWN_FILES | {OWNER_FILE, LOCK_FILE} | set((owner or {}).get("files", {}))
    return sorted(e.name for e in folder.iterdir() if e.name not in ours and not e.name.startswith("."))


def _removable(folder: Path, name: str, recorded: dict | None) -> str | None:
    """None when `--overwrite` may remove the listed entry `name`, else why not (in words). Removable:
    a plain name of an entry directly inside the folder, a regular file (not a link, not a folder),
    holding the bytes the owner file records (or those plus one whole JSONL row, left unrecorded by a
    crash between an append and the owner file's update)."""
    if name in (OWNER_FILE, LOCK_FILE):
        return "the folder's own bookkeeping, never listed by eagle-eval"
    if not name or name in (".", "..") or "/" in name or "\\" in name or Path(name).is_absolute():
        return "not a file name inside the folder"
    path = folder / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if path.resolve().parent != folder.resolve():
        return "outside the folder"
    if recorded is None or "sha256" not in recorded or "size" not in recorded:
        return "listed without a fingerprint (an older eagle-eval's owner file)"
    if st.st_size == recorded["size"]:
        return None if _file_fingerprint(path)["sha256"] == recorded["sha256"] else "changed since eagle-eval wrote it"
    if st.st_size > recorded["size"]:
        with open(path, "rb") as f:
            head, tail = f.read(recorded["size"]), f.read()
        if hashlib.sha256(head).hexdigest() == recorded["sha256"] and tail.endswith(b"\n") and \
                tail.count(b"\n") == 1 and _is_json(tail):
            return None
    return "changed since eagle-eval wrote it"


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except (ValueError, UnicodeDecodeError):
        return False


def _check(folder: Path, command: str, config: dict, inputs: dict, resume: bool, overwrite: bool,
           ignore: tuple, locked: bool = False) -> dict | None:
    """Refuse what this run may not do to the folder; returns its owner (None: new or to be replaced)."""
    if os.path.islink(folder) and not folder.exists():
        try:
            os.stat(folder)
        except OSError as exc:
            raise RunFolderError(f"--output-dir {folder}: a symbolic link that leads to no folder "
                                 f"({os_cause(exc)})") from exc
    if folder.exists() and not folder.is_dir():
        raise RunFolderError(f"--output-dir {folder}: is a file, not a folder")
    if not folder.is_dir():
        if resume:
            raise RunFolderError(f"--resume: {folder} does not exist (nothing to resume)")
        return None
    if not locked:
        _refuse_if_busy(folder)
    owner = _read_owner(folder) if not overwrite else None
    foreign = _foreign(folder, owner if not overwrite else _safe_owner(folder))
    if foreign:
        raise RunFolderError(f"--output-dir {folder}: holds files eagle-eval did not write ({', '.join(foreign[:3])}"
                             f"{', ...' if len(foreign) > 3 else ''}); choose another --output-dir")
    if overwrite:
        _removal_plan(folder, _safe_owner(folder))
        return None
    if owner is None:
        if any(e.name != LOCK_FILE for e in folder.iterdir()):
            raise RunFolderError(f"--output-dir {folder}: holds results of an older eagle-eval without an owner "
                                 f"file ({OWNER_FILE}), which --overwrite does not remove (it removes only files an owner file "
                                 "lists with their fingerprints); move them yourself or choose another --output-dir")
        if resume:
            raise RunFolderError(f"--resume: {folder} holds no run (nothing to resume)")
        return None
    if resume and owner.get("schema_version") != OWNER_SCHEMA:
        version = owner.get("schema_version")
        said = "has no schema_version" if version is None else f"has schema_version {json.dumps(version)[:20]}"
        raise RunFolderError(f"--resume: {folder / OWNER_FILE} {said}; this eagle-eval resumes owner files of "
                             f"schema_version {OWNER_SCHEMA} only (resume it with the eagle-eval that wrote it, or "
                             "choose another --output-dir)")
    diff = _differences(owner, command, config, inputs, ignore)
    if resume and diff:
        raise RunFolderError(f"--resume: {folder} belongs to another run: " + "; ".join(diff))
    if not resume:
        state = "a finished" if owner.get("status") == "finished" else "an unfinished (interrupted?)"
        hint = "pass --resume to continue it, " if command == "run" and not diff else ""
        raise RunFolderError(f"--output-dir {folder}: holds {state} `eagle-eval {owner.get('command')}`; "
                             f"{hint}pass --overwrite to replace it, or choose another --output-dir")
    return owner


def _safe_owner(folder: Path) -> dict | None:
    try:
        return _read_owner(folder)
    except RunFolderError:
        return None


def _busy_error(folder: Path) -> RunFolderError:
    return RunFolderError(f"--output-dir {folder}: another eagle-eval is writing there right now "
                          f"({folder / LOCK_FILE} is locked); wait for it or choose another --output-dir")


def _refuse_if_busy(folder: Path) -> None:
    """A live writer holds the lock: say so (opening the lock file changes no byte of the folder)."""
    try:
        fd = os.open(folder / LOCK_FILE, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _busy_error(folder) from None
    finally:
        os.close(fd)                         # closing releases a lock taken here


def _lock(folder: Path) -> int:
    lock_file = folder / LOCK_FILE
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, _file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _busy_error(folder) from None
    return fd


def _removal_plan(folder: Path, owner: dict | None) -> list[str]:
    """--overwrite: the listed entries to remove; refuses (nothing removed yet) when one of the entries
    the owner file lists, or a results file it does not list, may not be removed (`_removable`)."""
    listed = dict((owner or {}).get("files", {}))
    present = [n for n in listed if "/" in n or Path(n).is_absolute() or os.path.lexists(folder / n)]
    kept = [(n, why) for n in present if (why := _removable(folder, n, listed[n])) not in (None, "absent")]
    kept += [(n, "not listed in the owner file") for n in sorted(KNOWN_FILES)
             if n not in listed and os.path.lexists(folder / n)]
    if kept:
        named = "; ".join(f"{n} ({why})" for n, why in kept[:5]) + ("; ..." if len(kept) > 5 else "")
        raise RunFolderError(f"--overwrite: {folder}: nothing removed, these are left as they are: {named}. "
                             "eagle-eval removes only files it wrote there, unchanged; move these yourself or "
                             "choose another --output-dir")
    return [n for n in present if os.path.lexists(folder / n)]


def _clear(folder: Path, owner: dict | None) -> None:
    """--overwrite: remove the old run's files and its owner file (see `_removal_plan`)."""
    for name in _removal_plan(folder, owner):
        (folder / name).unlink()
    (folder / OWNER_FILE).unlink(missing_ok=True)


def open_run_folder(path: str | Path, command: str, config: dict, inputs: dict[str, str | None],
                    resume: bool = False, overwrite: bool = False, ignore: tuple = (),
                    full_fingerprint: bool = False) -> RunFolder:
    """Take the output folder for `command` (see the module docstring).

    config: the command's settings (JSON values); inputs: {config key: path} of every file or folder
    read (None = not given), compared by contents instead of by spelling (sampled, or every byte with
    `full_fingerprint`: results/input_digests.py); ignore: config keys a resumed run may change (e.g. --limit)."""
    if resume and overwrite:
        raise RunFolderError("--resume and --overwrite exclude each other")
    folder = Path(path)
    given = {k: {"path": str(v), "fingerprint": _input_fingerprint(k, v, full_fingerprint)}
             for k, v in inputs.items() if v is not None}
    with _os_errors(f"--output-dir {folder}: cannot be used"):
        _check(folder, command, config, given, resume, overwrite, ignore)     # refuse before touching anything
    with _os_errors(f"--output-dir {folder}: cannot be created"):
        folder.mkdir(parents=True, exist_ok=True)
    with _os_errors(f"--output-dir {folder}: cannot be locked"):
        fd = _lock(folder)
    try:
        with _os_errors(f"--output-dir {folder}: cannot be used"):
            owner = _check(folder, command, config, given, resume, overwrite, ignore, locked=True)   # again, locked
            if owner is None:
                _clear(folder, _safe_owner(folder))
        if owner is None:
            owner = {"schema_version": OWNER_SCHEMA, "command": command, "status": "running",
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "config": config, "inputs": given,
                     "files": {}}
        else:
            owner.update(status="running", resumed=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        rf = RunFolder(folder, fd, owner)
        rf._save()
        return rf
    except BaseException:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
        raise
