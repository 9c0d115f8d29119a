"""Long contexts built from the workload's own texts (`--long-context L[,L...]`), so that "does acceptance decay past
the training length" is one command (docs/context.md).

Contract: `build(read, chosen, lengths, fmt, tokenizer, limits, seed, source)` returns one question per chosen
question and length L (id `QUESTION/ctxL`, the question's category) and the provenance the report echoes. Each
prompt is ONE user turn: texts of the other questions read (every user text of the file, each at most once, in
the order `random.Random("SEED/QUESTION_ID")` shuffles them, so the same question's lengths share a prefix of one
order), a blank line between texts, then the question's first user text; rendered in the run's prompt format
(its chat template, or raw text without one). The fewest texts whose rendered prompt reaches L tokens are taken;
when that prompt is longer than the target takes (its positions less the decode's: `limits`), the texts are
truncated from the left until it fits. A length the target cannot take, or that every other text of the file
together cannot fill, is refused naming the file, the length and what it can build. No model here: the
tokenizer counts the tokens.
"""

from __future__ import annotations

import random

from eagle_eval.workload.data import DataError
from eagle_eval.workload.datasets import Question

SEPARATOR = "\n\n"


def texts_of(q: Question) -> list[str]:
    """The user texts of a question: its turns (a dataset), a plain row's `prompt`, or its `messages`' user
    contents; a row of `input_ids` alone has none."""
    if q.row is None:
        return [t for t in q.turns if isinstance(t, str) and t]
    if "input_ids" in q.row:
        return []
    if "messages" in q.row:
        msgs = q.row["messages"]
        if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
            raise DataError(f"{q.where}: key 'messages' must be a list of {{'role', 'content'}} objects")
        return [m["content"] for m in msgs if m.get("role") == "user" and isinstance(m.get("content"), str)
                and m["content"]]
    if isinstance(q.row.get("prompt"), str) and q.row["prompt"]:
        return [q.row["prompt"]]
    raise DataError(f"{q.where}: row has none of the keys 'prompt', 'messages' (with a user text) for --long-context")


class _Builder:
    """One question's long prompts: the pool in its seeded order, rendered and counted by the tokenizer."""

    def __init__(self, q: Question, pool: list[tuple[str, str]], fmt, tokenizer, seed: int):
        own = texts_of(q)
        if not own:
            raise DataError(f"{q.where}: --long-context needs the question's text, and this row holds only "
                            "'input_ids'")
        self.q, self.final, self.fmt, self.tokenizer = q, own[0], fmt, tokenizer
        self.order = [t for qid, t in pool if qid != q.id]
        random.Random(f"{seed}/{q.id}").shuffle(self.order)

    def content(self, filler: str) -> str:
        return filler + SEPARATOR + self.final if filler else self.final

    def tokens(self, filler: str) -> int:
        ids, _ = self.fmt.encode(self.tokenizer, [{"role": "user", "content": self.content(filler)}], self.q.where)
        return len(ids)

    def filler(self, k: int) -> str:
        return SEPARATOR.join(self.order[:k])

    def fewest_texts(self, length: int, source: str) -> int:
        """The fewest texts of the order whose prompt reaches `length` tokens (the count grows with k): doubling k
        until it does, then halving the last step, so a large file is never rendered whole."""
        hi = 1
        while hi < len(self.order) and self.tokens(self.filler(hi)) < length:
            hi *= 2
        hi = min(hi, len(self.order))
        most = self.tokens(self.filler(hi))
        if most < length:
            raise DataError(f"--long-context {length}: {source} cannot fill it: all {len(self.order)} other texts of "
                            f"the file make a prompt of {most} tokens for question {self.q.id!r} ({self.q.where}); "
                            "give a larger dataset (--dataset) or a smaller length")
        lo = hi // 2 if hi > 1 else 0          # tokens(filler(hi)) >= length > tokens(filler(lo)) (lo > 0)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tokens(self.filler(mid)) >= length:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def truncated(self, filler: str, cap: int) -> str:
        """`filler` cut from the left, as little as keeps the prompt within `cap` tokens."""
        lo, hi = 0, len(filler)                # characters dropped; dropping all of it fits (cap >= the question)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.tokens(filler[mid:]) <= cap:
                hi = mid
            else:
                lo = mid + 1
        return filler[lo:]


def build(read: list[Question], chosen: list[Question], lengths, fmt, tokenizer, limits, seed: int,
          source: str) -> tuple[list[Question], dict]:
    """(the long-context questions, chosen question by question and each length in the order given; the
    provenance). read: every question of the file (the pool of texts); limits: the oracle's (vocab, max
    positions or None, positions the decode adds, what sets the maximum), or None (no cap)."""
    cap, bound = None, None
    if limits is not None and limits[1] is not None:
        cap, bound = limits[1] - limits[2], limits[3]
        too_long = [n for n in lengths if n > cap]
        if too_long:
            raise DataError(f"--long-context {too_long[0]}: the target takes prompts of at most {cap} tokens here "
                            f"({limits[1]} positions ({bound}) less {limits[2]} for the decode: --max-new-tokens and "
                            "the last verify's drafts); give a smaller length or lower --max-new-tokens")
    pool = [(q.id, t) for q in read for t in texts_of(q)]
    out, tokens, texts, truncated = [], [], [], 0
    for q in chosen:
        b = _Builder(q, pool, fmt, tokenizer, seed)
        for length in lengths:
            k = b.fewest_texts(length, source)
            filler = b.filler(k)
            n = b.tokens(filler)
            if cap is not None and n > cap:
                filler = b.truncated(filler, cap)
                n = b.tokens(filler)
                truncated += 1
                if n < length:
                    raise DataError(f"--long-context {length}: question {q.id!r} ({q.where}) cannot be made between "
                                    f"{length} and {cap} tokens (truncated from the left it has {n}); give a length "
                                    f"further below {cap}")
            out.append(Question(f"{q.id}/ctx{length}", q.category, (b.content(filler),),
                                f"{q.where} (--long-context {length})"))
            tokens.append(n)
            texts.append(k)
    info = {"lengths": list(lengths), "pool": {"path": source, "questions": len(read), "texts": len(pool)},
            "order": f"random.Random('{seed}/QUESTION_ID').shuffle of the other questions' texts, each once (seed: "
                     "--shuffle-seed, else 0)",
            "prompt": "one user turn: the fewest texts that reach L tokens, a blank line between them, then the "
                      "question's first user text, in the prompt format; ids QUESTION/ctxL",
            "max_prompt_tokens": cap, "bound": bound, "truncated": truncated,
            "prompt_tokens": {"min": min(tokens), "max": max(tokens), "mean": sum(tokens) / len(tokens)},
            "texts_per_prompt": {"min": min(texts), "max": max(texts)}}
    return out, info
