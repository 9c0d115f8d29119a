"""The ground floor: what "bad input" means.

Every wing's error for bad input (a file, a key, an option, a server's answer) subclasses `UserError`;
the CLI catches `UserError` (and `FileNotFoundError`) and prints one line with exit status 2, never a
traceback. This module imports nothing of eagle-eval's.
"""


class UserError(Exception):
    """Bad input: the message names the file, the key or the option, and what was expected."""


USER_ERRORS = (UserError, FileNotFoundError)
