"""Load-time sanity checks of a draft head against its target.

Contract: `load_findings` looks only at weights and configs (no decoding; a few sampled matrix
statistics), so `load_oracle` runs it for every command and `run` prints it. It returns `Finding`s:
an lm_head / own embed_tokens that looks untrained (a fresh PyTorch or Hugging Face init, i.i.d.
numbers with no trained structure, collapsed rows), d2t/t2d consistency and the identity d2t on a
reduced vocab, NaN/inf in any draft tensor, RoPE base / scaling / max positions of the draft vs the target, dialect flags and which
engine reads which aux-id key, dtypes; head variants and the config-key audit in heads/checks/variants.py;
for an MLA head, heads/mla/checks.py. `coverage_finding` needs the target's greedy tokens and is
called by `diagnose`. A check that cannot run on an unusual model becomes an info finding, never a
crash.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from eagle_eval.models.capture import (
    ENGINE_NAMES,
    consistent_config_lines,
    default_hf_layers,
    engine_taps,
    sglang_deepseek_family,
)
from eagle_eval.heads.kind import kind
from eagle_eval.registry import HEAD_KINDS
from eagle_eval.heads.checks.variants import head_variant_findings
from eagle_eval.findings import Finding, error, guarded, info, warning

SAMPLE_ROWS = 4096           # matrix statistics use at most this many rows (deterministic sample)
COSINE_ROWS = 256            # rows compared pairwise for the "collapsed rows" check


@dataclass(frozen=True)
class MatrixStats:
    """Statistics of a weight matrix [rows, cols] (float32, over a deterministic row sample)."""
    rows: int
    cols: int
    mean: float
    std: float
    max_abs: float
    kurtosis: float              # E[z^4]: 3 for a normal, 1.8 for a uniform distribution
    row_norm_cv: float           # std / mean of the row L2 norms
    col_norm_cv: float
    mean_row_cosine: float       # mean cosine between distinct rows (near 1 = collapsed)

    def iid_cv(self, length: int) -> float:
        """Expected norm CV of a vector of `length` i.i.d. entries with this kurtosis (delta method)."""
        return math.sqrt(max(self.kurtosis - 1.0, 0.0) / (4.0 * length))

    @property
    def iid_like(self) -> bool:
        """Row and column norms no more spread than i.i.d. numbers give (plus 4 sampling SEs):
        trained matrices have structured norms (frequent tokens, active features)."""
        row_ok = self.row_norm_cv < self.iid_cv(self.cols) * (1 + 4 / math.sqrt(2 * self.rows))
        col_ok = self.col_norm_cv < self.iid_cv(self.rows) * (1 + 4 / math.sqrt(2 * self.cols))
        return row_ok and col_ok

    def describe(self) -> str:
        return (f"std {self.std:.4g}, mean {self.mean:+.3g}, kurtosis {self.kurtosis:.2f}, row-norm CV "
                f"{self.row_norm_cv:.3f} (i.i.d. {self.iid_cv(self.cols):.3f})")


@torch.no_grad()
def matrix_stats(weight: torch.Tensor) -> MatrixStats:
    w = weight.detach()
    if w.shape[0] > SAMPLE_ROWS:
        idx = torch.randperm(w.shape[0], generator=torch.Generator().manual_seed(0))[:SAMPLE_ROWS]
        w = w[idx.to(w.device)]
    w = w.float()                                                    # [R, C]
    mean, std = float(w.mean()), float(w.std())
    kurt = float((((w - mean) / std) ** 4).mean()) if std > 0 else 0.0
    rn, cn = w.norm(dim=1), w.norm(dim=0)
    unit = torch.nn.functional.normalize(w[:COSINE_ROWS], dim=1)    # [r, C]
    r = unit.shape[0]
    gram = unit @ unit.T
    cos = float((gram.sum() - gram.diagonal().sum()) / (r * (r - 1))) if r > 1 else 0.0
    return MatrixStats(rows=w.shape[0], cols=w.shape[1], mean=mean, std=std, max_abs=float(w.abs().max()),
                       kurtosis=kurt, row_norm_cv=float(rn.std() / rn.mean()) if rn.mean() > 0 else 0.0,
                       col_norm_cv=float(cn.std() / cn.mean()) if cn.mean() > 0 else 0.0, mean_row_cosine=cos)


def fresh_init(stats: MatrixStats, init_range: float | None) -> str | None:
    """The init a matrix still matches, or None: PyTorch's nn.Linear default (uniform in
    +-1/sqrt(in)), nn.Embedding's N(0, 1), or Hugging Face's N(0, initializer_range)."""
    bound = 1 / math.sqrt(stats.cols)
    if stats.max_abs <= bound * 1.001 and abs(stats.std * math.sqrt(3) / bound - 1) < 0.03:
        return f"PyTorch nn.Linear default init (uniform in +-1/sqrt({stats.cols}))"
    normal_kurtosis = abs(stats.kurtosis - 3) < max(0.1, 5 * math.sqrt(24 / (stats.rows * stats.cols)))
    for s0, name in ((init_range, f"Hugging Face init N(0, initializer_range={init_range})"),
                     (1.0, "nn.Embedding default init N(0, 1)")):
        if s0 and abs(stats.std / s0 - 1) < 0.03 and abs(stats.mean) < 0.05 * stats.std and normal_kurtosis \
                and stats.iid_like:
            return name
    return None


def matrix_findings(name: str, weight: torch.Tensor, init_range: float | None,
                    reference: torch.Tensor | None = None, ref_name: str = "") -> list[Finding]:
    """Untrained / collapsed / random-looking checks of one matrix, and its scale vs the target's."""
    if not torch.isfinite(weight).all():
        return [error(f"{name}-not-finite", f"{name} holds NaN or inf values")]
    s = matrix_stats(weight)
    if s.std == 0:
        return [error(f"{name}-degenerate", f"{name} is constant ({s.mean:+.3g} everywhere): never trained")]
    init = fresh_init(s, init_range)
    if init:
        return [error(f"{name}-untrained", f"{name} still matches a fresh init, {init} ({s.describe()}): "
                                            "servers run it and report accept length ~1.0")]
    out = []
    if s.mean_row_cosine > 0.9:
        out.append(error(f"{name}-collapsed", f"{name} rows are nearly identical (mean cosine "
                                               f"{s.mean_row_cosine:.3f}): every token gets the same vector"))
    elif s.iid_like:
        out.append(warning(f"{name}-random", f"{name} looks like i.i.d. random numbers ({s.describe()}): "
                                             "no trained structure"))
    if reference is not None:
        ref = matrix_stats(reference)
        ratio = s.std / ref.std if ref.std > 0 else float("inf")
        msg = f"{name} std {s.std:.4g} vs {ref_name} {ref.std:.4g} (ratio {ratio:.3g})"
        out.append(warning(f"{name}-scale", msg + ": far from the target's") if not 0.05 < ratio < 20
                   else info(f"{name}-stats", msg))
    if not out:
        out.append(info(f"{name}-stats", f"{name}: {s.describe()}"))
    return out


@torch.no_grad()
def own_table_findings(own: torch.Tensor, target_table: torch.Tensor, embedding: str) -> list[Finding]:
    """A draft's own embed_tokens vs the target's: vLLM uses the draft's table, SGLang the target's."""
    if tuple(own.shape) != tuple(target_table.shape):
        return [info("embed-tokens-shape", f"the draft's own embed_tokens is {list(own.shape)}, the target's "
                                           f"{list(target_table.shape)}")]
    rows = torch.randperm(own.shape[0], generator=torch.Generator().manual_seed(0))[:SAMPLE_ROWS]
    a, b = own[rows.to(own.device)].float(), target_table[rows.to(target_table.device)].float().to(own.device)
    cos = float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())
    if cos > 0.999:
        return [info("embed-tokens-same", f"the draft's own embed_tokens equals the target's (mean row cosine "
                                          f"{cos:.4f}): SGLang and vLLM embed tokens alike")]
    return [warning("embed-tokens-differs", f"the draft's own embed_tokens differs from the target's (mean row cosine "
                                           f"{cos:.3f}): vLLM embeds with the draft's table, SGLang with the target's, "
                                           f"so the servers disagree; this run uses {embedding}")]


def vocab_map_findings(d2t: torch.Tensor, t2d: torch.Tensor, t2d_in_checkpoint: bool) -> list[Finding]:
    """d2t [V_d] int64, t2d [V] bool: identity on a reduced vocab, range, order, consistency."""
    vd, v = d2t.numel(), t2d.numel()
    used = torch.arange(vd, device=d2t.device) + d2t                 # target id of each draft id
    if vd == v:
        if (d2t != 0).any():
            nonzero = int((d2t != 0).sum())
            return [warning("d2t-full-vocab-nonzero", f"draft vocab = target vocab ({v}) but d2t is not all "
                                                      f"zeros ({nonzero} entries): a permuted vocabulary")]
        return [info("vocab-map", f"full vocabulary ({v} tokens), no d2t needed")]
    if (d2t == 0).all():
        return [error("d2t-identity", f"d2t is all zeros on a reduced draft vocab ({vd} < {v}): draft ids map to "
                                      f"target ids 0..{vd - 1}, which is almost certainly wrong (a lost or "
                                      "regenerated vocab map)")]
    out = []
    if int(used.min()) < 0 or int(used.max()) >= v:
        return [error("d2t-out-of-range", f"d2t maps draft ids to target ids outside 0..{v - 1} "
                                          f"(min {int(used.min())}, max {int(used.max())})")]
    distinct = used.unique().numel()
    if distinct < vd:
        out.append(error("d2t-duplicates", f"d2t maps {vd} draft ids to only {distinct} distinct target ids"))
    elif not bool((used[1:] > used[:-1]).all()):
        out.append(warning("d2t-unsorted", "draft ids are not in ascending target-id order (SpecForge sorts them)"))
    if t2d_in_checkpoint:
        from_t2d = t2d.nonzero().flatten().to(used.device)
        if from_t2d.numel() != vd or not torch.equal(torch.sort(used).values, from_t2d):
            differ = len(set(from_t2d.tolist()) ^ set(used.tolist()))
            out.append(error("t2d-inconsistent", f"nonzero(t2d) != d2t + arange(V_d): t2d marks {from_t2d.numel()} "
                                                 f"target ids, d2t reaches {vd}, {differ} id(s) differ"))
    if not out:
        out.append(info("vocab-map", f"d2t/t2d consistent: {vd} draft ids -> {vd} distinct target ids of {v}"
                                     + ("" if t2d_in_checkpoint else " (t2d derived from d2t)")))
    return out


def coverage_finding(t2d: torch.Tensor, token_lists: list[list[int]]) -> Finding:
    """Share of the target's emitted tokens that the draft vocab can propose at all."""
    tokens = [t for seq in token_lists for t in seq]
    if not tokens:
        return info("vocab-coverage", "no target tokens to measure draft vocab coverage on")
    reachable = t2d.detach().cpu()
    covered = sum(bool(reachable[t]) for t in tokens if 0 <= t < reachable.numel())
    share = covered / len(tokens)
    msg = (f"draft vocab covers {share:.1%} of the target's {len(tokens)} greedy tokens on these prompts "
           f"({reachable.numel() - int(reachable.sum())} target ids unreachable)")
    if share < 0.5:
        return error("vocab-coverage", msg + ": wrong vocab map or a draft vocab from other data")
    if share < 0.9:
        return warning("vocab-coverage", msg + ": acceptance is capped by the missing tokens")
    return info("vocab-coverage", msg, share=share)


def _target_rope(cfg) -> tuple[float | None, str, dict | None]:
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    scaling = getattr(cfg, "rope_scaling", None) or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    return (float(theta) if theta is not None else None), kind, scaling


def rope_findings(head_cfg, raw: dict, target_cfg) -> list[Finding]:
    out = []
    theta, kind, _ = _target_rope(target_cfg)
    layer = raw.get("transformer_layer_config") or raw
    given = "rope_theta" in layer or "rope_theta" in (layer.get("rope_parameters") or {})
    dkind = (head_cfg.rope_scaling or {}).get("rope_type", (head_cfg.rope_scaling or {}).get("type", "default"))
    where = "" if given else " (not in the draft config.json: default 10000, as EAGLE official configs)"
    if theta is not None and abs(head_cfg.rope_theta - theta) > 1e-6 * theta:
        out.append(warning("rope-theta-mismatch", f"draft RoPE base {head_cfg.rope_theta:g}{where} != target's "
                                                  f"{theta:g}: right only if the head was trained with "
                                                  f"{head_cfg.rope_theta:g}"))
    else:
        shown = "unknown" if theta is None else format(theta, "g")
        out.append(info("rope", f"RoPE base {head_cfg.rope_theta:g} (draft) = {shown} (target){where}"))
    if dkind != kind:
        out.append(warning("rope-scaling-mismatch", f"draft rope scaling {dkind!r} != target's {kind!r}"))
    tmax = getattr(target_cfg, "max_position_embeddings", None)
    if tmax is not None and head_cfg.max_position_embeddings < tmax:
        out.append(warning("max-positions", f"draft max_position_embeddings {head_cfg.max_position_embeddings} < "
                                            f"target's {tmax}: longer contexts were never seen in training"))
    else:
        out.append(info("max-positions", f"max_position_embeddings draft {head_cfg.max_position_embeddings}, "
                                         f"target {tmax}"))
    return out


def config_aux_hf(raw: dict) -> list[int] | None:
    """HF layers a draft config.json names: the nested SGLang-style ids + 1, else the top-level vLLM-style
    ids, else None (capture.resolve_aux_layers has already checked that both agree)."""
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    return sorted(i + 1 for i in nested) if nested is not None else sorted(top) if top is not None else None


def aux_id_findings(raw: dict, num_layers: int, aux, cli_ids, deepseek_family: bool = False) -> list[Finding]:
    """What each engine taps for this config (capture.engine_taps) against the layers the config means
    (the head's training layers as far as its config says), and a --aux-layers that overrides them."""
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    from_config = config_aux_hf(raw) or default_hf_layers(num_layers)
    reference, source = (sorted(aux.hf), aux.source) if cli_ids is None else (sorted(from_config), "draft config")
    out = []
    recommended = consistent_config_lines(reference, deepseek_family)
    for taps in engine_taps(num_layers, nested, top, deepseek_family).values():
        if taps.hf is not None and list(taps.hf) == reference:
            continue
        tapped = f"HF {list(taps.hf)}" if taps.hf is not None else "no valid layers"
        out.append(warning(f"{taps.engine.replace('_', '-')}-taps-differ",
                           f"{ENGINE_NAMES[taps.engine]} would tap {tapped} ({taps.reads}), not the HF {reference} "
                           f"of the {source}: set {recommended} in the draft config.json so that every engine taps "
                           "the same tensors",
                           engine=taps.engine, engine_hf=list(taps.hf) if taps.hf is not None else None,
                           recommended=recommended))
    if cli_ids is not None and sorted(aux.hf) != sorted(from_config):
        out.append(warning("aux-layers-override",
                           f"--aux-layers gives HF {list(aux.hf)} but the draft config implies HF "
                           f"{sorted(from_config)}: "
                           "the head was probably trained on the config's layers",
                           config_hf=sorted(from_config)))
    return out


def dialect_findings(loaded, raw: dict) -> list[Finding]:
    cfg = loaded.head.config
    flags = {"norm_before_residual": cfg.norm_before_residual, "use_aux_hidden_state": cfg.num_aux > 1,
             "fc": cfg.has_fc, "fc_bias": cfg.fc_bias, "own embed_tokens": loaded.own_embedding}
    text = ", ".join(f"{k}={v}" for k, v in flags.items())
    out = [info("dialect", f"{loaded.dialect} layout ({Path(loaded.weights_file).name}): {text}")]
    if cfg.norm_before_residual:
        out.append(info("norm-before-residual", "norm_before_residual=True: the residual is hidden_norm(fc(aux)) "
                                                "(speculators/vLLM); an engine that ignores the flag feeds fc(aux)"))
    return out


# safetensors' integer dtype names, said as torch says them
_INT_NAMES = {"i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16",
              "u32": "uint32", "u64": "uint64"}


def stored_dtypes(weights_file: str) -> dict[str, str]:
    """Tensor name -> dtype as stored in a weights file (safetensors: from the header alone)."""
    path = Path(weights_file)
    if path.suffix == ".safetensors":
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        return {k: _INT_NAMES.get(v["dtype"].lower(), v["dtype"].lower()) for k, v in header.items()
                if k != "__metadata__"}
    tensors = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
    return {k: str(t.dtype).replace("torch.", "") for k, t in tensors.items()}


_SHORT = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "f16": "fp16", "float32": "fp32", "f32": "fp32",
          "float64": "fp64", "f64": "fp64"}


def dtype_findings(weights_file: str, run_dtype: str, target_cfg) -> list[Finding]:
    """Stored dtypes of the draft's weights (the vocab map named apart) against the target's and the run's;
    a weight stored in a non-float type is an error (heads/io.check_dtype refuses it at load)."""
    dtypes = stored_dtypes(weights_file)
    weights = {k: d for k, d in dtypes.items() if k not in ("d2t", "t2d")}
    not_float = sorted(k for k, d in weights.items() if d not in _SHORT)
    if not_float:
        return [error("dtype-not-float", f"draft weight(s) {not_float[:3]} stored as {weights[not_float[0]]}: "
                                         "a draft weight must be fp16, bf16, fp32 or fp64")]
    stored = sorted({_SHORT[d] for d in weights.values()})
    vocab_map = ", ".join(f"{k} {dtypes[k]}" for k in ("d2t", "t2d") if k in dtypes)
    tdtype = getattr(target_cfg, "dtype", None) or getattr(target_cfg, "torch_dtype", None)
    target_stored = _SHORT.get(str(tdtype).replace("torch.", ""), str(tdtype))
    msg = (f"draft weights stored {'/'.join(stored)}{f' ({vocab_map})' if vocab_map else ''}, target stored "
           f"{target_stored}, run in {run_dtype}")
    if run_dtype == "fp16" and "bf16" in stored + [target_stored]:
        return [warning("dtype", msg + ": bf16 weights run in fp16 can overflow (the engines serve bf16)")]
    if len(stored) > 1:
        return [info("dtype", msg + " (mixed dtypes in the draft file)")]
    return [info("dtype", msg)]


@torch.no_grad()
def finite_findings(head, checked_apart=("lm_head.weight", "embed_tokens.weight")) -> list[Finding]:
    """An error naming every floating tensor of the head that holds NaN or inf (the lm_head and own
    embed_tokens are `matrix_findings`' and left out here): such a head drafts garbage."""
    bad = [name for name, t in head.state_dict().items()
           if name not in checked_apart and t.dtype.is_floating_point and not bool(torch.isfinite(t).all())]
    if bad:
        return [error("weights-not-finite", f"draft tensor(s) {', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''} "
                                            "hold NaN or inf values: every draft is garbage", tensors=bad)]
    return [info("weights-finite", "every draft tensor is finite")]


def load_findings(target, loaded, aux, cli_aux_ids, embedding: str, cache: dict | None = None) -> list[Finding]:
    """Every load-time check. target: `Target`; loaded: `LoadedHead`; aux: resolved `AuxLayers`;
    cli_aux_ids: --aux-layers as given (None: from the head's config); embedding: which table the oracle uses
    (from `_choose_embedding`). `cache`: a dict kept beside the loaded weights, holding the checks that look
    only at them (the weight statistics), so that a variant of the same weights recomputes only the wiring's."""
    head, tcfg = loaded.head, target.text_config
    raw = json.loads((Path(loaded.path) / "config.json").read_text())
    cache = {} if cache is None else cache
    if not cache:
        cache.update(_weight_findings(target, loaded, raw))
    out = list(cache["lm_head"])
    if head.embed_tokens is not None:
        out += cache["embed_tokens"]
        out += guarded("embed_tokens", own_table_findings, head.embed_tokens.weight, target.input_embeddings.weight,
                       embedding)
    out.append(info("embedding", f"draft token embeddings: {embedding}"))
    out += cache["weights-finite"] + cache["vocab-map"] + cache["rope"]
    out += guarded("aux-ids", aux_id_findings, raw, target.num_layers, aux, cli_aux_ids,
                   sglang_deepseek_family(target.model.config))
    out += cache["dialect"] + cache["dtype"]
    out += head_variant_findings(loaded, aux)               # head variants and config keys
    out += cache["kind"]
    return out


def _weight_findings(target, loaded, raw: dict) -> dict[str, list[Finding]]:
    """The checks of `load_findings` that depend only on the loaded weights and configs, by name."""
    head, tcfg = loaded.head, target.text_config
    layer = raw.get("transformer_layer_config") or raw
    init_range = layer.get("initializer_range", 0.02)
    used = (torch.arange(head.d2t.numel(), device=head.d2t.device) + head.d2t)
    target_head = target.output_embeddings.weight
    out = {"lm_head": guarded("lm_head", lambda: matrix_findings(
        "lm_head", head.lm_head.weight, init_range, target_head[used.to(target_head.device)],
        "the target's lm_head rows of the draft vocab"))}
    out["embed_tokens"] = (guarded("embed_tokens", matrix_findings, "embed_tokens", head.embed_tokens.weight,
                                   init_range, target.input_embeddings.weight, "the target's embed_tokens")
                           if head.embed_tokens is not None else [])
    out["vocab-map"] = guarded("vocab-map", lambda: vocab_map_findings(head.d2t, head.t2d,
                                                                       "t2d" in stored_dtypes(loaded.weights_file)))
    out["weights-finite"] = guarded("weights-finite", finite_findings, head)
    out["rope"] = guarded("rope", rope_findings, head.config, raw, tcfg)
    out["dialect"] = guarded("dialect", dialect_findings, loaded, raw)
    run_dtype = _SHORT.get(str(target.model.dtype).replace("torch.", ""), str(target.model.dtype))
    out["dtype"] = guarded("dtype", dtype_findings, loaded.weights_file, run_dtype, tcfg)
    checks = kind(loaded.kind).checks if loaded.kind in HEAD_KINDS else None     # the head kind's own (heads/kind.py)
    out["kind"] = guarded(loaded.kind, checks, loaded, raw, tcfg) if checks else []
    return out
