#!/usr/bin/env python3
"""HF transformers on the same GPU and shapes as bench/gpu_bench.cpp, for the benchmark table.

Qwen3.5-4B shape (bench/configs/qwen3.5-4b), random bf16 weights, HF's default attention (sdpa)
and its pure-PyTorch GDN fallback (no flash-linear-attention on the test machine). Prints markdown:
prefill ms and tokens/s for prompts of N tokens (one forward, logits for the last position only),
and the decode step time at batch B after a B x C-token prefill (greedy argmax included).
Medians of --iters runs after one warm-up. Runs on the H200 test machine.
Usage: python3 tools/hf_bench.py [--prefill 512,2048,8192] [--batches 1,16,64] [--context 1024]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def timed(fn, iters):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="bench/configs/qwen3.5-4b/config.json")
    ap.add_argument("--prefill", default="512,2048,8192")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    tc = json.load(open(a.config))["text_config"]
    cfg = Qwen3_5TextConfig(**tc)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16).eval()
    V = cfg.vocab_size
    print(f"HF transformers, torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("\n| HF prefill N | ms | tok/s |\n|---|---|---|")
    with torch.no_grad():
        for n in [int(x) for x in a.prefill.split(",") if x]:
            ids = torch.randint(0, V, (1, n), device="cuda")
            ms = timed(lambda: model(input_ids=ids, logits_to_keep=1), max(1, a.iters // 2))
            print(f"| {n} | {ms:.1f} | {n / ms * 1e3:.0f} |", flush=True)
        print("\n| HF decode B | ctx | ms/step | tok/s |\n|---|---|---|---|")
        for b in [int(x) for x in a.batches.split(",") if x]:
            ids = torch.randint(0, V, (b, a.context), device="cuda")
            res = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            cache = res.past_key_values
            nxt = res.logits[:, -1].argmax(-1, keepdim=True)
            ts = []
            for step in range(a.iters + 2):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache = res.past_key_values
                nxt = res.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                if step >= 2:
                    ts.append((time.perf_counter() - t0) * 1e3)
            ms = statistics.median(ts)
            print(f"| {b} | {a.context} | {ms:.2f} | {b / ms * 1e3:.0f} |", flush=True)
            del cache, res
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
