"""Wire formats of the serving engines server-check talks to: SGLang and vLLM (no torch).

Contract: a client sends one prompt's token ids at temperature 0 and returns a `ServerReply` holding
the output tokens and the server's own acceptance counts for that request, under the server's field
names mapped to ours; every transport or format problem is a `ServerError` with a one-line message
that names the URL. Nothing here knows the oracle. Every request has a deadline for the whole of it
(connect to last byte) and one for its retries, both named in the error (`Http`); a server that was
connected but too slow is named as such, never as unreachable.

The formats handled, with the server versions they were read from, are listed in servers/sglang.py
and servers/vllm.py.
"""

from __future__ import annotations

import http.client
import io
import json as jsonlib
import socket
import ssl
import time
import urllib.parse
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


HEARTBEAT_S = 5.0          # a wait longer than this says so (the heartbeat), and again every HEARTBEAT_S
CONNECT_S = 10.0           # one connection attempt at most (and never past the request's deadline)
BACKOFF_S, MAX_BACKOFF_S = 0.2, 2.0                # between attempts: 0.2 s, doubling, at most 2 s
MAX_ANSWER = 256 * 2**20   # bytes; server-check's answers are kilobytes
RETRY_STATUS = (502, 503, 504)


@dataclass
class Answer:
    """One HTTP answer, read whole."""
    url: str
    status: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _NoConnection(Exception):
    """No connection was made (retried): the reason, e.g. '[Errno 111] Connection refused'."""


class _TooSlow(Exception):
    """The request's deadline passed while connected."""


class _Attempt:
    """One attempt's clock: its deadline, what the server has sent so far, and the heartbeat."""

    def __init__(self, url: str, deadline: float, heartbeat, limits: str):
        self.url, self.deadline, self.heartbeat, self.limits = url, deadline, heartbeat, limits
        self.start = time.monotonic()
        self.next_beat = self.start + HEARTBEAT_S
        self.sent, self.received, self.headers_done = False, 0, False

    def phase(self) -> str:
        if not self.sent:
            return "the request not yet taken by the server"
        if not self.received:
            return "no byte of the answer yet"
        where = "in the body" if self.headers_done else "in the status line and headers"
        return f"{self.received} bytes received, still {where}"

    def step(self) -> float:
        """How long the next blocking read or write may wait: up to the deadline or the next heartbeat
        (then it says how long it has waited and waits again). Raises _TooSlow past the deadline."""
        now = time.monotonic()
        if now >= self.deadline:
            raise _TooSlow()
        if now >= self.next_beat:
            if self.heartbeat is not None:
                self.heartbeat(f"waiting for {self.url}: {now - self.start:.0f} s so far ({self.limits}); "
                               f"connected, {self.phase()}")
            self.next_beat = now + HEARTBEAT_S
        return max(min(self.deadline, self.next_beat) - now, 1e-3)


class _TimedSocket:
    """A connected socket as the request is sent (sendall) and http.client reads the answer (makefile):
    every read and write waits at most until the attempt's deadline, so a server that trickles its bytes or
    sends an endless header is cut there. (A socket timeout alone bounds one read, which a byte a second
    never exceeds.)"""

    def __init__(self, sock: socket.socket, attempt: _Attempt):
        self.sock, self.attempt = sock, attempt

    def _wait(self, op, buf) -> int:
        while True:
            self.sock.settimeout(self.attempt.step())
            try:
                return op(buf)
            except socket.timeout:
                continue

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self._wait(self.sock.send, view):]
        self.attempt.sent = True

    def readinto(self, buf) -> int:
        n = self._wait(self.sock.recv_into, buf)
        self.attempt.received += n
        if self.attempt.received > MAX_ANSWER:
            raise ServerError(f"{self.attempt.url}: the answer is larger than {MAX_ANSWER // 2**20} MiB; "
                              "server-check's answers are kilobytes")
        return n

    def makefile(self, *args, **kw):
        return io.BufferedReader(_Reader(self))


class _Reader(io.RawIOBase):
    def __init__(self, sock: _TimedSocket):
        self.timed = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        return self.timed.readinto(buf)


class Http:
    """HTTP/1.1 to one server, each request on its own connection, with two deadlines: `timeout` bounds
    one request whole (connect, send, status line, headers and body), `retry_budget` the attempts of one
    request (a connection that cannot be made, HTTP 502/503/504: retried up to `retries` times, 0.2 s
    apart, doubling to 2 s; no attempt starts after the budget, and one that starts ends by it). A request
    the server may have run is never sent twice (vLLM counters). `heartbeat(line)`: told every HEARTBEAT_S
    while a request or its retries wait. Direct connections only (no HTTP proxy)."""

    def __init__(self, base_url: str, timeout: float, retries: int, retry_budget: float = 60.0,
                 heartbeat=None):
        self.base = base_url.rstrip("/")
        parts = urllib.parse.urlsplit(self.base)
        self.scheme, self.host, self.prefix = parts.scheme, parts.hostname or "", parts.path
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc = parts.netloc.rpartition("@")[2]
        self.timeout, self.retries, self.retry_budget, self.heartbeat = timeout, retries, retry_budget, heartbeat

    def _limits(self) -> str:
        return f"--timeout {self.timeout:g} s a request, --retry-budget {self.retry_budget:g} s for its attempts"

    def _connect(self, attempt: _Attempt) -> socket.socket:
        wait = min(CONNECT_S, attempt.deadline - time.monotonic())
        if wait <= 0:
            raise _NoConnection("no time left to connect")
        try:
            sock = socket.create_connection((self.host, self.port), timeout=wait)
            if self.scheme == "https":
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        except socket.timeout:
            raise _NoConnection(f"no connection within {wait:g} s") from None
        except OSError as exc:
            raise _NoConnection(str(exc) or type(exc).__name__) from None
        return sock

    def _once(self, method: str, path: str, body: bytes | None, deadline: float) -> Answer:
        url = self.base + path
        attempt = _Attempt(url, deadline, self.heartbeat, self._limits())
        sock = self._connect(attempt)
        head = [f"{method} {self.prefix + path} HTTP/1.1", f"Host: {self.netloc}", "Connection: close",
                "Accept: application/json", "User-Agent: eagle-eval"]
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
        timed = _TimedSocket(sock, attempt)
        try:
            timed.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + (body or b""))
            answer = http.client.HTTPResponse(timed, method=method)
            answer.begin()
            attempt.headers_done = True
            return Answer(url, answer.status, answer.read())
        except _TooSlow:
            spent = deadline - attempt.start
            raise ServerError(f"{url}: connected, but the answer was not complete within {spent:.3g} s "
                              f"({attempt.phase()}; {self._limits()}): the server is too slow or stalled") from None
        except http.client.IncompleteRead as exc:
            got = len(exc.partial)
            raise ServerError(f"{url}: the server broke the connection while sending its answer ({got} bytes of "
                              f"the body{'' if exc.expected is None else f' of {got + exc.expected}'})") from None
        except http.client.RemoteDisconnected:
            raise ServerError(f"{url}: connected, but the server closed the connection without answering "
                              f"({attempt.phase()})") from None
        except http.client.HTTPException as exc:
            raise ServerError(f"{url}: connected, but the answer is not HTTP/1.x ({type(exc).__name__}: "
                              f"{snippet(exc, 80)})") from None
        except OSError as exc:
            raise ServerError(f"{url}: connected, but the server broke the connection "
                              f"({attempt.phase()}: {snippet(exc, 80)})") from None
        finally:
            sock.close()

    def request(self, method: str, path: str, json=None) -> Answer:
        """The server's answer to one request (class contract); a ServerError naming the URL on anything
        but a status below 400."""
        url = self.base + path
        body = None if json is None else jsonlib.dumps(json).encode()
        start = time.monotonic()
        budget_end, next_beat = start + self.retry_budget, start + HEARTBEAT_S
        attempts = 0
        while True:
            attempts += 1
            now = time.monotonic()
            deadline = now + self.timeout if attempts == 1 else min(now + self.timeout, budget_end)
            try:
                answer, failure = self._once(method, path, body, deadline), None
                if answer.status not in RETRY_STATUS:
                    break
                failure = f"HTTP {answer.status}"
            except _NoConnection as exc:
                answer, failure = None, str(exc)
            pause = min(BACKOFF_S * 2 ** (attempts - 1), MAX_BACKOFF_S)
            now = time.monotonic()
            if attempts > self.retries or now + pause >= budget_end:
                break
            if self.heartbeat is not None and now >= next_beat:
                self.heartbeat(f"{url}: {failure}; attempt {attempts} of {self.retries + 1}, {now - start:.0f} s of "
                               f"--retry-budget {self.retry_budget:g} s")
                next_beat = now + HEARTBEAT_S
            time.sleep(pause)
        tried = (f"{attempts} attempt{'s' if attempts > 1 else ''} in {time.monotonic() - start:.1f} s; "
                 f"--retries {self.retries}, {self._limits()}")
        if answer is None:
            raise ServerError(f"cannot connect to {url} ({failure}; {tried}): is the server running at --url?")
        if answer.status >= 400:
            raise ServerError(f"{url} answered HTTP {answer.status}: {snippet(answer.text) or '(empty body)'}"
                              + (f" ({tried})" if answer.status in RETRY_STATUS else ""))
        return answer

    def json(self, method: str, path: str, json=None):
        r = self.request(method, path, json=json)
        try:
            return jsonlib.loads(r.content)
        except ValueError:
            raise ServerError(f"{self.base + path} answered with a body that is not JSON: "
                              f"{snippet(r.text) or '(empty body)'}") from None


def int_list(value) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        return list(value)
    return None
