"""A local HTTP server (127.0.0.1 only) that speaks SGLang's or vLLM's wire format, backed by an
eagle_eval oracle, with switchable faults. Started and stopped by the tests through `serve()`.

A stand-in, not an engine: it answers with its oracle's tokens and counts in the engine's format. Served
with the check's own oracle it is the oracle compared with itself over that wire, which tests how
server-check reads and judges the wire (and catches the faults planted here), never whether eagle-eval
agrees with SGLang or vLLM themselves (tests/test_real_vllm*.py run the real vLLM; SGLang is never run).

Faults that change the decoding itself are injected by building the server's oracle from a changed
settings (see test_server_check.py); the faults here change what goes over the wire:

| fault | effect |
|---|---|
| `draft_tokens_info` | /get_server_info reports speculative_num_draft_tokens = 8 with topk 1 (no adjustment) |
| `non_greedy` | output token 3 is the target's LEAST likely token there |
| `no_verify_ct` | meta_info without any spec_* field (speculative decoding off) |
| `http_500` | /generate and /v1/completions answer HTTP 500 |
| `malformed_json` | they answer 200 with a body that is not JSON |
| `slow` | they answer after 3 s |
| `per_step_reversed` | vLLM per-request metrics: per_step_accepted in reverse order (every total unchanged) |
| `not_samples` | at temperature > 0: the tokens drawn uniformly from the vocabulary (like the real vLLM 0.32 CPU build's speculative sampling, whose tokens the target often cannot emit: docs/server-check.md) |
| `wrong_residual` | at temperature > 0: a rejected draft is replaced by a sample of p itself (the rejected draft not removed) |

A block drafter's oracle (a DFlash draft) is served as SGLang's `DFLASH` (its /get_server_info says so: num_steps 1,
the block in speculative_num_draft_tokens) or vLLM's `dflash` (the same counters and per-request metrics).

At temperature > 0 the stand-in samples as its engine does: the decode policy of `rule` (default vLLM's rule for
the vLLM stand-in, SGLang's for the SGLang one) seeded with the request's seed, with the request's filters.

`raw_server(answer)` is another kind of server: raw sockets sending what no HTTP library would (an answer that
trickles a byte at a time, headers without end; `RAW_ANSWERS`), for the request deadlines.

`Engine(..., per_request="summary" | "detailed")` makes the vLLM stand-in answer with per-request
metrics under `metrics.speculative_decoding`, in the shape a real vLLM 0.32 answers
(tests/data/vllm_0.32_completion_detailed.json holds one such real answer).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from eagle_eval.stats.acceptance import AcceptanceCounts
from eagle_eval.records import Prompt

# one decode at a time across ALL fake servers: servers share cached oracles (and so target models, whose
# capture hooks are per model), and a `slow` handler may still be running after its test has ended
_DECODE_LOCK = threading.Lock()

FAULTS = ("draft_tokens_info", "non_greedy", "no_verify_ct", "http_500", "malformed_json", "slow", "per_step_reversed",
          "not_samples", "wrong_residual")


class Engine:
    def __init__(self, oracle, backend: str, fault: str | None = None, log_path=None, log_interval: int = 10,
                 per_request: str | None = None, rule: str | None = None):
        assert fault is None or fault in FAULTS, fault
        assert per_request in (None, "summary", "detailed"), per_request
        self.oracle, self.backend, self.fault, self.per_request = oracle, backend, fault, per_request
        self.rule = rule or backend
        self.num_steps = oracle.resolved.num_steps
        self.log_path, self.log_interval = log_path, log_interval
        self.window = [0, 0]                     # accepted tokens incl. bonus, verify steps
        self.total = [0, 0]
        self.requests = 0
        if backend == "vllm":
            from prometheus_client import CollectorRegistry, Counter
            self.registry = CollectorRegistry()
            labels = ["model_name", "engine"]
            self.counters = {name: Counter(f"vllm:spec_decode_num_{name}", name, labels, registry=self.registry)
                             for name in ("drafts", "draft_tokens", "accepted_tokens")}
            self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "per pos", labels + ["position"],
                                   registry=self.registry)
            for name in self.counters:           # vLLM registers the series at start-up
                self.counters[name].labels("fake-model", "0")
            for i in range(self.num_steps):
                self.per_pos.labels("fake-model", "0", str(i))

    def decode(self, input_ids: list[int], max_new_tokens: int, sampling: dict | None = None):
        with _DECODE_LOCK:
            oracle = self.oracle
            if max_new_tokens != oracle.settings.workload.max_new_tokens:
                oracle = oracle.with_(max_new_tokens=max_new_tokens)
            if sampling and sampling.get("temperature", 0) > 0:
                return self._sample(oracle, input_ids, sampling)
            rec = oracle.decode(Prompt(id=f"r{self.requests}", category="x", input_ids=list(input_ids)))
            self.requests += 1
            out = list(rec.output_ids)
            if self.fault == "non_greedy" and len(out) > 3:
                logits = oracle.speculator.target.forward(torch.tensor([list(input_ids) + out[:3]]), None)
                out[3] = int(logits[0, -1].argmin())
            self._account(rec)
            return rec, out

    def _sample(self, oracle, input_ids: list[int], sampling: dict):
        """The engine's speculative sampling (its rule, the request's filters and seed)."""
        from eagle_eval.loop.reference import speculative_decode

        top_k = sampling.get("top_k") or 0
        oracle = oracle.with_(temperature=float(sampling["temperature"]), top_p=float(sampling.get("top_p", 1.0)),
                              top_k=max(int(top_k), 0), min_p=float(sampling.get("min_p", 0.0)), accept_rule=self.rule)
        spec = oracle.speculator
        if self.fault == "wrong_residual":
            spec = _with_wrong_residual(spec)
        r = oracle.resolved
        gen = torch.Generator().manual_seed(int(sampling.get("seed", 0)))
        d = speculative_decode(spec, list(input_ids), r.num_steps, oracle.settings.workload.max_new_tokens,
                               oracle.eos_ids, r.topk, r.num_draft_tokens, generator=gen)
        out = list(d.output_ids)
        if self.fault == "not_samples":
            vocab = spec.target.info.vocab_size
            out = torch.randint(0, vocab, (len(out),), generator=gen).tolist()
        self.requests += 1
        rec = SimpleRecord(d.accepted_per_cycle)
        self._account(rec)
        return rec, out

    def _account(self, rec):
        for n in rec.accepted_per_cycle:
            self.window[0] += n + 1
            self.window[1] += 1
            self.total[0] += n + 1
            self.total[1] += 1
            if self.window[1] == self.log_interval and self.log_path is not None:
                tau = self.window[0] / self.window[1]
                with open(self.log_path, "a") as f:
                    f.write(f"[2026-05-01 10:00:00] Decode batch, #running-req: 1, #token: 64, token usage: 0.00, "
                            f"accept len: {tau:.2f}, accept rate: {(tau - 1) / self.num_steps:.2f}, "
                            "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0, \n")
                self.window = [0, 0]
        if self.backend == "vllm":
            c = AcceptanceCounts.from_accepted(rec.accepted_per_cycle, self.num_steps)
            self.counters["drafts"].labels("fake-model", "0").inc(c.cycles)
            self.counters["draft_tokens"].labels("fake-model", "0").inc(c.cycles * self.num_steps)
            self.counters["accepted_tokens"].labels("fake-model", "0").inc(c.accepted_drafts)
            for i, a in enumerate(c.accepted):
                self.per_pos.labels("fake-model", "0", str(i)).inc(a)

    def server_info(self) -> dict:
        model, num_steps = self.oracle.settings.model, self.oracle.resolved.num_steps
        d = 8 if self.fault == "draft_tokens_info" else num_steps + 1
        avg = self.total[0] / self.total[1] if self.total[1] else None
        # an MTP layer: NEXTN, drafted from the target's folder; a block drafter is served as SGLang's DFLASH:
        # num_steps forced to 1, the block = num_draft_tokens (speculative_hook.py _handle_dflash)
        mtp = self.oracle.resolved.head.kind == "mtp"
        block = self.oracle.resolved.head.extra.get("block") is not None
        algo = "NEXTN" if mtp else "DFLASH" if block else "EAGLE3"
        return {"model_path": model.target, "version": "fake", "speculative_algorithm": algo,
                "speculative_num_steps": 1 if block else num_steps, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": d, "speculative_draft_model_path": model.target if mtp else model.draft,
                **({"speculative_dflash_block_size": d} if block else {}),
                "internal_states": [{"avg_spec_accept_length": avg, "last_gen_throughput": 0.0}]}

    def sglang_generate(self, body: dict) -> dict:
        params = body["sampling_params"]
        sampling = {"temperature": params["temperature"], "top_p": params.get("top_p", 1.0),
                    "top_k": params.get("top_k", -1), "min_p": params.get("min_p", 0.0),
                    "seed": params.get("sampling_seed", 0)}
        rec, out = self.decode(body["input_ids"], params["max_new_tokens"], sampling)
        meta = {"id": "x", "prompt_tokens": len(body["input_ids"]), "completion_tokens": len(out),
                "finish_reason": {"type": "length", "length": len(out)}}
        if self.fault != "no_verify_ct":
            c = AcceptanceCounts.from_accepted(rec.accepted_per_cycle, self.num_steps)
            hist = list(c.histogram)
            while hist and hist[-1] == 0:       # SGLang grows the histogram only as far as it was used
                hist.pop()
            meta.update(spec_verify_ct=c.cycles, spec_accept_length=len(out) / c.cycles,
                        spec_accepted_drafts=c.accepted_drafts, spec_proposed_drafts=c.cycles * self.num_steps,
                        spec_accept_rate=c.accepted_drafts / (c.cycles * self.num_steps),
                        spec_accept_histogram=hist)
        return {"text": " ".join(f"w{t}" for t in out), "output_ids": out, "meta_info": meta}

    def vllm_complete(self, body: dict) -> dict:
        assert isinstance(body["prompt"], list)
        sampling = {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed") if k in body}
        rec, out = self.decode(body["prompt"], body["max_tokens"], sampling)
        choice = {"index": 0, "text": "", "finish_reason": "length", "logprobs": None}
        if body.get("return_token_ids"):
            choice["token_ids"] = out
        answer = {"id": "cmpl-x", "object": "text_completion", "model": body.get("model"), "choices": [choice],
                  "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(out),
                            "total_tokens": len(body["prompt"]) + len(out)}, "metrics": None}
        if self.per_request is not None:
            answer["metrics"] = {"time_to_first_token_ms": None, "speculative_decoding": self._spec_metrics(rec)}
        return answer

    def _spec_metrics(self, rec) -> dict:
        """vLLM's per-request metrics for one decode, with every verify step proposing num_steps drafts."""
        c = AcceptanceCounts.from_accepted(rec.accepted_per_cycle, self.num_steps)
        steps = list(rec.accepted_per_cycle)
        if self.fault == "per_step_reversed":
            steps.reverse()
        spec = {"mean_acceptance_length": c.tau or 1.0, "acceptance_histogram": list(c.histogram),
                "num_spec_steps": c.cycles, "num_accepted_draft_tokens": c.accepted_drafts,
                "num_draft_tokens": c.cycles * self.num_steps, "num_spec_tokens": self.num_steps}
        spec["draft_acceptance_rate"] = c.accepted_drafts / spec["num_draft_tokens"] if c.cycles else 0.0
        if self.per_request == "detailed" and steps:
            spec.update(per_step_accepted=steps, per_step_drafted=[self.num_steps] * len(steps))
        return spec


class SimpleRecord:
    """What `_account` and the answers read of a decode: its accepted drafts per cycle."""

    def __init__(self, accepted_per_cycle):
        self.accepted_per_cycle = list(accepted_per_cycle)


def _with_wrong_residual(spec):
    """The speculator with vLLM's rule broken: a rejected draft's replacement sampled from p itself (the draft
    not removed), so the server emits the rejected draft again now and then."""
    from dataclasses import replace

    from eagle_eval.rules.base import coin
    from eagle_eval.rules.vllm import VllmRule

    class WrongResidual(VllmRule):
        def node(self, p, children):
            (d,) = children
            return (0, None) if coin(self.rng) < float(p[d]) else (None, p)

    return replace(spec, policy=WrongResidual(decoding=spec.policy.decoding))


def _handler(engine: Engine):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, payload, content_type="application/json"):
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if engine.backend == "sglang" and self.path in ("/get_server_info", "/server_info"):
                return self._send(200, engine.server_info())
            if engine.backend == "vllm" and self.path == "/metrics":
                from prometheus_client import generate_latest
                return self._send(200, generate_latest(engine.registry), "text/plain; version=0.0.4")
            if engine.backend == "vllm" and self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            path = {"sglang": "/generate", "vllm": "/v1/completions"}[engine.backend]
            if self.path != path:
                return self._send(404, {"detail": "Not Found"})
            if engine.fault == "http_500":
                return self._send(500, {"error": "CUDA error: an illegal memory access was encountered"})
            if engine.fault == "malformed_json":
                return self._send(200, b"<html>502 Bad Gateway</html>", "text/html")
            if engine.fault == "slow":
                time.sleep(3)
            answer = engine.sglang_generate(body) if engine.backend == "sglang" else engine.vllm_complete(body)
            self._send(200, answer)
    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):   # client gave up (timeout)
            super().handle_error(request, client_address)


@contextmanager
def serve(engine: Engine):
    """Run `engine` on 127.0.0.1 at a free port; yields the base URL."""
    httpd = _Server(("127.0.0.1", 0), _handler(engine))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


# -- servers no HTTP library would be: answers that trickle or never end (127.0.0.1, raw sockets) -----------

def _drip(conn, stop: threading.Event, head: bytes, unit: bytes, every: float) -> None:
    """Send `head`, then `unit` every `every` seconds until the client hangs up or the server stops."""
    conn.sendall(head)
    while not stop.wait(every):
        conn.sendall(unit)


RAW_ANSWERS = {
    # slow drip: each byte well inside any per-read timeout, the whole answer never inside the deadline
    "drip_body": lambda conn, stop: _drip(conn, stop, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                          b"Content-Length: 100000\r\n\r\n{\"text\": \"", b"a", 0.05),
    "drip_status": lambda conn, stop: _drip(conn, stop, b"", b"H", 0.05),
    # endless header: header lines (fewer than http.client's 100 before the deadline), or one endless line
    "header_lines": lambda conn, stop: _drip(conn, stop, b"HTTP/1.1 200 OK\r\n", b"X-Wait: 1\r\n", 0.2),
    "header_line": lambda conn, stop: _drip(conn, stop, b"HTTP/1.1 200 OK\r\nX-Wait: ", b"a", 0.01),
    # endless header, fast: http.client's own limit of 100 headers ends it before any deadline
    "header_flood": lambda conn, stop: _drip(conn, stop, b"HTTP/1.1 200 OK\r\n", b"X-Wait: 1\r\n" * 50, 0.01),
}


@contextmanager
def raw_server(answer: str):
    """A socket server on 127.0.0.1 answering every connection with RAW_ANSWERS[answer] (the request is read
    first); yields the base URL. On exit it stops sending and closes every connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.05)
    stop, conns = threading.Event(), []

    def handle(conn):
        try:
            conn.settimeout(5)
            conn.recv(65536)
            RAW_ANSWERS[answer](conn, stop)
        except OSError:                      # the client hung up (its deadline)
            pass
        finally:
            conn.close()

    def serve_forever():
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            thread = threading.Thread(target=handle, args=(conn,), daemon=True)
            conns.append(thread)
            thread.start()

    main = threading.Thread(target=serve_forever, daemon=True)
    main.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        main.join(timeout=5)
        for thread in conns:
            thread.join(timeout=5)
        srv.close()


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
