"""Run configuration: frozen dataclasses validated at construction (no torch).

CLI flags mirror these fields one to one; `None` means "not given" and is resolved (and echoed)
by the API.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TARGET = REPO_ROOT / "checkpoints" / "target"
BUNDLED_DRAFT = REPO_ROOT / "checkpoints" / "draft"
BUNDLED_PROMPTS = REPO_ROOT / "data" / "prompts.jsonl"

EMBEDDING_CHOICES = ("auto", "target", "own")
DTYPE_CHOICES = ("auto", "bf16", "fp16", "fp32")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the option."""


@dataclass(frozen=True)
class RunConfig:
    target: str = str(BUNDLED_TARGET)
    draft: str = str(BUNDLED_DRAFT)
    prompts: str = str(BUNDLED_PROMPTS)
    num_steps: int = 5
    topk: int = 1
    num_draft_tokens: int | None = None      # SGLang's meaning; None = num_steps + 1 for chains
    max_new_tokens: int = 64
    aux_layers: tuple[int, ...] | None = None
    aux_convention: str = "sglang"
    draft_embedding: str = "auto"
    dtype: str = "auto"                      # auto = bf16 on a GPU, fp32 on the CPU
    device_map: str = "auto"
    max_memory: str | None = None
    trust_remote_code: bool = False
    check_lossless: bool = False
    limit: int | None = None                 # evaluate the first N prompts only
    position_offset: int = 0                 # 1 = SGLang's draft positions before PR #25015
    seed: int = 0
    output_dir: str | None = None
    resume: bool = False

    def __post_init__(self):
        if self.num_steps < 1:
            raise ConfigError(f"--num-steps must be >= 1, got {self.num_steps}")
        if self.topk < 1:
            raise ConfigError(f"--topk must be >= 1, got {self.topk}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 2:
            raise ConfigError(f"--num-draft-tokens must be >= 2 (root + one draft), got {self.num_draft_tokens}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.aux_convention not in ("sglang", "vllm", "hf"):
            raise ConfigError(f"--aux-convention must be sglang, vllm or hf, got {self.aux_convention!r}")
        if self.draft_embedding not in EMBEDDING_CHOICES:
            raise ConfigError(f"--draft-embedding must be one of {EMBEDDING_CHOICES}, got {self.draft_embedding!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.position_offset not in (0, 1):
            raise ConfigError(f"--position-offset must be 0 or 1, got {self.position_offset}")
        if self.resume and not self.output_dir:
            raise ConfigError("--resume needs --output-dir (the run to continue)")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers) if self.aux_layers is not None else None
        return d

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    # settings that do not change what is measured; a resumed run may differ in these
    RESUMABLE = ("output_dir", "resume", "limit", "check_lossless")


def parse_ids(text: str | None) -> tuple[int, ...] | None:
    """'1,15,28' or '[1, 15, 28]' -> (1, 15, 28)."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(int(p) for p in str(text).strip("[] ").split(",") if p.strip())
    except ValueError as exc:
        raise ConfigError(f"--aux-layers must be comma-separated integers, got {text!r}") from exc
