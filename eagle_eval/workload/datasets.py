"""Benchmark datasets -> questions (no tokenizer, no model; local files only).

Contract: `read_questions(path, fmt)` reads a `.jsonl` file line by line, or a `.json`/`.parquet` file
or a `save_to_disk` folder through the `datasets` library, detects the format from the columns unless
one is given, and returns `Question`s: an id, a category and the user turns in order (the plain
prompt JSONL keeps its row, rendered later by `data.tokenize_row`). `select` applies --categories,
--shuffle-seed and --limit, in that order. Bad input is a `DataError` naming the file, row and key.

Formats (columns read; everything else is ignored):

| format     | id             | category         | turns                                            |
|------------|----------------|------------------|--------------------------------------------------|
| mt_bench   | `question_id`  | `category`       | `turns` (FastChat question.jsonl, 2 turns)       |
| spec_bench | `question_id`  | `category`       | `turns` (same shape, 13 categories)              |
| gsm8k      | row number     | "gsm8k"          | [`question`]                                     |
| humaneval  | `task_id`      | "humaneval"      | [`prompt`]                                       |
| alpaca     | row number     | "alpaca"         | [`instruction` + blank line + `input` if any]    |
| sharegpt   | `id` or row    | "sharegpt"       | the `value` of each `conversations` turn from human/user |
| prompts    | `id` or row    | `category`       | the row (`prompt`, `messages` or `input_ids`)    |

A `category` column, when present, wins over the format's default category.
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.settings import DATASET_FORMATS
from eagle_eval.workload.data import DataError

# Spec-Bench = the 8 MT-Bench categories + these 5 (its question.jsonl has the MT-Bench shape)
SPEC_BENCH_ONLY = frozenset({"translation", "summarization", "qa", "math_reasoning", "rag"})
PLAIN_KEYS = ("prompt", "messages", "input_ids")
HUMAN_ROLES = ("human", "user")
REQUIRED = {"mt_bench": ("turns",), "spec_bench": ("turns",), "gsm8k": ("question",),
            "humaneval": ("prompt",), "alpaca": ("instruction",), "sharegpt": ("conversations",)}


@dataclass(frozen=True)
class Question:
    id: str
    category: str
    turns: tuple[str, ...]        # user messages in order; empty for a plain prompt row
    where: str                    # "FILE:LINE" or "FILE row N", for error messages
    row: dict | None = None       # plain prompt JSONL row (`prompt`, `messages` or `input_ids`)


@dataclass(frozen=True)
class Table:
    rows: list[tuple[str, dict]]  # (where, row)
    columns: tuple[str, ...]
    split: str | None = None      # the split read from a DatasetDict folder


def read_jsonl_rows(path: Path) -> Table:
    """Rows of a JSONL file, each with its 'FILE:LINE' (exact line numbers in every error)."""
    rows, columns = [], {}
    try:
        text = Path(path).read_text()
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not a text (UTF-8 JSONL) file ({exc.reason} at byte {exc.start})") from exc
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise DataError(f"{where}: each line must be a JSON object")
        rows.append((where, row))
        columns.update(dict.fromkeys(row))
    return Table(rows, tuple(columns))


def _load_with_datasets(path: Path):
    import datasets

    with tempfile.TemporaryDirectory(prefix="eagle-eval-ds-") as cache:   # never the user's HF cache
        if path.is_dir():
            return datasets.load_from_disk(str(path), keep_in_memory=True)
        reader = {".json": datasets.Dataset.from_json, ".parquet": datasets.Dataset.from_parquet}[path.suffix]
        return reader(str(path), keep_in_memory=True, cache_dir=cache)


def _pick_split(ds, path: Path):
    if not hasattr(ds, "column_names") or isinstance(ds.column_names, dict):       # a DatasetDict
        splits = list(ds)
        if len(splits) == 1 or "test" in splits:
            split = splits[0] if len(splits) == 1 else "test"
            return ds[split], split
        raise DataError(f"{path}: a DatasetDict with splits {splits} and no 'test' split: save the split to "
                        "evaluate on its own (ds['NAME'].save_to_disk(...))")
    return ds, None


def read_table(path: str | Path) -> Table:
    """Rows of a .jsonl/.json/.parquet file or a save_to_disk folder (missing values dropped)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: dataset does not exist (local files and save_to_disk folders only)")
    if path.is_file() and path.suffix == ".jsonl":
        return read_jsonl_rows(path)
    if path.is_file() and path.suffix not in (".json", ".parquet"):
        raise DataError(f"{path}: expected a .jsonl, .json or .parquet file or a save_to_disk folder")
    from datasets import disable_progress_bars, enable_progress_bars, is_progress_bar_enabled

    was_enabled = is_progress_bar_enabled()
    disable_progress_bars()
    try:
        ds, split = _pick_split(_load_with_datasets(path), path)
    except DataError:
        raise
    except Exception as exc:       # the datasets/pyarrow errors are many; keep their first line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{path}: cannot be read as a dataset ({first})") from exc
    finally:
        if was_enabled:
            enable_progress_bars()
    rows = [(f"{path} row {i}", {k: v for k, v in r.items() if v is not None}) for i, r in enumerate(ds, 1)]
    return Table(rows, tuple(ds.column_names), split)


def detect_format(table: Table, path) -> str:
    cols = set(table.columns)
    if "turns" in cols:
        cats = {str(r.get("category")) for _, r in table.rows}
        return "spec_bench" if cats & SPEC_BENCH_ONLY else "mt_bench"
    for fmt, needed in (("sharegpt", {"conversations"}), ("alpaca", {"instruction"}),
                        ("humaneval", {"prompt", "task_id"}), ("gsm8k", {"question"})):
        if needed <= cols:
            return fmt
    if cols & set(PLAIN_KEYS):
        return "prompts"
    raise DataError(f"{path}: cannot tell the dataset format from the columns {sorted(cols)}; "
                    f"pass --dataset-format (one of {', '.join(DATASET_FORMATS)})")


def _text(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: key '{key}' must be a non-empty string")
    return value


def _turns(row: dict, where: str) -> tuple[str, ...]:
    turns = row.get("turns")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise DataError(f"{where}: key 'turns' must be a non-empty list of non-empty strings")
    return tuple(turns)


def _sharegpt_turns(row: dict, where: str) -> tuple[str, ...]:
    conv = row.get("conversations")
    if not isinstance(conv, list) or not all(isinstance(m, dict) and isinstance(m.get("from"), str)
                                             and isinstance(m.get("value"), str) for m in conv):
        raise DataError(f"{where}: key 'conversations' must be a list of {{'from', 'value'}} objects")
    turns = tuple(m["value"] for m in conv if m["from"].lower() in HUMAN_ROLES)
    if not turns or not all(t.strip() for t in turns):
        raise DataError(f"{where}: key 'conversations' has no human turn, or an empty one")
    return turns


def _category(row: dict, where: str, default: str) -> str:
    """The row's `category` (a non-empty string; a list or a number is not coerced), else `default`."""
    value = row.get("category")
    if value is None:
        return default
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: key 'category' = {json.dumps(value)[:40]}: expected a non-empty string")
    return value


def _id(row: dict, key: str, where: str, default) -> str:
    """The row's id under `key`: a string or an integer (MT-Bench's question_id), said as a string; true,
    1.0, a list or an object are refused rather than turned into text."""
    value = row.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value):
        raise DataError(f"{where}: key '{key}' = {json.dumps(value)[:40]}: expected a string or an integer id")
    return str(value)


def to_question(fmt: str, row: dict, index: int, where: str) -> Question:
    """One row of a format -> Question (index is the 1-based row number, the id when there is none)."""
    category = _category(row, where, fmt)
    if fmt in ("mt_bench", "spec_bench"):
        if "question_id" not in row:
            raise DataError(f"{where}: key 'question_id' is missing")
        return Question(_id(row, "question_id", where, None), category, _turns(row, where), where)
    if fmt == "gsm8k":
        return Question(_id(row, "id", where, index), category, (_text(row, "question", where),), where)
    if fmt == "humaneval":
        qid = _id(row, "task_id", where, index)
        return Question(qid, category, (_text(row, "prompt", where),), where)
    if fmt == "alpaca":
        text = _text(row, "instruction", where)
        extra = row.get("input")
        if extra is not None and not isinstance(extra, str):
            raise DataError(f"{where}: key 'input' must be a string")
        return Question(_id(row, "id", where, index), category, (f"{text}\n\n{extra}" if extra else text,), where)
    if fmt == "sharegpt":
        return Question(_id(row, "id", where, index), category, _sharegpt_turns(row, where), where)
    return Question(_id(row, "id", where, f"row-{index}"), _category(row, where, "default"), (), where, row=row)


def read_questions(path: str | Path, fmt: str | None = None) -> tuple[list[Question], str, Table]:
    """(questions in file order, the format used, the table read)."""
    table = read_table(path)
    if not table.rows:
        raise DataError(f"{path}: no rows")
    fmt = fmt or detect_format(table, path)
    missing = [k for k in REQUIRED.get(fmt, ()) if k not in table.columns]
    if fmt == "prompts" and not set(PLAIN_KEYS) & set(table.columns):
        missing = [" or ".join(PLAIN_KEYS)]
    if missing:
        raise DataError(f"{path}: format {fmt} needs column '{missing[0]}' (columns: {', '.join(table.columns)})")
    questions, seen = [], set()
    for index, (where, row) in enumerate(table.rows, 1):
        q = to_question(fmt, row, index, where)
        if q.id in seen:
            raise DataError(f"{where}: duplicate id {q.id!r}")
        seen.add(q.id)
        questions.append(q)
    return questions, fmt, table


def select(questions: list[Question], source, categories=None, shuffle_seed=None, limit=None) -> list[Question]:
    """--categories (keep these), then --shuffle-seed (random.Random(seed).shuffle), then --limit.

    >>> qs = [Question(str(i), "ab"[i % 2], ("w5",), "f") for i in range(6)]
    >>> [q.id for q in select(qs, "f", categories=("a",), limit=2)]
    ['0', '2']
    >>> [q.id for q in select(qs, "f", shuffle_seed=0)] == [q.id for q in select(qs, "f", shuffle_seed=0)]
    True
    """
    if categories:
        present = sorted({q.category for q in questions})
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise DataError(f"{source}: --categories {unknown[0]!r} matches no question "
                            f"(categories: {', '.join(present)})")
        questions = [q for q in questions if q.category in categories]
    questions = list(questions)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(questions)
    return questions[:limit] if limit is not None else questions
