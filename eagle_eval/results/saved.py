"""Saved results of every command: which file each writes, its schema version, reading and checking it.

Contract: `read_result(path)` takes a results file or the output folder of any command and returns a
`Result` of one of these kinds, refusing, in one line naming the file, what it cannot trust: a file that
is missing, unreadable, not UTF-8 JSON, under a file, of an unknown schema version (the known one is
named), whose numbers do not follow from its own counts, or whose header contradicts its table (the
num_steps or max_steps its config says against the ones its counts cover: both values named).

| kind         | command        | file               | schema | checked against its counts |
|--------------|----------------|--------------------|--------|----------------------------|
| run          | `run`          | report.json        | 1      | summary / per_position of every group from its histogram; groups and context buckets add up; config.num_steps = the histogram's |
| profile      | `profile`      | profile.json       | 1      | each num_steps (and num_draft_tokens) section from its histogram; sections 1..config.max_steps |
| ablation     | `ablate`       | ablation.json      | 1      | each variant's sections (within 1..config.max_steps); every row's tau from its section |
| diagnosis    | `diagnose`     | diagnosis.json     | 2      | every finding well formed; exit_status from the findings |
| server_check | `server-check` | server_check.json  | 1      | the oracle's counts as for a run; exit_status from the verdict |

A result keeps its findings: the load-time checks (`config.sanity` of run, profile and server-check
results, each variant's `sanity` of an ablation when present) and a diagnosis' findings; `status` is
the exit status a re-render implies (errors.py), so `eagle-eval report` can fail a CI step as the run did.
No torch, no model.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from eagle_eval.errors import ExitCode, UserError
from eagle_eval.stats.acceptance import AcceptanceCounts
from eagle_eval.findings import SEVERITIES, Finding, decide, exit_status

FILES = {"run": "report.json", "profile": "profile.json", "ablation": "ablation.json",
         "diagnosis": "diagnosis.json", "server_check": "server_check.json"}
SCHEMAS = {"run": 1, "profile": 1, "ablation": 1, "diagnosis": 2, "server_check": 1}
COMMANDS = {"run": "run", "profile": "profile", "ablation": "ablate", "diagnosis": "diagnose",
            "server_check": "server-check"}
VERDICT_STATUS = {"agree": ExitCode.OK, "disagree": ExitCode.FAILED, "incomplete": ExitCode.UNDECIDED,
                  "undecided": ExitCode.UNDECIDED}      # servers/check.py EXIT_STATUS


class ResultFileError(UserError, ValueError):
    """A results file (report.json, samples) that is missing, not JSON, or not what eagle-eval writes."""


@dataclass(frozen=True)
class Result:
    label: str          # as given on the command line
    path: str           # the file read
    report: dict
    kind: str = "run"                                  # a key of FILES
    findings: list = field(default_factory=list)       # Finding: load-time checks, a diagnosis' findings
    status: int = ExitCode.OK                          # the exit status a re-render implies (errors.py)


def worst(*statuses: int) -> int:
    """The status of several: any failure 1, else any undecided 3, else 0.

    >>> worst(0, 3, 0), worst(3, 1), worst()
    (3, 1, 0)
    """
    if ExitCode.FAILED in statuses:
        return ExitCode.FAILED
    return ExitCode.UNDECIDED if ExitCode.UNDECIDED in statuses else ExitCode.OK


def _results_file(path: Path) -> Path:
    """The results file of a folder (the one its command wrote), or `path` itself."""
    if not path.is_dir():
        return path
    present = [name for name in FILES.values() if (path / name).is_file()]
    if len(present) == 1:
        return path / present[0]
    if not present:
        raise ResultFileError(f"{path}: holds no eagle-eval results (one of {', '.join(FILES.values())} expected)")
    try:
        command = json.loads((path / "eagle_eval_run.json").read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        command = None
    mine = [name for kind, name in FILES.items() if COMMANDS[kind] == command and name in present]
    if len(mine) == 1:
        return path / mine[0]
    raise ResultFileError(f"{path}: holds several results files ({', '.join(present)}); name the one to read")


def read_json(file: Path) -> object:
    """A JSON value from `file`; every way it cannot be read is one line naming the file."""
    for parent in file.parents:
        if parent.exists() and not parent.is_dir():
            raise ResultFileError(f"{file}: {parent} is a file, not a folder")
        if parent.exists():
            break
    try:
        data = file.read_bytes()
    except FileNotFoundError as exc:
        raise ResultFileError(f"{file}: no such report file") from exc
    except IsADirectoryError as exc:
        raise ResultFileError(f"{file}: is a folder") from exc
    except OSError as exc:
        raise ResultFileError(f"{file}: cannot be read ({exc.strerror or exc})") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultFileError(f"{file}: not a UTF-8 text file ({exc.reason} at byte {exc.start}); "
                              "an eagle-eval JSON results file was expected") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultFileError(f"{file}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from exc
    except RecursionError as exc:
        raise ResultFileError(f"{file}: nested too deeply to be an eagle-eval results file") from exc


def kind_of(report, file: Path) -> str:
    """Which command's results these are, from their contents (a renamed file is still recognised)."""
    if not isinstance(report, dict):
        raise ResultFileError(f"{file}: not an eagle-eval results file (a JSON object is expected, got a "
                              f"JSON {type(report).__name__})")
    if report.get("kind") == "server_check":
        return "server_check"
    for kind, keys in (("profile", ("by_num_steps",)), ("ablation", ("rows", "variants", "costs")),
                       ("diagnosis", ("findings", "configured_aux_layers"))):
        if all(k in report for k in keys):
            return kind
    for key in ("config", "summary", "per_position", "histogram"):
        if key not in report:
            raise ResultFileError(f"{file}: key '{key}' is missing (not an eagle-eval results file? expected one of "
                                  f"{', '.join(FILES.values())})")
    return "run"


def _check_schema(report: dict, kind: str, file: Path) -> None:
    version, known = report.get("schema_version"), SCHEMAS[kind]
    if version != known:
        said = "has no schema_version" if version is None else f"has schema_version {json.dumps(version)[:20]}"
        raise ResultFileError(f"{file}: {said}; this eagle-eval reads {FILES[kind]} ({COMMANDS[kind]} results) "
                              f"of schema_version {known} only")


def counts_of(body: dict, path, group: str) -> AcceptanceCounts:
    """The counts of one group {summary, per_position, histogram}, refused when its figures do not follow."""
    try:
        hist = body["histogram"]
        if not isinstance(hist, list) or not hist or not all(isinstance(h, int) and not isinstance(h, bool)
                                                            and h >= 0 for h in hist):
            raise TypeError("'histogram' is not a list of counts")
        counts = AcceptanceCounts(len(hist) - 1, list(hist))
        same = (body["per_position"] == counts.per_position()
                and body["summary"]["cycles"] == counts.cycles
                and body["summary"]["accepted_drafts"] == counts.accepted_drafts
                and body["summary"]["accept_length"] == counts.tau)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResultFileError(f"{path}: group {group}: malformed ({type(exc).__name__}: {exc})") from exc
    if not same:
        raise ResultFileError(f"{path}: group {group}: 'summary'/'per_position' do not follow from its 'histogram'")
    return counts


def check_counts(report: dict, path) -> None:
    """A run-shaped report: every group's figures from its histogram, the groups adding up to the whole."""
    whole = counts_of(report, path, "all")
    for key in ("by_category", "by_turn"):
        groups = report.get(key, {})
        if not isinstance(groups, dict):
            raise ResultFileError(f"{path}: key '{key}' is not an object of groups")
        parts = [counts_of(body, path, f"{key}[{name!r}]") for name, body in groups.items()]
        total = [sum(h) for h in zip(*(p.histogram for p in parts))]
        if parts and total != whole.histogram:
            raise ResultFileError(f"{path}: the '{key}' histograms add up to {total}, not to the whole {whole.histogram}")


def check_context(section, path, whole: list[int] | None = None, where: str = "by_context") -> None:
    """A context section of cycles (results/context.py): each bucket's cycles and tau from its histogram, and
    the buckets adding up to `whole` (the run's histogram) when given."""
    if section is None:
        return
    total = None
    try:
        if section["kind"] != "cycles":
            return
        for i, b in enumerate(section["buckets"]):
            hist = b["histogram"]
            if not isinstance(hist, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                     for h in hist):
                raise TypeError(f"buckets[{i}] 'histogram' is not a list of counts")
            counts = AcceptanceCounts(len(hist) - 1, list(hist))
            if b["cycles"] != counts.cycles or b["accept_length"]["value"] != counts.tau:
                raise ResultFileError(f"{path}: {where} bucket {b.get('context')}: 'cycles'/'accept_length' do not "
                                      "follow from its 'histogram'")
            total = list(hist) if total is None else [a + h for a, h in zip(total, hist)]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResultFileError(f"{path}: {where}: malformed ({type(exc).__name__}: {exc})") from exc
    if whole is not None and total is not None and total != list(whole):
        raise ResultFileError(f"{path}: the '{where}' histograms add up to {total}, not to the whole {whole}")


def _check_run(report: dict, path) -> None:
    """check_counts, the context buckets, and the num_steps the report's header says is the one its table
    covers."""
    check_counts(report, path)
    check_context(report.get("by_context"), path, report["histogram"])
    check_context(report.get("server_by_context"), path, where="server_by_context")
    said = (report.get("config") or {}).get("num_steps")
    covered = len(report["histogram"]) - 1
    if said != covered:
        raise ResultFileError(f"{path}: config.num_steps is {json.dumps(said)[:20]} but its table (histogram and "
                              f"per_position) covers num_steps {covered}: the report contradicts itself")


def _steps_cover(by_steps: dict, max_steps, path, where: str, every: bool = True) -> None:
    """A profile's sections are num_steps 1..max_steps, as its config says (`every`: all of them; an
    ablation's tree sections hold those a num_draft_tokens fits)."""
    if max_steps is None:
        return
    keys = sorted(int(s) for s in by_steps)
    fits = isinstance(max_steps, int) and not isinstance(max_steps, bool) and (
        keys == list(range(1, max_steps + 1)) if every else set(keys) <= set(range(1, max_steps + 1)))
    if not fits:
        raise ResultFileError(f"{path}: config.max_steps is {json.dumps(max_steps)[:20]} but '{where}' holds "
                              f"num_steps {', '.join(map(str, keys))}: the report contradicts itself")


def _sections(by_steps, path, where: str) -> None:
    if not isinstance(by_steps, dict) or not by_steps or not all(str(k).isdigit() for k in by_steps):
        raise ResultFileError(f"{path}: '{where}' must map each num_steps (\"1\", \"2\", ...) to its counts")
    for s, body in by_steps.items():
        counts = counts_of(body, path, f"{where}[{s}]")
        if counts.num_steps != int(s):
            raise ResultFileError(f"{path}: {where}[{s}]: its histogram covers num_steps {counts.num_steps}")


def _check_profile(report: dict, path) -> None:
    _sections(report["by_num_steps"], path, "by_num_steps")
    _steps_cover(report["by_num_steps"], (report.get("config") or {}).get("max_steps"), path, "by_num_steps")
    for d, by_steps in (report.get("by_num_draft_tokens") or {}).items():
        _sections(by_steps, path, f"by_num_draft_tokens[{d}]")


def _check_ablation(report: dict, path) -> None:
    variants, rows = report["variants"], report["rows"]
    if not isinstance(variants, list) or not isinstance(rows, list):
        raise ResultFileError(f"{path}: 'variants' and 'rows' must be lists")
    taus = {}
    for i, v in enumerate(variants):
        if not isinstance(v, dict) or "variant" not in v or "by_num_steps" not in v:
            raise ResultFileError(f"{path}: variants[{i}]: 'variant' and 'by_num_steps' expected")
        _sections(v["by_num_steps"], path, f"variants[{i}].by_num_steps")
        _steps_cover(v["by_num_steps"], (report.get("config") or {}).get("max_steps"), path,
                     f"variants[{i}].by_num_steps", every=False)
        taus.update({(v["variant"], int(s)): b["summary"]["accept_length"] for s, b in v["by_num_steps"].items()})
    for i, r in enumerate(rows):
        key = (r.get("variant"), r.get("num_steps")) if isinstance(r, dict) else None
        if key not in taus or r.get("tau") != taus[key]:
            raise ResultFileError(f"{path}: rows[{i}]: its tau does not follow from the counts of variant "
                                  f"{key[0] if key else '?'!r} num_steps {key[1] if key else '?'}")


def _findings(items, path, where: str) -> list[Finding]:
    if not isinstance(items, list):
        raise ResultFileError(f"{path}: '{where}' must be a list of findings")
    out = []
    for i, f in enumerate(items):
        try:
            if not isinstance(f, dict) or not all(isinstance(f.get(k), str) for k in ("severity", "code", "message")):
                raise ValueError("'severity', 'code' and 'message' (strings) expected")
            out.append(Finding.from_dict(f))
        except ValueError as exc:
            raise ResultFileError(f"{path}: {where}[{i}]: not a finding ({exc}; severities {', '.join(SEVERITIES)})")
    return out


def _load_findings(report: dict, kind: str, path) -> list[Finding]:
    if kind == "diagnosis":
        return _findings(report["findings"], path, "findings")
    if kind == "ablation":
        return [f for i, v in enumerate(report["variants"]) if "sanity" in v
                for f in _findings(v["sanity"], path, f"variants[{i}].sanity")]
    return _findings((report.get("config") or {}).get("sanity", []), path, "config.sanity")


def _status(report: dict, kind: str, findings: list[Finding], path) -> int:
    """The exit status the command gave these results (diagnosis and server-check recorded theirs: checked)."""
    if kind == "diagnosis":
        recorded, now = report.get("exit_status"), exit_status(findings)
        # diagnose before errors.ExitCode exited 1 on an undecided finding too; such files say 1 for now's 3
        older = ExitCode.FAILED if now == ExitCode.UNDECIDED else now
        if recorded not in (now, older):
            raise ResultFileError(f"{path}: 'exit_status' {recorded!r} does not follow from its findings ({now})")
        return now
    status = decide(findings).status
    if kind == "server_check":
        verdict = report.get("verdict")
        if verdict not in VERDICT_STATUS or report.get("exit_status") != VERDICT_STATUS[verdict]:
            raise ResultFileError(f"{path}: verdict {verdict!r} and exit_status {report.get('exit_status')!r} do "
                                  "not agree")
        return worst(status, VERDICT_STATUS[verdict])
    if kind == "run" and report["summary"].get("lossless") is False:
        status = worst(status, ExitCode.FAILED)               # a lossless check that found a divergence
    if kind in ("run", "profile"):                            # --train-context: decayed 1, undecided 3
        from eagle_eval.results.context import finding_status
        status = worst(status, finding_status(report))
    return status


def status_of(report: dict, kind: str, findings: list[Finding], path) -> int:
    """The exit status a re-render of `report` implies (a re-bucketed one's too: results/context.py)."""
    return _status(report, kind, findings, path)


CHECKS = {"run": _check_run, "server_check": _check_run, "profile": _check_profile,
          "ablation": _check_ablation, "diagnosis": lambda report, path: None}


def read_result(path: str | Path, label: str | None = None) -> Result:
    """A results file, or a command's output folder holding one, checked (module docstring)."""
    given = Path(os.fspath(path))
    file = _results_file(given) if given.exists() else given
    report = read_json(file)
    kind = kind_of(report, file)
    _check_schema(report, kind, file)
    CHECKS[kind](report, file)
    found = _load_findings(report, kind, file)
    return Result(label=label if label is not None else str(path), path=str(file), report=report, kind=kind,
                  findings=found, status=_status(report, kind, found, file))
