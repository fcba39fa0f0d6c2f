#!/usr/bin/env python3
"""HF transformers bf16 logits for the tiny checkpoints, on the GPU, for the same token ids as the
float32 goldens: the reference a bf16 engine is measured against (how far HF's own bf16 forward
is from float32 is the yardstick for ours). Writes goldens/<model>.bf16.safetensors next to the f32
goldens: prompt.<i>.logits and decode.<j>.logits (f32 tensors holding the bf16 run's logits).
Usage (H200 machine): python3 tools/make_bf16_goldens.py --data test_data --out $OUT
"""
import argparse
import os

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="test_data")
    ap.add_argument("--out", default="test_data/goldens")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name in ("tiny_real", "tiny_odd"):
        g = load_file(os.path.join(a.data, "goldens", f"{name}.safetensors"))
        m = Qwen3_5ForCausalLM.from_pretrained(os.path.join(a.data, name), dtype=torch.bfloat16,
                                               attn_implementation="eager").cuda().eval()
        out = {}
        with torch.no_grad():
            i = 0
            while f"prompt.{i}.ids" in g:
                ids = g[f"prompt.{i}.ids"].long().cuda()
                out[f"prompt.{i}.logits"] = m(input_ids=ids[None]).logits[0].float().cpu().contiguous()
                ref = g[f"prompt.{i}.logits"]
                err = (out[f"prompt.{i}.logits"] - ref).abs().max().item()
                agree = (out[f"prompt.{i}.logits"].argmax(-1) == ref.argmax(-1)).float().mean().item()
                print(f"{name} prompt {i} T={ids.numel()}: HF bf16 vs f32 max|err| {err:.3e} "
                      f"rel {err / ref.abs().max().item():.3e} argmax agree {agree:.4f}")
                i += 1
            j = 0
            while f"decode.{j}.ids" in g:
                ids = g[f"decode.{j}.ids"].long().cuda()
                P = int(g[f"decode.{j}.prefill_len"][0])
                res = m(input_ids=ids[None, :P], use_cache=True)
                cache, rows = res.past_key_values, []
                for t in range(P, ids.numel()):
                    res = m(input_ids=ids[None, t:t + 1], past_key_values=cache, use_cache=True)
                    cache = res.past_key_values
                    rows.append(res.logits[0, -1].float().cpu())
                out[f"decode.{j}.logits"] = torch.stack(rows).contiguous()
                j += 1
        save_file(out, os.path.join(a.out, f"{name}.bf16.safetensors"),
                  metadata={"transformers": transformers.__version__, "torch": torch.__version__,
                            "dtype": "bfloat16", "device": "cuda", "attn": "eager"})


if __name__ == "__main__":
    main()
