"""The ground floor: what "bad input" means, and what an internal error is.

Every wing's error for bad input (a file, a key, an option, a server's answer) subclasses `UserError`;
the CLI catches `UserError` (and `FileNotFoundError`) and prints one line with exit status 2, never a
traceback. Any other exception is a bug (or a fault of the machine): one line with exit status 70
(`ExitCode.INTERNAL`); work on prompts runs inside `stage(prompt ids, name)`, so that line names the
prompt and the stage (`--debug` prints the traceback). This module imports nothing of eagle-eval's.
"""

from contextlib import contextmanager


class UserError(Exception):
    """Bad input: the message names the file, the key or the option, and what was expected."""


USER_ERRORS = (UserError, FileNotFoundError)


class ExitCode:
    """Every command's exit status (docs/exit-codes.md): one table, used by every command."""
    OK = 0            # the command ran and nothing it checks failed
    FAILED = 1        # a finding that fails the check: a load-time error, a mismatch, a lossless divergence,
                      # a server that disagrees, a target that does not fit
    BAD_INPUT = 2     # bad input or environment: one line naming the file, key or option
    UNDECIDED = 3     # the data cannot decide (an interval straddles the bound, a field the check needs is missing)
    INTERNAL = 70     # an unexpected exception (a bug, or a fault of the machine): one line naming the prompt
                      # and the stage where there is one (EX_SOFTWARE of sysexits.h); never 1
    INTERRUPTED = 130  # Ctrl-C: what was written so far is kept and named


class CheckFailed(Exception):
    """A command stopped because something it checks failed (exit 1), e.g. a head whose load-time checks found
    an error; `report` holds what was measured so far (rendered by the CLI)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report


class InternalError(Exception):
    """An unexpected exception while working on named prompts: the message names them, the stage and the
    exception; the exception itself is the `__cause__` (its traceback is what `--debug` prints)."""


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message` (a CUDA error spans lines; --debug shows the rest)."""
    lines = str(exc).strip().splitlines()
    text = lines[0] + (" ..." if len(lines) > 1 else "") if lines else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def prompts_label(ids) -> str:
    """The prompts a stage worked on, for its one line.

    >>> prompts_label(["q17"]), prompts_label(["q1", "q2"])
    ('prompt q17', 'prompts q1, q2')
    >>> prompts_label([f"q{i}" for i in range(1, 10)])
    'prompts q1 .. q9 (9)'
    """
    ids = [str(i) for i in ids]
    if len(ids) == 1:
        return f"prompt {ids[0]}"
    if len(ids) <= 3:
        return f"prompts {', '.join(ids)}"
    return f"prompts {ids[0]} .. {ids[-1]} ({len(ids)})"


@contextmanager
def stage(ids, name: str):
    """Work on the prompts `ids` in stage `name` ("decode", "profile", ...): an unexpected exception leaves as an
    `InternalError` saying "prompt q17, decode: RuntimeError: ..."; bad input, a failed check, an inner stage's
    InternalError and Ctrl-C pass through as they are."""
    try:
        yield
    except (UserError, FileNotFoundError, CheckFailed, InternalError):
        raise
    except Exception as exc:
        raise InternalError(f"{prompts_label(ids)}, {name}: {one_line(exc)}") from exc


@contextmanager
def within(context: str):
    """Around stages: an InternalError they raise leaves with `context` before its text ("variant aux_layers=...:
    prompts p0 .. p7 (8), profile: ...")."""
    try:
        yield
    except InternalError as exc:
        raise InternalError(f"{context}: {exc}") from (exc.__cause__ or exc)
