"""Wire formats of the serving engines server-check talks to: SGLang and vLLM (no torch).

Contract: a client sends one prompt's token ids at temperature 0 and returns a `ServerReply` holding
the output tokens and the server's own acceptance counts for that request, under the server's field
names mapped to ours; every transport or format problem is a `ServerError` with a one-line message
that names the URL. Nothing here knows the oracle.

The formats handled, with the server versions they were read from, are listed in servers/sglang.py
and servers/vllm.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from eagle_eval.errors import UserError

class ServerError(UserError, RuntimeError):
    """The server could not be reached or answered something unusable; the message is one line."""


@dataclass
class ServerReply:
    """One request's outcome as the server reports it (None = not reported by this server)."""
    output_ids: list[int] | None
    completion_tokens: int | None
    verify_count: int | None = None        # SGLang spec_verify_ct; vLLM num_spec_steps or delta of num_drafts
    accepted_drafts: int | None = None     # bonus not counted
    accept_length: float | None = None     # SGLang's own meta_info.spec_accept_length
    histogram: list[int] | None = None     # SGLang spec_accept_histogram; vLLM acceptance_histogram
    accepted_per_position: list[int] | None = None   # vLLM: from per-request metrics, or delta of ..._per_pos
    draft_tokens: int | None = None        # vLLM num_draft_tokens (or its delta); SGLang proposed drafts
    accepted_per_cycle: list[int] | None = None      # accepted drafts of each verify step, in order (vLLM detailed)
    source: str | None = None              # where the acceptance counts came from (vLLM: see servers/vllm.py)
    notes: list[str] = field(default_factory=list)   # what this server did not report, and why it matters
    raw: dict = field(default_factory=dict)          # the server's own fields, for the report


def snippet(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n] + "..."


class Http:
    """requests.Session with urllib3 retries (connection errors, 502/503/504) and explicit timeouts."""

    def __init__(self, base_url: str, timeout: float, retries: int):
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        self.base = base_url.rstrip("/")
        self.timeout = timeout
        # no read retries: a request the server may have run is never sent twice (vLLM counters)
        retry = Retry(total=retries, connect=retries, read=0, status=retries, other=0,
                      status_forcelist=(502, 503, 504), allowed_methods=None, backoff_factor=0.2,
                      raise_on_status=False)
        self.session = requests.Session()
        adapter = HTTPAdapter(max_retries=retry)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)

    def request(self, method: str, path: str, **kw):
        import requests
        from urllib3.exceptions import ProtocolError, ReadTimeoutError

        url = self.base + path
        try:
            r = self.session.request(method, url, timeout=(min(10.0, self.timeout), self.timeout), **kw)
        except requests.exceptions.ConnectTimeout:
            raise ServerError(f"{url}: no connection within {min(10.0, self.timeout):g} s") from None
        except requests.exceptions.ReadTimeout:
            raise ServerError(f"{url} did not answer within {self.timeout:g} s (--timeout)") from None
        except requests.exceptions.ConnectionError as exc:
            # with a urllib3 Retry, an exhausted read timeout arrives as ConnectionError(MaxRetryError); a body
            # that stalls after the headers as ConnectionError(ReadTimeoutError); one cut short as ProtocolError
            inner = exc.args[0] if exc.args else None
            if isinstance(inner, ReadTimeoutError) or isinstance(getattr(inner, "reason", None), ReadTimeoutError):
                raise ServerError(f"{url} did not answer within {self.timeout:g} s (--timeout)") from None
            if isinstance(inner, ProtocolError) and "Connection broken" in str(inner):
                raise ServerError(f"{url}: the server broke the connection while sending its answer "
                                  f"({snippet(inner, 80)})") from None
            reason = re.search(r"\[Errno -?\d+\] [^'\")]+", str(exc))
            raise ServerError(f"cannot connect to {url} ({reason.group(0) if reason else 'connection failed'}): "
                              "is the server running at --url?") from None
        except requests.exceptions.ChunkedEncodingError as exc:
            raise ServerError(f"{url}: the server broke the connection while sending its answer "
                              f"({snippet(exc, 80)})") from None
        except requests.exceptions.RequestException as exc:
            raise ServerError(f"{url}: {type(exc).__name__}: {snippet(exc)}") from None
        if r.status_code >= 400:
            raise ServerError(f"{url} answered HTTP {r.status_code}: {snippet(r.text) or '(empty body)'}")
        return r

    def json(self, method: str, path: str, **kw):
        r = self.request(method, path, **kw)
        try:
            return r.json()
        except ValueError:
            raise ServerError(f"{self.base + path} answered with a body that is not JSON: "
                              f"{snippet(r.text) or '(empty body)'}") from None


def int_list(value) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None
