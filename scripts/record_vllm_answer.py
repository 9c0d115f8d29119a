"""Record real vLLM answers with per-request speculative metrics, for tests/test_vllm_per_request.py.

Contract: serves the bundled pair (checkpoints/target + checkpoints/draft, num_speculative_tokens 5,
fp32) with scripts/vllm_cpu.py once per `--per-request-spec-decode-metrics` level asked, sends the
first bundled prompt exactly as server-check's vLLM client does (same body), and writes
tests/data/vllm_0.32_completion_<level>.json: the request, the answer as received, the
`spec_decode` lines of /metrics read before and after it (after: once two reads 0.5 s apart agree),
the server command (paths relative to the repository) and the date. Each level costs one server
start (about 1 minute on 2 cores).

    python scripts/record_vllm_answer.py [--level detailed] [--level summary]

Uses eagle_eval only to render the prompt's token ids (the oracle's own workload).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import vllm_cpu  # noqa: E402

TARGET, DRAFT = REPO / "checkpoints" / "target", REPO / "checkpoints" / "draft"
NUM_STEPS, SERVED_NAME = 5, "bundled-target"


def spec_lines(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return "".join(line + "\n" for line in text.splitlines() if "spec_decode" in line)


def settled(url: str) -> str:
    last = spec_lines(url)
    for _ in range(20):
        time.sleep(0.5)
        now = spec_lines(url)
        if now == last:
            return now
        last = now
    raise RuntimeError("/metrics did not settle")


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def dump(payload: dict) -> str:
    """JSON with one key per line and every list of plain values on one line."""
    def fmt(value, indent: str) -> str:
        inner = indent + " "
        if isinstance(value, dict) and value:
            return "{\n" + ",\n".join(f"{inner}{json.dumps(k)}: {fmt(v, inner)}" for k, v in value.items()) + \
                f"\n{indent}}}"
        if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            return "[\n" + ",\n".join(inner + fmt(v, inner) for v in value) + f"\n{indent}]"
        return json.dumps(value)
    text = fmt(payload, "") + "\n"
    if json.loads(text) != payload:
        raise AssertionError("dump changed the payload")
    return text


def first_prompt():
    from eagle_eval import api
    from eagle_eval.settings import Settings

    config = Settings.of(target=str(TARGET), draft=str(DRAFT), num_steps=NUM_STEPS, dtype="fp32")
    oracle = api.load_oracle(config)
    return api.checked_workload(config, oracle).first_prompts[0], config.workload.max_new_tokens


def record(level: str, prompt, max_new_tokens: int) -> Path:
    extra = ("--per-request-spec-decode-metrics", level, "--served-model-name", SERVED_NAME)
    command = vllm_cpu.server_command(TARGET, 0, DRAFT, {"num_speculative_tokens": NUM_STEPS}, extra)
    command = ["python"] + [c.replace(str(REPO) + "/", "") for c in command[1:]]
    command[command.index("--port") + 1] = "PORT"
    # the same body as eagle_eval/servers/vllm.py VLLMClient.generate
    body = {"model": SERVED_NAME, "prompt": list(prompt.input_ids), "max_tokens": max_new_tokens,
            "temperature": 0.0, "return_token_ids": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    with vllm_cpu.serve(TARGET, DRAFT, {"num_speculative_tokens": NUM_STEPS}, extra_args=extra) as server:
        before = settled(server.url)
        answer = post(server.url, body)
        after = settled(server.url)
    out = REPO / "tests" / "data" / f"vllm_{vllm_cpu.VLLM_VERSION.rsplit('.', 1)[0]}_completion_{level}.json"
    payload = {"recorded": {"by": "scripts/record_vllm_answer.py", "vllm": f"vllm-cpu {vllm_cpu.VLLM_VERSION}",
                            "server_command": command, "prompt_id": prompt.id,
                            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
               "request": body, "response": answer, "metrics_before": before, "metrics_after": after}
    out.write_text(dump(payload))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", action="append", choices=["summary", "detailed"])
    args = parser.parse_args(argv)
    prompt, max_new_tokens = first_prompt()
    for level in args.level or ["detailed", "summary"]:
        print(f"wrote {record(level, prompt, max_new_tokens)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
