"""The command line: builds a RunConfig and calls the API; nothing else.

Heavy imports (torch, transformers) happen inside the commands, so `eagle-eval --help` is instant.
"""

from __future__ import annotations

import sys

import click

from eagle_eval.config import (
    AUX_CONVENTIONS,
    BUNDLED_DRAFT,
    BUNDLED_PROMPTS,
    BUNDLED_TARGET,
    DATASET_FORMATS,
    DTYPE_CHOICES,
    EMBEDDING_CHOICES,
    FP8_MATMUL_CHOICES,
    RunConfig,
    parse_floats,
    parse_ids,
    parse_names,
)


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
        click.option("--train-acc", default=None,
                     help="The head's training-time validation accuracy per draft step, acc_1,acc_2,... (SpecForge "
                          "acc_k); default: the head folder's training_metrics.json. Set beside the measured rates."),
        click.option("--aux-convention", type=click.Choice(AUX_CONVENTIONS), default="sglang",
                     show_default=True, help="sglang: output of layer k; vllm: input of layer k; hf: HF index; "
                     "boundary: state after k blocks, N = last layer's output before the final norm (gpt-oss "
                     "heads; without --aux-layers the draft config's ids are read this way)."),
        click.option("--draft-embedding", type=click.Choice(EMBEDDING_CHOICES), default="auto", show_default=True,
                     help="auto: the draft's own table if it has one that differs (vLLM); target: SGLang's rule."),
        click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True,
                     help="auto = bf16 on a GPU, fp32 on the CPU."),
        click.option("--device-map", default="auto", show_default=True, help="auto | cpu | cuda:N"),
        click.option("--max-memory", default=None, help="Per device, e.g. 0=70GiB,1=70GiB,cpu=100GiB"),
        click.option("--trust-remote-code", is_flag=True, default=False),
        click.option("--fp8-matmul", type=click.Choice(FP8_MATMUL_CHOICES), default="auto", show_default=True,
                     help="A block-FP8 target kept FP8 on the GPU: kernel = transformers' FP8 kernel (needs the "
                          "`kernels` package and its Hub kernel), dequantize = eagle-eval dequantizes each weight "
                          "per forward (W8A16), auto = the kernel when it loads."),
        click.option("--overwrite", is_flag=True, default=False,
                     help="Replace the results already in --output-dir (their files are removed first)."),
        click.option("--allow-unknown-head-keys", is_flag=True, default=False,
                     help="Proceed when the head's config.json has keys that change the draft's math in an engine "
                          "but are not implemented here (named in the error)."),
        click.option("--limit", type=int, default=None,
                     help="Evaluate the first N questions only (after --categories and --shuffle-seed)."),
        click.option("--position-offset", type=click.IntRange(0, 1), default=0, show_default=True,
                     help="1 reproduces SGLang's draft positions before PR #25015 (p+k+1)."),
        click.option("--eagle-depth", type=int, default=None,
                     help="EAGLE's depth (num_steps = depth + 1); with --eagle-top-k and --eagle-total-token."),
        click.option("--eagle-top-k", type=int, default=None, help="EAGLE's top_k (= --topk)."),
        click.option("--eagle-total-token", type=int, default=None,
                     help="EAGLE's total_token (= --num-draft-tokens, root included)."),
        click.option("--seed", type=int, default=0, show_default=True),
        *data_options(),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def data_options() -> list:
    """Dataset and prompt-format options (issue 6), one to one with RunConfig fields."""
    return [
        click.option("--dataset", default=None,
                     help="Benchmark .jsonl/.json/.parquet file or save_to_disk folder; replaces --prompts."),
        click.option("--dataset-format", type=click.Choice(DATASET_FORMATS), default=None,
                     help="Default: detected from the columns (echoed in the report)."),
        click.option("--categories", default=None, help="Keep these categories, e.g. writing,coding."),
        click.option("--shuffle-seed", type=int, default=None, help="Shuffle the questions (seeded) before --limit."),
        click.option("--no-chat-template", is_flag=True, default=False,
                     help="Raw text prompts even when the tokenizer has a chat template."),
        click.option("--chat-template", default=None, help="Jinja chat template FILE instead of the tokenizer's."),
        click.option("--system-prompt", default=None, help="System message put before every conversation."),
        click.option("--enable-thinking/--disable-thinking", default=None,
                     help="Pass enable_thinking=True/False to the chat template (default: not passed)."),
    ]


def build_config(**kw) -> RunConfig:
    kw["aux_layers"] = parse_ids(kw.get("aux_layers"))
    kw["categories"] = parse_names(kw.get("categories"))
    kw["train_acc"] = parse_floats(kw.get("train_acc"), "--train-acc")
    _refuse_explicit_with_eagle(kw)
    return RunConfig(**kw)


def _refuse_explicit_with_eagle(kw: dict) -> None:
    """--eagle-* set num_steps/topk/num_draft_tokens: the same flags given by hand are a conflict
    (RunConfig can only see values that differ from the defaults)."""
    from click.core import ParameterSource

    from eagle_eval.config import ConfigError

    ctx = click.get_current_context(silent=True)
    if ctx is None or all(kw.get(k) is None for k in ("eagle_depth", "eagle_top_k", "eagle_total_token")):
        return
    given = [f"--{k.replace('_', '-')}" for k in ("num_steps", "topk", "num_draft_tokens")
             if k in ctx.params and ctx.get_parameter_source(k) is ParameterSource.COMMANDLINE]
    if given:
        raise ConfigError(f"{', '.join(given)} conflict with --eagle-depth/--eagle-top-k/--eagle-total-token "
                          "(num_steps = depth + 1, topk = top_k, num_draft_tokens = total_token): give one set")


def fail(message: str, exc: BaseException | None = None) -> None:
    ctx = click.get_current_context(silent=True)
    if exc is not None and ctx is not None and (ctx.find_root().obj or {}).get("debug"):
        import traceback
        traceback.print_exception(exc)
    click.echo(f"eagle-eval: error: {message}", err=True)
    sys.exit(2)


def call(fn, *args, interrupted: str | None = None, **kw):
    """fn(*args, **kw) -> (result, warnings caught): bad input is one line and exit 2 (`--debug`: with
    the traceback); Ctrl-C says what was kept (`interrupted`) and exits 130."""
    import warnings

    from eagle_eval.errors import USER_ERRORS

    with warnings.catch_warnings(record=True) as caught:
        try:
            return fn(*args, **kw), list(caught)
        except USER_ERRORS as exc:
            fail(str(exc), exc)
        except KeyboardInterrupt:
            click.echo(f"\neagle-eval: interrupted{'; ' + interrupted if interrupted else ''}", err=True)
            sys.exit(130)


def echo(text: str, caught: list) -> None:
    """Print the command's output, then the Python warnings it does not already say."""
    click.echo(text)
    for w in caught:
        if str(w.message) not in text:
            click.echo(f"eagle-eval: warning: {w.message}", err=True)


def run_check(kw: dict, config_cls, run, render, report_name: str) -> None:
    """diagnose / server-check: split the command's own options (config_cls's fields) from run's, run it,
    print its report and exit with its status (bad input: one line, exit 2)."""
    from dataclasses import fields

    own = {f.name: kw.pop(f.name) for f in fields(config_cls)}
    result, caught = call(lambda: run(build_config(**kw), config_cls(**own), progress=True),
                          interrupted=_unfinished(own["output_dir"]))
    echo(render(result.report), caught)
    if own["output_dir"]:
        click.echo(f"\nwrote {own['output_dir']}/{report_name}")
    sys.exit(result.exit_status)


def _unfinished(output_dir: str | None) -> str | None:
    return (f"{output_dir} holds an unfinished run: run the same command with --overwrite to start it again"
            if output_dir else None)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, default=False, help="On bad input, also print the traceback.")
@click.option("--gpus-per-replica", type=int, default=None,
              help="Under torchrun / accelerate launch: GPUs each process (one replica of the target) takes on its "
                   "node; default: the node's GPUs split evenly between its processes (docs/parallel.md).")
@click.pass_context
def main(ctx, debug, gpus_per_replica):
    """Ground-truth acceptance for EAGLE-3 draft heads (reference greedy loop in pure PyTorch)."""
    ctx.obj = {"debug": debug}
    _join_launch(gpus_per_replica)


def _join_launch(gpus_per_replica: int | None) -> None:
    """Under a launcher (WORLD_SIZE > 1): this replica's GPUs, the process group, rank-tagged output."""
    import os

    if gpus_per_replica is None and (os.environ.get("WORLD_SIZE") or "1") == "1":
        return
    from eagle_eval.errors import USER_ERRORS
    from eagle_eval.parallel import console, group

    try:
        console.setup(group.init(gpus_per_replica))
    except USER_ERRORS as exc:
        fail(str(exc), exc)


@main.command()
@model_options
@click.option("--check-lossless", is_flag=True, default=False,
              help="Also run plain greedy decoding and report the first divergence per prompt.")
@click.option("--output-dir", default=None, help="Write report.json and samples.jsonl here.")
@click.option("--resume", is_flag=True, default=False, help="Continue an interrupted run in --output-dir.")
def run(**kw):
    """Evaluate a head on a prompt set and print the per-position report."""
    from eagle_eval import api
    from eagle_eval.results.report import render_table

    config, _ = call(build_config, **kw)
    resume = (f"the finished prompts are in {config.output_dir}/samples.jsonl: run the same command with "
              "--resume to continue") if config.output_dir else None
    result, caught = call(api.evaluate, config, interrupted=resume)
    text = render_table(result.report)
    if result.report["config"].get("sanity"):           # issue 5: load-time checks
        from eagle_eval.results.findings import Finding, render_findings
        text += "\n\nload-time checks\n" + render_findings(
            [Finding.from_dict(f) for f in result.report["config"]["sanity"]], only_problems=True)
    echo(text, caught)
    if config.output_dir:
        click.echo(f"\nwrote {config.output_dir}/report.json and {config.output_dir}/samples.jsonl")
    if result.report["summary"]["lossless"] is False:
        sys.exit(1)


@main.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--markdown", is_flag=True, default=False, help="Markdown tables instead of the terminal table.")
@click.option("--csv", "csv_path", default=None, help="Write the per-group acceptance CSV here.")
@click.option("--plot", "plot_path", default=None,
              help="Write a PNG: per-position acceptance curves and tau by category (needs matplotlib).")
def report_command(results, markdown, csv_path, plot_path):
    """Re-render saved results (report.json files or run folders) without loading a model;
    with two results, also their differences, flagging those beyond sampling noise."""
    from eagle_eval.errors import USER_ERRORS
    from eagle_eval.results import compare

    try:
        loaded = [compare.load_result(p) for p in results]
        click.echo(compare.render_results(loaded, markdown=markdown))
        if csv_path:
            from eagle_eval.results.tables import write_csv
            labelled = len(loaded) > 1                         # a `result` column only when there are several
            write_csv(csv_path, [(r.label if labelled else None, r.report) for r in loaded])
            click.echo(f"\nwrote {csv_path}")
        if plot_path:
            from eagle_eval.results.plot import plot_results
            plot_results(loaded, plot_path)
            click.echo(f"wrote {plot_path}")
    except USER_ERRORS as exc:
        fail(str(exc))


def profile_options(f):
    for opt in reversed([
        click.option("--max-steps", type=int, default=8, show_default=True,
                      help="Profile every num_steps from 1 to this (one target forward per prompt)."),
        click.option("--responses", default=None,
                     help="JSONL continuations (`output_ids` or `text`, by `id`), e.g. saved from a server at "
                          "temperature 0; checked against the target's argmax."),
        click.option("--batch-tokens", type=int, default=16384, show_default=True,
                     help="Padded tokens per teacher-forced batch (bounds memory)."),
        click.option("--output-dir", default=None),
    ]):
        f = opt(f)
    return f


def build_profile_config(max_steps, responses, batch_tokens, **kw):
    from eagle_eval.config import ProfileConfig
    return ProfileConfig(run=build_config(**kw), max_steps=max_steps, responses=responses,
                         batch_tokens=batch_tokens)


@main.command("profile")
@model_options
@profile_options
def profile_command(**kw):
    """Exact acceptance for every num_steps <= --max-steps from one teacher-forced pass."""
    from eagle_eval import api
    from eagle_eval.results.report import render_steps_table

    pcfg, _ = call(build_profile_config, **kw)
    result, caught = call(api.profile, pcfg, interrupted=_unfinished(kw["output_dir"]))
    echo(render_steps_table(result.report), caught)
    if kw["output_dir"]:
        click.echo(f"\nwrote {kw['output_dir']}/profile.json and {kw['output_dir']}/samples.jsonl")


@main.command("ablate")
@model_options
@profile_options
@click.option("--vary", multiple=True, metavar="FIELD=VALUE[;FIELD=VALUE]",
              help="A variant to profile besides the base, e.g. --vary aux_layers=0,3,6 --vary dtype=bf16 "
                   "--vary no_chat_template=true (repeatable).")
@click.option("--cost-ratio", type=float, default=None,
              help="c = T_draft_step / T_target_step; default: timed on this device.")
@click.option("--server-draft-ms", type=float, default=None, help="Your server's draft step time (ms).")
@click.option("--server-target-ms", type=float, default=None, help="Your server's target decode step time (ms).")
@click.option("--topk-grid", default=None, help="Tree widths to compare, e.g. 1,2,4 (1 = chain).")
@click.option("--draft-tokens-grid", default=None,
              help="num_draft_tokens values for the trees, e.g. 4,8,16 (kept where D <= K + (S-1) K^2 + 1).")
def ablate_command(vary, cost_ratio, server_draft_ms, server_target_ms, topk_grid, draft_tokens_grid, **kw):
    """Tau, per-position rates and modelled speedup over num_steps and other axes."""
    from eagle_eval import api
    from eagle_eval.results.report import render_ablation

    if (server_draft_ms is None) != (server_target_ms is None):
        fail("--server-draft-ms and --server-target-ms go together")
    server = (server_draft_ms, server_target_ms) if server_draft_ms is not None else None
    pcfg, _ = call(build_profile_config, **kw)
    result, caught = call(lambda: api.ablate(pcfg, list(vary), cost_ratio, server, topk_grid=parse_ids(topk_grid),
                                             draft_tokens_grid=parse_ids(draft_tokens_grid)),
                          interrupted=_unfinished(kw["output_dir"]))
    echo(render_ablation(result), caught)
    if kw["output_dir"]:
        click.echo(f"\nwrote ablation.json, ablation.csv and ablation.png to {kw['output_dir']}")


@main.command("server-check")
@model_options
@click.option("--backend", type=click.Choice(["sglang", "vllm"]), required=True)
@click.option("--url", default=None, help="The running server, http://HOST:PORT.")
@click.option("--mode", type=click.Choice(["exact", "tolerance"]), default="exact", show_default=True,
              help="exact: every request's tokens and counts must equal the oracle's (a faithful fp32 engine); "
                   "tolerance: a 95%% interval of per-request acceptance differences within --tolerance "
                   "(servers with bf16 kernels).")
@click.option("--tolerance", type=float, default=0.05, show_default=True,
              help="Relative tolerance: per-request interval in --mode tolerance, and the SGLang log.")
@click.option("--tie-margin", type=float, default=0.1, show_default=True,
              help="A divergence where the target's logit margin is below this is numerics, not a bug.")
@click.option("--timeout", type=float, default=300.0, show_default=True, help="Seconds per HTTP request.")
@click.option("--retries", type=int, default=2, show_default=True,
              help="Retries on connection errors and HTTP 502/503/504.")
@click.option("--served-model-name", default=None, help="vLLM: the `model` field (default: first of /v1/models).")
@click.option("--metrics-settle", type=float, default=0.2, show_default=True,
              help="vLLM: seconds between /metrics reads until two agree.")
@click.option("--vllm-metrics", type=click.Choice(["auto", "per-request", "counters"]), default="auto",
              show_default=True,
              help="vLLM: where each request's acceptance is read. auto: the answer's per-request metrics when "
                   "the server offers them (vllm serve --per-request-spec-decode-metrics detailed), else deltas "
                   "of the server-wide /metrics counters (quiet server only); per-request: never counter deltas; "
                   "counters: always counter deltas (compared with the per-request metrics when present).")
@click.option("--sglang-log", default=None, help="SGLang server log covering this workload: compare its accept len.")
@click.option("--hypotheses/--no-hypotheses", default=True, show_default=True,
              help="When acceptance disagrees, rank the usual wiring faults by how well each reproduces it.")
@click.option("--output-dir", default=None, help="Write server_check.json here.")
def server_check_command(**kw):
    """Compare a running SGLang/vLLM server with the oracle: tokens, acceptance, settings.
    Exit 0 = agree, 1 = disagree, 2 = error, 3 = incomplete (a field the check needs is missing)."""
    from eagle_eval.servers.check import ServerCheckConfig, render_server_check, run_server_check

    run_check(kw, ServerCheckConfig, run_server_check, render_server_check, "server_check.json")


@main.command("diagnose")
@model_options
@click.option("--train-dump", default=None, metavar="FILE",
              help="Training hidden-state dump: a SpecForge data_N.ckpt (or its folder) or a safetensors/.pt file "
                   "with input_ids and aux_hidden_states; each block is matched to an HF index.")
@click.option("--fingerprint", is_flag=True, default=False,
              help="Print the first values and norms of each aux feature for the first prompt tokens.")
@click.option("--sweep/--no-sweep", default=True, show_default=True, help="Profile aux-layer candidates.")
@click.option("--template-check/--no-template-check", default=True, show_default=True,
              help="Compare acceptance with the tokenizer's template, raw prompts and --chat-template.")
@click.option("--prompt-budget", type=int, default=64, show_default=True,
              help="The most questions profiled: looks at 8, 16, 32, ... prompts, stopping at the first that decides.")
@click.option("--output-dir", default=None, help="Write diagnosis.json here.")
def diagnose_command(**kw):
    """Find train/serve mismatches: load-time checks, aux-layer sweep, training-dump match, chat template.
    Exit 0 = consistent (nothing wrong), 1 = a mismatch, an error-level finding or a check that could not
    decide (inconclusive), 2 = bad input."""
    from eagle_eval.diagnose.run import DiagnoseConfig, diagnose, render_diagnosis

    run_check(kw, DiagnoseConfig, diagnose, render_diagnosis, "diagnosis.json")


if __name__ == "__main__":
    main()
