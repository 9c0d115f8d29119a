"""What a person sees of a run over many processes: rank 0 speaks, every line says which rank.

Contract: `setup(group)` (the CLI calls it once, before anything loads), for a group of more than
one: stderr of every rank is prefixed `[rank R/N] ` at the start of each line (and after a carriage
return, so a progress bar redraws with its tag); on the other ranks stdout goes nowhere (rank 0 prints
the report), Python warnings are not shown (rank 0's are: the settings are checked equal) and the
loaders' progress bars are off (HF_HUB_DISABLE_PROGRESS_BARS). Errors and tracebacks of every rank
still reach stderr, tagged. A group of one is left as it is.
"""

from __future__ import annotations

import io
import os
import sys


class Tagged(io.TextIOBase):
    """A text stream that writes `tag` at the start of every line of the stream it wraps.

    >>> out = io.StringIO(); t = Tagged(out, "[rank 1/2] ")
    >>> _ = t.write("a\\nb"); _ = t.write("c\\n\\rd\\n"); out.getvalue()
    '[rank 1/2] a\\n[rank 1/2] bc\\n\\r[rank 1/2] d\\n'
    """

    def __init__(self, stream, tag: str):
        self._stream, self._tag, self._at_start = stream, tag, True

    def write(self, text: str) -> int:
        if not isinstance(text, str):    # click probes with b"" whether a stream takes bytes
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        out = []
        for ch in text:
            if ch == "\n":
                out.append(ch)
                self._at_start = True
            elif ch == "\r":
                out.append(ch + self._tag)
                self._at_start = False
            else:
                if self._at_start:
                    out.append(self._tag)
                    self._at_start = False
                out.append(ch)
        self._stream.write("".join(out))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    @property
    def encoding(self):
        return getattr(self._stream, "encoding", "utf-8")


def setup(group) -> None:
    """See the module docstring."""
    if group.world == 1 or isinstance(sys.stderr, Tagged):
        return
    sys.stderr = Tagged(sys.stderr, f"[rank {group.rank}/{group.world}] ")
    if not group.is_main:
        import warnings

        sys.stdout = open(os.devnull, "w")
        warnings.simplefilter("ignore")
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
