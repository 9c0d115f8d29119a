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
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise DataError(f"{where}: key 'input_ids' must be a non-empty list of integers (true is not a token id)")
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


def check_prompts(prompts, limits, where: str) -> None:
    """Refuse prompts the target cannot take: token ids outside its vocabulary, or more positions than
    the maximum once max_new_tokens and the last verify's drafts are added. limits: (vocab_size,
    max_positions or None, positions the decode adds after the prompt, what sets the maximum)."""
    vocab, max_pos, extra, bound = limits
    for p in prompts:
        bad = next((t for t in p.input_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise DataError(f"{where}: prompt id {p.id!r}: token id {bad} is outside the target's vocabulary "
                            f"0..{vocab - 1}")
        check_length(p, max_pos, extra, where, bound)


def check_length(prompt, max_pos: int | None, extra: int, where: str, bound: str = "max_position_embeddings") -> None:
    if max_pos is not None and len(prompt.input_ids) + extra > max_pos:
        raise DataError(f"{where}: prompt id {prompt.id!r} has {len(prompt.input_ids)} tokens; with {extra} more "
                        f"(--max-new-tokens + draft steps) that is past the target's {max_pos} positions "
                        f"({bound}): shorten it, lower --max-new-tokens, or leave it out (--categories/--limit)")
