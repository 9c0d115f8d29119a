"""server-check never waits without a bound, nor silently: every request has a deadline for the whole of it
(connect to last byte) and one for its retries, both named in the error; a server that was connected but
too slow is named so (never "cannot connect"); a long wait says so on stderr.

The servers are raw sockets on 127.0.0.1 (tests/fake_servers.py `raw_server`) that send what no HTTP
library would: a byte at a time, or headers that never end. Each test is bounded by the deadline it sets
(1 s) plus a margin; the margins below are generous for a loaded 2-core machine, and still far under the
minutes these servers held the old client (one socket read at a time under --timeout).
"""

import re
import time

import pytest
from click.testing import CliRunner
from fake_servers import closed_port, raw_server

from eagle_eval.cli import main
from eagle_eval.servers import http as http_module
from eagle_eval.servers.http import Http, ServerError

MARGIN = 2.0          # seconds past a deadline the client may take to give up (scheduling on a loaded machine)


def _ask(url, heartbeat=None, **kw):
    """POST as the SGLang client does; (the error, seconds taken)."""
    start = time.monotonic()
    with pytest.raises(ServerError) as err:
        Http(url, **{"timeout": 1.0, "retries": 0, "retry_budget": 5.0, **kw}, heartbeat=heartbeat).json(
            "POST", "/generate", json={"input_ids": [1, 2, 3]})
    return str(err.value), time.monotonic() - start


@pytest.mark.parametrize("answer, where", [
    ("drip_body", "still in the body"),                              # headers at once, then a byte every 50 ms
    ("drip_status", "still in the status line and headers"),         # the status line itself a byte every 50 ms
])
def test_a_slow_drip_is_cut_by_the_request_deadline(answer, where):
    with raw_server(answer) as url:
        message, took = _ask(url)
    assert 1.0 <= took < 1.0 + MARGIN, took
    assert message.startswith(f"{url}/generate: connected, but the answer was not complete within 1 s (")
    assert where in message and "--timeout 1 s a request, --retry-budget 5 s" in message
    assert "cannot connect" not in message and "\n" not in message


@pytest.mark.parametrize("answer", [
    "header_lines",            # a header line every 200 ms: fewer than http.client's 100 before the deadline
    "header_line",             # one header line that never ends, a byte every 10 ms
])
def test_an_endless_header_is_cut_by_the_request_deadline(answer):
    with raw_server(answer) as url:
        message, took = _ask(url)
    assert 1.0 <= took < 1.0 + MARGIN, took
    assert re.match(rf"{url}/generate: connected, but the answer was not complete within 1 s \(\d+ bytes received, "
                    r"still in the status line and headers; --timeout 1 s a request, --retry-budget 5 s", message)
    assert "cannot connect" not in message


def test_a_flood_of_headers_is_refused_as_not_http_at_once():
    with raw_server("header_flood") as url:
        message, took = _ask(url)
    assert took < 1.0, took                                   # http.client's own limit, before the deadline
    assert message == f"{url}/generate: connected, but the answer is not HTTP/1.x (HTTPException: got more than 100 headers)"


@pytest.mark.parametrize("retries, budget", [(10**6, 1.0), (10**9, 1.5)])
def test_huge_retries_against_a_closed_port_end_within_the_retry_budget(retries, budget):
    url = f"http://127.0.0.1:{closed_port()}"
    message, took = _ask(url, retries=retries, retry_budget=budget)
    assert took <= budget + MARGIN, took
    attempts = int(re.search(r"; (\d+) attempts in", message).group(1))
    assert 3 <= attempts < 20                                 # retried, 0.2 s apart doubling, inside the budget
    assert message.startswith(f"cannot connect to {url}/generate ([Errno 111] Connection refused; ")
    assert f"--retries {retries}, --timeout 1 s a request, --retry-budget {budget:g} s" in message


def test_no_retry_gives_one_attempt():
    message, took = _ask(f"http://127.0.0.1:{closed_port()}", retries=0, retry_budget=30.0)
    assert "; 1 attempt in" in message and took < MARGIN


def test_a_long_wait_says_so_every_few_seconds(monkeypatch):
    """The heartbeat: a request still waiting, or still retrying, is named on the callback (the CLI: stderr)."""
    monkeypatch.setattr(http_module, "HEARTBEAT_S", 0.2)
    lines = []
    with raw_server("drip_body") as url:
        _ask(url, heartbeat=lines.append)
    assert len(lines) >= 3, lines
    assert all(re.match(rf"waiting for {url}/generate: [\d.]+ s so far \(--timeout 1 s a request, --retry-budget "
                        r"5 s for its attempts\); connected, \d+ bytes received, still in the body", line)
               for line in lines), lines
    lines.clear()
    url = f"http://127.0.0.1:{closed_port()}"
    _ask(url, heartbeat=lines.append, retries=10**6, retry_budget=1.5)
    assert lines and all(re.match(rf"{url}/generate: \[Errno 111\] Connection refused; attempt \d+ of 1000001, "
                                  r"[\d.]+ s of --retry-budget 1.5 s", line) for line in lines), lines


def test_cli_retries_end_within_the_budget_with_a_heartbeat_on_stderr(monkeypatch):
    """Before the target is loaded: the bundled pair's settings, a closed port, a huge --retries."""
    monkeypatch.setattr(http_module, "HEARTBEAT_S", 0.3)
    url = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    res = CliRunner().invoke(main, ["server-check", "--backend", "sglang", "--url", url, "--retries", "1000000",
                                    "--retry-budget", "1.5", "--timeout", "1"])
    assert time.monotonic() - start < 1.5 + MARGIN
    assert res.exit_code == 2, res.output
    *beats, last = res.stderr.strip().splitlines()
    assert beats and all(b.startswith(f"eagle-eval: {url}/get_server_info: [Errno 111] Connection refused; attempt ")
                         for b in beats), beats
    assert last.startswith(f"eagle-eval: error: cannot connect to {url}/get_server_info ([Errno 111] Connection "
                           "refused; ") and "--retries 1000000, --timeout 1 s a request, --retry-budget 1.5 s" in last


@pytest.mark.parametrize("kw, said", [
    (dict(retry_budget=0), "--retry-budget must be > 0"),
    (dict(url="http://:8000"), "names no host"),
    (dict(url="http://127.0.0.1:99999"), "Port out of range"),
])
def test_deadline_options_are_checked(kw, said):
    from eagle_eval.servers.options import ServerCheckOptions
    from eagle_eval.settings import ConfigError

    with pytest.raises(ConfigError, match=said):
        ServerCheckOptions(**{"backend": "sglang", "url": "http://127.0.0.1:1", **kw})


def test_reading_vllm_counters_until_they_settle_says_so_when_it_takes_long(monkeypatch):
    """The other wait of server-check: /metrics read until two reads agree (--metrics-settle apart)."""
    from eagle_eval.servers.vllm import VLLMClient

    monkeypatch.setattr(http_module, "HEARTBEAT_S", 0.1)

    class Moving:                                   # counters that never settle: every read one more draft
        base, reads, heartbeat = "http://vllm", 0, None

        def request(self, method, path):
            self.reads += 1

            class Answer:
                text = f'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {self.reads}.0\n'
            return Answer()

    http, lines = Moving(), []
    http.heartbeat = lines.append
    VLLMClient(http, model="m", settle=0.05).settled_counters(tries=8)
    assert http.reads == 9 and lines, lines
    assert all(re.fullmatch(r"http://vllm/metrics: \d+ s reading until two reads agree \(\d reads so far, at most 9, "
                            r"--metrics-settle 0.05 s apart\)", line) for line in lines), lines
