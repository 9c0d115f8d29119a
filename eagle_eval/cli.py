"""The command line: builds a RunConfig and calls the API; nothing else.

Heavy imports (torch, transformers) happen inside the commands, so `eagle-eval --help` is instant.
"""

from __future__ import annotations

import sys

import click

from eagle_eval.config import BUNDLED_DRAFT, BUNDLED_PROMPTS, BUNDLED_TARGET, DTYPE_CHOICES, \
    EMBEDDING_CHOICES, ConfigError, RunConfig, parse_ids


def model_options(f):
    """Options shared by every command that loads a target and a head."""
    opts = [
        click.option("--target", default=str(BUNDLED_TARGET), show_default="bundled target",
                     help="Local Hugging Face causal-LM folder."),
        click.option("--draft", default=str(BUNDLED_DRAFT), show_default="bundled head",
                     help="EAGLE-3 head folder (SpecForge/SGLang, EAGLE or speculators layout)."),
        click.option("--prompts", default=str(BUNDLED_PROMPTS), show_default="bundled prompts",
                     help="JSONL with `prompt`, `messages` or `input_ids` per row."),
        click.option("--num-steps", type=int, default=5, show_default=True, help="Draft steps S per cycle."),
        click.option("--topk", type=int, default=1, show_default=True, help="Draft top-k (1 = chain)."),
        click.option("--num-draft-tokens", type=int, default=None,
                     help="SGLang's speculative_num_draft_tokens (verify nodes incl. root)."),
        click.option("--max-new-tokens", type=int, default=64, show_default=True),
        click.option("--aux-layers", default=None, help="Aux layer ids, e.g. 1,3,5 (see --aux-convention)."),
        click.option("--aux-convention", type=click.Choice(["sglang", "vllm", "hf"]), default="sglang",
                     show_default=True, help="sglang: output of layer k; vllm: input of layer k; hf: HF index."),
        click.option("--draft-embedding", type=click.Choice(EMBEDDING_CHOICES), default="auto", show_default=True,
                     help="auto: the draft's own table if it has one that differs (vLLM); target: SGLang's rule."),
        click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True,
                     help="auto = bf16 on a GPU, fp32 on the CPU."),
        click.option("--device-map", default="auto", show_default=True, help="auto | cpu | cuda:N"),
        click.option("--max-memory", default=None, help="Per device, e.g. 0=70GiB,1=70GiB,cpu=100GiB"),
        click.option("--trust-remote-code", is_flag=True, default=False),
        click.option("--limit", type=int, default=None, help="Evaluate the first N prompts only."),
        click.option("--position-offset", type=click.IntRange(0, 1), default=0, show_default=True,
                     help="1 reproduces SGLang's draft positions before PR #25015 (p+k+1)."),
        click.option("--seed", type=int, default=0, show_default=True),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_config(**kw) -> RunConfig:
    kw["aux_layers"] = parse_ids(kw.get("aux_layers"))
    return RunConfig(**kw)


def fail(message: str) -> None:
    click.echo(f"eagle-eval: error: {message}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Ground-truth acceptance for EAGLE-3 draft heads (reference greedy loop in pure PyTorch)."""


@main.command()
@model_options
@click.option("--check-lossless", is_flag=True, default=False,
              help="Also run plain greedy decoding and report the first divergence per prompt.")
@click.option("--output-dir", default=None, help="Write report.json and samples.jsonl here.")
@click.option("--resume", is_flag=True, default=False, help="Continue an interrupted run in --output-dir.")
def run(**kw):
    """Evaluate a head on a prompt set and print the per-position report."""
    from eagle_eval import api
    from eagle_eval.errors import USER_ERRORS
    from eagle_eval.report import render_table

    try:
        config = build_config(**kw)
        result = api.evaluate(config)
    except USER_ERRORS as exc:
        fail(str(exc))
    click.echo(render_table(result.report))
    if config.output_dir:
        click.echo(f"\nwrote {config.output_dir}/report.json and {config.output_dir}/samples.jsonl")
    if result.report["summary"]["lossless"] is False:
        sys.exit(1)


if __name__ == "__main__":
    main()
