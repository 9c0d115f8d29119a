"""Time the converted SmolLM2-135M-Instruct target on this machine and show its greedy answers.

    python scripts/measure_smollm2.py [--target DIR] [--output FILE.json]

Measures (fp32, CPU, torch's default thread count unless --threads): the folder's load time
(model + tokenizer), one teacher-forced forward over 512 tokens (no cache, logits for every
position), and greedy `generate` of 64 new tokens at batch 1 and batch 16 (left-padded chat
prompts, min_new_tokens=64 so every row makes 64 tokens). Prints the batch-1 answers to a few
instruction prompts rendered with the tokenizer's chat template, to be read for fluency.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

PROMPTS = [
    "Write a short paragraph about why the sky is blue.",
    "List three tips for staying focused while studying.",
    "Tom has 12 apples and gives 5 to his friend. How many apples does he have left?",
    "Write a Python function that returns the sum of a list of numbers.",
    "What is the difference between weather and climate?",
    "Hi! How are you today?",
]
NEW_TOKENS = 64
TF_TOKENS = 512


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def encode(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return tokenizer(rendered, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def generate(model, tokenizer, prompts: list[list[int]], force_length: bool = True) -> torch.Tensor:
    """Left-padded greedy generation -> new tokens [B, <= NEW_TOKENS]; `force_length`: exactly
    NEW_TOKENS (eos suppressed before that, for timing)."""
    t = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (t - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (t - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                         min_new_tokens=NEW_TOKENS if force_length else None, do_sample=False)
    return out[:, t:]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=None, help="converted folder (default: ensure_smollm2())")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--output", default=None, help="write the measurements here as JSON")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.target is None:
        from fetch_smollm2 import ensure_smollm2
        args.target = str(ensure_smollm2())
    res = {"target": args.target, "threads": torch.get_num_threads(), "torch": torch.__version__}
    (model, tokenizer), res["load_s"] = timed(lambda: (
        AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32, local_files_only=True).eval(),
        AutoTokenizer.from_pretrained(args.target, local_files_only=True)))
    print(f"load (model + tokenizer): {res['load_s']:.2f} s", flush=True)

    # a 512-token teacher-forced forward: the chat prompts and their answers' worth of text, repeated
    text = " ".join(PROMPTS) * 20
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][:, :TF_TOKENS]
    assert ids.shape[1] == TF_TOKENS
    with torch.no_grad():
        model(input_ids=ids)                                      # warm-up at the timed shape
        times = sorted(timed(lambda: model(input_ids=ids, output_hidden_states=True))[1] for _ in range(3))
    res["teacher_forced_512_s"] = times
    print(f"teacher-forced forward, {TF_TOKENS} tokens (hidden states on, full logits): "
          f"{times[0]:.2f} s best of 3, median {times[1]:.2f} s ({TF_TOKENS / times[0]:.0f} tokens/s)", flush=True)

    prompts = [encode(tokenizer, p) for p in PROMPTS]
    generate(model, tokenizer, prompts[:1])                       # warm-up
    out1, res["generate_b1_s"] = timed(lambda: generate(model, tokenizer, prompts[:1]))
    print(f"greedy generate, batch 1, {NEW_TOKENS} new tokens: {res['generate_b1_s']:.2f} s "
          f"({NEW_TOKENS / res['generate_b1_s']:.1f} tokens/s)", flush=True)
    batch16 = [prompts[i % len(prompts)] for i in range(16)]
    out16, res["generate_b16_s"] = timed(lambda: generate(model, tokenizer, batch16))
    print(f"greedy generate, batch 16, {NEW_TOKENS} new tokens each: {res['generate_b16_s']:.2f} s "
          f"({16 * NEW_TOKENS / res['generate_b16_s']:.1f} tokens/s)", flush=True)

    res["answers"] = []
    for p, ids_p in zip(PROMPTS, prompts):
        o = generate(model, tokenizer, [ids_p], force_length=False)[0].tolist()
        eos = tokenizer.eos_token_id
        answer = tokenizer.decode(o[:o.index(eos)] if eos in o else o)
        res["answers"].append({"prompt": p, "answer": answer})
        print(f"\n[{p}]\n-> {answer!r}", flush=True)
    # batched (left-padded) answers equal the batch-1 ones? (fp32; padding may still move low bits)
    same = [out16[i].tolist() == generate(model, tokenizer, [batch16[i]])[0].tolist() for i in range(2)]
    res["batch16_equals_batch1_first2"] = same
    print(f"\nbatch-16 rows 0-1 equal their batch-1 generations: {same}")
    if args.output:
        Path(args.output).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
