"""The ground floor: what "bad input" means.

Every wing's error for bad input (a file, a key, an option, a server's answer) subclasses `UserError`;
the CLI catches `UserError` (and `FileNotFoundError`) and prints one line with exit status 2, never a
traceback. This module imports nothing of eagle-eval's.
"""


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
    INTERRUPTED = 130  # Ctrl-C: what was written so far is kept and named


class CheckFailed(Exception):
    """A command stopped because something it checks failed (exit 1), e.g. a head whose load-time checks found
    an error; `report` holds what was measured so far (rendered by the CLI)."""

    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report
