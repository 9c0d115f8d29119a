"""Settings: one typed, frozen object per run, in groups, validated once; the CLI is generated from it.

Contract: `Settings` holds what the oracle needs, in the groups a reader looks for:
- `model`: what is loaded (target, head, dtype, placement, quantized matmuls, the head's training accuracy and
  sequence length);
- `speculation`: how drafts are made and verified (steps, topk, draft tokens, aux layers and their
  convention, embedding table, positions);
- `decoding`: how tokens are chosen (greedy at temperature 0, else sampling under an engine's rule; the seed);
- `workload`: which prompts, how they are rendered (long contexts built from them), how long each decode runs;
- `output`: where results go (folder, resume, overwrite) and the context buckets of the acceptance.
Each command adds its own small group of options (`LoopOptions` for run, `ProfileOptions`,
`AblateOptions` here; `DiagnoseOptions` and `ServerCheckOptions` beside their commands, which know
the engines and checks they name). Every field is declared with `opt(...)`, whose metadata holds
its help, choices, flag and parser: cli.py builds every option from it, `--config FILE` (YAML or JSON)
is read against it, and docs/cli.md is generated from it. Each group checks its own values at
construction (`__post_init__`): a wrong type is an error naming the key, never coerced.

`Settings.of(**flat)` builds one from flat field names (they are unique across groups);
`settings.with_(**flat)` is the same settings with some fields changed (the oracle's `with_` reuses
every loaded weight the change does not touch); `settings.flat()` is the flat dict reports echo.
No torch here: `eagle-eval --help` stays instant.
"""

from __future__ import annotations

import json
import math
import typing
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path

from eagle_eval.errors import UserError
from eagle_eval.registry import RULES

REPO_ROOT = Path(__file__).resolve().parent.parent
# The bundled pair, heads, prompts and plan configs are package data: eagle_eval/bundled/ holds links to the
# repository's checkpoints/ and data/ (an editable install and scripts/build_bundled.py use those), and a wheel
# or a `pip install .` the files themselves; so the defaults are found the same way from any install
# (README "Bundled default").
BUNDLED = Path(__file__).resolve().parent / "bundled"
BUNDLED_TARGET = BUNDLED / "checkpoints" / "target"
BUNDLED_DRAFT = BUNDLED / "checkpoints" / "draft"
BUNDLED_PROMPTS = BUNDLED / "data" / "prompts.jsonl"
BUNDLED_PLAN_CONFIGS = ("deepseek-v3", "kimi-k2.5")      # data/plan/NAME/config.json, as published


def bundled_missing(path) -> str | None:
    """Why `path` is missing when it is one of the bundled files (a default), else None."""
    p = Path(path)
    if p.exists() or BUNDLED not in (p, *p.parents):
        return None
    return (f"{p} is bundled with eagle-eval (package data) but missing from this install: it was installed "
            "without its package data (from a source without eagle_eval/bundled's files, or a checkout made "
            "without symbolic links); reinstall from a complete source or wheel, or name your own")

EMBEDDING_CHOICES = ("auto", "target", "own")
# the aux-layer id conventions (models/capture.py `to_hf` reads them; docs/eagle3.md section 1): id k means ...
AUX_CONVENTIONS = {
    "sglang": "output of layer k (HF index k + 1; -1 = the embedding output): SGLang, SpecForge",
    "vllm": "input of layer k (HF index k): vLLM, speculators, EAGLE official",
    "hf": "output_hidden_states[k] (HF index k)",
    "boundary": "the state after k blocks, 0..N; N = the last layer's output BEFORE the final norm, which HF's "
                "output_hidden_states[N] is not (gpt-oss-style heads)",
}
DTYPE_CHOICES = ("auto", "bf16", "fp16", "fp32")
MTP_CONVENTIONS = ("vllm", "sglang", "transformers")     # heads/mtp/conventions.py ENGINES
DFLASH_CONVENTIONS = ("published", "vllm-cpu")           # heads/dflash/conventions.py CONVENTIONS
FP8_MATMUL_CHOICES = ("auto", "kernel", "dequantize")     # models/quant/fp8.py
# dataset readers (workload/datasets.py); "prompts" is the plain prompt JSONL of --prompts
DATASET_FORMATS = ("mt_bench", "spec_bench", "gsm8k", "humaneval", "alpaca", "sharegpt", "prompts")
DEFAULT_NUM_STEPS, DEFAULT_TOPK = 5, 1


class ConfigError(UserError, ValueError):
    """A setting that cannot be used; the message names the option (or the key of a --config file)."""


# -- parsers for values given as text (a flag, a --vary) ------------------------------------------

def _parse_list(text, cast, message: str) -> tuple | None:
    """'1,15,28' or '[1, 15, 28]' -> a tuple of cast values; None or blank -> None."""
    if text is None or not str(text).strip():
        return None
    try:
        return tuple(cast(p.strip()) for p in str(text).strip("[] ").split(",") if p.strip())
    except ValueError as exc:
        raise ConfigError(f"{message}, got {text!r}") from exc


def _int(text: str) -> int:
    if text.lower() in ("true", "false"):
        raise ValueError(text)
    return int(text)


def parse_ids(text, option: str = "--aux-layers") -> tuple[int, ...] | None:
    """'1,15,28' or '[1, 15, 28]' -> (1, 15, 28).

    >>> parse_ids("[1, 15, 28]")
    (1, 15, 28)
    """
    return _parse_list(text, _int, f"{option} must be comma-separated integers")


def parse_floats(text, option: str = "--train-acc") -> tuple[float, ...] | None:
    """'0.8,0.7,0.6' -> (0.8, 0.7, 0.6); None or blank -> None."""
    return _parse_list(text, float, f"{option} must be comma-separated numbers")


def parse_names(text, option: str = "--categories") -> tuple[str, ...] | None:
    """'writing, coding' -> ('writing', 'coding'); None or blank -> None."""
    if text is None or not str(text).strip():
        return None
    return tuple(p.strip() for p in str(text).split(",") if p.strip())


def parse_context_buckets(text, option: str = "--context-buckets") -> tuple[int, ...] | None:
    """'auto' (or blank) -> None: powers of two over the contexts seen (stats/context.py `auto_edges`);
    '0,512,2048' -> (0, 512, 2048), checked by `check_context_edges`.

    >>> parse_context_buckets("auto"), parse_context_buckets("512,2048")
    (None, (512, 2048))
    """
    if text is None or str(text).strip().lower() in ("", "auto"):
        return None
    edges = _parse_list(text, _int, f"{option} must be auto or increasing token counts, e.g. 0,512,2048,8192")
    check_context_edges(edges, option)
    return edges


def check_context_edges(edges, option: str = "--context-buckets") -> None:
    if edges is None:
        return
    if not edges or any(e < 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"{option} must be auto or strictly increasing token counts >= 0 (bucket edges, e.g. "
                          f"0,512,2048,8192), got {','.join(map(str, edges)) or 'none'}")


def parse_bool(text, option: str) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0", "on", "off", "yes", "no"):
        raise ConfigError(f"{option}: expected true or false, got {text!r}")
    return value in ("true", "1", "on", "yes")


# -- the field declaration ----------------------------------------------------------------------

def choices_of(f) -> tuple | None:
    """A field's choices: a tuple, or a callable giving one when asked (a registry's names: a rule registered
    after import is a choice too)."""
    choices = f.metadata.get("choices")
    return tuple(choices()) if callable(choices) else choices


def opt(default, help: str, *, choices=None, parse=None, flag: str | None = None, show_default=None,
        secondary: str | None = None, metavar: str | None = None, input_path: bool = False,
        resumable: bool = False, cli: bool = True):
    """A settings field with everything the CLI, --config files and the docs need.

    parse: text -> value for fields that are not plain int/float/str/bool (lists); flag: the option's
    name when it is not --field-name; secondary: a boolean's off switch when it is not --no-NAME
    (--enable-thinking/--disable-thinking, --no-chat-template/--use-chat-template); input_path: a file or
    folder the run reads (the output folder records its contents); resumable: may differ when a run is
    resumed; cli: False for API-only fields.
    """
    meta = {"help": help, "choices": choices, "parse": parse, "flag": flag, "show_default": show_default,
            "secondary": secondary, "metavar": metavar, "input_path": input_path, "resumable": resumable,
            "cli": cli}
    return field(default=default, metadata=meta)


def flag_name(f) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


_HINTS: dict[type, dict] = {}


def field_types(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def _conform(value, hint, where: str):
    """`value` checked against the annotation `hint`; lists become tuples where a tuple is declared (the
    JSON/YAML spelling of one), an int becomes a float where a float is declared; anything else that does
    not fit is a ConfigError naming `where`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _conform(value, a, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return tuple(_conform(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {type(value).__name__} {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {type(value).__name__} {value!r}")
        return value
    return value


class Group:
    """A frozen settings group: types checked, then `validate()` (the group's own checks), at construction."""

    def __post_init__(self):
        hints = field_types(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            conformed = _conform(value, hints[f.name], flag_name(f))
            if conformed is not value:
                object.__setattr__(self, f.name, conformed)
            choices = choices_of(f)
            if choices and conformed is not None and conformed not in choices:
                raise ConfigError(f"{flag_name(f)} must be one of {', '.join(map(str, choices))}, got {conformed!r}")
        self.validate()

    def validate(self) -> None:
        """The group's own checks (ranges, exclusions); a ConfigError names the option."""

    def as_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def at_least(value, low, option: str, what: str = "") -> None:
    if value is not None and value < low:
        raise ConfigError(f"{option} must be >= {low}{what}, got {value}")


# -- the groups ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSettings(Group):
    """What is loaded: the target, the head, and how they are held."""
    target: str = opt(str(BUNDLED_TARGET), "Hugging Face causal-LM folder (or a multimodal model run on text), or a "
                      "model id (org/name) found as from_pretrained finds it: the HF cache, downloaded unless "
                      "HF_HUB_OFFLINE=1.", show_default="the bundled target", input_path=True)
    revision: str | None = opt(None, "With a model id as --target: its branch, tag or commit (from_pretrained's "
                               "revision; default main).")
    draft: str = opt(str(BUNDLED_DRAFT), "EAGLE-3 head folder (SpecForge/SGLang, EAGLE or speculators layout), or a "
                     "model id (org/name), as --target.", show_default="the bundled head", input_path=True)
    draft_revision: str | None = opt(None, "With a model id as --draft: its branch, tag or commit (default main).")
    dtype: str = opt("auto", "auto = bf16 on a GPU, fp32 on the CPU.", choices=DTYPE_CHOICES)
    device_map: str = opt("auto", "auto (every visible GPU, else the CPU) | cpu | cuda:N.")
    max_memory: str | None = opt(None, "Per device, e.g. 0=70GiB,1=70GiB,cpu=100GiB (accelerate's max_memory).")
    trust_remote_code: bool = opt(False, "Run the target folder's own Python code (auto_map).")
    fp8_matmul: str = opt("auto", "A block-FP8 target kept FP8 on the GPU: kernel = transformers' FP8 kernel (needs "
                          "the `kernels` package and its Hub kernel), dequantize = eagle-eval dequantizes each weight "
                          "per forward (W8A16), auto = the kernel when it loads.", choices=FP8_MATMUL_CHOICES)
    allow_unknown_head_keys: bool = opt(False, "Proceed when the head's config.json has keys that change the draft's "
                                        "math in an engine but are not implemented here (named in the error).")
    allow_load_errors: bool = opt(False, "Measure even when a load-time check finds an error (a head or target that "
                                  "cannot give a meaningful number: NaN weights, a broken vocab map, ...); without it "
                                  "run, profile and ablate stop with exit status 1 before decoding.")
    train_acc: tuple[float, ...] | None = opt(
        None, "The head's training-time validation accuracy per draft step, acc_1,acc_2,... (SpecForge acc_k); "
        "default: the head folder's training_metrics.json. Set beside the measured rates.", parse=parse_floats)
    train_context: int | None = opt(
        None, "The draft's training sequence length (tokens): the acceptance by context says which buckets lie past "
        "it and whether acceptance decayed there (decayed / not decayed / undecided, with an interval; exit 1 "
        "decayed, 3 undecided).", resumable=True)

    def validate(self):
        if self.train_acc is not None and (not self.train_acc or not all(0 <= a <= 1 for a in self.train_acc)):
            raise ConfigError(f"--train-acc must be accuracies in [0, 1], one per draft step, got {list(self.train_acc)}")
        at_least(self.train_context, 1, "--train-context")
        if self.device_map not in ("auto", "cpu") and not self.device_map.startswith("cuda"):
            raise ConfigError(f"--device-map must be auto, cpu or cuda:N, got {self.device_map!r}")


@dataclass(frozen=True)
class SpeculationSettings(Group):
    """How drafts are made and verified. num_steps, topk and num_draft_tokens use SGLang's names; EAGLE's
    (depth, top_k, total_token) are accepted instead, never beside them."""
    num_steps: int | None = opt(None, "Draft steps S per cycle.", show_default=str(DEFAULT_NUM_STEPS))
    topk: int | None = opt(None, "Draft top-k (1 = chain, > 1 = SGLang's/EAGLE's tree).", show_default=str(DEFAULT_TOPK))
    num_draft_tokens: int | None = opt(None, "SGLang's speculative_num_draft_tokens: verify-tree nodes, root included "
                                       "(a chain uses num_steps + 1, as SGLang does).")
    eagle_depth: int | None = opt(None, "EAGLE's depth (num_steps = depth + 1); with --eagle-top-k and "
                                  "--eagle-total-token.")
    eagle_top_k: int | None = opt(None, "EAGLE's top_k (= --topk).")
    eagle_total_token: int | None = opt(None, "EAGLE's total_token (= --num-draft-tokens, root included).")
    aux_layers: tuple[int, ...] | None = opt(None, "Aux layer ids, e.g. 1,3,5 (read as --aux-convention says); "
                                             "default: the head's config, else HF[2], HF[N//2], HF[N-3].",
                                             parse=parse_ids)
    aux_convention: str = opt("sglang", "; ".join(f"{k}: {v.split(' (')[0]}" for k, v in AUX_CONVENTIONS.items())
                              + " (boundary without --aux-layers reads the draft config's ids this way).",
                              choices=tuple(AUX_CONVENTIONS))
    draft_embedding: str = opt("auto", "auto: the draft's own table if it has one that differs (vLLM); target: the "
                               "target's (SGLang's rule); own: the draft's.", choices=EMBEDDING_CHOICES)
    position_offset: int = opt(0, "1 reproduces SGLang's draft positions before PR #25015 (p+k+1).", choices=(0, 1))
    mtp_convention: str = opt("vllm", "With --draft mtp, whose way of running the MTP layer: its input before or after "
                              "the target's final norm, position-0 embedding masking, the output handed to the next "
                              "step (before or after the MTP output norm), the layer schedule (docs/mtp.md).",
                              choices=MTP_CONVENTIONS)
    mtp_planted: tuple[str, ...] | None = opt(None, "API only (diagnose): single MTP choices changed from the "
                                              "convention, e.g. ('input=pre', 'chain=post').", cli=False)
    dflash_convention: str = opt("published", "With a DFlash drafter, how its context keys are normed: published "
                                 "(z-lab, SGLang, vLLM on CUDA: each draft layer's own k_norm) or vllm-cpu (vLLM 0.32's "
                                 "CPU build: draft layer 0's k_norm in every layer, a kernel defect; "
                                 "docs/server-check.md).", choices=DFLASH_CONVENTIONS)

    def validate(self):
        eagle = (self.eagle_depth, self.eagle_top_k, self.eagle_total_token)
        if any(v is not None for v in eagle):
            if any(v is None for v in eagle):
                raise ConfigError("--eagle-depth, --eagle-top-k and --eagle-total-token go together")
            given = [flag for flag, v in (("--num-steps", self.num_steps), ("--topk", self.topk),
                                          ("--num-draft-tokens", self.num_draft_tokens)) if v is not None]
            if given:
                raise ConfigError(f"{', '.join(given)} conflict with --eagle-depth/--eagle-top-k/--eagle-total-token "
                                  "(num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token): give one set")
            at_least(self.eagle_depth, 0, "--eagle-depth")
            object.__setattr__(self, "num_steps", self.eagle_depth + 1)
            object.__setattr__(self, "topk", self.eagle_top_k)
            object.__setattr__(self, "num_draft_tokens", self.eagle_total_token)
        if self.num_steps is None:
            object.__setattr__(self, "num_steps", DEFAULT_NUM_STEPS)
        if self.topk is None:
            object.__setattr__(self, "topk", DEFAULT_TOPK)
        at_least(self.num_steps, 1, "--num-steps")
        at_least(self.topk, 1, "--topk")
        at_least(self.num_draft_tokens, 2, "--num-draft-tokens", " (root + one draft)")

    @property
    def eagle_params(self) -> dict | None:
        if self.eagle_depth is None:
            return None
        return {"depth": self.eagle_depth, "top_k": self.eagle_top_k, "total_token": self.eagle_total_token,
                "conversion": "num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token"}


MIN_TEMPERATURE = 1e-6


def check_temperature(value: float, option: str) -> None:
    """0 (greedy) or at least MIN_TEMPERATURE: below it float32 makes p one-hot for any logit gap over 1e-4
    (exp(-gap / T) underflows: greedy, say 0), and far below (about 1e-36) logits / T overflow."""
    if value < 0 or 0 < value < MIN_TEMPERATURE:
        raise ConfigError(f"{option} must be 0 (greedy) or >= {MIN_TEMPERATURE:g}, got {value!r}: below "
                          f"{MIN_TEMPERATURE:g} float32 makes the target's p one-hot (greedy: give 0), and far below "
                          "it logits / T overflow")


@dataclass(frozen=True)
class DecodingSettings(Group):
    """How tokens are chosen: the target's distribution after temperature and filters, and the engine's rule
    for verifying drafts against it (docs/eagle3.md section 8). Temperature 0 is greedy under every rule."""
    temperature: float = opt(0.0, "Sampling temperature of the target (0 = greedy: argmax, every rule the same; "
                             "else >= 1e-6). At 0 the other sampling options are refused: they would change nothing.")
    top_k: int = opt(0, "Keep the k most likely target tokens before sampling (0 = off).")
    top_p: float = opt(1.0, "Keep the smallest set of target tokens whose probability reaches p (1 = off).")
    min_p: float = opt(0.0, "Drop target tokens below min_p times the most likely one's probability (0 = off).")
    accept_rule: str = opt("vllm", "How drafts are verified when sampling, engine by engine, in that engine's "
                           "filter order (one record per rule, eagle_eval/rules/; each rule's acceptance in "
                           "docs/sampling.md).", choices=RULES.names)
    accept_threshold_single: float = opt(1.0, "SGLang --speculative-accept-threshold-single: a child whose target "
                                         "probability reaches it is accepted outright.")
    accept_threshold_acc: float = opt(1.0, "SGLang --speculative-accept-threshold-acc: the coin is compared with "
                                      "cumsum(p) / this.")
    seed: int = opt(0, "Seed of every random choice (torch.manual_seed at the start; each sample's generator); "
                    "0..2^64-1.")

    def validate(self):
        check_temperature(self.temperature, "--temperature")
        if not 0 <= self.seed < 2 ** 64:
            raise ConfigError(f"--seed must be in 0..2^64-1 (what torch.manual_seed takes), got {self.seed}")
        at_least(self.top_k, 0, "--top-k")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise ConfigError(f"--min-p must be in [0, 1), got {self.min_p}")
        for name in ("accept_threshold_single", "accept_threshold_acc"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be in (0, 1], got {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class WorkloadSettings(Group):
    """Which prompts, how they are rendered, and how long each decode runs."""
    prompts: str = opt(str(BUNDLED_PROMPTS), "JSONL with `prompt`, `messages` or `input_ids` per row.",
                       show_default="the bundled prompts", input_path=True)
    dataset: str | None = opt(None, "Benchmark .jsonl/.json/.parquet file or save_to_disk folder; replaces --prompts.",
                              input_path=True)
    dataset_format: str | None = opt(None, "Default: detected from the columns (echoed in the report).",
                                     choices=DATASET_FORMATS)
    categories: tuple[str, ...] | None = opt(None, "Keep these categories, e.g. writing,coding.", parse=parse_names)
    shuffle_seed: int | None = opt(None, "Shuffle the questions (seeded) before --limit.")
    limit: int | None = opt(None, "Evaluate the first N questions only (after --categories and --shuffle-seed).",
                            resumable=True)
    no_chat_template: bool = opt(False, "Raw text prompts even when the tokenizer has a chat template.",
                                 secondary="--use-chat-template")
    chat_template: str | None = opt(None, "Jinja chat template FILE instead of the tokenizer's.", input_path=True)
    system_prompt: str | None = opt(None, "System message put before every conversation.")
    enable_thinking: bool | None = opt(None, "Pass enable_thinking=True/False to the chat template (default: not "
                                       "passed).", flag="--enable-thinking", secondary="--disable-thinking")
    max_new_tokens: int = opt(64, "New tokens per prompt (cut earlier at EOS).")
    long_context: tuple[int, ...] | None = opt(
        None, "Build each question's prompt to at least L tokens (one prompt per L given, id QUESTION/ctxL): the "
        "texts of the other questions read, in a seeded order (--shuffle-seed, else 0), then the question's first "
        "user text, as one user turn in the prompt format; truncated from the left to fit the target's positions "
        "less the decode's; refused when the texts cannot fill L (workload/long_context.py).",
        parse=lambda t: parse_ids(t, "--long-context"), metavar="L[,L...]")

    def validate(self):
        at_least(self.max_new_tokens, 1, "--max-new-tokens")
        at_least(self.limit, 1, "--limit")
        if self.dataset_format is not None and self.dataset is None:
            raise ConfigError("--dataset-format needs --dataset (--prompts is always the plain prompt JSONL)")
        if self.categories is not None and (not self.categories or not all(c.strip() for c in self.categories)):
            raise ConfigError(f"--categories must be comma-separated non-empty names, got {list(self.categories)!r}")
        if self.no_chat_template and self.chat_template is not None:
            raise ConfigError("--no-chat-template and --chat-template exclude each other")
        if self.no_chat_template and self.enable_thinking is not None:
            raise ConfigError("--enable-thinking/--disable-thinking need a chat template (--no-chat-template given)")
        if self.long_context is not None:
            if not self.long_context or min(self.long_context) < 1:
                raise ConfigError(f"--long-context must be token counts >= 1, got {list(self.long_context)}")
            if len(set(self.long_context)) < len(self.long_context):
                raise ConfigError(f"--long-context gives a length twice ({list(self.long_context)}); give each once")


@dataclass(frozen=True)
class OutputSettings(Group):
    """Where results go, and how acceptance is bucketed by context. An output folder belongs to one run
    (results/run_folder.py)."""
    output_dir: str | None = opt(None, "Write the results here (a folder that belongs to this run).", resumable=True)
    resume: bool = opt(False, "Continue an interrupted run in --output-dir.", resumable=True)
    overwrite: bool = opt(False, "Replace the results already in --output-dir (only the files eagle-eval wrote "
                          "there, unchanged, are removed).", resumable=True)
    full_fingerprint: bool = opt(False, "Fingerprint every byte of every input in the folder's owner file (default: "
                                 "files up to 64 MiB whole, larger safetensors by header, size and sampled blocks of "
                                 "each tensor; results/input_digests.py).", resumable=True)
    context_buckets: tuple[int, ...] | None = opt(
        None, "Acceptance by context (the cycle's root position: prompt + tokens generated before it) in buckets "
        "[e_i, e_i+1) of these edges, e.g. 0,512,2048,8192 (the last bucket open); auto = powers of two over the "
        "contexts seen. --train-context is always an edge.", parse=parse_context_buckets, show_default="auto",
        metavar="auto|E1,E2,...", resumable=True)

    def validate(self):
        if self.resume and not self.output_dir:
            raise ConfigError("--resume needs --output-dir (the run to continue)")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        check_context_edges(self.context_buckets)


GROUPS = {"model": ModelSettings, "speculation": SpeculationSettings, "decoding": DecodingSettings,
          "workload": WorkloadSettings, "output": OutputSettings}


@dataclass(frozen=True)
class Settings:
    """Everything the oracle needs for one run (see the module docstring)."""
    model: ModelSettings = field(default_factory=ModelSettings)
    speculation: SpeculationSettings = field(default_factory=SpeculationSettings)
    decoding: DecodingSettings = field(default_factory=DecodingSettings)
    workload: WorkloadSettings = field(default_factory=WorkloadSettings)
    output: OutputSettings = field(default_factory=OutputSettings)

    def __post_init__(self):
        for name, cls in GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"settings group {name!r} must be a {cls.__name__}, got {getattr(self, name)!r}")

    @classmethod
    def of(cls, **flat) -> "Settings":
        """From flat field names, e.g. Settings.of(num_steps=3, limit=4); unknown names are errors."""
        by_group = _by_group(flat)
        return cls(**{g: GROUPS[g](**kw) for g, kw in by_group.items()})

    def with_(self, **flat) -> "Settings":
        """The same settings with the fields named changed. Changing num_steps, topk or num_draft_tokens drops
        EAGLE's names, and the reverse, so a variant never conflicts with how its base was given."""
        by_group = _by_group(flat)
        spec = by_group.get("speculation")
        if spec is not None:
            explicit, eagle = ("num_steps", "topk", "num_draft_tokens"), ("eagle_depth", "eagle_top_k", "eagle_total_token")
            if any(k in spec for k in explicit):
                spec = {**dict.fromkeys(eagle), **spec}
            elif any(k in spec for k in eagle) or self.speculation.eagle_depth is not None:
                spec = {**dict.fromkeys(explicit), **spec}     # num_steps etc. derived from EAGLE's names again
            by_group["speculation"] = spec
        return replace(self, **{g: replace(getattr(self, g), **kw) for g, kw in by_group.items()})

    def flat(self) -> dict:
        """Every field by its flat name (JSON values): what reports echo under `config`."""
        out = {}
        for name in GROUPS:
            out.update(getattr(self, name).as_dict())
        return out

    def grouped(self) -> dict:
        """{group: {field: value}}: what a run folder's settings file holds and --config reads."""
        return {name: getattr(self, name).as_dict() for name in GROUPS}

    def input_paths(self) -> dict[str, str | None]:
        """{field: path} of every input read (--prompts only when no --dataset replaces it)."""
        out = {}
        for name in GROUPS:
            group = getattr(self, name)
            for f in fields(group):
                if f.metadata.get("input_path"):
                    out[f.name] = getattr(group, f.name)
        if self.workload.dataset:
            out["prompts"] = None
        return out

    @staticmethod
    def resumable() -> tuple[str, ...]:
        """Settings that do not change what is measured: a resumed run may differ in these."""
        return tuple(f.name for cls in GROUPS.values() for f in fields(cls) if f.metadata.get("resumable"))


FIELD_GROUP = {f.name: name for name, cls in GROUPS.items() for f in fields(cls)}


def _by_group(flat: dict) -> dict[str, dict]:
    """{group: {field: value}} of flat field names; an unknown name is an error."""
    by_group: dict[str, dict] = {}
    for key, value in flat.items():
        group = FIELD_GROUP.get(key)
        if group is None:
            raise ConfigError(f"unknown setting {key!r} (settings are: {', '.join(sorted(FIELD_GROUP))})")
        by_group.setdefault(group, {})[key] = value
    return by_group


# -- each command's own options ------------------------------------------------------------------

@dataclass(frozen=True)
class LoopOptions(Group):
    """`run`: the loop's own options."""
    check_lossless: bool = opt(False, "Also run plain greedy decoding and report the first divergence per prompt; at "
                               "temperature > 0 a distribution check of the output against the target's p (chi-square "
                               "on rank cells, false-alarm rate 0.001; consistent / differs / undecided: undecided when the tokens cannot "
                               "see a departure of half the sampled mass, differs when the rule is not plain sampling, "
                               "e.g. SGLang thresholds below 1).",
                               resumable=True)
    batch_size: int = opt(1, "Prompts verified in one target forward, each with its own accepted length (first "
                          "turns; loop/batched.py); at temperature > 0 each prompt draws from its own stream, "
                          "so the records equal batch 1's.")
    cuda_graphs: bool = opt(True, "Replay the chain cycle as a CUDA graph where it can be captured (one GPU, chains, "
                            "greedy; MoE only with experts routed on the device); else the eager loop, the reason in "
                            "the report's config.loop.",
                            flag="--cuda-graphs", secondary="--no-cuda-graphs")

    def validate(self):
        at_least(self.batch_size, 1, "--batch-size")


@dataclass(frozen=True)
class ProfileOptions(Group):
    """`profile`: every num_steps <= max_steps from one teacher-forced pass."""
    max_steps: int = opt(8, "Profile every num_steps from 1 to this (one target forward per prompt).")
    responses: str | None = opt(None, "JSONL continuations (`output_ids` or `text`, by `id`), e.g. saved from a server; "
                                "at temperature 0 checked against the target's argmax, at temperature > 0 taken as "
                                "they are.", input_path=True)
    batch_tokens: int = opt(16384, "Padded tokens per teacher-forced batch (bounds memory).")
    draft_tokens_grid: tuple[int, ...] | None = opt(None, "Trees: also profile these num_draft_tokens "
                                                    "(by_num_draft_tokens).", parse=lambda t: parse_ids(t, "--draft-tokens-grid"))
    expectation_floor: float = opt(1e-4, "Temperature > 0, one-hot rules: a chain whose P(A >= i) falls below this is not "
                                   "followed further off the continuation; its deeper P(A >= j) are set to 0, each too "
                                   "low by less than the floor. Trees: a node off the continuation reached with "
                                   "probability below it is not expanded (each P(A >= d) too low by at most the "
                                   "start's `cut`). The report counts the starts cut and their largest cut. "
                                   "0 = exact up to float rounding (about 3x the greedy profile's time unfiltered "
                                   "at temperature 1).")
    samples_per_prompt: int = opt(1, "Temperature > 0: sampled continuations per prompt (profile and ablate).")
    rollouts: int = opt(0, "Sampled drafts (vllm-probabilistic, sglang-rs) at temperature > 0: 0 = estimate P(A >= i), "
                        "i >= 2, along the sampled continuation itself (importance-weighted, unbiased, no extra target "
                        "forward); M >= 1 = M draft paths per start drawn from min(p, q) (unbiased, its variance per "
                        "start reported; M x (max_steps - 1) target tokens per start; M <= --batch-tokens). "
                        "--responses needs M >= 1. Refused where no draft is sampled (temperature 0, one-hot rules).")

    def profile_options(self) -> "ProfileOptions":
        """The ProfileOptions part (an AblateOptions is one too)."""
        return ProfileOptions(**{f.name: getattr(self, f.name) for f in fields(ProfileOptions)})

    def validate(self):
        at_least(self.max_steps, 1, "--max-steps")
        at_least(self.batch_tokens, 1, "--batch-tokens")
        at_least(self.samples_per_prompt, 1, "--samples-per-prompt")
        at_least(self.rollouts, 0, "--rollouts")
        if self.rollouts > self.batch_tokens:
            raise ConfigError(f"--rollouts {self.rollouts}: each start's rollouts are drafted in one batch, more rows "
                              f"than --batch-tokens {self.batch_tokens} allows; give at most {self.batch_tokens}")
        if not 0 <= self.expectation_floor < 1:
            raise ConfigError(f"--expectation-floor must be in [0, 1), got {self.expectation_floor}")
        if self.responses is not None and not Path(self.responses).is_file():
            raise ConfigError(f"--responses {self.responses}: not a file")
        for d in self.draft_tokens_grid or ():
            at_least(d, 2, "--draft-tokens-grid", " (root + one draft)")


@dataclass(frozen=True)
class AblateOptions(ProfileOptions):
    """`ablate`: the profile's options, the variants of the base settings (each profiled) and the speedup
    model's costs."""
    vary: tuple[str, ...] = opt((), "A variant to profile besides the base, e.g. --vary aux_layers=0,3,6 --vary "
                                "dtype=bf16 --vary 'no_chat_template=true;max_new_tokens=32' (repeatable).",
                                metavar="FIELD=VALUE[;FIELD=VALUE]")
    cost_ratio: float | None = opt(None, "c = T_draft_step / T_target_step (a block drafter: its one draft forward "
                                   "per cycle); default: timed on this device.")
    server_draft_ms: float | None = opt(None, "Your server's draft step time (ms; a block drafter: its one draft "
                                        "forward per cycle); with --server-target-ms.")
    server_target_ms: float | None = opt(None, "Your server's target decode step time (ms).")
    topk_grid: tuple[int, ...] | None = opt(None, "Tree widths to compare, e.g. 1,2,4 (1 = chain).",
                                            parse=lambda t: parse_ids(t, "--topk-grid"))
    temperature_grid: tuple[float, ...] | None = opt(None, "Temperatures to compare, e.g. 0,0.6,1.0 (one profile per "
                                                     "temperature, each with the base's other sampling settings).",
                                                     parse=lambda t: parse_floats(t, "--temperature-grid"))

    def validate(self):
        super().validate()
        if (self.server_draft_ms is None) != (self.server_target_ms is None):
            raise ConfigError("--server-draft-ms and --server-target-ms go together")
        for name in ("cost_ratio", "server_draft_ms", "server_target_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0, got {value}")
        for k in self.topk_grid or ():
            at_least(k, 1, "--topk-grid")
        for t in self.temperature_grid or ():
            check_temperature(t, "--temperature-grid")
        for name in ("topk_grid", "draft_tokens_grid", "temperature_grid"):
            values = getattr(self, name) or ()
            twice = sorted({v for v in values if values.count(v) > 1})
            if twice:
                raise ConfigError(f"--{name.replace('_', '-')} gives {', '.join(map(str, twice))} twice (the same "
                                  "profile again); give each value once")


def parse_setting(name: str, text: str, groups=tuple(GROUPS.values())):
    """The value of setting `name` written as text (`--vary name=text`): the field's own parser for lists,
    else its annotation's type (int, float, bool, str; 'none' = None where None is allowed)."""
    f = next((f for g in groups for f in fields(g) if f.name == name), None)
    if f is None:
        raise ConfigError(f"unknown setting {name!r}")
    option = flag_name(f)
    if f.metadata.get("parse"):
        return f.metadata["parse"](text)
    hint = field_types(next(g for g in groups if f in fields(g)))[name]
    args = typing.get_args(hint)
    if text.strip().lower() == "none" and type(None) in args:
        return None
    base = next((a for a in args if a is not type(None)), hint)
    try:
        if base is bool:
            return parse_bool(text, option)
        if base is int:
            return _int(text.strip())
        if base is float:
            return float(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: expected {'an integer' if base is int else 'a number'}, got {text!r}") from exc
    return text


# -- --config FILE -------------------------------------------------------------------------------

def read_settings_file(path: str, command: str, own: type[Group] | None) -> dict:
    """A YAML or JSON settings file -> flat {field: value}. Keys are flat field names or groups of them
    ({"speculation": {"num_steps": 3}}), as `Settings.grouped()` writes them, plus an optional
    `command` that must be this one; unknown keys are errors naming the file and the key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from exc
    data = _load_yaml_or_json(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of settings, got {type(data).__name__}")
    own_fields = {f.name for f in fields(own)} if own else set()
    own_group = own.__name__ if own else None
    flat: dict = {}
    given: dict[str, str] = {}          # field -> where the file gives it ("key 'x'" or "key 'group.x'")

    def put(name: str, value, where: str) -> None:
        if name in given:               # flat and grouped both: which one is meant cannot be told
            raise ConfigError(f"--config {path}: {given[name]} and {where} both set {name}; give it once")
        given[name] = where
        flat[name] = _text_value(name, value, own)

    for key, value in data.items():
        if key == "command":
            if value != command:
                raise ConfigError(f"--config {path}: key 'command' is {value!r}, but this is `eagle-eval {command}`")
            continue
        if key in GROUPS or (own is not None and key == OWN_GROUP_KEY):
            if not isinstance(value, dict):
                raise ConfigError(f"--config {path}: key {key!r} must be a mapping of settings")
            allowed = {f.name for f in fields(GROUPS[key])} if key in GROUPS else own_fields
            for k, v in value.items():
                if k not in allowed:
                    raise ConfigError(f"--config {path}: key '{key}.{k}' is not a setting of group {key!r}"
                                      f"{'' if key in GROUPS else f' ({own_group})'}")
                put(k, v, f"key '{key}.{k}'")
        elif key in FIELD_GROUP or key in own_fields:
            put(key, value, f"key '{key}'")
        else:
            raise ConfigError(f"--config {path}: key {key!r} is not a setting of `eagle-eval {command}`")
    return flat


OWN_GROUP_KEY = "options"           # the command's own group in a settings file


def _text_value(name: str, value, own):
    """A settings file may spell a list as the flag would ("1,3,5"): parsed by the field's own parser."""
    if isinstance(value, str):
        for g in (*GROUPS.values(), *([own] if own else [])):
            f = next((f for f in fields(g) if f.name == name), None)
            if f is not None and f.metadata.get("parse"):
                return f.metadata["parse"](value)
    return value


def _load_yaml_or_json(text: str, path: str):
    """The file's value; a key given twice in one mapping is an error naming both lines (YAML and JSON
    readers would keep the last one without a word)."""
    if path.endswith(".json"):
        try:
            return json.loads(text, object_pairs_hook=lambda pairs: _no_twice(pairs, text, path))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--config {path}: not valid JSON ({exc})") from exc
    import yaml

    try:
        return yaml.load(text, Loader=_strict_yaml_loader(path))
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config {path}: not valid YAML ({str(exc).splitlines()[0]})") from exc


def _twice(key, places: list[tuple[int, int]], path: str) -> ConfigError:
    """places: (line, column), 1-based, where the key is written; columns said when two share a line."""
    lines = [line for line, _ in places]
    said = [f"line {line}" + (f" column {col}" if lines.count(line) > 1 else "") for line, col in places] or ["?"]
    return ConfigError(f"--config {path}: key {key!r} is given twice in one mapping "
                       f"({', '.join(said[:-1])} and {said[-1]}); give it once")


def _no_twice(pairs: list, text: str, path: str) -> dict:
    """json's object_pairs_hook: a dict, or the error of a key given twice (the lines where the key is written)."""
    keys = [k for k, _ in pairs]
    twice = next((k for i, k in enumerate(keys) if k in keys[:i]), None)
    if twice is None:
        return dict(pairs)
    raise _twice(twice, _key_lines(text, twice), path)


def _key_lines(text: str, key: str) -> list[tuple[int, int]]:
    """(line, column) of every place `key` is written as an object key ("key" then ':'), outside other strings."""
    import re

    out, i = [], 0
    while i < len(text):
        if text[i] != '"':
            i += 1
            continue
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        try:
            is_key = json.loads(text[i:j + 1]) == key and re.compile(r"\s*:").match(text, j + 1)
        except json.JSONDecodeError:
            is_key = False
        if is_key:
            out.append((text.count("\n", 0, i) + 1, i - text.rfind("\n", 0, i)))
        i = j + 1
    return out


def _strict_yaml_loader(path: str):
    """yaml.SafeLoader that refuses a key given twice in one mapping (merge keys `<<` excepted)."""
    import yaml

    class Strict(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key, mark = self.construct_object(key_node, deep=True), key_node.start_mark
                try:
                    if key in seen:
                        raise _twice(key, [(m.line + 1, m.column + 1) for m in (seen[key], mark)], path)
                    seen[key] = mark
                except TypeError:           # an unhashable key: the safe constructor refuses it itself
                    continue
            return super().construct_mapping(node, deep)
    return Strict


def settings_file_text(command: str, settings: Settings, own: Group | None) -> str:
    """The YAML that reruns this run: `eagle-eval COMMAND --config FILE` (resume/overwrite left out)."""
    import yaml

    data = {"command": command, **settings.grouped()}
    data["output"] = {k: v for k, v in data["output"].items() if k in ("output_dir", "context_buckets")}
    if settings.speculation.eagle_depth is not None:      # given as EAGLE's names: the others follow from them
        data["speculation"].update(num_steps=None, topk=None, num_draft_tokens=None)
    if own is not None and fields(own):
        data[OWN_GROUP_KEY] = own.as_dict()
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def split_flat(flat: dict, own: type[Group] | None) -> tuple[dict, dict]:
    """(Settings fields, the command's own fields) of a flat dict."""
    own_names = {f.name for f in fields(own)} if own else set()
    return ({k: v for k, v in flat.items() if k not in own_names}, {k: v for k, v in flat.items() if k in own_names})


def field_default(f):
    return f.default if f.default is not MISSING else f.default_factory()


@dataclass(frozen=True)
class PlanOptions(Group):
    """`plan`: does a target (and head) fit these GPUs? No weight is read (plan/command.py)."""
    target: str | None = opt(None, "Target folder: config.json (and model.safetensors.index.json if any); no weights "
                             "are read. Or a model id (org/name): its config files from the HF cache, downloaded "
                             "unless HF_HUB_OFFLINE=1 (never its weights). Required unless --bundled-config.")
    bundled_config: str | None = opt(None, "Plan a published model whose config.json ships with eagle-eval, in place "
                                     "of --target.", choices=BUNDLED_PLAN_CONFIGS)
    revision: str | None = opt(None, "With a model id as --target: its branch, tag or commit (default main).")
    draft: str | None = opt(None, "EAGLE-3 head folder or model id (optional): its bytes and KV cache, with the "
                            "lm_head.")
    draft_revision: str | None = opt(None, "With a model id as --draft: its branch, tag or commit (default main).")
    gpus: int | None = opt(None, "GPUs to plan for (default: those visible here).")
    gpu_memory: str | None = opt(None, "Memory of each GPU: 141GB (GB = 10^9 bytes) or 80GiB (GiB = 2^30 bytes); a "
                                 "lower-case b or a bare number is refused (default: the visible GPUs').")
    max_context: int | None = opt(None, "Tokens per sequence for the KV cache (default: the target's "
                                  "max_position_embeddings).")
    batch: int = opt(1, "Sequences at once.")
    dtype: str = opt("bf16", "The run's dtype.", choices=("bf16", "fp16", "fp32"))
    quantized: str = opt("held", "held: quantized weights as eagle-eval loads them (INT4 packed, FP8 blocks on an FP8 "
                         "GPU); dequantized: every weight in --dtype (transformers' INT4 decompression).",
                         choices=("held", "dequantized"))
    reserve: str = opt("2GiB", "Kept free on each GPU for the CUDA context and activations (a size as --gpu-memory, "
                       "or 0).")
    trust_remote_code: bool = opt(False, "Build the folder's own model code.")
    json_file: str | None = opt(None, "Also write the plan as JSON to this file.", flag="--json")

    def validate(self):
        from eagle_eval.units import parse_size

        if self.target is None and self.bundled_config is None:
            raise ConfigError("--target is required (a folder holding the target's config.json, or a model id), or "
                              f"--bundled-config ({', '.join(BUNDLED_PLAN_CONFIGS)})")
        if self.target is not None and self.bundled_config is not None:
            raise ConfigError("--target and --bundled-config exclude each other: give one")
        for name, (low, high, why) in PLAN_LIMITS.items():
            option, value = f"--{name.replace('_', '-')}", getattr(self, name)
            at_least(value, low, option)
            if value is not None and value > high:
                raise ConfigError(f"{option} {value}: a plan takes at most {high} ({why})")
        if self.gpu_memory is not None:
            parse_size(self.gpu_memory, "--gpu-memory", ConfigError)
        parse_size(self.reserve, "--reserve", ConfigError, allow_zero=True)

    @property
    def target_name(self) -> str:
        """--target, or the bundled config's folder."""
        return self.target if self.target is not None else str(BUNDLED / "data" / "plan" / self.bundled_config)


# what a plan takes, at most: beyond these the meta tensors that carry the KV cache overflow, and a
# placement over more GPUs than any model has layers says nothing
PLAN_LIMITS = {"gpus": (1, 512, "one replica of a target over more GPUs than a model has layers is not a placement"),
               "max_context": (1, 2**27, "tokens per sequence"), "batch": (1, 2**16, "sequences at once")}
