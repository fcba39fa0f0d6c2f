#!/usr/bin/env python3
"""Tiny random Qwen3.5 checkpoints and HF float32 golden logits for deltaserve's CPU gate.

Runs on the H200 test machine (transformers 5.17, torch 2.11; the GDN runs on HF's pure-PyTorch
fallback, on the CPU here so that no TF32 creeps in). Writes, under --out (default test_data):
  tiny_real/  config.json + model.safetensors            real head dims (hd 256, dk = dv 128), tied
  tiny_odd/   config.json + sharded model-*.safetensors  dk != dv, nv = 2 nk, untied, other theta/rotary
  goldens/<model>.safetensors  per prompt i: prompt.<i>.ids [T] i32, prompt.<i>.logits [T, V] f32
                               per decode case j: decode.<j>.ids [P + D] i32, decode.<j>.prefill_len [1]
                               i32, decode.<j>.logits [D, V] f32 (teacher-forced steps through HF's cache)
Usage: python3 tools/make_goldens.py --out test_data
"""
import argparse
import copy
import glob
import json
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

LIN, FULL = "linear_attention", "full_attention"

MODELS = {
    "tiny_real": dict(
        seed=1,
        text=dict(vocab_size=384, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                  layer_types=[LIN, LIN, LIN, FULL], num_attention_heads=4, num_key_value_heads=2,
                  head_dim=256, linear_num_key_heads=2, linear_num_value_heads=4,
                  linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                  rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=True,
                  eos_token_id=2,
                  rope_parameters=dict(rope_type="default", rope_theta=1e7, partial_rotary_factor=0.25,
                                       mrope_section=[11, 11, 10], mrope_interleaved=True)),
        shard=None,
        prompts=[1, 2, 17, 64, 100, 1100],
        decodes=[(17, 8), (1100, 8)]),
    "tiny_odd": dict(
        seed=2,
        text=dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                  layer_types=[LIN, FULL, LIN, LIN, FULL, LIN], num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
                  linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
                  linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096,
                  tie_word_embeddings=False, eos_token_id=3,
                  rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=0.5,
                                       mrope_section=[3, 3, 2], mrope_interleaved=True)),
        shard="150KB",
        prompts=[3, 65, 129, 1030],
        decodes=[(65, 8), (1030, 4)]),
}

F32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


def randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                v = torch.rand(p.shape, generator=g) * 2 - 1
            elif name.endswith("dt_bias"):
                v = torch.randn(p.shape, generator=g) * 0.5
            elif name.endswith("linear_attn.norm.weight"):
                v = 1 + torch.randn(p.shape, generator=g) * 0.3
            elif p.dim() == 1:
                v = torch.randn(p.shape, generator=g) * 0.3
            else:
                v = torch.randn(p.shape, generator=g) * 0.08
            if not name.endswith(F32_SUFFIXES):
                v = v.to(torch.bfloat16).float()  # what the bf16 file holds, exactly
            p.copy_(v)


def save_checkpoint(model, out_dir, shard):
    """bf16 save_pretrained, then A_log and the gated norm rewritten as F32 as in real checkpoints."""
    f32 = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith(F32_SUFFIXES)}
    shutil.rmtree(out_dir, ignore_errors=True)
    bf = copy.deepcopy(model).to(torch.bfloat16)
    kw = {"max_shard_size": shard} if shard else {}
    bf.save_pretrained(out_dir, **kw)
    total = 0
    for f in sorted(glob.glob(os.path.join(out_dir, "*.safetensors"))):
        sd = load_file(f)
        for k in list(sd):
            if k in f32:
                sd[k] = f32[k].contiguous()
            total += sd[k].numel() * sd[k].element_size()
        save_file(sd, f, metadata={"format": "pt"})
    idx = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        j = json.load(open(idx))
        j.setdefault("metadata", {})["total_size"] = total
        json.dump(j, open(idx, "w"), indent=2)
    keys = []
    for f in sorted(glob.glob(os.path.join(out_dir, "*.safetensors"))):
        keys += list(load_file(f).keys())
    prefixes = sorted({k.split(".layers.")[0] if ".layers." in k else k for k in keys
                       if not k.startswith("model.visual.")})
    print("  saved text keys (non-layer):", prefixes)
    return f32


def golden(name, spec, out):
    print(f"== {name}")
    tc = spec["text"]
    vc = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
              out_hidden_size=tc["hidden_size"], patch_size=16, temporal_patch_size=2,
              spatial_merge_size=2, num_position_embeddings=16)
    cfg = Qwen3_5Config(text_config=tc, vision_config=vc, tie_word_embeddings=tc["tie_word_embeddings"])
    torch.manual_seed(spec["seed"])
    cg = Qwen3_5ForConditionalGeneration(cfg).float().eval()
    randomise(cg, spec["seed"])
    ck = os.path.join(out, name)
    f32 = save_checkpoint(cg, ck, spec["shard"])

    ref, info = Qwen3_5ForCausalLM.from_pretrained(ck, dtype=torch.float32, attn_implementation="eager",
                                                   output_loading_info=True)
    ref.eval()
    assert not info["missing_keys"], info["missing_keys"]
    sd = ref.state_dict()
    for k, v in f32.items():
        assert torch.equal(sd[k.replace("model.language_model.", "model.")].float(), v), k
    print("  loading info ok; F32 params read back exactly; tied:", ref.config.tie_word_embeddings)

    g = torch.Generator().manual_seed(100 + spec["seed"])
    V = tc["vocab_size"]
    tensors = {}
    with torch.no_grad():
        for i, T in enumerate(spec["prompts"]):
            ids = torch.randint(0, V, (T,), generator=g)
            logits = ref(input_ids=ids[None]).logits[0].float()
            if i == 1:
                other = cg(input_ids=ids[None]).logits[0].float()
                print("  CondGen vs ForCausalLM max diff:", (other - logits).abs().max().item())
            tensors[f"prompt.{i}.ids"] = ids.to(torch.int32)
            tensors[f"prompt.{i}.logits"] = logits.contiguous()
            srt = logits.sort(-1, descending=True).values
            print(f"  prompt {i}: T={T} max|logit|={logits.abs().max().item():.3f} "
                  f"min top-2 margin={(srt[:, 0] - srt[:, 1]).min().item():.2e}")
        for j, (P, D) in enumerate(spec["decodes"]):
            ids = torch.randint(0, V, (P + D,), generator=g)
            res = ref(input_ids=ids[None, :P], use_cache=True)
            cache = res.past_key_values
            rows = []
            for t in range(P, P + D):
                res = ref(input_ids=ids[None, t:t + 1], past_key_values=cache, use_cache=True)
                cache = res.past_key_values
                rows.append(res.logits[0, -1].float())
            dec = torch.stack(rows)
            full = ref(input_ids=ids[None]).logits[0, P:].float()
            print(f"  decode {j}: P={P} D={D} max|decode-full|={(dec - full).abs().max().item():.2e}")
            tensors[f"decode.{j}.ids"] = ids.to(torch.int32)
            tensors[f"decode.{j}.prefill_len"] = torch.tensor([P], dtype=torch.int32)
            tensors[f"decode.{j}.logits"] = dec.contiguous()
    os.makedirs(os.path.join(out, "goldens"), exist_ok=True)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "model": name, "dtype": "float32", "attn": "eager", "device": "cpu"}
    save_file(tensors, os.path.join(out, "goldens", f"{name}.safetensors"), metadata=meta)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="test_data")
    ap.add_argument("--only", default=None)
    a = ap.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name, spec in MODELS.items():
        if a.only and a.only != name:
            continue
        golden(name, spec, a.out)


if __name__ == "__main__":
    main()
