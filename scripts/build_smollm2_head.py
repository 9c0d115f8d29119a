"""Train an EAGLE-3 draft head for SmolLM2-135M-Instruct on the target's own greedy answers.

    python scripts/build_smollm2_head.py [--out checkpoints/smollm2-eagle3] [--work DIR] [--probe]

writes `OUT/config.json`, `OUT/model.safetensors` (bf16 weights, SpecForge/SGLang layout, draft vocab
V_d = 8192 with d2t/t2d, no embed_tokens: the target's table is used) and `OUT/training_metrics.json`
(validation acc_1..acc_k, simulated accept lengths, the recipe), and `scripts/smollm2_eval_prompts.jsonl`
(held-out evaluation prompts). The target comes from `fetch_smollm2.ensure_smollm2()` (or --target).

Pipeline (phase 2 is cached batch by batch under --work, so an interrupted build resumes):
  1. instructions: templated one-turn instructions in 8 categories (smollm2_instructions.py), train /
     validation / evaluation drawn from separate seeds, disjoint; no downloaded data;
  2. answers + features: the fp32 target's greedy answers (HF generate, left-padded batches of 64, at
     most `max_new_tokens`) to the prompts rendered with the tokenizer's chat template (its default
     system prompt included, exactly as `eagle-eval run` renders a `messages` row), with the aux
     features HF[2], HF[15], HF[27] (the engine defaults HF[2], HF[N//2], HF[N-3] for N = 30; SGLang
     ids [1, 14, 26], vLLM ids [2, 15, 27]) captured in the same pass (smollm2_features.py); labels =
     the target's argmax = its next greedy token. A few sequences are re-run teacher-forced to check
     features and argmax against the capture eagle-eval's profile does (recorded);
  3. draft vocab: the V_d most frequent target argmax tokens over the training answers
     (build_bundled.draft_vocab);
  4. training: build_bundled.train_head (training-time test with eagle_eval.unroll.unroll_chains,
     `ttt_steps` chain steps from every pair, CE against the target argmax, step weights 0.8^j, bf16
     autocast, AdamW, cosine schedule); lm_head rows and the final norm start as the target's;
  5. validation: per-step teacher-forced accuracy acc_1..acc_k and simulated accept lengths on the
     held-out answers, with the weights rounded to bf16 as saved (smollm2_metrics.py).

Why generation-time features: on this shared CPU the fp32 target decodes ~40-120 new tokens/s at
batch 64 and runs ~150 tokens/s teacher-forced, so a second, teacher-forced pass over the ~130k
tokens would add about 15 minutes to ~23 of generation; the features captured while decoding are
the fp32 target's own (the check above bounds the difference: ~2e-6 relative, argmax identical).
Threads: one (`torch.set_num_threads(1)`): on the busy 2-core machine two OpenMP threads decoded
at half the speed of one (21 vs 41 tokens/s in one trial).

Size: bf16 is the saved dtype because fp32 would need V_d <= ~2k for 25 MB (the non-vocab part alone is
5.1 M parameters = 20 MB in fp32); in bf16, V_d = 8192 gives 19.7 MB and covers the target's greedy
tokens on the validation answers almost entirely (the share is recorded).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import build_bundled as bb  # noqa: E402  (HeadBatch, greedy_batch, length_batches, train_head, ...)
import smollm2_instructions as instr  # noqa: E402
from smollm2_features import (check_against_teacher_forced, generate_split, head_batches_from,  # noqa: E402
                              load_split)
from smollm2_metrics import metrics_file, validation_metrics  # noqa: E402

SEEDS = {"train": 101, "val": 102, "eval": 103}
SEED_HEAD_INIT = 111          # head init; the batch order uses build_bundled.SEED_HEAD_INIT (train_head)
AUX_HF = (2, 15, 27)          # HF[2], HF[N//2], HF[N-3], N = 30
EVAL_PROMPTS_FILE = HERE / "smollm2_eval_prompts.jsonl"


@dataclass(frozen=True)
class Recipe:
    train_prompts: int = 896
    val_prompts: int = 128
    eval_prompts: int = 48        # + instr.HANDWRITTEN, for the CLI measurement
    max_new_tokens: int = 96       # eagle-eval run's default is 64 new tokens (+ num_steps verified)
    gen_batch: int = 64
    draft_vocab_size: int = 8192
    intermediate_size: int = 1536  # the target's (SpecForge copies the target's config)
    num_attention_heads: int = 9
    num_key_value_heads: int = 3
    head_dim: int = 64
    rope_theta: float = 100000.0   # the target's
    ttt_steps: int = 5
    ttt_decay: float = 0.8
    steps: int = 480
    batch_tokens: int = 2048       # padded tokens per training batch
    lr: float = 2e-3
    eval_steps: int = 7            # validation accuracy reported for draft steps 1..eval_steps

    def data_key(self) -> str:
        """Hash of what the cached answers and features depend on."""
        keys = ("train_prompts", "val_prompts", "max_new_tokens", "gen_batch")
        return hashlib.sha256(json.dumps({k: getattr(self, k) for k in keys} | {"seeds": SEEDS},
                                         sort_keys=True).encode()).hexdigest()[:12]


PROBE = Recipe(train_prompts=64, val_prompts=16, gen_batch=32, steps=10)


def log(msg: str) -> None:
    bb.log(msg)


# -- phases 1-2: instructions, greedy answers and their features --------------------------------
def encode(tokenizer, text: str) -> list[int]:
    """Prompt ids as eagle-eval renders a one-turn `messages` row (templates.PromptFormat.encode)."""
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


def generation_batches(tokenizer, items: list[instr.Instruction], size: int) -> list[list[instr.Instruction]]:
    """Batches of `size` sorted by (category, prompt length, id): little padding, and categories with
    short answers (math, conversation) finish their batches early."""
    ordered = sorted(items, key=lambda i: (i.category, len(encode(tokenizer, i.text)), i.id))
    return [ordered[k:k + size] for k in range(0, len(ordered), size)]


def write_eval_prompts(evals: list[instr.Instruction]) -> None:
    rows = [i.row() for i in evals]
    rows += [{"id": f"handwritten-{k:02d}", "category": "handwritten",
              "messages": [{"role": "user", "content": t}]} for k, t in enumerate(instr.HANDWRITTEN)]
    EVAL_PROMPTS_FILE.write_text("".join(json.dumps(r) + "\n" for r in rows))


# -- phases 4-5: the head ------------------------------------------------------------------------
def round_to_bf16(head) -> None:
    """Round every float parameter to bf16 in place (kept as fp32): the weights as saved and loaded."""
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def save(head, out: Path, metrics: dict) -> None:
    from eagle_eval.heads.io import save_head

    sglang_ids = [i - 1 for i in AUX_HF]
    save_head(copy.deepcopy(head).to(torch.bfloat16), out, aux_layer_ids_sglang=sglang_ids)
    config = json.loads((out / "config.json").read_text())
    # vLLM/speculators read the top-level key as input-of-layer ids (= HF index = SGLang id + 1)
    config["eagle_aux_hidden_state_layer_ids"] = list(AUX_HF)
    config["torch_dtype"] = "bfloat16"
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")


# -- driver ----------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="converted SmolLM2 folder (default: ensure_smollm2())")
    ap.add_argument("--out", default=str(ROOT / "checkpoints" / "smollm2-eagle3"))
    ap.add_argument("--work", default="/tmp/smollm2-head-build", help="cache of answers and features")
    ap.add_argument("--probe", action="store_true", help="time every phase on a small slice; write nothing")
    ap.add_argument("--steps", type=int, default=None, help="override Recipe.steps")
    ap.add_argument("--train-prompts", type=int, default=None, help="override Recipe.train_prompts")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    recipe = PROBE if args.probe else Recipe()
    if args.steps is not None:
        recipe = replace(recipe, steps=args.steps)
    if args.train_prompts is not None:
        recipe = replace(recipe, train_prompts=args.train_prompts)
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.target is None:
        from fetch_smollm2 import ensure_smollm2
        args.target = str(ensure_smollm2())
    work = Path(args.work) / (("probe-" if args.probe else "") + recipe.data_key())
    t_start, cpu_start = time.time(), time.process_time()
    phases = {}
    log(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); recipe {asdict(recipe)}; work {work}")
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target, local_files_only=True)
    n_layers = model.config.num_hidden_layers
    assert AUX_HF == (2, n_layers // 2, n_layers - 3), (AUX_HF, n_layers)

    train, val, evals = instr.split((SEEDS["train"], SEEDS["val"], SEEDS["eval"]),
                                    (recipe.train_prompts, recipe.val_prompts, recipe.eval_prompts))
    if not args.probe:
        write_eval_prompts(evals)
    t = time.time()
    for name, items in (("val", val), ("train", train)):
        generate_split(model, tokenizer, generation_batches(tokenizer, items, recipe.gen_batch), encode,
                       AUX_HF, recipe.max_new_tokens, work / name, log)
    phases["generate_s"] = time.time() - t

    t = time.time()
    data = {name: load_split(work / name) for name in ("train", "val")}
    capture_check = check_against_teacher_forced(model, data["val"], AUX_HF, sequences=4)
    log(f"generation-time capture vs teacher-forced: {capture_check}")
    train_batches = head_batches_from(data["train"], AUX_HF, recipe.batch_tokens, model.config.hidden_size)
    val_batches = head_batches_from(data["val"], AUX_HF, recipe.batch_tokens, model.config.hidden_size)
    tokens = {name: {"sequences": int(d.prompt_len.numel()), "tokens": int(d.ids.numel()),
                     "answer_tokens": int(d.ids.numel() - d.prompt_len.sum())} for name, d in data.items()}
    del data
    used = bb.draft_vocab(train_batches, model.config.vocab_size, recipe.draft_vocab_size)
    spec = bb.HeadSpec(intermediate_size=recipe.intermediate_size, num_attention_heads=recipe.num_attention_heads,
                       num_key_value_heads=recipe.num_key_value_heads, head_dim=recipe.head_dim,
                       ttt_steps=recipe.ttt_steps, ttt_decay=recipe.ttt_decay, steps=recipe.steps, lr=recipe.lr,
                       rope_theta=recipe.rope_theta, init_seed=SEED_HEAD_INIT)
    head = bb.build_head(model, used, spec)    # lm_head rows and the final norm start as the target's
    log(f"training: {len(train_batches)} batches, {sum(int((b.labels >= 0).sum()) for b in train_batches)} "
        f"labelled pairs; draft vocab {used.numel()}; data {tokens}")
    bb.train_head(head, model, train_batches, AUX_HF, spec, "smollm2-eagle3")
    phases["train_s"] = time.time() - t

    t = time.time()
    round_to_bf16(head)
    val_metrics = validation_metrics(head, model, val_batches, recipe.eval_steps)
    every = max(1, len(train_batches) // max(1, len(val_batches)))
    train_metrics = validation_metrics(head, model, train_batches[::every][:len(val_batches)], recipe.eval_steps)
    phases["validate_s"] = time.time() - t
    phases["total_wall_s"] = time.time() - t_start
    phases["total_cpu_s"] = time.process_time() - cpu_start
    log(f"phases: {json.dumps({k: round(v, 1) for k, v in phases.items()})}")
    log(f"validation: {json.dumps(val_metrics['summary'])}")
    log(f"train slice: {json.dumps(train_metrics['summary'])}")
    if args.probe:
        return
    seeds = SEEDS | {"head_init": SEED_HEAD_INIT, "batch_order": bb.SEED_HEAD_INIT}
    save(head, Path(args.out), metrics_file(recipe=asdict(recipe), seeds=seeds, aux_hf=AUX_HF, data=tokens,
                                            phases=phases, val=val_metrics, train=train_metrics,
                                            target=args.target, capture_check=capture_check))
    log(f"wrote {args.out} ({bb.dir_size_mb(Path(args.out)):.1f} MB)")


if __name__ == "__main__":
    main()
