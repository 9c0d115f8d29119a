"""Fingerprints of the inputs an output folder records: cheap by default, every byte on request.

Contract: `fingerprint(path, full=False)` says whether a file or folder still holds what a run started
with, in seconds for a 700 GB target. What a sampled fingerprint covers (`SAMPLED_COVERS`, recorded in
the owner file):
- a file up to `FULL_BELOW` bytes: every byte (configs, tokenizers, small heads);
- a larger safetensors file: its size, its whole header (every tensor's name, dtype, shape and offsets)
  and the first, middle and last `BLOCK` bytes of every tensor's data;
- a larger zip-format torch file (`torch.save`, e.g. pytorch_model.bin): its size, the zip directory and
  the first, middle and last `BLOCK` bytes of every member (each tensor storage is one member);
- any other large file: its size and `SPREAD` blocks spread evenly over it.
A tensor rewritten in place (scaled, retrained, replaced) changes its first block, so it is caught; an
edit of a few values inside a large tensor, between the sampled blocks, is not: `full=True` (the CLI's
--full-fingerprint) hashes every byte (about 0.8 s per GB), with a progress bar once it reads more than
`LONG_READ` bytes. Fingerprints of the two methods differ; `same_contents` compares like with like.
Hidden files are skipped in folders. No torch.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

FULL, SAMPLED = "full", "sampled-v1"
FULL_BELOW = 64 << 20          # bytes: smaller files are hashed whole even when sampling
BLOCK = 4096                   # bytes read at each sampled place
SPREAD = 64                    # blocks over a large file of another format
LONG_READ = 1 << 30            # a full fingerprint reading more than this shows a bar
CHUNK = 16 << 20
SAMPLED_COVERS = (f"files up to {FULL_BELOW >> 20} MiB: every byte; larger safetensors: size, header and the first, "
                  f"middle and last {BLOCK} bytes of each tensor; larger zip torch files: size, directory and the "
                  f"same blocks of each member; other large files: size and {SPREAD} evenly spread blocks")
FULL_COVERS = "every byte of every file"
_cache: dict[tuple, str] = {}


def _whole(path: Path, bar=None) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return h.hexdigest()


def _spans(f, size: int) -> list[tuple[int, int]] | None:
    """(start, end) of each tensor's data of a safetensors file, or None when it is not one."""
    head = f.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    if n > min(size - 8, 100 << 20):
        return None
    try:
        header = json.loads(f.read(n))
        spans = [tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return [(8 + n, 8 + n)] + [(8 + n + a, 8 + n + b) for a, b in sorted(spans)]


def _zip_spans(path: Path) -> list[tuple[int, int]] | None:
    """(start, end) of each stored member's data of a zip (torch.save) file, or None."""
    if not zipfile.is_zipfile(path):
        return None
    out = []
    with zipfile.ZipFile(path) as z, open(path, "rb") as f:
        for info in z.infolist():
            f.seek(info.header_offset)
            local = f.read(30)
            if len(local) < 30 or local[:4] != b"PK\x03\x04":
                return None
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            start = info.header_offset + 30 + name_len + extra_len
            out.append((start, start + info.compress_size))
    return out


def _blocks(start: int, end: int) -> list[tuple[int, int]]:
    """The first, middle and last BLOCK bytes of [start, end) (all of it when that is shorter)."""
    if end - start <= 3 * BLOCK:
        return [(start, end)]
    mid = start + (end - start) // 2 - BLOCK // 2
    return [(start, start + BLOCK), (mid, mid + BLOCK), (end - BLOCK, end)]


def _sampled(path: Path, size: int) -> str:
    h = hashlib.sha256(f"{SAMPLED} size {size}\n".encode())
    with open(path, "rb") as f:
        spans = _spans(f, size) if path.suffix == ".safetensors" else None
        if spans is not None:
            f.seek(0)
            h.update(f.read(spans[0][0]))                          # the whole header
            places = [b for s, e in spans[1:] for b in _blocks(s, e)]
        else:
            members = _zip_spans(path)
            if members is not None:                                # the first header and the directory
                places = [(0, min(BLOCK, size)), (max(0, size - (64 << 10)), size)]
                places += [b for s, e in members for b in _blocks(s, e)]
            elif size <= 2 * SPREAD * BLOCK:
                places = [(0, size)]
            else:
                step = (size - BLOCK) // (SPREAD - 1)
                places = [(i * step, i * step + BLOCK) for i in range(SPREAD)] + [(size - BLOCK, size)]
        for start, end in places:
            f.seek(start)
            h.update(struct.pack("<QQ", start, end))
            h.update(f.read(end - start))
    return h.hexdigest()


def file_digest(path: Path, full: bool = False, bar=None) -> str:
    """sha256 of every byte (`full`, or a file up to FULL_BELOW), else of the sampled places (module
    docstring); cached per process by (path, size, mtime, method)."""
    st = path.stat()
    method = FULL if full or st.st_size <= FULL_BELOW else SAMPLED
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, method)
    if key not in _cache:
        _cache[key] = _whole(path, bar) if method == FULL else _sampled(path, st.st_size)
    elif bar is not None and method == FULL:
        bar.update(st.st_size)
    return _cache[key]


def _files(p: Path) -> list[Path]:
    return sorted(f for f in p.rglob("*") if f.is_file()
                  and not any(part.startswith(".") for part in f.relative_to(p).parts))


def _bar(files: list[Path], full: bool, progress):
    """A tqdm bar over the bytes a full fingerprint reads, when that is long (None otherwise)."""
    if not full or not progress:
        return None
    total = sum(f.stat().st_size for f in files)
    if total < LONG_READ:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="B", unit_scale=True, desc=f"fingerprint (every byte of {files[0].parent})")


def fingerprint(path: str | Path, full: bool = False, progress: bool = True) -> dict:
    """{"kind": "file", "sha256", "method", "covers"} or {"kind": "folder", "files": {relative name:
    sha256}, "method", "covers"}; a path that does not exist is {"kind": "missing"} (the loader will
    say so). `progress`: a bar when a full fingerprint reads more than LONG_READ bytes."""
    p = Path(path)
    method, covers = (FULL, FULL_COVERS) if full else (SAMPLED, SAMPLED_COVERS)
    if not p.is_file() and not p.is_dir():
        return {"kind": "missing"}
    files = [p] if p.is_file() else _files(p)
    bar = _bar(files, full, progress) if files else None
    try:
        if p.is_file():
            return {"kind": "file", "sha256": file_digest(p, full, bar), "method": method, "covers": covers}
        return {"kind": "folder", "files": {str(f.relative_to(p)): file_digest(f, full, bar) for f in files},
                "method": method, "covers": covers}
    finally:
        if bar is not None:
            bar.close()


def method_of(fp: dict | None) -> str:
    """The method a recorded fingerprint was made with (older owner files hashed every byte)."""
    return (fp or {}).get("method", FULL)


def same_contents(before: dict | None, path, now: dict) -> bool:
    """Whether `path` (fingerprinted `now`) holds what `before` recorded, compared with before's method."""
    if before is None:
        return False
    if method_of(before) != method_of(now) and now.get("kind") != "missing":
        now = fingerprint(path, full=method_of(before) == FULL)
    strip = ("method", "covers")
    if method_of(before) == FULL:       # older owner files wrote neither key
        return {k: v for k, v in before.items() if k not in strip} == {k: v for k, v in now.items() if k not in strip}
    return before == now
