"""The command line, generated from the settings: every option comes from a field's metadata
(eagle_eval/settings.py `opt`), so its default, choices and help are written once; a command builds
`Settings` (plus its own options) and calls the Python API; nothing else.

`--config FILE` (YAML or JSON, as a run folder's settings.yaml) fills the settings; flags given on the
command line override it, and every boolean has its off switch (`--check-lossless/--no-check-lossless`), so a
file's `true` can be turned off. An option a command does not use is not one of its options (click refuses it).
Exit statuses are `errors.ExitCode` for every command (docs/exit-codes.md); an unexpected exception is one
line and exit 70, naming the prompt and the stage where there is one (`--debug`: the traceback). Heavy
imports (torch, transformers) happen inside the commands, so `eagle-eval --help` is instant.
"""

from __future__ import annotations

import sys
import typing
from dataclasses import MISSING, fields

import click
from click.core import ParameterSource

from eagle_eval.errors import CheckFailed, ExitCode, InternalError, one_line
from eagle_eval.settings import (
    GROUPS,
    AblateOptions,
    ConfigError,
    Group,
    LoopOptions,
    PlanOptions,
    ProfileOptions,
    Settings,
    choices_of,
    field_types,
    flag_name,
    read_settings_file,
    split_flat,
)

# which settings each command takes: every group, less the fields it does not use
NOT_USED = {
    "run": set(),
    "profile": {"resume"},
    "ablate": {"resume"},
    "diagnose": {"resume"},
    "server-check": {"resume"},
}
OWN_ONLY = {"plan"}                  # commands that take their own options and no Settings


def _own_options(command: str) -> type[Group] | None:
    if command == "plan":
        return PlanOptions
    if command == "diagnose":
        from eagle_eval.diagnose.options import DiagnoseOptions
        return DiagnoseOptions
    if command == "server-check":
        from eagle_eval.servers.options import ServerCheckOptions
        return ServerCheckOptions
    return {"run": LoopOptions, "profile": ProfileOptions, "ablate": AblateOptions}.get(command)


def _unwrap_optional(hint):
    """int | None -> int; anything else as it is."""
    if typing.get_origin(hint) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _click_option(f, owner: type):
    """The click option of one settings field: default None (= not given), help and choices from metadata."""
    m, base = f.metadata, _unwrap_optional(field_types(owner)[f.name])
    default = f.default if f.default is not MISSING else None
    # the real default is shown (and given to click); whether a value was given is read from its source
    shown = m.get("show_default") or (default not in (None, (), False))
    kw = {"default": None if isinstance(default, tuple) else default, "help": m["help"], "show_default": shown}
    name = flag_name(f)
    decls = [name]
    if base is bool:                  # on and off: a settings file's true can be turned off on the command line
        decls = [f"{name}/{m.get('secondary') or '--no-' + name[2:]}"]
    elif typing.get_origin(base) is tuple and not m.get("parse"):
        kw["multiple"] = True                    # a repeatable option (--vary)
    elif choices_of(f):
        kw["type"] = click.Choice([str(c) for c in choices_of(f)])
    elif base in (int, float):
        kw["type"] = base
    if m.get("metavar"):
        kw["metavar"] = m["metavar"]
    return click.option(*decls, f.name, **kw)


def _from_cli(f, owner: type, value):
    """A value click gave for field f -> the setting's value (lists parsed by the field's own parser)."""
    m = f.metadata
    if m.get("parse") and isinstance(value, str):
        return m["parse"](value)
    if isinstance(value, tuple) and not m.get("parse"):
        return value
    if choices_of(f) and isinstance(value, str) and all(isinstance(c, int) for c in choices_of(f)):
        return int(value)
    return value


def settings_options(command: str):
    """Decorator: every option of `command` (its settings groups, its own options, --config)."""
    def decorate(fn):
        own = _own_options(command)
        opts = [click.option("--config", "config_file", default=None, metavar="FILE",
                             help="A YAML or JSON settings file (e.g. a run folder's settings.yaml); flags override it.")]
        groups = [] if command in OWN_ONLY else list(GROUPS.values())
        for cls in [*groups, *([own] if own else [])]:
            for f in fields(cls):
                if f.metadata.get("cli", True) and f.name not in NOT_USED.get(command, set()):
                    opts.append(_click_option(f, cls))
        for opt in reversed(opts):
            fn = opt(fn)
        return fn
    return decorate


def build(command: str, kw: dict) -> tuple[Settings, Group | None]:
    """(Settings, the command's own options) from the settings file and the flags given on the command line."""
    ctx = click.get_current_context()
    own_cls = _own_options(command)
    flat = read_settings_file(kw["config_file"], command, own_cls) if kw.get("config_file") else {}
    defaults = {f.name: f.default for cls in GROUPS.values() for f in fields(cls)}
    unused = sorted(k for k in set(flat) & NOT_USED.get(command, set()) if flat[k] != defaults.get(k))
    if unused:                           # a saved settings.yaml holds every field, at its default where unused
        raise ConfigError(f"{kw['config_file']}: {', '.join(unused)} is not a setting of `{command}` "
                          f"(it would be ignored); remove it for this command")
    groups = [] if command in OWN_ONLY else list(GROUPS.values())
    owners = {f.name: (f, cls) for cls in [*groups, *([own_cls] if own_cls else [])] for f in fields(cls)}
    for name, value in kw.items():
        if name == "config_file" or ctx.get_parameter_source(name) not in (ParameterSource.COMMANDLINE,
                                                                          ParameterSource.ENVIRONMENT):
            continue
        f, cls = owners[name]
        flat[name] = _from_cli(f, cls, value)
    settings_flat, own_flat = split_flat(flat, own_cls)
    if command in OWN_ONLY:
        return None, own_cls(**own_flat)
    return Settings.of(**settings_flat), (own_cls(**own_flat) if own_cls else None)


def _debug_traceback(exc: BaseException | None) -> None:
    ctx = click.get_current_context(silent=True)
    if exc is not None and ctx is not None and (ctx.find_root().obj or {}).get("debug"):
        import traceback
        traceback.print_exception(exc)


def fail(message: str, exc: BaseException | None = None) -> None:
    _debug_traceback(exc)
    click.echo(f"eagle-eval: error: {message}", err=True)
    sys.exit(ExitCode.BAD_INPUT)


def internal_error(exc: Exception, kept: str | None = None) -> None:
    """An unexpected exception: one line (the prompt and the stage where an `errors.stage` named them; what
    was kept), exit 70; `--debug` prints the traceback first."""
    _debug_traceback(exc)
    what = str(exc) if isinstance(exc, InternalError) else one_line(exc)
    click.echo(f"eagle-eval: internal error: {what} (a bug or a fault of this machine; `eagle-eval --debug ...` "
               f"prints the traceback){'; ' + kept if kept else ''}", err=True)
    sys.exit(ExitCode.INTERNAL)


def call(fn, *args, interrupted: str | None = None, **kw):
    """fn(*args, **kw) -> (result, warnings caught): bad input is one line and exit 2 (`--debug`: with
    the traceback); a failed check prints what it found and exits 1; Ctrl-C says what was kept
    (`interrupted`) and exits 130; any other exception is one line and exit 70, saying what was kept."""
    import warnings

    from eagle_eval.errors import USER_ERRORS

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args, **kw), list(caught)
        except USER_ERRORS as exc:
            fail(str(exc), exc)
        except CheckFailed as exc:
            click.echo(f"eagle-eval: {exc}", err=True)
            sys.exit(ExitCode.FAILED)
        except KeyboardInterrupt:
            click.echo(f"\neagle-eval: interrupted{'; ' + interrupted if interrupted else ''}", err=True)
            sys.exit(ExitCode.INTERRUPTED)
        except Exception as exc:
            internal_error(exc, interrupted)


def echo(text: str, caught: list) -> None:
    """Print the command's output, then the Python warnings it does not already say."""
    click.echo(text)
    seen = set()
    for w in caught:
        msg = str(w.message)
        if msg not in text and msg not in seen:
            seen.add(msg)
            click.echo(f"eagle-eval: warning: {msg}", err=True)


def _unfinished(output_dir: str | None, resumable: bool = False) -> str | None:
    if not output_dir:
        return None
    if resumable:
        return (f"the finished prompts are in {output_dir}/samples.jsonl: run the same command with --resume "
                "to continue")
    return f"{output_dir} holds an unfinished run: run the same command with --overwrite to start it again"


def _load_findings_text(report: dict) -> str:
    from eagle_eval.findings import Finding, render_findings

    found = report["config"].get("sanity")
    if not found:
        return ""
    return "\n\nload-time checks\n" + render_findings([Finding.from_dict(f) for f in found], only_problems=True)


class LazyGroup(click.Group):
    """Builds a command's options only when that command is used: `eagle-eval run` never imports the
    diagnose or server-check options (and the engines they name)."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.factories: dict[str, typing.Callable[[], click.Command]] = {}

    def list_commands(self, ctx):
        return sorted(set(self.commands) | set(self.factories))

    def get_command(self, ctx, name):
        if name not in self.commands and name in self.factories:
            self.add_command(self.factories[name](), name)
        return self.commands.get(name)

    def invoke(self, ctx):
        """Every command: an exception no command turned into its exit status is bad input (exit 2) or an
        internal error (exit 70), one line either way; never a traceback with status 1."""
        from eagle_eval.errors import USER_ERRORS

        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Abort, click.exceptions.Exit):
            raise
        except USER_ERRORS as exc:
            fail(str(exc), exc)
        except Exception as exc:
            internal_error(exc)


def _version() -> str:
    """eagle-eval's version from the installed package's metadata, with the libraries that decide the numbers."""
    import importlib.metadata as md
    import platform

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"
    libs = ", ".join(f"{n} {version(n)}" for n in ("torch", "transformers", "huggingface_hub"))
    return f"eagle-eval {version('eagle-eval')} ({libs}; Python {platform.python_version()})"


def _print_version(ctx, param, value) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version())
        ctx.exit(ExitCode.OK)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Print eagle-eval's version (and torch's, transformers', huggingface_hub's) and exit.")
@click.option("--debug/--no-debug", default=False,
              help="On bad input or an internal error, also print the traceback.")
@click.option("--gpus-per-replica", type=click.IntRange(min=1), default=None,
              help="Under torchrun / accelerate launch: GPUs each process (one replica of the target) takes on its "
                   "node; default: the node's GPUs split evenly between its processes (docs/parallel.md). A setting "
                   "of the launch, not of the run: it is not compared on --resume.")
@click.pass_context
def main(ctx, debug, gpus_per_replica):
    """Ground-truth acceptance for EAGLE-3 draft heads: a reference speculative loop in pure PyTorch, greedy
    (equal to plain greedy decoding) or sampling under each engine's accept rule (--temperature > 0).
    Exit status (every command): 0 ok, 1 a check failed, 2 bad input, 3 undecided, 70 internal error,
    130 interrupted."""
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


def _run(kw: dict) -> None:
    from eagle_eval.commands.run import evaluate
    from eagle_eval.results.report import render_table

    (settings, options), _ = call(build, "run", kw)
    out = settings.output.output_dir
    result, caught = call(evaluate, settings, options, interrupted=_unfinished(out, resumable=True))
    echo(render_table(result.report) + _load_findings_text(result.report), caught)
    if out:
        click.echo(f"\nwrote {out}/report.json, {out}/samples.jsonl and {out}/acceptance.csv")
    if result.report["summary"]["lossless"] is False:
        sys.exit(ExitCode.FAILED)
    _exit_on_context_finding(result.report)
    if result.report["summary"].get("distribution_check", {}).get("verdict") == "undecided":
        sys.exit(ExitCode.UNDECIDED)        # temperature > 0: too few tokens to decide (never "lossless")


def _exit_on_context_finding(report: dict) -> None:
    """--train-context: acceptance decayed past it exits 1, undecided 3 (results/context.py `finding_status`)."""
    from eagle_eval.results.context import finding_status

    status = finding_status(report)
    if status:
        sys.exit(status)


def _profile(kw: dict) -> None:
    from eagle_eval.commands.profile import profile
    from eagle_eval.results.report import render_steps_table

    (settings, options), _ = call(build, "profile", kw)
    out = settings.output.output_dir
    result, caught = call(profile, settings, options, interrupted=_unfinished(out))
    echo(render_steps_table(result.report) + _load_findings_text(result.report), caught)
    if out:
        click.echo(f"\nwrote {out}/profile.json, {out}/samples.jsonl and {out}/per_start.jsonl")
    _exit_on_context_finding(result.report)


def _ablate(kw: dict) -> None:
    from eagle_eval.commands.ablate import ablate
    from eagle_eval.results.report import render_ablation

    (settings, options), _ = call(build, "ablate", kw)
    out = settings.output.output_dir
    result, caught = call(ablate, settings, options, interrupted=_unfinished(out))
    echo(render_ablation(result), caught)
    if out:
        click.echo(f"\nwrote {', '.join(result.get('files', []))} to {out}")
    if result["advice"]["verdict"] == "undecided":
        sys.exit(ExitCode.UNDECIDED)


def _run_check(command: str, kw: dict, run, render, report_name: str) -> None:
    """diagnose / server-check: run it, print its report and exit with its status."""
    (settings, options), _ = call(build, command, kw)
    out = settings.output.output_dir
    result, caught = call(lambda: run(settings, options, progress=True), interrupted=_unfinished(out))
    echo(render(result.report), caught)
    if out:
        click.echo(f"\nwrote {out}/{report_name}")
    sys.exit(result.exit_status)


def _server_check(kw: dict) -> None:
    from eagle_eval.servers.check import render_server_check, run_server_check

    _run_check("server-check", kw, run_server_check, render_server_check, "server_check.json")


def _diagnose(kw: dict) -> None:
    from eagle_eval.diagnose.run import diagnose, render_diagnosis

    _run_check("diagnose", kw, diagnose, render_diagnosis, "diagnosis.json")


def _plan(kw: dict) -> None:
    from eagle_eval.plan.command import check_json_path, make_plan, render_plan, write_plan_json

    (_, options), _ = call(build, "plan", kw)
    if options.json_file:
        call(check_json_path, options.json_file)          # before the plan: an unwritable --json fails at once
    plan, caught = call(make_plan, options)
    echo(render_plan(plan), caught)
    if options.json_file:
        call(write_plan_json, plan, options.json_file)
        click.echo(f"\nwrote {options.json_file}")
    sys.exit(ExitCode.OK if plan.fits else ExitCode.FAILED)


SETTINGS_COMMANDS = {
    "run": (_run, "Evaluate a head on a prompt set and print the per-position report (exit 1: a load-time error, "
                  "or a lossless check that diverged)."),
    "profile": (_profile, "Exact acceptance for every num_steps <= --max-steps from one teacher-forced pass "
                          "(--num-steps picks the rows samples.jsonl holds)."),
    "ablate": (_ablate, "Tau, per-position rates and modelled speedup over num_steps and other axes (each --vary a "
                        "variant of the base; the target and the head load once unless a variant changes a model "
                        "setting)."),
    "server-check": (_server_check, "Compare a running SGLang/vLLM server with the oracle: tokens, acceptance, "
                                    "settings. Exit 0 = agree, 1 = disagree, 2 = error, 3 = incomplete or undecided "
                                    "(a field the check needs is missing, or the interval straddles the tolerance)."),
    "diagnose": (_diagnose, "Find train/serve mismatches: load-time checks, aux-layer sweep, training-dump match, "
                            "chat template. Exit 0 = consistent (nothing wrong), 1 = a mismatch or an error-level "
                            "finding, 3 = a check that could not decide (inconclusive), 2 = bad input."),
    "plan": (_plan, "Does the target (and head) fit these GPUs? Bytes of every part as held, the KV cache per "
                    "token, the placement accelerate would choose and room left per GPU; no weight is read. "
                    "Exit 0 = fits, 1 = does not fit (and what would), 2 = bad input."),
}


def _settings_command(name: str) -> click.Command:
    body, text = SETTINGS_COMMANDS[name]

    @click.command(name, help=text)
    @settings_options(name)
    def command(**kw):
        body(kw)
    return command


for _name in SETTINGS_COMMANDS:
    main.factories[_name] = (lambda n: lambda: _settings_command(n))(_name)


REPORT_OPTIONS = {"context_buckets": None, "train_context": None}       # (field, its group), filled below


def _report_options(fn):
    """`report`'s context options, declared once in settings.py like every option (OutputSettings.context_buckets,
    ModelSettings.train_context)."""
    from eagle_eval.settings import ModelSettings, OutputSettings

    for cls in (ModelSettings, OutputSettings):
        for f in fields(cls):
            if f.name in REPORT_OPTIONS:
                REPORT_OPTIONS[f.name] = (f, cls)
    for name in reversed(list(REPORT_OPTIONS)):
        fn = _click_option(*REPORT_OPTIONS[name])(fn)
    return fn


@main.command("report")
@click.argument("results", nargs=-1, required=True)
@click.option("--markdown/--no-markdown", default=False, help="Markdown tables instead of the terminal table.")
@click.option("--csv", "csv_path", default=None, help="Write the per-group acceptance CSV here.")
@click.option("--plot", "plot_path", default=None,
              help="Write a PNG: per-position acceptance curves, tau by category and by context (needs matplotlib).")
@_report_options
def report_command(results, markdown, csv_path, plot_path, **context):
    """Re-render saved results (report.json files or run folders) without loading a model;
    with two results, also their differences, flagging those beyond sampling noise. --context-buckets and
    --train-context re-bucket runs, profiles and server-checks by context from the records saved beside them."""
    from eagle_eval.errors import USER_ERRORS
    from eagle_eval.results import comparison as compare

    try:
        from eagle_eval.diagnose.run import render_diagnosis
        from eagle_eval.servers.check import render_server_check

        loaded = [compare.load_result(p) for p in results]
        given = {k: _from_cli(*REPORT_OPTIONS[k], v) for k, v in context.items()
                 if click.get_current_context().get_parameter_source(k) == ParameterSource.COMMANDLINE}
        if given:
            loaded = [_rebucketed(r, given) for r in loaded]
        click.echo(compare.render_results(loaded, markdown=markdown, renderers={
            "diagnosis": render_diagnosis, "server_check": render_server_check}))
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
        fail(str(exc), exc)
    sys.exit(compare.results_status(loaded))


def _rebucketed(result, given: dict):
    """A saved result re-bucketed by context (results/context.py `rebucket`) with the options given, the others
    as it was made; its exit status again from its findings."""
    from dataclasses import replace

    from eagle_eval.results.context import rebucket
    from eagle_eval.results.saved import status_of
    from eagle_eval.settings import ModelSettings, OutputSettings

    cfg = result.report.get("config") or {}
    edges = given.get("context_buckets", cfg.get("context_buckets"))
    train = given.get("train_context", cfg.get("train_context"))
    OutputSettings(context_buckets=edges), ModelSettings(train_context=train)         # checked as run checks them
    report = rebucket(result.kind, result.report, result.path, edges, train)
    return replace(result, report=report, status=status_of(report, result.kind, result.findings, result.path))


def reference_markdown() -> str:
    """docs/cli.md: every command and option, from the same metadata the CLI is built from."""
    ctx = main.make_context("eagle-eval", ["--help"], resilient_parsing=True)
    lines = ["# CLI reference", "",
             "Generated from the settings (`python -m eagle_eval.cli reference > docs/cli.md`; a test checks it is "
             "current). Every option's default, choices and help come from one field of eagle_eval/settings.py or "
             "of the command's own options.", ""]
    commands = [(None, main, ctx)] + [(name, main.get_command(ctx, name), None) for name in main.list_commands(ctx)]
    for name, cmd, sub in commands:
        title = "`eagle-eval` (before the command: `eagle-eval --debug run ...`)" if name is None else \
            f"`eagle-eval {name}`"
        lines += [f"## {title}", "", (cmd.help or "").strip().replace("\n    ", " "), "",
                  "| option | default | help |", "|---|---|---|"]
        sub = sub or cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
        for p in cmd.get_params(sub):
            record = p.get_help_record(sub)
            if record is None or not isinstance(p, click.Option):
                continue
            decl, text = record
            default = ""
            if "[default: " in text:
                text, _, default = text.rpartition("[default: ")
                default = default.rstrip("]")
            cell = lambda t: t.strip().replace("|", "\\|")  # noqa: E731
            lines.append(f"| `{cell(decl)}` | {cell(default)} | {cell(text)} |")
        lines.append("")
    return "\n".join(lines)


def entry(args: list[str] | None = None) -> None:
    """The `eagle-eval` script and `python -m eagle_eval`: `main`, and in a process of a launched run an end
    without the interpreter's finalisation, with the command's own status (`group.exit_process`). An
    unexpected error that escaped `main` (the commands turn theirs into one line and exit 70) is one line too
    (`--debug`: the traceback) and status 70 (internal error), never 1 (a failed check)."""
    try:
        main(args=args, prog_name="eagle-eval")
    except SystemExit as exc:
        status = exc.code
        if not _launched():
            raise
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            click.echo("\neagle-eval: interrupted", err=True)
            status = ExitCode.INTERRUPTED
        else:
            if "--debug" in (sys.argv[1:] if args is None else args):       # main's context is gone by now
                import traceback
                traceback.print_exception(exc)
            click.echo(f"eagle-eval: internal error: {one_line(exc)}", err=True)
            status = ExitCode.INTERNAL
        if not _launched():
            sys.exit(status)
    from eagle_eval.parallel import group

    group.exit_process(status)


def _launched() -> bool:
    """This process joined a launched run's group (`_join_launch`)."""
    from eagle_eval.parallel import group

    return group.current().world > 1


if __name__ == "__main__":
    if sys.argv[1:] == ["reference"]:
        print(reference_markdown(), end="")
    else:
        entry()
