"""One prompt row -> token ids, and the error every bad prompt input raises.

A row carries `prompt` (text, tokenized as is), `messages` (a chat, rendered by a
templates.PromptFormat) or `input_ids` (pre-tokenized); files are read by datasets.py and
conversations.py. Errors name the file, line and key.
"""

from __future__ import annotations

from eagle_eval.errors import UserError


class DataError(UserError, ValueError):
    """Prompt data that cannot be used; the message names file, line and key."""


def tokenize_row(row: dict, tokenizer, where: str, fmt) -> tuple[list[int], str | None]:
    """fmt: the templates.PromptFormat that renders `messages` rows."""
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
        return fmt.encode_chat(tokenizer, msgs, where)
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise DataError(f"{where}: key 'prompt' must be a non-empty string")
        return tokenizer(row["prompt"])["input_ids"], row["prompt"]
    raise DataError(f"{where}: row has none of the keys 'prompt', 'messages', 'input_ids'")
