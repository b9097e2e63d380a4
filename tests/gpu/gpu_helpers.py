"""What the GPU tests ask nvidia-smi and an engine's OpenAI endpoint (shared by their modules)."""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request

__all__ = ["complete", "generate_ids", "gpu_pids_of_group", "kill_9_and_check_memory_freed", "model_name", "next_token_logprobs",
           "nvidia_apps", "spec_counters"]


def nvidia_apps() -> dict[int, float]:
    """pid -> MiB of GPU memory for every compute process nvidia-smi lists."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    apps: dict[int, float] = {}
    for line in out.strip().splitlines():
        pid, mib = (x.strip() for x in line.split(","))
        if pid.isdigit():
            apps[int(pid)] = apps.get(int(pid), 0.0) + float(mib)
    return apps


def gpu_pids_of_group(pgid: int) -> dict[int, float]:
    """GPU memory (MiB) by pid of the processes in process group ``pgid``."""
    mine = {}
    for pid, mib in nvidia_apps().items():
        try:
            if os.getpgid(pid) == pgid:
                mine[pid] = mib
        except ProcessLookupError:
            continue
    return mine


def model_name(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def complete(base_url: str, prompt: str, max_tokens: int) -> str:
    """One greedy completion of exactly ``max_tokens`` tokens."""
    body = json.dumps({"model": model_name(base_url), "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _generate(base_url: str, body: dict) -> dict:
    req = urllib.request.Request(f"{base_url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def generate_ids(base_url: str, input_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy token ids of exactly ``max_tokens`` tokens after ``input_ids`` (LMDeploy's ``/generate``:
    tokens in, tokens out, so two engines are compared token by token, not through detokenised text)."""
    out = _generate(base_url, {"input_ids": input_ids, "max_tokens": max_tokens, "temperature": 0.0,
                               "ignore_eos": True})
    return list(out["output_ids"])


def next_token_logprobs(base_url: str, input_ids: list[int], k: int) -> dict[int, float]:
    """The engine's ``k`` most likely next tokens after ``input_ids`` with their log-probabilities under
    the unprocessed distribution: temperature 1 with no top-k / top-p filter, so TurboMind (which reports
    log-probabilities of the filtered, renormalised distribution it samples from) and the PyTorch engine
    (``--logprobs-mode raw_logprobs``) both report ``log_softmax(logits)``. The token drawn is irrelevant."""
    out = _generate(base_url, {"input_ids": input_ids, "max_tokens": 1, "temperature": 1.0, "top_k": 0,
                               "top_p": 1.0, "return_logprob": True, "top_logprobs_num": k})
    tops = out["meta_info"]["output_top_logprobs"][0]
    return {int(tok): float(lp) for lp, tok in tops}


def kill_9_and_check_memory_freed(engines: dict, victim_name: str) -> None:
    """kill -9 of ``engines[victim_name]``'s server: check_health reports it dead with the signal as its
    return code; stopping every engine then leaves none of their processes holding GPU memory (LMDeploy's
    engine process is a child in the same process group and survives the parent). Each engine must hold
    GPU memory before, or the check would prove nothing."""
    import signal
    import time

    import pytest

    from orchestrator.errors import EngineDiedError

    held = {name: gpu_pids_of_group(proc.pid) for name, proc in engines.items()}
    for name, pids in held.items():
        assert pids and sum(pids.values()) > 1024, f"engine {name} holds no GPU memory per nvidia-smi: {pids}"
    victim = engines[victim_name]
    victim.check_health()
    os.kill(victim.pid, signal.SIGKILL)
    time.sleep(1.0)
    with pytest.raises(EngineDiedError):
        victim.check_health()
    assert victim.returncode == -signal.SIGKILL
    for proc in engines.values():
        proc.stop()
    deadline = time.monotonic() + 30
    still: dict[int, float] = {}
    while time.monotonic() < deadline:
        apps = nvidia_apps()
        still = {pid: apps[pid] for pids in held.values() for pid in pids if pid in apps}
        if not still:
            break
        time.sleep(1)
    assert not still, f"GPU memory still held after stop by {still}"


def spec_counters(base_url: str) -> dict[str, float]:
    """The engine's ``lmdeploy:spec_decode_*`` counters from its ``/metrics`` page."""
    from tuning.bench import parse_spec_counters

    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10) as r:
        return parse_spec_counters(r.read().decode())
