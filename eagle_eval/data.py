"""Prompts -> token ids (chat templates live here).

Contract: `load_prompts` reads a JSONL file whose rows carry `prompt` (text), `messages` (chat,
rendered with the tokenizer's chat template, generation prompt added) or `input_ids`
(pre-tokenized), with optional `id` and `category`; bad rows are errors naming file, line and key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from eagle_eval.records import Prompt


class DataError(ValueError):
    """Prompt data that cannot be used; the message names file, line and key."""


def render_messages(tokenizer, messages, where: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{where}: row has 'messages' but the target tokenizer has no chat template")
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:
        raise DataError(f"{where}: chat template failed on 'messages' ({exc})") from exc


def tokenize_row(row: dict, tokenizer, where: str, fmt=None) -> tuple[list[int], str | None]:
    """fmt: a templates.PromptFormat for `messages` rows (None = the tokenizer's own template)."""
    if "input_ids" in row:
        ids = row["input_ids"]
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) for i in ids):
            raise DataError(f"{where}: key 'input_ids' must be a non-empty list of integers")
        return ids, None
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and "role" in m and "content" in m
                                                 for m in msgs):
            raise DataError(f"{where}: key 'messages' must be a list of {{'role', 'content'}} objects")
        if fmt is None:
            text = render_messages(tokenizer, msgs, where)
            return tokenizer(text, add_special_tokens=False)["input_ids"], text
        return fmt.encode_chat(tokenizer, msgs, where)
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DataError(f"{where}: key 'prompt' must be a non-empty string")
        return tokenizer(row["prompt"])["input_ids"], row["prompt"]
    raise DataError(f"{where}: row has none of the keys 'prompt', 'messages', 'input_ids'")


def load_prompts(path: str | Path, tokenizer, limit: int | None = None) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: prompts file does not exist")
    prompts, seen = [], set()
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise DataError(f"{where}: each line must be a JSON object")
        ids, text = tokenize_row(row, tokenizer, where)
        pid = str(row.get("id", f"row-{lineno}"))
        if pid in seen:
            raise DataError(f"{where}: duplicate id {pid!r}")
        seen.add(pid)
        prompts.append(Prompt(id=pid, category=str(row.get("category", "default")), input_ids=ids, text=text))
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise DataError(f"{path}: no prompts")
    return prompts


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
