#!/usr/bin/env python3
"""/metrics must be valid Prometheus text exposition format, checked with the official client's
parser (Debian's python3-prometheus-client): a served model name with a quote, a backslash and a
long tail, after a request so the histograms hold samples.

usage: metrics_format_test.py DELTASERVE_BINARY TOKENIZER_DIR
"""
import json
import re
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

NAME = 'my"model\\name-' + "x" * 300


def main():
    binary, tokenizer = sys.argv[1], sys.argv[2]
    server = subprocess.Popen(
        [binary, "serve", "--port", "0", "--tokenizer", tokenizer, "--served-model-name", NAME],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = None
        for line in server.stdout:
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port, "the server did not print its address"
        base = f"http://127.0.0.1:{port}"
        body = json.dumps({"prompt": "Hello", "max_tokens": 3}).encode()
        req = urllib.request.Request(base + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(req, timeout=60).status == 200
        text = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        families = list(text_string_to_metric_families(text))
        names = {f.name for f in families}
        assert len(families) >= 15, f"{len(families)} metric families"
        # vLLM's names beside ours, for its dashboards.
        for vllm in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:prompt_tokens", "vllm:generation_tokens",
                     "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
            assert vllm in names, (vllm, sorted(names))
        # The engine thread's forward and host seconds: both counted once a step has run.
        by_name = {f.name: f for f in families}
        for ours in ("deltaserve_engine_forward_seconds", "deltaserve_engine_host_seconds"):
            assert ours in by_name, (ours, sorted(names))
            assert by_name[ours].samples[0].value > 0, (ours, by_name[ours].samples)
        histograms = [f for f in families if f.type == "histogram"]
        assert len(histograms) == 6, [f.name for f in histograms]
        for f in histograms:
            counts = [s for s in f.samples if s.name.endswith("_count")]
            assert len(counts) == 1 and counts[0].value >= 1, (f.name, counts)
        for f in families:
            for s in f.samples:
                assert s.labels.get("model_name") == NAME, (s.name, s.labels)
        print(f"ok: {len(families)} families, {sum(len(f.samples) for f in families)} samples")
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()
