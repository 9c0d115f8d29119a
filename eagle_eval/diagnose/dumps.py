"""Training hidden-state dumps: read them and say which target tensor each dumped block is.

Contract: `read_dump` accepts
  * SpecForge's offline hidden-state files: `scripts/prepare_hidden_states.py` in sgl-project/SpecForge
    `torch.save`s one dict per sample to `OUTPUT/rows_A-B/data_N.ckpt` with `input_ids` [T],
    `loss_mask` [T], `hidden_state` [1, T, H_t] (the last hidden state, after the final norm) and
    `aux_hidden_state` [1, T, k*H_t] (the captured layers, concatenated in capture order); its
    `OfflineEagle3Dataset.process_data` reads them back by these keys and squeezes the batch dim.
    A folder is accepted too: the `data_N.ckpt` with the lowest N below it is read.
  * a plain safetensors or torch file (.pt/.pth/.bin/.ckpt) with `input_ids` ([T] or [1, T]) and
    `aux_hidden_states` ([T, k*H_t] or [1, T, k*H_t]; `aux_hidden_state` is accepted as well).
Torch files are read with `weights_only=True` (plain tensors only). `match_dump` runs the target on
the same input_ids with output_hidden_states and compares every dumped block with every HF[i]
(cosine per token, averaged; norm ratio = mean dump norm / mean HF[i] norm).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle_eval.errors import UserError
from eagle_eval.findings import Finding, error, info, undecided, warning

AUX_KEYS = ("aux_hidden_states", "aux_hidden_state")
MAX_TOKENS = 512             # tokens compared; features at t depend only on tokens <= t
EXACT_COSINE = 0.99          # below this the best match is reported as weak
AMBIGUOUS_MARGIN = 1e-3      # best and runner-up cosines closer than this: ambiguous


class DumpError(UserError, ValueError):
    """A --train-dump that cannot be read; the message names the file and the key."""


@dataclass(frozen=True)
class Dump:
    file: str
    format: str                           # "specforge" or "plain"
    input_ids: torch.Tensor               # [T] int64
    aux: torch.Tensor                     # [T, k*H_t]
    hidden_state: torch.Tensor | None     # [T, H_t] SpecForge's last hidden state, if present
    notes: tuple[str, ...] = ()

    def blocks(self, hidden_size: int) -> int:
        return self.aux.shape[-1] // hidden_size


@dataclass(frozen=True)
class BlockMatch:
    block: int                  # position in the dump's concatenation
    hf_index: int               # best-matching HF[i]
    cosine: float
    norm_ratio: float
    runner_up: int              # second-best HF index, and its cosine
    runner_up_cosine: float

    def as_dict(self) -> dict:
        return {"block": self.block, "hf_index": self.hf_index, "cosine": round(self.cosine, 6),
                "norm_ratio": round(self.norm_ratio, 6), "runner_up": self.runner_up,
                "runner_up_cosine": round(self.runner_up_cosine, 6)}


@dataclass
class DumpMatch:
    dump: Dump
    tokens: int                               # tokens compared
    blocks: list[BlockMatch]
    hidden_state: BlockMatch | None = None    # SpecForge's `hidden_state` against every HF[i]
    num_layers: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def hf(self) -> list[int]:
        return [b.hf_index for b in self.blocks]

    @property
    def confident(self) -> bool:
        return all(b.cosine >= EXACT_COSINE and b.cosine - b.runner_up_cosine >= AMBIGUOUS_MARGIN
                   for b in self.blocks)


def describe_hf(i: int, num_layers: int) -> str:
    """HF index in words (docs/eagle3.md section 1).

    >>> describe_hf(3, 8), describe_hf(0, 8), describe_hf(8, 8)
    ('HF[3] = output of layer 2', 'HF[0] = embedding output', 'HF[8] = final norm output')
    """
    if i == 0:
        return "HF[0] = embedding output"
    if i == num_layers:
        return f"HF[{i}] = final norm output"
    return f"HF[{i}] = output of layer {i - 1}"


def find_dump_file(path: Path) -> Path:
    """A file as given; in a folder, SpecForge's data_N.ckpt with the lowest N, else the first tensor file."""
    if path.is_file():
        return path
    if not path.is_dir():
        raise DumpError(f"--train-dump {path}: no such file or folder")
    numbered = sorted((int(m.group(1)), p) for p in path.rglob("data_*.ckpt")
                      if (m := re.fullmatch(r"data_(\d+)\.ckpt", p.name)))
    if numbered:
        return numbered[0][1]
    files = sorted(p for ext in ("safetensors", "pt", "pth", "ckpt", "bin") for p in path.rglob(f"*.{ext}"))
    if not files:
        raise DumpError(f"--train-dump {path}: folder holds no data_N.ckpt, .safetensors, .pt, .pth or .bin file")
    return files[0]


def _load(file: Path) -> dict:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file
        return load_file(str(file))
    try:
        data = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise DumpError(f"{file}: cannot be read as plain tensors with torch.load(weights_only=True) ({exc})") from exc
    if not isinstance(data, dict):
        raise DumpError(f"{file}: expected a dict of tensors, got {type(data).__name__}")
    return data


def _squeeze_batch(t: torch.Tensor, key: str, file: Path, dims: int) -> torch.Tensor:
    """[1, ...] -> [...]; a real batch is an error (one sample per dump)."""
    if t.dim() == dims + 1:
        if t.shape[0] != 1:
            raise DumpError(f"{file}: key {key!r} has shape {list(t.shape)}: one sample per file expected (batch 1)")
        t = t[0]
    if t.dim() != dims:
        raise DumpError(f"{file}: key {key!r} has shape {list(t.shape)}, expected {dims} dims (+ optional batch 1)")
    return t


def read_dump(path: str | Path, hidden_size: int) -> Dump:
    """Read one dumped sample; hidden_size = the target's H_t (the width of each block)."""
    file = find_dump_file(Path(path))
    data = _load(file)
    key = next((k for k in AUX_KEYS if k in data and data[k] is not None), None)
    if key is None and any(k in data for k in AUX_KEYS):
        raise DumpError(f"{file}: 'aux_hidden_state' is empty (None): the dump was made without aux hidden states "
                        "(SpecForge: --enable-aux-hidden-states)")
    if "input_ids" not in data or key is None:
        raise DumpError(f"{file}: needs keys 'input_ids' and one of {list(AUX_KEYS)}; found {sorted(data)}")
    aux = data[key]
    if isinstance(aux, (list, tuple)):                      # a list of per-layer [T, H_t] tensors
        aux = torch.cat([_squeeze_batch(a, key, file, 2) for a in aux], dim=-1)
    aux = _squeeze_batch(aux, key, file, 2)
    ids = _squeeze_batch(data["input_ids"], "input_ids", file, 1).long()
    if aux.shape[-1] % hidden_size:
        raise DumpError(f"{file}: key {key!r} has width {aux.shape[-1]}, not a multiple of the target's "
                        f"hidden_size {hidden_size} (a dump of another model?)")
    notes = []
    if ids.numel() > aux.shape[0]:                          # batch padding kept in input_ids
        notes.append(f"input_ids has {ids.numel()} tokens, {key} {aux.shape[0]}: compared the first {aux.shape[0]}")
        ids = ids[: aux.shape[0]]
    elif ids.numel() < aux.shape[0]:
        raise DumpError(f"{file}: {key} has {aux.shape[0]} positions but input_ids only {ids.numel()} tokens")
    hidden = data.get("hidden_state")
    if hidden is not None:
        hidden = _squeeze_batch(hidden, "hidden_state", file, 2)[: ids.numel()]
    fmt = "specforge" if {"loss_mask", "hidden_state", "aux_hidden_state"} <= set(data) else "plain"
    return Dump(file=str(file), format=fmt, input_ids=ids, aux=aux, hidden_state=hidden, notes=tuple(notes))


def _best(scores: list[tuple[float, float]], block: int) -> BlockMatch:
    """scores[i] = (mean cosine, norm ratio) against HF[i]."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i][0], i))
    best, second = order[0], order[1] if len(order) > 1 else order[0]
    return BlockMatch(block=block, hf_index=best, cosine=scores[best][0], norm_ratio=scores[best][1],
                      runner_up=second, runner_up_cosine=scores[second][0])


@torch.no_grad()
def match_dump(target, dump: Dump, max_tokens: int = MAX_TOKENS) -> DumpMatch:
    """Every dumped block (and SpecForge's hidden_state) against every HF[0..N] of `target`."""
    h = target.info.hidden_size
    ids = dump.input_ids[:max_tokens]
    if int(ids.max()) >= target.info.vocab_size or int(ids.min()) < 0:
        raise DumpError(f"{dump.file}: input_ids hold ids outside the target's vocabulary "
                        f"0..{target.info.vocab_size - 1}")
    t = ids.numel()
    k = dump.blocks(h)
    feats = [dump.aux[:t, j * h:(j + 1) * h] for j in range(k)]                 # k x [t, H_t]
    if dump.hidden_state is not None and dump.hidden_state.shape[-1] == h:
        feats.append(dump.hidden_state[:t])
    out = target.model(input_ids=ids[None].to(target.input_device), output_hidden_states=True, use_cache=False)
    scores = [[] for _ in feats]                                                  # per feature, per HF index
    for hs in out.hidden_states:                                                  # N + 1 tensors [1, t, H_t]
        ref = hs[0].float()
        ref_norm = ref.norm(dim=-1)
        for j, f in enumerate(feats):
            f = f.to(ref.device).float()
            cos = torch.nn.functional.cosine_similarity(f, ref, dim=-1).mean()
            scores[j].append((float(cos), float(f.norm(dim=-1).mean() / ref_norm.mean().clamp_min(1e-30))))
    blocks = [_best(scores[j], j) for j in range(k)]
    hidden = _best(scores[k], -1) if len(feats) > k else None
    notes = list(dump.notes)
    if t < dump.input_ids.numel():
        notes.append(f"compared the first {t} of {dump.input_ids.numel()} tokens")
    return DumpMatch(dump=dump, tokens=t, blocks=blocks, hidden_state=hidden, num_layers=target.num_layers,
                     notes=notes)


def dump_findings(match: DumpMatch, aux_hf: tuple[int, ...], num_aux: int, sweep: bool = True) -> list[Finding]:
    """Which HF index each block is, and whether the evaluation feeds the same tensors in the same order
    (`sweep`: whether the aux-layer sweep runs too and decides when the dump cannot)."""
    n = match.num_layers
    out = [info("dump-read", f"{match.dump.file} ({match.dump.format} format, {match.tokens} tokens, "
                             f"{len(match.blocks)} block(s))" + "".join(f"; {x}" for x in match.notes))]
    for b in match.blocks:
        line = (f"dump block {b.block} = {describe_hf(b.hf_index, n)} (cos {b.cosine:.4f}, norm ratio "
                f"{b.norm_ratio:.3f}; next best HF[{b.runner_up}] cos {b.runner_up_cosine:.4f})")
        if b.cosine < EXACT_COSINE:
            out.append(warning("dump-block-weak", line + ": no HF index matches closely (another target, dtype "
                                                         "or prompt format?)"))
        elif b.cosine - b.runner_up_cosine < AMBIGUOUS_MARGIN:
            out.append(warning("dump-block-ambiguous", line + ": two HF indices match equally well (undecided "
                                                              "between them)"))
        else:
            out.append(info("dump-block", line))
    if match.hidden_state is not None:
        hs = match.hidden_state
        out.append(info("dump-hidden-state", f"dump hidden_state = {describe_hf(hs.hf_index, n)} "
                                             f"(cos {hs.cosine:.4f})"))
    return out + [_layers_finding(match, aux_hf, num_aux, sweep)]


def _plausible(b: BlockMatch) -> set[int] | None:
    """The HF indices a block may be: one when confident, the best two when ambiguous, None when weak."""
    if b.cosine < EXACT_COSINE:
        return None
    return {b.hf_index} if b.cosine - b.runner_up_cosine >= AMBIGUOUS_MARGIN else {b.hf_index, b.runner_up}


def _layers_finding(match: DumpMatch, aux_hf: tuple[int, ...], num_aux: int, sweep: bool) -> Finding:
    """Three ways: mismatch (a block is surely not the tensor fed there), match (every block surely is),
    inconclusive (a weak or ambiguous block leaves it open: a warning when the sweep decides instead)."""
    dumped = match.hf
    if len(dumped) != num_aux:
        return error("dump-block-count", f"the dump holds {len(dumped)} block(s) but the head fuses {num_aux}")
    plausible = [_plausible(b) for b in match.blocks]
    if match.confident and dumped != sorted(dumped):
        return error("dump-block-order", f"dump blocks are HF {dumped}, not in ascending order: the head was "
                                         "trained on this order, the engines concatenate low -> high")
    if any(p is not None and fed not in p for p, fed in zip(plausible, aux_hf)):
        sg = [i - 1 for i in dumped]
        return error("dump-layers-mismatch",
                     f"trained on HF {dumped} (SGLang ids {sg}, vLLM ids {dumped}) but the evaluation feeds "
                     f"HF {list(aux_hf)}: set eagle_config.eagle_aux_hidden_state_layer_ids={sg} (SGLang) / "
                     f"eagle_aux_hidden_state_layer_ids={dumped} (vLLM)", dump_hf=dumped)
    if all(p == {fed} for p, fed in zip(plausible, aux_hf)):
        return info("dump-layers-match", f"the evaluation feeds the dumped tensors HF {dumped}, in the same order")
    open_blocks = [b.block for b, p, fed in zip(match.blocks, plausible, aux_hf) if p != {fed}]
    message = (f"the dump cannot tell whether the evaluation's HF {list(aux_hf)} are the trained tensors: block(s) "
               f"{open_blocks} match no HF index closely or two equally well; "
               + ("the aux-layer sweep's verdict decides" if sweep
                  else "run the aux-layer sweep (drop --no-sweep) to decide, or dump another sample"))
    return (warning if sweep else undecided)("dump-layers-inconclusive", message, open_blocks=open_blocks)
