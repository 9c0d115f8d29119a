"""The Python API: `load_oracle(config)` and `evaluate(config)`; the CLI and test suites call these.

Contract: this is the only module that wires the stages together:
load (target, head, prompts) -> capture -> draft -> verify -> record -> report.
Every setting that was resolved here (aux layers in all conventions, embedding table, vocab map,
steps/topk/draft tokens really used) is returned in `Oracle.resolved` and echoed in every report.
"""

from __future__ import annotations

import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from eagle_eval.config import ConfigError, RunConfig
from eagle_eval.models.capture import engine_taps, resolve_aux_layers
from eagle_eval.models.head_io import load_head
from eagle_eval.results.plot import plot_ablation
from eagle_eval.results.records import Prompt, SampleRecord, read_jsonl
from eagle_eval.results.report import build_report
from eagle_eval.results.tables import write_csv, write_rows_csv
from eagle_eval.spec.chain import Speculator, speculative_decode
from eagle_eval.spec.greedy import first_divergence, plain_greedy
from eagle_eval.workload.conversations import load_workload, run_turns

log = logging.getLogger("eagle_eval")

SGLANG_TOPK1_MESSAGE = ("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                        "when speculative_eagle_topk == 1")


def resolve_speculative(num_steps: int, topk: int, num_draft_tokens: int | None) -> tuple[int, list[str]]:
    """num_draft_tokens as SGLang would use it, and the warnings SGLang would log."""
    from eagle_eval.spec.tree import pool_size

    notes = []
    if topk == 1:
        if num_draft_tokens is not None and num_draft_tokens != num_steps + 1:
            notes.append(f"{SGLANG_TOPK1_MESSAGE}: --num-draft-tokens {num_draft_tokens} -> {num_steps + 1}")
        return num_steps + 1, notes
    if num_draft_tokens is None:
        raise ConfigError(f"--topk {topk} (a tree) needs --num-draft-tokens D: the verify tree's nodes, root "
                          f"included, 2 <= D <= {pool_size(num_steps, topk) + 1} for num_steps {num_steps}")
    if num_draft_tokens - 1 > pool_size(num_steps, topk):
        raise ConfigError(f"--num-draft-tokens {num_draft_tokens}: a tree of num_steps {num_steps} and topk {topk} "
                          f"has only K + (S-1) K^2 = {pool_size(num_steps, topk)} candidates, so D <= "
                          f"{pool_size(num_steps, topk) + 1}")
    return num_draft_tokens, notes


def _resolve_dtype(dtype: str) -> str:
    if dtype != "auto":
        return dtype
    return "bf16" if torch.cuda.is_available() else "fp32"


@dataclass
class Oracle:
    """A loaded target + head with every setting resolved; decodes prompts with the reference loop."""
    config: RunConfig
    speculator: Speculator
    tokenizer: object
    eos_ids: set[int]
    resolved: dict
    warnings: list[str] = field(default_factory=list)

    def limits(self, extra: int | None = None) -> tuple[int, int | None, int]:
        """(vocab size, max positions, positions a decode adds past the prompt) for check_prompts."""
        info, cfg = self.speculator.target.info, self.config
        verify = max(cfg.num_steps, self.resolved["num_draft_tokens"])     # positions one verify adds
        return info.vocab_size, info.max_positions, cfg.max_new_tokens + verify + 1 if extra is None else extra

    def decode(self, prompt: Prompt, check_lossless: bool | None = None) -> SampleRecord:
        from eagle_eval.workload.data import check_length

        cfg = self.config
        _, max_positions, extra = self.limits()
        check_length(prompt, max_positions, extra, "the workload")
        d = speculative_decode(self.speculator, prompt.input_ids, cfg.num_steps, cfg.max_new_tokens,
                               self.eos_ids, cfg.topk, self.resolved["num_draft_tokens"])
        rec = SampleRecord(id=prompt.id, category=prompt.category, prompt_len=len(prompt.input_ids),
                           output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                           emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
        if cfg.topk > 1:
            rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
            rec.extra["tree_shape_per_cycle"] = d.tree_shape_per_cycle
        if cfg.check_lossless if check_lossless is None else check_lossless:
            target = self.speculator.target
            greedy = plain_greedy(target, prompt.input_ids, cfg.max_new_tokens, self.eos_ids)
            rec.divergence = first_divergence(target, prompt.input_ids, d.output_ids, greedy)
            rec.lossless = rec.divergence is None
        return rec


def _eos_ids(tokenizer, model) -> set[int]:
    ids = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for e in (gen_eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(i) for i in e)
    return ids


def _choose_embedding(choice: str, loaded, target) -> tuple[object, str]:
    """(embedding module, which table) following --draft-embedding (vLLM's rule for `auto`)."""
    head = loaded.head
    target_table = target.model.get_input_embeddings()
    own = head.embed_tokens
    compatible = tuple(target_table.weight.shape) == (head.config.vocab_size, head.config.hidden_size)
    if choice == "own" or (choice == "auto" and own is not None):
        if own is None:
            raise ConfigError(f"--draft-embedding own: {loaded.weights_file} has no 'embed_tokens.weight'")
        same = compatible and torch.equal(own.weight.detach().cpu().to(target_table.weight.dtype),
                                          target_table.weight.detach().cpu())
        if choice == "own" or not same:
            return own, "draft (own embed_tokens in the checkpoint)"
    if not compatible:
        raise ConfigError(
            f"{loaded.path}: the target's embedding table is {list(target_table.weight.shape)} but the head "
            f"needs [{head.config.vocab_size}, {head.config.hidden_size}] and has no embed_tokens of its own")
    return target_table, "target (the target's embed_tokens)"


def _train_acc(config: RunConfig, head_dir) -> dict | None:
    """The head's training-time per-step accuracy: --train-acc, else the head folder's file, else None."""
    from eagle_eval.models.training_metrics import read_train_acc

    if config.train_acc is not None:
        return {"acc": list(config.train_acc), "source": "--train-acc"}
    found = read_train_acc(head_dir)
    return {"acc": list(found[0]), "source": found[1]} if found else None


def load_oracle(config: RunConfig) -> Oracle:
    from eagle_eval.models.target import load_target

    notes = []
    num_draft_tokens, spec_notes = resolve_speculative(config.num_steps, config.topk, config.num_draft_tokens)
    notes += spec_notes
    dtype = _resolve_dtype(config.dtype)
    target, tokenizer = load_target(config.target, dtype=dtype, device_map=config.device_map,
                                    max_memory=config.max_memory, trust_remote_code=config.trust_remote_code)
    loaded = load_head(config.draft, allow_unknown_keys=config.allow_unknown_head_keys)
    notes += loaded.key_notes
    head = loaded.head
    if head.config.vocab_size != target.info.vocab_size:
        raise ConfigError(f"{loaded.path}/config.json: vocab_size={head.config.vocab_size} but the target "
                          f"{config.target} has {target.info.vocab_size} output logits")
    if head.config.target_hidden_size != target.info.hidden_size:
        raise ConfigError(f"{loaded.path}/config.json: target_hidden_size={head.config.target_hidden_size} "
                          f"but the target's hidden_size is {target.info.hidden_size}")
    aux = resolve_aux_layers(target.num_layers, head.config.num_aux, config.aux_layers, config.aux_convention,
                             loaded.aux_ids_sglang, loaded.aux_ids_vllm)
    draft_device = target.output_device
    head.to(device=draft_device, dtype=target.model.dtype)
    table, table_name = _choose_embedding(config.draft_embedding, loaded, target)
    table_device = table.weight.device
    dtype_t = head.lm_head.weight.dtype

    def embed(ids: torch.Tensor) -> torch.Tensor:
        return table(ids.to(table_device)).to(draft_device, dtype_t)

    reduced = head.config.draft_vocab_size < head.config.vocab_size
    d2t_identity = bool((head.d2t == 0).all())
    if reduced and d2t_identity:
        notes.append(f"{loaded.weights_file}: d2t is all zeros (identity) on a reduced draft vocab "
                     f"({head.config.draft_vocab_size} < {head.config.vocab_size}): draft ids map to "
                     "the first target ids, which is almost certainly wrong")
    for n in notes:
        warnings.warn(n, stacklevel=2)
    resolved = {
        "num_steps": config.num_steps, "topk": config.topk, "num_draft_tokens": num_draft_tokens,
        "num_draft_tokens_given": config.num_draft_tokens,
        "eagle_params": ({"depth": config.eagle_depth, "top_k": config.eagle_top_k,
                          "total_token": config.eagle_total_token,
                          "conversion": "num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token"}
                         if config.eagle_depth is not None else None),
        "aux_layers": {**aux.as_dict(), "engines": {e: t.as_dict() for e, t in engine_taps(
            target.num_layers, loaded.aux_ids_sglang, loaded.aux_ids_vllm).items()}},
        "embedding": table_name,
        "vocab_map": {"draft_vocab_size": head.config.draft_vocab_size, "vocab_size": head.config.vocab_size,
                      "d2t": "checkpoint" if loaded.d2t_in_checkpoint else "none (full vocab)",
                      "d2t_identity": d2t_identity},
        "head": {"path": loaded.path, "dialect": loaded.dialect, "weights": loaded.weights_file,
                 "norm_before_residual": head.config.norm_before_residual,
                 "rope_theta": head.config.rope_theta, "rope_scaling": head.config.rope_scaling,
                 "variant": head.config.variant(), "keys": loaded.key_audit.as_dict()},
        "target": {**target.info.__dict__, "devices": list(target.info.devices)},
        "draft_device": str(draft_device),
        "dtype": dtype,
        "position_offset": config.position_offset,
        "accept_length_definition": "mean over verify cycles of (accepted drafts + 1), bonus counted",
        "train_acc": _train_acc(config, loaded.path),
    }
    from eagle_eval.models.sanity import load_findings  # issue 5: load-time checks, printed by `run`
    resolved["sanity"] = [f.as_dict() for f in load_findings(target, loaded, aux, config, table_name)]
    spec = Speculator(target=target, head=head, embed=embed, aux_hf=aux.hf,
                      position_offset=config.position_offset)
    return Oracle(config=config, speculator=spec, tokenizer=tokenizer,
                  eos_ids=_eos_ids(tokenizer, target.model), resolved=resolved, warnings=notes)


@dataclass
class RunResult:
    report: dict
    samples: list[SampleRecord]


def checked_workload(config: RunConfig, oracle: Oracle, extra: int | None = None):
    """load_workload, then refuse prompts the target cannot take (token ids outside its vocabulary,
    more positions than max_position_embeddings with `extra` more; default: a decode's)."""
    from eagle_eval.workload.data import check_prompts

    workload = load_workload(config, oracle.tokenizer)
    check_prompts(workload.first_prompts, oracle.limits(extra), workload.resolved["dataset_source"]["path"])
    return workload


def _open_folder(command: str, config: RunConfig, settings: dict, inputs: dict, resume: bool = False):
    """The output folder for `command`, owned by this run (results/run_folder.py), or None."""
    from eagle_eval.results.run_folder import open_run_folder

    if not config.output_dir:
        return None
    return open_run_folder(config.output_dir, command, settings, inputs, resume=resume,
                           overwrite=config.overwrite, ignore=RunConfig.RESUMABLE)


def _resumed_rows(folder, workload) -> list[SampleRecord]:
    """Finished rows of an interrupted run (a last line cut short is dropped); rows naming prompts the
    workload does not hold are refused."""
    from eagle_eval.results.run_folder import RunFolderError

    file = folder.file("samples.jsonl")
    if not file.is_file():
        return []
    try:
        done = [SampleRecord.from_json(r) for r in read_jsonl(file)]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise RunFolderError(f"--resume: {file}: not readable as sample rows ({exc}); pass --overwrite to "
                             "start afresh") from exc
    known = {f"{q.id}" for q in workload.questions} | {p.id for p in workload.first_prompts}
    stray = [s.id for s in done if s.id not in known and s.id.rsplit("/turn", 1)[0] not in known]
    if stray:
        raise RunFolderError(f"--resume: {file}: row id {stray[0]!r} is not a prompt of this workload")
    folder.write_text("samples.jsonl", "".join(json.dumps(s.to_json()) + "\n" for s in done))
    return done


def _workload_digests(prompts: list[Prompt]) -> dict[str, str]:
    from eagle_eval.results.run_folder import fingerprint_value
    return {p.id: fingerprint_value(p.input_ids) for p in prompts}


def evaluate(config: RunConfig, progress: bool = True) -> RunResult:
    """Run the reference loop over the prompts; with output_dir, write samples.jsonl as it goes."""
    torch.manual_seed(config.seed)
    folder = _open_folder("run", config, config.as_dict(), config.input_paths(), resume=config.resume)
    try:
        return _evaluate(config, folder, progress)
    finally:
        if folder is not None:
            folder.close()


def _evaluate(config: RunConfig, folder, progress: bool) -> RunResult:
    from tqdm import tqdm

    oracle = load_oracle(config)
    workload = checked_workload(config, oracle)
    done = []
    if folder is not None:
        folder.record_workload(_workload_digests(workload.first_prompts), config.resume)
        done = _resumed_rows(folder, workload) if config.resume else []
    finished = {s.id: s for s in done}
    samples = list(done)
    for rec in tqdm(run_turns(workload, oracle.decode, finished), total=workload.pending(finished),
                    desc="prompts", unit="prompt", disable=not progress):
        samples.append(rec)
        if folder is not None:
            folder.append_row("samples.jsonl", rec.to_json())
    report = build_report(config, {**oracle.resolved, **workload.resolved}, samples,
                          oracle.warnings + workload.warnings, sample_prompt=workload.sample_prompt)
    if folder is not None:
        folder.write_json("report.json", report)
        write_csv(folder.file("acceptance.csv"), [(None, report)])
        folder.note("acceptance.csv")
        folder.finish()
    return RunResult(report=report, samples=samples)


@dataclass
class ProfileResult:
    report: dict                       # holds by_num_steps {"1": {summary, per_position, histogram}, ...}
    samples: list[SampleRecord]        # rows carry run_lengths and accepted_per_cycle_by_num_steps
    oracle: Oracle | None = None


def _read_responses(path: str, prompts: list[Prompt], tokenizer, vocab_size: int) -> list[list[int]]:
    """Continuations from a JSONL file (`output_ids` or `text` per row), matched by `id` or by order."""
    from eagle_eval.workload.data import DataError

    rows = read_jsonl(Path(path))
    by_id = {str(r["id"]): r for r in rows if "id" in r}
    out = []
    for i, p in enumerate(prompts):
        row = by_id.get(p.id) if by_id else (rows[i] if i < len(rows) else None)
        if row is None:
            raise DataError(f"{path}: no response for prompt id {p.id!r}")
        if "output_ids" in row:
            ids = row["output_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise DataError(f"{path}: response for {p.id!r}: key 'output_ids' must be a list of integers")
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise DataError(f"{path}: response for {p.id!r}: key 'output_ids' holds token id {bad}, outside "
                                f"the target's vocabulary 0..{vocab_size - 1}")
            out.append(ids)
        elif isinstance(row.get("text"), str):
            out.append(tokenizer(row["text"], add_special_tokens=False)["input_ids"])
        else:
            raise DataError(f"{path}: response for {p.id!r} has neither 'output_ids' (a list) nor 'text' (a string)")
    return out


def profile(pcfg, progress: bool = True, oracle: Oracle | None = None) -> ProfileResult:
    """Teacher-forced profile: exact per-cycle acceptance for every num_steps <= max_steps."""
    cfg = pcfg.run
    torch.manual_seed(cfg.seed)
    folder = _open_folder("profile", cfg, pcfg.as_dict(), {**cfg.input_paths(), "responses": pcfg.responses})
    try:
        return _profile(pcfg, folder, progress, oracle)
    finally:
        if folder is not None:
            folder.close()


def _profile(pcfg, folder, progress: bool, oracle: Oracle | None) -> ProfileResult:
    from tqdm import tqdm

    from eagle_eval.results.report import DEFINITIONS, provenance, summarize, training_prediction
    from eagle_eval.spec import profile as prof
    from eagle_eval.spec.tree import pool_size
    cfg, k_max = pcfg.run, pcfg.max_steps
    oracle = oracle or load_oracle(cfg)
    spec, tok = oracle.speculator, oracle.tokenizer
    need = cfg.max_new_tokens + k_max
    workload = checked_workload(cfg, oracle, need + 1)   # the same datasets, templates and filters as `run`
    prompts = workload.first_prompts              # the profile covers first turns only
    vocab = oracle.limits()[0]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (min(oracle.eos_ids) if oracle.eos_ids else 0)
    if pcfg.responses:
        conts = _extend(spec, prompts, [c[:need] for c in _read_responses(pcfg.responses, prompts, tok, vocab)],
                        need, pad, pcfg.batch_tokens)
    else:
        conts = prof.greedy_continuations(spec, [p.input_ids for p in prompts], need, pad, pcfg.batch_tokens)
    # trees: the config's D (capped where the pool of S levels is smaller) and any grid D that fits
    d_main = {s: min(oracle.resolved["num_draft_tokens"], pool_size(s, cfg.topk) + 1) for s in range(1, k_max + 1)}
    grid = [(s, d) for d in (pcfg.draft_tokens_grid or ()) for s in range(1, k_max + 1)
            if 2 <= d <= pool_size(s, cfg.topk) + 1]
    tree = (cfg.topk, sorted(set(d_main.items()) | set(grid))) if cfg.topk > 1 else (1, None)

    def run_profile(indices, desc):
        out = {}
        seqs = [prompts[i].input_ids + conts[i] for i in indices]
        for batch in tqdm(list(prof._batches(seqs, 0, pcfg.batch_tokens)), desc=desc, unit="batch",
                          disable=not progress):
            items = [(prompts[indices[j]], conts[indices[j]]) for j in batch]
            for j, res in zip(batch, prof.profile_batch(spec, items, k_max, cfg.max_new_tokens, pad, *tree)):
                out[indices[j]] = res
        return out

    profiled = run_profile(list(range(len(prompts))), "profile")
    divergences = [{"id": profiled[i].prompt.id, **profiled[i].divergence}
                   for i in range(len(prompts)) if profiled[i].divergence is not None]
    numeric = []
    if pcfg.responses and divergences:
        # responses that are not the target's greedy: profile the greedy sequence from the divergence on
        bad = [i for i in range(len(prompts)) if profiled[i].divergence is not None]
        cut = [conts[i][: profiled[i].divergence["position"]] for i in bad]
        for i, c in zip(bad, _extend(spec, [prompts[i] for i in bad], cut, need, pad, pcfg.batch_tokens)):
            conts[i] = c
        for i, res in run_profile(bad, "re-profile").items():
            res.divergence = profiled[i].divergence
            profiled[i] = res
    elif divergences:
        # our own batched greedy vs the teacher-forced argmax: rounding (near-ties, e.g. in bf16), kept
        numeric, divergences = divergences, []
    profiled = [profiled[i] for i in range(len(prompts))]

    def simulate(p, s, d=None):
        if p.tree_runs is None:
            return prof.simulate_cycles(p.run_lengths, p.continuation, s, cfg.max_new_tokens, oracle.eos_ids)
        runs, off = p.tree_runs[(s, d or d_main[s])]
        return prof.simulate_cycles(runs, p.continuation, s, cfg.max_new_tokens, oracle.eos_ids, off)

    sims = {s: [simulate(p, s) for p in profiled] for s in range(1, k_max + 1)}
    by_steps = {}
    for s, decoded in sims.items():
        recs = [_record(p, d) for p, d in zip(profiled, decoded)]
        by_steps[str(s)] = summarize(recs, s)
        if oracle.resolved.get("train_acc") and cfg.topk == 1:
            by_steps[str(s)]["training_prediction"] = training_prediction(oracle.resolved["train_acc"],
                                                                          by_steps[str(s)], s)
        if cfg.topk > 1:
            by_steps[str(s)]["num_draft_tokens"] = d_main[s]
        if s == min(cfg.num_steps, k_max):
            samples = recs
    by_draft_tokens = {}
    for s, d in grid:
        recs = [_record(p, simulate(p, s, d)) for p in profiled]
        by_draft_tokens.setdefault(str(d), {})[str(s)] = summarize(recs, s)
    for i, (rec, p) in enumerate(zip(samples, profiled)):
        s_run = min(cfg.num_steps, k_max)
        rec.extra["run_lengths"] = p.run_lengths if p.tree_runs is None else p.tree_runs[(s_run, d_main[s_run])][0]
        rec.extra["accepted_per_cycle_by_num_steps"] = {str(s): sims[s][i].accepted_per_cycle for s in sims}
        rec.extra["response_divergence"] = p.divergence
    report = {"schema_version": 1, "config": {**pcfg.as_dict(), **oracle.resolved, **workload.resolved},
              "by_num_steps": by_steps, "response_divergences": divergences,
              "numeric_divergences": numeric,
              **({"by_num_draft_tokens": by_draft_tokens} if grid else {}),
              "definitions": DEFINITIONS, "warnings": oracle.warnings, "provenance": provenance(cfg.seed)}
    if folder is not None:
        folder.record_workload(_workload_digests(prompts), resume=False)
        folder.write_text("samples.jsonl", "".join(json.dumps(r.to_json()) + "\n" for r in samples))
        folder.write_json("profile.json", report)
        folder.finish()
    return ProfileResult(report=report, samples=samples, oracle=oracle)


def _extend(spec, prompts: list[Prompt], conts: list[list[int]], need: int, pad: int,
            batch_tokens: int) -> list[list[int]]:
    """Extend continuations greedily to `need` tokens, in batches (responses stop at max_new_tokens
    or EOS; the loop's last verify looks num_steps tokens further)."""
    from eagle_eval.spec import profile as prof

    short = [i for i, c in enumerate(conts) if len(c) < need]
    out = [c[:need] for c in conts]
    if short:
        missing = max(need - len(conts[i]) for i in short)
        more = prof.greedy_continuations(spec, [prompts[i].input_ids + conts[i] for i in short], missing, pad,
                                         batch_tokens)
        for i, m in zip(short, more):
            out[i] = (conts[i] + m)[:need]
    return out


def _record(p, d) -> SampleRecord:
    rec = SampleRecord(id=p.prompt.id, category=p.prompt.category, prompt_len=len(p.prompt.input_ids),
                       output_ids=d.output_ids, accepted_per_cycle=d.accepted_per_cycle,
                       emitted_per_cycle=d.emitted_per_cycle, verify_count=len(d.accepted_per_cycle))
    if p.tree_runs is not None:
        rec.extra["off_top1_per_cycle"] = d.off_top1_per_cycle
    return rec


def ablate(base, variants: list[str], cost_ratio: float | None = None, server_ms: tuple | None = None,
           progress: bool = True, topk_grid=None, draft_tokens_grid=None) -> dict:
    """Profile the base config and each `--vary` variant (for each topk of the grid, with every
    num_draft_tokens of the grid from one tree expansion); tabulate tau and modelled speedup per
    (num_steps, topk, num_draft_tokens). server_ms = (draft step ms, target step ms) from a server."""
    settings = {**base.as_dict(), "vary": list(variants), "cost_ratio": cost_ratio,
                "server_ms": list(server_ms) if server_ms else None,
                "topk_grid": list(topk_grid or []), "draft_tokens_grid": list(draft_tokens_grid or [])}
    folder = _open_folder("ablate", base.run, settings, {**base.run.input_paths(), "responses": base.responses})
    try:
        result = _ablate(base, variants, cost_ratio, server_ms, progress, topk_grid, draft_tokens_grid)
        if folder is not None:
            _write_ablation(folder, result)
        return result
    finally:
        if folder is not None:
            folder.close()


def _write_ablation(folder, result: dict) -> None:
    folder.note("ablation.csv")
    write_rows_csv(folder.file("ablation.csv"), result["rows"])
    try:
        folder.note("ablation.png")
        plot_ablation(folder.file("ablation.png"), result["rows"])
    except ConfigError as exc:          # matplotlib is an optional extra
        result["warnings"] = [f"ablation.png not written: {exc}"]
    folder.write_json("ablation.json", result)
    folder.finish()


def _ablate(base, variants, cost_ratio, server_ms, progress, topk_grid, draft_tokens_grid) -> dict:
    from dataclasses import replace as _replace

    from eagle_eval import ablate as abl
    from eagle_eval.results.report import provenance
    from eagle_eval.spec.tree import pool_size

    run = _replace(base.run, output_dir=None, resume=False, overwrite=False)
    named = [("base", {})] + [abl.parse_variant(v) for v in variants]
    topks = list(topk_grid or [run.topk])
    grid = tuple(draft_tokens_grid or ())
    if any(k > 1 for k in topks) and not grid and run.num_draft_tokens is None:
        raise ConfigError("a topk > 1 in the grid needs --draft-tokens-grid (or --num-draft-tokens)")
    k_max = base.max_steps
    sizes = {s + 1 for s in range(1, k_max + 1)} | set(grid) | ({run.num_draft_tokens} if run.num_draft_tokens else set())
    server = abl.Costs(server_ms[0] / server_ms[1], {}, "server step times (r = 1)") if server_ms else None
    rows, sections, costs = [], [], None
    for name, overrides in named:
        for k in topks:
            d_main = None if k == 1 else max(d for d in (grid or (run.num_draft_tokens,))
                                             if d <= pool_size(k_max, k) + 1)
            cfg = abl.apply(run, {**overrides, "topk": k, "num_draft_tokens": d_main})
            res = profile(_replace(base, run=cfg, draft_tokens_grid=grid if k > 1 else None), progress=progress)
            if costs is None:
                costs = (abl.Costs(cost_ratio, {}, "given (--cost-ratio; r = 1)") if cost_ratio is not None
                         else abl.measure_costs(res.oracle, sizes))
            label = name if len(topks) == 1 else f"{name} topk={k}"
            shapes = ({str(d): sec for d, sec in res.report.get("by_num_draft_tokens", {}).items()}
                      if k > 1 and grid else {None: res.report["by_num_steps"]})
            for d, by_steps in shapes.items():
                mine = abl.variant_rows(label if d is None else f"{label} D={d}", by_steps, costs, server, k,
                                        int(d) if d else None)
                rows += mine
                best = abl.best_row(mine)
                sections.append({"variant": mine[0]["variant"], "overrides": {
                    kk: list(v) if isinstance(v, tuple) else v for kk, v in overrides.items()},
                    "topk": k, "num_draft_tokens": int(d) if d else None,
                    "aux_layers": res.report["config"]["aux_layers"],
                    "best_num_steps": best["num_steps"], "best_speedup_model": best["speedup_model"],
                    "best_num_steps_server": abl.best_row(mine, "speedup_server")["num_steps"] if server else None,
                    "by_num_steps": by_steps})
    overall = abl.best_row(rows)
    result = {"schema_version": 1, "config": {**base.as_dict(), "topk_grid": topks, "draft_tokens_grid": list(grid)},
              "costs": {"cost_ratio": costs.cost_ratio,
                        "verify_ratio": {str(n): v for n, v in costs.verify_ratio.items()},
                        "source": costs.source, "times_ms": costs.times_ms,
                        "server_ms": {"draft_step": server_ms[0], "target_step": server_ms[1]} if server_ms else None},
              "speedup_model": "S = (1 + sum_{i<=S} u_i) / (S c + r), c = T_draft_step / T_target_step, "
                               "r = T_verify(S+1 tokens, or num_draft_tokens for a tree) / T_target(1 token)",
              "best": {k: overall[k] for k in ("variant", "num_steps", "topk", "num_draft_tokens", "speedup_model")},
              "variants": sections, "rows": rows, "provenance": provenance(run.seed)}
    return result
