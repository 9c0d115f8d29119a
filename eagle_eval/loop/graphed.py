"""The chain cycle captured once as a CUDA graph and replayed: the loop without the host launching
hundreds of kernels per cycle.

Contract: `cycle_runner(fn, state, spec, enabled)` returns a callable that does what `fn()` does, and
whether it is a replayed graph. `fn` is `batched.chain_cycle` over static buffers (the row caches of
loop/rows.py, the rows' roots, last outs and lengths): S draft steps, the verify forward of
S+1 tokens per row, the acceptance, the rollback (lengths set on the device) and the draft re-run,
all in one graph, so a cycle costs one replay and one device->host read of the accepted tokens. The
graph replays the very kernels the eager call runs, on the same buffers: its tokens equal the eager
loop's (fp32 test on the GPU, tests/test_gpu_speed.py).

Where a graph cannot hold the cycle, it is not tried and the loop runs eager, with a one-line reason
(`capture_blockers`): no CUDA device; parameters on the CPU or on several devices (accelerate's
offload and pipeline hooks move tensors between devices on the host: one graph is one device); a
mixture-of-experts target (transformers' eager experts loop over the experts a batch hits, found with `.nonzero()`
on the host: the shapes depend on the routing, which a replay would freeze; its "grouped_mm" path routes on the
device but copies a host tensor inside the forward, which a capture refuses: measured on the H100). A capture
that fails anyway (some other host read inside a model's forward) falls back the same way, its error
in the reason. Capture follows PyTorch's recipe (torch.cuda.graphs docs, `torch.cuda.graph`): warm-up
calls on a side stream first, then one capture; warm-ups change the state, which is put back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

MOE_MARKERS = ("Experts", "MoE", "Moe")
# why each of transformers' experts implementations (integrations/moe.py) cannot be captured. "grouped_mm" routes on
# the device with fixed shapes, but its forward still copies a host tensor to the device: measured on the H100 (torch
# 2.11, transformers 5.17), capture fails with "Cannot copy between CPU and CUDA tensors during CUDA graph capture"
ROUTING = {"eager": "loops over the experts a batch hits, found with .nonzero() on the host",
           "grouped_mm": "copies a host tensor to the device inside its forward (capture measured to fail on torch "
                         "2.11 / transformers 5.17)"}


def capture_blockers(spec, cuda: bool | None = None) -> str | None:
    """Why the loop of `spec` cannot be captured (one line), or None. cuda: whether a CUDA device is
    there (default: ask torch)."""
    own = getattr(spec.draft_state, "capture_blocker", None)     # a kind's own batched drafting (loop/batched.py)
    if own is not None:
        return own
    if getattr(spec.head, "depth", 1) > 1:
        return (f"a {spec.head.depth}-layer draft head: the captured cycle is built for one draft layer (not extended "
                "to layers above the first); the loop runs eager")
    model = spec.target.model
    experts = (getattr(spec.target.info, "experts", None) or {}).get("implementation", "unknown")
    for name, module in model.named_modules():
        if any(m in type(module).__name__ for m in MOE_MARKERS):
            how = (ROUTING.get(experts) or "routes tokens to experts with shapes found on the host")
            return (f"{name} ({type(module).__name__}) {how} (mixture of experts, experts_implementation "
                    f"{experts!r}): a CUDA graph cannot replay it; the loop runs eager")
    if not (torch.cuda.is_available() if cuda is None else cuda):
        return "no CUDA device: the loop runs eager"
    devices = {p.device for p in model.parameters()} | {p.device for p in spec.head.parameters()}
    if any(d.type != "cuda" for d in devices):
        return (f"parameters on {sorted(str(d) for d in devices if d.type != 'cuda')} (accelerate offload): "
                "a CUDA graph holds one device's work only; the loop runs eager")
    if len(devices) > 1:
        return (f"the target is spread over {sorted(str(d) for d in devices)} (accelerate hooks across devices): "
                "a CUDA graph holds one device's work only; the loop runs eager")
    return None


def capture(fn: Callable, state: list[torch.Tensor], warmups: int = 2):
    """Capture fn() as a CUDA graph -> a callable replaying it (returns fn's outputs, rewritten in
    place by each replay). `state`: tensors fn changes, restored after each warm-up."""
    saved = [t.clone() for t in state]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
            for t, s in zip(state, saved):
                t.copy_(s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()

    def replay():
        graph.replay()
        return outputs
    return replay


def cycle_runner(fn: Callable, state: list[torch.Tensor], spec, enabled: bool,
                 policy_blocker: str | None = None) -> tuple[Callable, bool, str | None]:
    """(callable, replayed as a graph, why not when `enabled`); policy_blocker: why the decode policy's batched
    form cannot be held by a graph (`RowPolicies.capture_blocker`: a sampling rule draws on the host)."""
    if not enabled:
        return fn, False, None
    reason = policy_blocker or capture_blockers(spec)
    if reason is None:
        try:
            return capture(fn, state), True, None
        except RuntimeError as exc:                   # a host read or sync inside the forward
            try:
                torch.cuda.synchronize()
            except RuntimeError:
                pass
            reason = f"CUDA graph capture failed ({str(exc).splitlines()[0][:160]}); the loop runs eager"
    return fn, False, reason
