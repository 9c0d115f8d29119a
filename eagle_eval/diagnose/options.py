"""`diagnose`'s own options, declared like every setting (eagle_eval/settings.py `opt`)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle_eval.settings import Group, at_least, opt


@dataclass(frozen=True)
class DiagnoseOptions(Group):
    train_dump: str | None = opt(None, "Training hidden-state dump: a SpecForge data_N.ckpt (or its folder) or a "
                                 "safetensors/.pt file with input_ids and aux_hidden_states; each block is matched "
                                 "to an HF index.", metavar="FILE", input_path=True)
    fingerprint: bool = opt(False, "Print the first values and norms of each aux feature for the first prompt tokens.")
    sweep: bool = opt(True, "Profile aux-layer candidates.", flag="--sweep", secondary="--no-sweep")
    template_check: bool = opt(True, "Compare acceptance with the tokenizer's template, raw prompts and "
                               "--chat-template.", flag="--template-check", secondary="--no-template-check")
    prompt_budget: int = opt(64, "The most questions profiled: looks at 8, 16, 32, ... prompts, stopping at the "
                             "first that decides.")

    def validate(self):
        at_least(self.prompt_budget, 1, "--prompt-budget")
