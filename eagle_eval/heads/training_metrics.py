"""A head's training-time validation accuracy per draft step, read from its folder.

Contract: `read_train_acc(head_dir)` returns the teacher-forced per-step accuracies acc_1..acc_k
(SpecForge's `acc_k`, docs/eagle3.md section 5) from `training_metrics.json` beside the weights, or None
when the file is absent. Accepted layouts: `{"validation": {"acc": [...]}}` (what the project's
builders write) or `{"acc": [...]}`. A file that is present but unreadable is bad input.
"""

from __future__ import annotations

import json
from pathlib import Path

from eagle_eval.errors import UserError

FILE = "training_metrics.json"


class TrainingMetricsError(UserError, ValueError):
    """training_metrics.json that is not JSON or has no usable per-step accuracy list."""


def check_acc(acc, where: str) -> tuple[float, ...]:
    """Per-step accuracies as a tuple of floats in [0, 1]; `where` names the source in the message."""
    if not isinstance(acc, (list, tuple)) or not acc:
        raise TrainingMetricsError(f"{where}: expected a non-empty list of per-step accuracies acc_1..acc_k")
    bad = [a for a in acc if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1]
    if bad:
        raise TrainingMetricsError(f"{where}: accuracies must be numbers in [0, 1], got {bad}")
    return tuple(float(a) for a in acc)


def read_train_acc(head_dir: str | Path) -> tuple[tuple[float, ...], str] | None:
    """(acc_1..acc_k, source) from head_dir/training_metrics.json, or None without that file."""
    path = Path(head_dir) / FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrainingMetricsError(f"{path}: not readable JSON ({exc})") from exc
    if isinstance(data, dict) and isinstance(data.get("validation"), dict) and "acc" in data["validation"]:
        return check_acc(data["validation"]["acc"], f"{path}: key validation.acc"), f"{path} (validation.acc)"
    if isinstance(data, dict) and "acc" in data:
        return check_acc(data["acc"], f"{path}: key acc"), f"{path} (acc)"
    raise TrainingMetricsError(f"{path}: no per-step accuracy list (expected key validation.acc or acc)")
