"""What every process of one run must agree on, as one sha256 per key (compared by `Group.check_same`).

Contract: `settings_digests(command, settings, inputs)` is taken before anything loads: one digest per
setting of the command (the dict its owner file records, input paths left out), one per input by its
contents in light form (`light_fingerprint`), and one for eagle-eval's own source files and the library
versions, so a node with other code or another torch is named at once. `loaded_digests(resolved,
prompt_digests, inputs)` is taken after the target, head and prompts are loaded: the resolved settings
(`Oracle.resolved`, less what is each replica's own: its devices and the spellings of its paths) and the
token ids of every prompt.

Why a light fingerprint and not the owner file's full one: every process would read every weight
file (a 600 GB checkpoint, once per process); file names and sizes plus the bytes of the small files
(config.json, tokenizer, template, prompts) tell two copies of a checkpoint apart in practice, and rank 0
still records the full sha256 of every input in the owner file. Spellings are not compared: another
node may hold the same checkpoint under another path.
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

from eagle_eval.results.run_folder import file_sha256

SMALL_FILE = 32 << 20          # files up to this size are hashed; larger ones (weights) by size only
_PACKAGE = Path(__file__).resolve().parent.parent


def _sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def light_fingerprint(path: str | Path) -> dict:
    """{"file": size and sha256 (small)} or {"folder": {name: size and sha256 (small files)}} (hidden
    files skipped), or {"missing": true}."""
    p = Path(path)

    def one(f: Path) -> dict:
        size = f.stat().st_size
        return {"size": size, **({"sha256": file_sha256(f)} if size <= SMALL_FILE else {})}

    if p.is_file():
        return {"file": one(p)}
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file()
                       and not any(part.startswith(".") for part in f.relative_to(p).parts))
        return {"folder": {str(f.relative_to(p)): one(f) for f in files}}
    return {"missing": True}


@lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 over eagle-eval's own .py files (names and bytes) and the versions of the libraries
    that decide the numbers."""
    import importlib.metadata as md

    h = hashlib.sha256()
    for f in sorted(_PACKAGE.rglob("*.py")):
        h.update(str(f.relative_to(_PACKAGE)).encode() + b"\0" + f.read_bytes() + b"\0")
    for name in ("torch", "transformers", "accelerate", "safetensors", "tokenizers"):
        try:
            h.update(f"{name}={md.version(name)}\0".encode())
        except md.PackageNotFoundError:
            h.update(f"{name}=none\0".encode())
    return h.hexdigest()


def settings_digests(command: str, settings: dict, inputs: dict[str, str | None]) -> dict[str, str]:
    """{key: sha256}: the command, each setting (not the input paths), each given input by contents,
    the code and library versions."""
    out = {"command": _sha(command), "eagle-eval code and library versions": code_digest()}
    out.update({k: _sha(v) for k, v in settings.items() if k not in inputs})
    out.update({f"contents of --{k.replace('_', '-')}": _sha(light_fingerprint(v))
                for k, v in inputs.items() if v is not None})
    return out


def _roots(inputs: dict[str, str | None]) -> list[tuple[str, str]]:
    """(spelling, placeholder) for each input path, as given and resolved, the longest first."""
    pairs = set()
    for k, v in inputs.items():
        if v is not None:
            pairs |= {(str(v), f"<{k}>"), (str(Path(v).resolve()), f"<{k}>")}
    return sorted(pairs, key=lambda p: -len(p[0]))


def _scrub(value, roots):
    """`value` without what is one replica's own: devices, and input paths (replaced by their name)."""
    if isinstance(value, dict):
        return {k: _scrub(v, roots) for k, v in value.items() if k not in ("devices", "draft_device")}
    if isinstance(value, (list, tuple)):
        return [_scrub(v, roots) for v in value]
    if isinstance(value, str):
        for spelling, name in roots:
            value = value.replace(spelling, name)
    return value


def loaded_digests(resolved: dict, prompt_digests: dict[str, str], inputs: dict[str, str | None]) -> dict[str, str]:
    """{key: sha256} of the resolved settings (devices and path spellings left out) and of the
    prompts' token ids."""
    clean = _scrub(resolved, _roots(inputs))
    return {**{f"resolved {k}": _sha(v) for k, v in clean.items()}, "prompt token ids": _sha(prompt_digests)}
