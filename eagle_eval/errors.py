"""The ground floor: what "bad input" means.

Every wing's error for bad input (a file, a key, an option, a server's answer) subclasses `UserError`;
the CLI catches `UserError` (and `FileNotFoundError`) and prints one line with exit status 2, never a
traceback. This module imports nothing of eagle-eval's.

Exit statuses, one table for every command (`results/findings.decide` maps findings onto it):

| status | name               | meaning |
|--------|--------------------|---------|
| 0      | `EXIT_OK`          | done; no finding fails the check |
| 1      | `EXIT_FAILED`      | a finding that fails the check (an error-level finding, a mismatch, a lossless divergence) |
| 2      | `EXIT_BAD_INPUT`   | bad input or environment (`UserError`): one line, nothing measured |
| 3      | `EXIT_UNDECIDED`   | nothing failed, but a check could not decide (undecided / incomplete) |
| 130    | `EXIT_INTERRUPTED` | Ctrl-C (128 + SIGINT), what was kept is said |
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNDECIDED = 3
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """Bad input: the message names the file, the key or the option, and what was expected."""


USER_ERRORS = (UserError, FileNotFoundError)
