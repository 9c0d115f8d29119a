"""Prompt format: chat template (the tokenizer's, a FILE, or none), system prompt, thinking switch.

Contract: `PromptFormat.resolve` decides once per run which template text is used and records its
SHA-256, so a report says exactly how prompts were rendered. `render` turns a conversation (a list of
{'role', 'content'}) into the prompt text, with the generation prompt added; `encode` tokenizes it.
With a template the rendered text is tokenized without special tokens (the template writes them);
without one the contents are joined with blank lines and tokenized with the tokenizer's own special
tokens, as a plain `prompt` row is. The thinking switch (`enable_thinking`, Qwen3's template kwarg) is passed to
the template only when given; a switch that changes no prompt is refused (`ThinkingIgnored`,
workload/conversations.py renders the prompts both ways and compares).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from eagle_eval.settings import ConfigError
from eagle_eval.workload.data import DataError

NO_TEMPLATE_GIVEN = "none (--no-chat-template)"


class ThinkingIgnored(ConfigError):
    """--enable-thinking / --disable-thinking given, but no prompt renders differently with it on and off."""

NO_TEMPLATE_IN_TOKENIZER = "none (the tokenizer has no chat template)"


@dataclass(frozen=True)
class PromptFormat:
    template: str | None            # the exact jinja text used; None = raw text
    source: str                     # "tokenizer", the --chat-template FILE, or one of the NO_TEMPLATE_*
    system_prompt: str | None = None
    enable_thinking: bool | None = None

    @classmethod
    def resolve(cls, tokenizer, no_chat_template: bool = False, chat_template: str | None = None,
                system_prompt: str | None = None, enable_thinking: bool | None = None) -> "PromptFormat":
        if no_chat_template:
            return cls(None, NO_TEMPLATE_GIVEN, system_prompt, None)
        if chat_template is not None:
            path = Path(chat_template)
            if path.is_dir():
                raise ConfigError(f"--chat-template {chat_template}: is a folder, a Jinja template file was expected")
            if not path.is_file():
                raise ConfigError(f"--chat-template {chat_template}: file does not exist")
            try:
                text = path.read_text()
            except UnicodeDecodeError as exc:
                raise ConfigError(f"--chat-template {chat_template}: not a UTF-8 text file ({exc.reason} at byte "
                                  f"{exc.start}); a Jinja template was expected") from exc
            return cls(text, str(path), system_prompt, enable_thinking)
        if getattr(tokenizer, "chat_template", None):
            return cls(tokenizer.get_chat_template(), "tokenizer", system_prompt, enable_thinking)
        return cls(None, NO_TEMPLATE_IN_TOKENIZER, system_prompt, None)

    @property
    def template_sha256(self) -> str | None:
        return hashlib.sha256(self.template.encode()).hexdigest() if self.template is not None else None

    def as_dict(self) -> dict:
        return {"chat_template": self.source, "template_sha256": self.template_sha256,
                "system_prompt": self.system_prompt, "enable_thinking": self.enable_thinking}

    def conversation(self, messages: list[dict]) -> list[dict]:
        """The messages with the system prompt first (unless the conversation brings its own)."""
        if self.system_prompt is None or (messages and messages[0].get("role") == "system"):
            return list(messages)
        return [{"role": "system", "content": self.system_prompt}, *messages]

    def render(self, tokenizer, messages: list[dict], where: str) -> str:
        msgs = self.conversation(messages)
        if self.template is None:
            return "\n\n".join(m["content"] for m in msgs)
        extra = {} if self.enable_thinking is None else {"enable_thinking": self.enable_thinking}
        try:
            return tokenizer.apply_chat_template(msgs, chat_template=self.template, tokenize=False,
                                                 add_generation_prompt=True, **extra)
        except Exception as exc:
            raise DataError(f"{where}: chat template ({self.source}) failed ({exc})") from exc

    def encode(self, tokenizer, messages: list[dict], where: str) -> tuple[list[int], str]:
        """(prompt ids, rendered text) of a conversation ending with a user turn."""
        text = self.render(tokenizer, messages, where)
        ids = tokenizer(text, add_special_tokens=self.template is None)["input_ids"]
        if not ids:
            raise DataError(f"{where}: the rendered prompt is empty")
        return ids, text

    def encode_chat(self, tokenizer, messages: list[dict], where: str) -> tuple[list[int], str]:
        """A `messages` row of the plain prompt JSONL: needs a template unless --no-chat-template."""
        if self.source == NO_TEMPLATE_IN_TOKENIZER:
            raise DataError(f"{where}: row has 'messages' but the target tokenizer has no chat template")
        return self.encode(tokenizer, messages, where)
