"""Run configuration: frozen dataclasses validated at construction (no torch).

CLI flags mirror these fields one to one; `None` means "not given" and is resolved (and echoed)
by the API.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from eagle_eval.errors import UserError

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_TARGET = REPO_ROOT / "checkpoints" / "target"
BUNDLED_DRAFT = REPO_ROOT / "checkpoints" / "draft"
BUNDLED_PROMPTS = REPO_ROOT / "data" / "prompts.jsonl"

EMBEDDING_CHOICES = ("auto", "target", "own")
AUX_CONVENTIONS = ("sglang", "vllm", "hf", "boundary")    # models/capture.py CONVENTIONS
DTYPE_CHOICES = ("auto", "bf16", "fp16", "fp32")
FP8_MATMUL_CHOICES = ("auto", "kernel", "dequantize")     # models/quant/fp8.py
# dataset readers (eagle_eval/datasets.py); "prompts" is the plain prompt JSONL of --prompts
DATASET_FORMATS = ("mt_bench", "spec_bench", "gsm8k", "humaneval", "alpaca", "sharegpt", "prompts")


class ConfigError(UserError, ValueError):
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
    fp8_matmul: str = "auto"                 # a target held in block FP8: transformers' kernel or eagle-eval's dequantizing
    allow_unknown_head_keys: bool = False    # proceed past head config keys that change an engine's math
    check_lossless: bool = False
    limit: int | None = None                 # evaluate the first N questions only (after categories, shuffle)
    position_offset: int = 0                 # 1 = SGLang's draft positions before PR #25015
    eagle_depth: int | None = None           # EAGLE's names: S = depth + 1, K = top_k, D = total_token
    eagle_top_k: int | None = None
    eagle_total_token: int | None = None
    seed: int = 0
    output_dir: str | None = None
    resume: bool = False
    overwrite: bool = False                  # replace the run already in output_dir (its files go first)
    dataset: str | None = None               # benchmark file or save_to_disk folder; replaces `prompts`
    dataset_format: str | None = None        # None = detected from the columns (echoed in the report)
    categories: tuple[str, ...] | None = None
    shuffle_seed: int | None = None          # None = file order
    no_chat_template: bool = False           # True = raw text even when the tokenizer has a template
    chat_template: str | None = None         # jinja FILE used instead of the tokenizer's template
    system_prompt: str | None = None
    enable_thinking: bool | None = None      # passed to the template as `enable_thinking` when not None
    train_acc: tuple[float, ...] | None = None   # acc_1..acc_k at training; None = the head folder's file
    batch_size: int = 1                      # prompts verified in one target forward (speculative/batched.py)
    cuda_graphs: bool = True                 # chain cycle replayed as a CUDA graph where it can be (GPU, one device, no MoE)

    def __post_init__(self):
        if self.num_steps < 1:
            raise ConfigError(f"--num-steps must be >= 1, got {self.num_steps}")
        if self.topk < 1:
            raise ConfigError(f"--topk must be >= 1, got {self.topk}")
        if self.num_draft_tokens is not None and self.num_draft_tokens < 2:
            raise ConfigError(f"--num-draft-tokens must be >= 2 (root + one draft), got {self.num_draft_tokens}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.aux_convention not in AUX_CONVENTIONS:
            raise ConfigError(f"--aux-convention must be one of {AUX_CONVENTIONS}, got {self.aux_convention!r}")
        if self.draft_embedding not in EMBEDDING_CHOICES:
            raise ConfigError(f"--draft-embedding must be one of {EMBEDDING_CHOICES}, got {self.draft_embedding!r}")
        if self.dtype not in DTYPE_CHOICES:
            raise ConfigError(f"--dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        if self.fp8_matmul not in FP8_MATMUL_CHOICES:
            raise ConfigError(f"--fp8-matmul must be one of {FP8_MATMUL_CHOICES}, got {self.fp8_matmul!r}")
        eagle = (self.eagle_depth, self.eagle_top_k, self.eagle_total_token)
        if any(v is not None for v in eagle):
            if any(v is None for v in eagle):
                raise ConfigError("--eagle-depth, --eagle-top-k and --eagle-total-token go together")
            explicit = {"--num-steps": (self.num_steps, 5, self.eagle_depth + 1),
                        "--topk": (self.topk, 1, self.eagle_top_k),
                        "--num-draft-tokens": (self.num_draft_tokens, None, self.eagle_total_token)}
            clash = [f"{k} {v}" for k, (v, default, eagle_v) in explicit.items() if v not in (default, eagle_v)]
            if clash:
                raise ConfigError(f"{', '.join(clash)} conflict with --eagle-depth/--eagle-top-k/--eagle-total-token "
                                  "(num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token): give one set")
            object.__setattr__(self, "num_steps", self.eagle_depth + 1)
            object.__setattr__(self, "topk", self.eagle_top_k)
            object.__setattr__(self, "num_draft_tokens", self.eagle_total_token)
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.position_offset not in (0, 1):
            raise ConfigError(f"--position-offset must be 0 or 1, got {self.position_offset}")
        if self.resume and not self.output_dir:
            raise ConfigError("--resume needs --output-dir (the run to continue)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        if self.train_acc is not None:
            acc = tuple(float(a) for a in self.train_acc)
            if not acc or not all(0 <= a <= 1 for a in acc):
                raise ConfigError(f"--train-acc must be accuracies in [0, 1], one per draft step, got {list(acc)}")
            object.__setattr__(self, "train_acc", acc)
        self._check_data_options()

    def _check_data_options(self):
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.dataset_format is not None and self.dataset_format not in DATASET_FORMATS:
            raise ConfigError(f"--dataset-format must be one of {DATASET_FORMATS}, got {self.dataset_format!r}")
        if self.dataset_format is not None and self.dataset is None:
            raise ConfigError("--dataset-format needs --dataset (--prompts is always the plain prompt JSONL)")
        if self.categories is not None:
            given = self.categories.split(",") if isinstance(self.categories, str) else self.categories
            names = tuple(str(c).strip() for c in given)
            if not names or not all(names):
                raise ConfigError(f"--categories must be comma-separated non-empty names, got {self.categories!r}")
            object.__setattr__(self, "categories", names)
        if self.no_chat_template and self.chat_template is not None:
            raise ConfigError("--no-chat-template and --chat-template exclude each other")
        if self.no_chat_template and self.enable_thinking is not None:
            raise ConfigError("--enable-thinking/--disable-thinking need a chat template (--no-chat-template given)")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["aux_layers"] = list(self.aux_layers) if self.aux_layers is not None else None
        d["categories"] = list(self.categories) if self.categories is not None else None
        return d

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    # settings that do not change what is measured; a resumed run may differ in these
    RESUMABLE = ("output_dir", "resume", "overwrite", "limit", "check_lossless")
    # fields naming files or folders that are read: an output folder records their contents, not their spelling
    INPUT_PATHS = ("target", "draft", "prompts", "dataset", "chat_template")

    def input_paths(self) -> dict[str, str | None]:
        """{field: path} of every input read (--prompts only when no --dataset replaces it)."""
        return {k: (None if k == "prompts" and self.dataset else getattr(self, k)) for k in self.INPUT_PATHS}


def _parse_list(text: str | None, cast, message: str) -> tuple | None:
    """'1,15,28' or '[1, 15, 28]' -> a tuple of cast values; None or blank -> None."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(cast(p) for p in str(text).strip("[] ").split(",") if p.strip())
    except ValueError as exc:
        raise ConfigError(f"{message}, got {text!r}") from exc


def parse_ids(text: str | None) -> tuple[int, ...] | None:
    """'1,15,28' or '[1, 15, 28]' -> (1, 15, 28)."""
    return _parse_list(text, int, "--aux-layers must be comma-separated integers")


def parse_floats(text: str | None, option: str) -> tuple[float, ...] | None:
    """'0.8,0.7,0.6' -> (0.8, 0.7, 0.6); None or blank -> None."""
    return _parse_list(text, float, f"{option} must be comma-separated numbers")


def parse_names(text: str | None) -> tuple[str, ...] | None:
    """'writing, coding' -> ('writing', 'coding'); None or blank -> None."""
    if text is None or not str(text).strip():
        return None
    return tuple(p.strip() for p in str(text).split(",") if p.strip())


@dataclass(frozen=True)
class ProfileConfig:
    """`eagle-eval profile`: run's settings plus the profile's own."""
    run: RunConfig
    max_steps: int = 8
    responses: str | None = None             # JSONL with `output_ids` or `text` per prompt
    batch_tokens: int = 16384                # padded tokens per teacher-forced batch
    draft_tokens_grid: tuple[int, ...] | None = None   # trees: also profile these D (by_num_draft_tokens)

    def __post_init__(self):
        if self.max_steps < 1:
            raise ConfigError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.batch_tokens < 1:
            raise ConfigError(f"--batch-tokens must be >= 1, got {self.batch_tokens}")
        if self.responses is not None and not Path(self.responses).is_file():
            raise ConfigError(f"--responses: {self.responses} does not exist")

    def as_dict(self) -> dict:
        return {**self.run.as_dict(), "max_steps": self.max_steps, "responses": self.responses,
                "batch_tokens": self.batch_tokens,
                "draft_tokens_grid": list(self.draft_tokens_grid) if self.draft_tokens_grid else None}
