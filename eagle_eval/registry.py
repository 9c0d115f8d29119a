"""Named things, each one record registered once: the accept rules, the head kinds, the serving engines.

The ground floor beside errors: it imports nothing of eagle-eval's at import time. Each entry is a placeholder
"package.module:NAME" (lm-evaluation-harness' lazy registry), so `names()` lists what exists without importing torch
(settings reads its choices here), and `get(name)` imports the module that holds the record the first time it is
asked for. A test (or a user's plugin) registers more with `register(name, record_or_placeholder)`; nothing in the
package needs an edit for it.

>>> reg = Registry("toy", {"a": "eagle_eval.errors:UserError"})
>>> reg.names(), reg.get("a").__name__
(('a',), 'UserError')
>>> reg.get("b")
Traceback (most recent call last):
...
KeyError: "unknown toy 'b': expected one of a"
"""

from __future__ import annotations

import importlib


class Registry:
    """Name -> record, loaded lazily from "module:attribute" placeholders."""

    def __init__(self, what: str, entries: dict[str, object]):
        self.what = what
        self._entries = dict(entries)

    def names(self) -> tuple[str, ...]:
        """Every registered name, in registration order (nothing imported)."""
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str):
        """The record registered as `name` (its module imported the first time)."""
        if name not in self._entries:
            raise KeyError(f"unknown {self.what} {name!r}: expected one of {', '.join(self._entries)}")
        entry = self._entries[name]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = getattr(importlib.import_module(module), attribute)
            self._entries[name] = entry
        return entry

    def records(self) -> list:
        """Every record (each module imported)."""
        return [self.get(n) for n in self._entries]

    def register(self, name: str, entry: object) -> None:
        """Add `name` (a record, or a "module:attribute" placeholder); a name already taken is refused."""
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered already")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        """Remove `name` (a test's own entry, when it is done)."""
        self._entries.pop(name)


# the accept rules at temperature > 0, one file per engine (eagle_eval/rules/)
RULES = Registry("accept rule", {
    "vllm": "eagle_eval.rules.vllm:VLLM",
    "vllm-probabilistic": "eagle_eval.rules.vllm:VLLM_PROBABILISTIC",
    "sglang": "eagle_eval.rules.sglang:SGLANG",
    "sglang-rs": "eagle_eval.rules.sglang:SGLANG_RS",
    "eagle": "eagle_eval.rules.eagle:EAGLE",
})

# the draft head kinds, one folder each (eagle_eval/heads/)
HEAD_KINDS = Registry("head kind", {
    "llama": "eagle_eval.heads.eagle3.kind:KIND",        # EAGLE-3, a Llama-style (GQA) draft layer; P-EAGLE too
    "mla": "eagle_eval.heads.mla.kind:KIND",             # EAGLE-3 with DeepSeek multi-head latent attention
    "mtp": "eagle_eval.heads.mtp.kind:KIND",             # the target's own MTP layers (--draft mtp)
    "dflash": "eagle_eval.heads.dflash.kind:KIND",       # block drafters: DFlash / DFlash2
})

# the serving engines server-check talks to, one module each (eagle_eval/servers/)
ENGINES = Registry("serving engine", {
    "sglang": "eagle_eval.servers.sglang:ENGINE",
    "vllm": "eagle_eval.servers.vllm:ENGINE",
})
