#!/usr/bin/env python3
"""Real-size check data for the CUDA backend: a random Qwen3.5-4B-shaped checkpoint and HF logits.

Runs on the H200 test machine (transformers 5.17, torch 2.11; the GDN on HF's pure-PyTorch
fallback). Writes under --out (default /tmp/q4b_check; 8.4 GB, never carried back):
  ckpt/            config.json + model-*.safetensors: Qwen3_5ForCausalLM.save_pretrained in bf16,
                   the shapes of bench/configs/qwen3.5-4b (HF init, 1-D parameters randomised)
  ref.safetensors  per case c in (short, long):
                     c.ids  [T] i32      the prompt (random ids)
                     c.rows [R] i32      the positions compared
                     c.f32  [R, V] f32   HF float32 logits (GPU, TF32 off)   -- the reference
                     c.bf16 [R, V] f32   HF bfloat16 logits                  -- the yardstick
tests/gpu/real_size_test.cpp (DS_REAL_CHECK_DIR=<out>) compares the CUDA forward with them.
Usage: python3 tools/make_4b_check.py [--out DIR] [--long 4640]
"""
import argparse
import json
import os
import shutil
import time

import torch
from safetensors.torch import save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/q4b_check")
    ap.add_argument("--config", default="bench/configs/qwen3.5-4b/config.json")
    ap.add_argument("--short", type=int, default=64)
    ap.add_argument("--long", type=int, default=4640)
    ap.add_argument("--rows", type=int, default=128, help="last positions of the long prompt compared")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    tc = json.load(open(a.config))["text_config"]
    cfg = Qwen3_5TextConfig(**tc)
    torch.manual_seed(4)
    with torch.device("cuda"):
        model = Qwen3_5ForCausalLM(cfg).float().eval()
    g = torch.Generator(device="cuda").manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g, device="cuda") * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + torch.randn(p.shape, generator=g, device="cuda") * 0.1)
            elif p.dim() == 1 and not name.endswith("A_log"):
                p.copy_(torch.randn(p.shape, generator=g, device="cuda") * 0.1)
            p.copy_(p.to(torch.bfloat16).float())  # exactly what the bf16 file holds
    ck = os.path.join(a.out, "ckpt")
    shutil.rmtree(ck, ignore_errors=True)
    with torch.device("cuda"):
        bf = Qwen3_5ForCausalLM(cfg).to(torch.bfloat16).eval()
    bf.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
    bf.save_pretrained(ck)
    print(f"saved {ck} in {time.time() - t0:.1f} s", flush=True)

    V = cfg.vocab_size
    gi = torch.Generator().manual_seed(6)
    out = {}
    with torch.no_grad():
        for case, T, R in (("short", a.short, a.short), ("long", a.long, a.rows)):
            ids = torch.randint(0, V, (T,), generator=gi)
            rows = torch.arange(T - R, T, dtype=torch.int32)
            x = ids[None].cuda()
            f = model(input_ids=x, logits_to_keep=R).logits[0].float()
            b = bf(input_ids=x, logits_to_keep=R).logits[0].float()
            agree = (f.argmax(-1) == b.argmax(-1)).float().mean().item()
            lp_err = (torch.log_softmax(f, -1) - torch.log_softmax(b, -1)).abs().max().item()
            srt = f.sort(-1, descending=True).values
            print(f"{case}: T={T} R={R} max|logit| {f.abs().max().item():.3f} median top-2 margin "
                  f"{(srt[:, 0] - srt[:, 1]).median().item():.3e}; HF bf16 vs f32: argmax "
                  f"{agree:.4f}, max|dlogprob| {lp_err:.4f}", flush=True)
            out[f"{case}.ids"] = ids.to(torch.int32)
            out[f"{case}.rows"] = rows
            out[f"{case}.f32"] = f.cpu().contiguous()
            out[f"{case}.bf16"] = b.cpu().contiguous()
    save_file(out, os.path.join(a.out, "ref.safetensors"))
    print(f"done in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
