"""Findings: what `diagnose` and the load-time checks report, one line each (no torch).

Contract: a finding is (severity, code, message[, detail]); `severity` is `info`, `warning`,
`undecided` (a check that could not tell: never reported as fine) or `error`; `code` is a stable
kebab-case identifier tests and scripts can match; `message` is one line that says what was
measured and why it matters. `exit_status` is 1 when any finding is an error (every mismatch is
reported as an error), else 3 when one is undecided, else 0 (errors.ExitCode); `decide` adds the
codes behind it (what `eagle-eval report` says when a re-render fails).
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEVERITIES = ("info", "warning", "undecided", "error")


@dataclass(frozen=True)
class Finding:
    severity: str
    code: str
    message: str
    detail: dict = field(default_factory=dict)     # machine-readable numbers behind the message

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def as_dict(self) -> dict:
        out = {"severity": self.severity, "code": self.code, "message": self.message}
        if self.detail:
            out["detail"] = self.detail
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Finding":
        return cls(d["severity"], d["code"], d["message"], d.get("detail") or {})


def info(code: str, message: str, **detail) -> Finding:
    return Finding("info", code, message, detail)


def warning(code: str, message: str, **detail) -> Finding:
    return Finding("warning", code, message, detail)


def undecided(code: str, message: str, **detail) -> Finding:
    return Finding("undecided", code, message, detail)


def error(code: str, message: str, **detail) -> Finding:
    return Finding("error", code, message, detail)


def guarded(name: str, fn, *args) -> list[Finding]:
    """fn(*args), a list of findings; a check must never stop a run: an exception becomes an info
    finding saying the check was skipped."""
    try:
        return fn(*args)
    except Exception as exc:
        return [info(f"{name}-skipped", f"{name} check skipped ({type(exc).__name__}: {exc})")]


def by_severity(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then info; stable within a severity.

    >>> [f.code for f in by_severity([info("a", ""), error("b", ""), warning("c", "")])]
    ['b', 'c', 'a']
    """
    return sorted(findings, key=lambda f: -SEVERITIES.index(f.severity))


def exit_status(findings: list[Finding]) -> int:
    """1 (a check failed) when any finding is an error, else 3 (undecided) when one is undecided, else 0.

    >>> exit_status([info("a", ""), warning("b", "")]), exit_status([error("c", ""), undecided("d", "")])
    (0, 1)
    >>> exit_status([undecided("d", "")])
    3
    """
    if any(f.severity == "error" for f in findings):
        return 1
    return 3 if any(f.severity == "undecided" for f in findings) else 0


@dataclass(frozen=True)
class Decision:
    """The exit status a list of findings implies (`exit_status`) and the codes that set it."""
    status: int                       # errors.ExitCode: OK, FAILED or UNDECIDED
    failing: tuple[str, ...] = ()     # codes of the error-level findings
    undecided: tuple[str, ...] = ()   # codes of the undecided ones

    def message(self, what: str = "check") -> str:
        """One line: which findings set the status ('' when it is 0)."""
        if self.failing:
            return f"{len(self.failing)} {what}(s) failed: {', '.join(self.failing)}"
        if self.undecided:
            return f"{len(self.undecided)} {what}(s) could not decide: {', '.join(self.undecided)}"
        return ""


def decide(findings) -> Decision:
    """Findings (or their dicts, as a report stores them) -> `exit_status` and the codes behind it.

    >>> decide([info("a", ""), warning("b", "")]).status, decide([undecided("c", ""), error("d", "")])
    (0, Decision(status=1, failing=('d',), undecided=('c',)))
    """
    found = [f if isinstance(f, Finding) else Finding.from_dict(f) for f in findings]
    failing = tuple(dict.fromkeys(f.code for f in found if f.severity == "error"))
    open_ = tuple(dict.fromkeys(f.code for f in found if f.severity == "undecided"))
    return Decision(exit_status(found), failing, open_)


def render_findings(findings: list[Finding], only_problems: bool = False) -> str:
    """A table: severity, code, message; with only_problems, info lines are counted, not shown."""
    shown = [f for f in by_severity(findings) if not (only_problems and f.severity == "info")]
    width = max((len(f.code) for f in shown), default=4)
    sev = max((len(f.severity) for f in shown), default=7)          # 7 = "warning"; "undecided" is longer
    lines = [f"{f.severity.upper():<{max(sev, 7)}} {f.code:<{width}}  {f.message}" for f in shown]
    if only_problems:
        passed = len(findings) - len(shown)
        lines.append(f"({passed} check(s) passed or informational; `eagle-eval diagnose` shows them all)")
    return "\n".join(lines)
