"""The Python API: what the CLI, diagnose, server-check and test suites call.

Settings (`eagle_eval.settings.Settings`, built with `Settings.of(**flat)` or group by group) -> an
`Oracle` (`load_oracle`; `oracle.with_(...)` for a variant that reuses the loaded weights) -> the
commands over it: `evaluate` (the reference loop over a workload), `profile` (every num_steps from one
teacher-forced pass), `ablate` (variants, each profiled). `run_prompts` / `profile_prompts` take prompts
in memory. Every resolved setting is in `Oracle.resolved` (a typed `Resolved`) and echoed in every report.
"""

from __future__ import annotations

from eagle_eval.commands.ablate import ablate
from eagle_eval.commands.profile import ProfileResult, profile, profile_oracle, profile_prompts
from eagle_eval.commands.run import RunResult, evaluate, run_prompts
from eagle_eval.oracle import (
    SGLANG_TOPK1_MESSAGE,
    Oracle,
    Resolved,
    checked_workload,
    load_oracle,
    resolve_speculative,
)
from eagle_eval.settings import AblateOptions, LoopOptions, ProfileOptions, Settings

__all__ = ["Settings", "LoopOptions", "ProfileOptions", "AblateOptions", "Oracle", "Resolved", "load_oracle",
           "checked_workload", "resolve_speculative", "SGLANG_TOPK1_MESSAGE", "evaluate", "run_prompts",
           "RunResult", "profile", "profile_oracle", "profile_prompts", "ProfileResult", "ablate"]
