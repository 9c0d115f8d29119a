"""Where a target's modules go: accelerate's placement, computed on a model built on the meta device.

Contract:
- `no_split_classes(model)`: the module classes never split across devices: the model's own
  `_no_split_modules` (its decoder layer) plus eagle-eval's packed expert list.
- `infer_placement(model, max_memory)`: what `from_pretrained(device_map="auto", max_memory=...)` computes
  (transformers 5.24 `integrations/accelerate.py::_get_device_map`): accelerate's `get_balanced_memory`
  over the GPUs, then `infer_auto_device_map`, GPUs first, then "cpu", then "disk". No weight is read.
Sizes are read by `eagle_eval.units.parse_size` (bytes reach accelerate, never text it would read its own way).
The model is only inspected; nothing is moved.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

PACKED_EXPERTS = "PackedInt4Experts"


def no_split_classes(model) -> list[str]:
    return sorted(set(getattr(model, "_no_split_modules", None) or []) | {PACKED_EXPERTS})


@contextmanager
def quiet_accelerate():
    """accelerate warns once per GPU id it cannot see (a plan for 8 GPUs made on a laptop) and about
    tied weights of a meta model; the plan says what matters itself."""
    loggers = [logging.getLogger(n) for n in ("accelerate.utils.modeling", "accelerate.big_modeling")]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)


def infer_placement(model, max_memory: dict, balanced: bool = True) -> dict:
    """{module name: 0..N-1 | "cpu" | "disk"} for `model` (on the meta device) under `max_memory`
    ({gpu index | "cpu" | "disk": bytes})."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = no_split_classes(model)
    with quiet_accelerate():
        budget = dict(max_memory)
        if balanced and sum(isinstance(k, int) for k in budget) > 1:
            budget = get_balanced_memory(model, max_memory=budget, no_split_module_classes=no_split)
        return infer_auto_device_map(model, max_memory=budget, no_split_module_classes=no_split)


def resolve_device_map(model, device_map, max_memory: dict | None) -> dict:
    """A device map for loading: a dict as given; "auto" as transformers' from_pretrained reads it: without
    `max_memory` the free memory of each GPU (90% of it with one GPU, and 90% of the host's), no GPU and no
    `max_memory` -> everything on the CPU; with `max_memory`, that budget (GPUs, then cpu, then disk)."""
    import torch

    if isinstance(device_map, dict):
        return device_map
    if max_memory is None:
        if not torch.cuda.is_available():
            return {"": "cpu"}
        from accelerate.utils import get_max_memory

        budget = get_max_memory()
        gpus = [k for k in budget if isinstance(k, int)]
        if len(gpus) == 1:
            budget[gpus[0]] = int(budget[gpus[0]] * 0.9)
        if "cpu" in budget:
            budget["cpu"] = int(budget["cpu"] * 0.9)
        max_memory = budget
    return infer_placement(model, max_memory)
