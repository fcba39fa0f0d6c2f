#!/usr/bin/env python3
"""Writes bench/results/h200.json from gpu_bench markdown output of one H200 run.

usage: tools/h200_json.py --commit SHA --date YYYY-MM-DD [--base-commit SHA --base FILE...]
                          [--fla fla_bench.jsonl] [--gdn NAME=MS ...] [--attn attn_bench.md]
                          [--gdn-decode NAME=gpu_bench.md ...] [--serve serve8k.jsonl
                          --serve-flags STR] [--offline offline8k.jsonl]
                          [--decode-ctx gpu_bench.md ...] [--mixed gpu_bench.md]
                          FILE...    (gpu_bench outputs of the same commit; medians across them;
                                      give them first: --decode-from and the other list options
                                      take every argument after them)
       tools/h200_json.py --commit SHA --date YYYY-MM-DD --prefix prefix_bench.jsonl
                          (only the prefix_cache key: gpu_run.sh's prefix stage, cache on vs off)

Keys (snake case, units in the names): commit, date, gpu, decode_ms (graphed, per batch size, at
the context the bench used), decode_eager_ms, prefill_ms (per length), runs, base_* for an A/B
against another commit, and gdn_chunk_ms_per_layer: ours (--gdn 1x8192=4.45) beside fla's
CUDA-graph medians from ../shared/peers/fla_bench.py's JSON lines (--fla) of the same session (or,
where fla got nothing in, its last figures, marked; the table replaced is kept as "previous"),
and gdn_decode_us_per_layer: fla's fused recurrent kernel per batch size (--fla) beside our fused
decode layer's (--gdn-decode, from gpu_bench's per-op tables); serve_8k_1k from gpu_run.sh
serve8k's JSON lines (--serve; rows not run again kept with their commit, the rows replaced kept
as earlier_by_concurrency), offline_8k_1k from its offline8k ones (--offline: the same workload
without HTTP, and serve's TPOT over offline's), decode_ms_ctx<N>k from gpu_bench runs at another
context (--decode-ctx); mixed_step_ms from gpu_bench --mixed's table (--mixed: per number of decode
rows, the step's ms beside its prefill chunk alone); decode_ms from other gpu_bench outputs than the prefill's (--decode-from,
with decode_commit); attention_prefill_tflops
(per shape) and attention_prefill_tflops_8k from attn_bench's table (--attn);
prefix_cache: per setting (on / off) the multi-turn run (hit rate, TTFT, tok/s) and the median
tok/s, TTFT and TPOT of the never-hitting runs. Other keys already in the file are kept.
"""
import argparse
import json
import re
import statistics
from pathlib import Path


def parse(path):
    decode, eager, prefill, ctx = {}, {}, {}, None
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and re.fullmatch(r"\d+", cells[0]) and re.fullmatch(r"\d+", cells[1]):
            decode[cells[0]] = float(cells[3])
            eager[cells[0]] = float(cells[2])
            ctx = int(cells[1])
        elif len(cells) == 5 and re.fullmatch(r"\d+", cells[0]) and "%" in cells[4]:
            prefill[cells[0]] = float(cells[1])
    return decode, eager, prefill, ctx


def medians(files):
    """Per table (decode, eager decode, prefill), each row's median over the runs that have it
    (runs may cover different prefill lengths or batch sizes); rows in first-seen order."""
    runs = [parse(f) for f in files]
    out = []
    for k in range(3):
        keys = list(dict.fromkeys(key for r in runs for key in r[k]))
        out.append({key: round(statistics.median(r[k][key] for r in runs if key in r[k]), 3)
                    for key in keys})
    return out, runs[0][3]


def mixed(path, commit):
    """gpu_bench --mixed's rows as mixed_step_ms: {"commit", "ctx", "<B>_decode_rows": {...}}."""
    out = {"commit": commit}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and all(re.fullmatch(r"[\d.]+", c) for c in cells) and \
                "." in cells[3] and "." not in cells[2]:
            out["ctx"] = int(cells[1])
            out[f"{cells[0]}_decode_rows"] = {"prefill_tokens": int(cells[2]), "ms": float(cells[3]),
                                              "prefill_alone_ms": float(cells[4])}
    return out


def attention(path):
    """attn_bench's rows as {"1x8192": TFLOP/s, "1x2048+6144": ...}."""
    out = {}
    for line in Path(path).read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+ x \d+", cells[0]):
            shape = cells[0].replace(" ", "") + (f"+{cells[1]}" if cells[1] != "0" else "")
            out[shape] = float(cells[3])
    return out


def gdn_decode_ours(path):
    """The fused GDN decode kernel's microseconds per layer call, per batch size, from gpu_bench's
    per-op tables ("eager decode step, B=N" blocks, op gdn_decode_fused)."""
    out, batch = {}, None
    for line in Path(path).read_text().splitlines():
        m = re.match(r"eager decode step, B=(\d+)", line)
        if m:
            batch = m.group(1)
        elif not line.strip() or not line.startswith("  "):
            batch = None
        elif batch and line.split()[0] == "gdn_decode_fused":
            total_ms, calls = float(line.split()[1]), int(line.split()[2])
            out[batch] = round(total_ms / calls * 1e3, 2)
    return out


def json_objects(path):
    """Every JSON value in a file, however the lines break (serve8k writes one over two lines)."""
    text, dec, at, out = Path(path).read_text(), json.JSONDecoder(), 0, []
    while True:
        while at < len(text) and text[at].isspace():
            at += 1
        if at >= len(text):
            return out
        value, at = dec.raw_decode(text, at)
        out.append(value)


def latency_cells(run):
    return {"total_tok_s": run["total_tok_per_s"], "ttft_ms": run["ttft_ms"],
            "tpot_ms": run["tpot_ms"], "itl_ms": run.get("itl_ms"),
            "num_prompts": run["num_prompts"]}


def serve(path, commit, date, flags, old):
    """gpu_run.sh serve8k's JSON lines as serve_8k_1k: the table's other keys (SGLang's published
    cells, the fp8 rows, notes) kept; the rows of concurrencies not run again kept in
    by_concurrency, each marked with its commit and flags; the rows it replaces kept under
    "earlier_by_concurrency" with their commit and flags (the earlier table before them under its
    "previous")."""
    by_c = {str(r["concurrency"]): latency_cells(r["run"]) for r in json_objects(path) if r["run"]}
    old = dict(old or {})
    old_rows = dict(old.pop("by_concurrency", {}))
    old_commit, old_flags = old.pop("commit", None), old.pop("flags", None)
    old.pop("date", None)
    earlier = old.pop("earlier_by_concurrency", None)
    replaced = {k: old_rows.pop(k) for k in list(old_rows) if k in by_c}
    for row in old_rows.values():
        row.setdefault("commit", old_commit)
        row.setdefault("flags", old_flags)
    out = {"commit": commit, "date": date, "flags": flags,
           "by_concurrency": {**by_c, **old_rows}, **old}
    if replaced:
        out["earlier_by_concurrency"] = {"commit": old_commit, "flags": old_flags,
                                         "by_concurrency": replaced}
        if earlier:
            out["earlier_by_concurrency"]["previous"] = earlier
    elif earlier:
        out["earlier_by_concurrency"] = earlier
    return out


def offline(path, commit, serve_doc):
    """gpu_run.sh offline8k's lines as offline_8k_1k, with serve's TPOT p50 over offline's per
    concurrency where serve_8k_1k has it (HTTP's cost)."""
    by_c = {str(r["max_concurrency"]): latency_cells(r) for r in json_objects(path) if r}
    out = {"commit": commit, "by_concurrency": by_c}
    served = (serve_doc or {}).get("by_concurrency", {})
    out["http_tpot_p50_over_offline"] = {
        c: round(served[c]["tpot_ms"]["p50"] / v["tpot_ms"]["p50"], 4)
        for c, v in by_c.items() if c in served}
    return out


def prefix_cache(path, commit, date):
    runs = json_objects(path)
    out = {"commit": commit, "date": date}
    for mode in ("on", "off"):
        mine = [r["run"] for r in runs if r["prefix_caching"] == mode and r["run"]]
        multi = [r for r in mine if r.get("workload") == "multi-turn"]
        rand = [r for r in mine if r.get("workload") != "multi-turn"]
        med = lambda xs: round(statistics.median(xs), 3)
        out[mode] = {
            "multi_turn": {k: multi[0][k] for k in ("num_clients", "turns", "system_len", "turn_len",
                                                   "output_len", "hit_rate", "total_tok_per_s",
                                                   "ttft_ms", "later_turns")} if multi else None,
            "no_hit_1k_256_c64": {"runs": len(rand),
                                  "total_tok_s": med([r["total_tok_per_s"] for r in rand]),
                                  "ttft_ms_p50": med([r["ttft_ms"]["p50"] for r in rand]),
                                  "tpot_ms_mean": med([r["tpot_ms"]["mean"] for r in rand])},
        }
    return out


def chunk_table(gdn, commit, old):
    """gdn_chunk_ms_per_layer from this run's ours (and fla, when it ran): the table it replaces
    kept under "previous" (one level), and where fla did not run (its budget, a fresh machine's
    compiles) its last figures kept beside ours, marked with the commit they were measured at."""
    new = {"ours": gdn["ours"], "commit": commit}
    if gdn["fla"]:
        new["fla"] = gdn["fla"]
    elif old.get("fla"):
        new["fla"] = old["fla"]
        new["fla_measured_at"] = old.get("fla_measured_at", old.get("commit"))
    if old:
        new["previous"] = {k: v for k, v in old.items() if k != "previous"}
    return new


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--base-commit")
    ap.add_argument("--base", nargs="*", default=[])
    ap.add_argument("--out", default="bench/results/h200.json")
    ap.add_argument("--fla")
    ap.add_argument("--gdn", nargs="*", default=[])
    ap.add_argument("--prefix")
    ap.add_argument("--attn", help="attn_bench's table (ms per layer, TFLOP/s per shape)")
    ap.add_argument("--gdn-decode", nargs="*", default=[],
                    help="NAME=gpu_bench.md: our fused GDN decode us per layer (e.g. ours=f32.md "
                         "ours_bf16_state=bf16.md)")
    ap.add_argument("--serve", help="gpu_run.sh serve8k's serve8k.jsonl")
    ap.add_argument("--serve-flags", default="")
    ap.add_argument("--offline", help="gpu_run.sh offline8k's offline8k.jsonl (after --serve's)")
    ap.add_argument("--decode-ctx", nargs="*", default=[],
                    help="gpu_bench outputs of decode at another context: decode_ms_ctx<N>")
    ap.add_argument("--mixed", help="gpu_bench --mixed output: mixed_step_ms")
    ap.add_argument("--decode-from", nargs="*", default=[],
                    help="take decode_ms / decode_eager_ms from these gpu_bench outputs instead "
                         "(a build of the same run whose decode path is the same)")
    ap.add_argument("--decode-commit", help="the build --decode-from came from")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    path = Path(a.out)
    doc = json.loads(path.read_text()) if path.exists() else {}
    if a.prefix:
        doc["prefix_cache"] = prefix_cache(a.prefix, a.commit, a.date)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        return
    (decode, eager, prefill), ctx = medians(a.files)
    doc.update({"commit": a.commit, "date": a.date, "gpu": "NVIDIA H200", "runs": len(a.files),
                "decode_context_tokens": ctx, "decode_ms": decode, "decode_eager_ms": eager,
                "prefill_ms": prefill})
    if a.decode_from:
        (decode, eager, _), ctx = medians(a.decode_from)
        doc.update({"decode_context_tokens": ctx, "decode_ms": decode, "decode_eager_ms": eager,
                    "decode_commit": a.decode_commit or a.commit})
    else:
        doc.pop("decode_commit", None)
    if a.base:
        (bd, be, bp), _ = medians(a.base)
        doc.update({"base_commit": a.base_commit, "base_decode_ms": bd, "base_decode_eager_ms": be,
                    "base_prefill_ms": bp})
    if a.fla or a.gdn:
        gdn = {"ours": {k: float(v) for k, v in (x.split("=") for x in a.gdn)}, "fla": {}}
        decode = {}
        for line in Path(a.fla).read_text().splitlines() if a.fla else []:
            d = json.loads(line)
            # The 4B shape (16 q/k heads, 32 v heads) fresh: variants gva16 and gva16_varlen8x1024.
            if d.get("section") == "a" and d.get("ms_graph") is not None and \
                    d.get("variant") in ("gva16", "gva16_varlen8x1024"):
                shape = ("8x1024" if d.get("varlen") else f"1x{d['tokens']}")
                gdn["fla"][shape] = d["ms_graph"]
            if d.get("section") == "b" and d.get("variant") == "gva16" and d.get("us_graph"):
                decode[str(d["B"])] = d["us_graph"]
        if gdn["ours"]:  # fla's alone go beside the ours they were measured with
            doc["gdn_chunk_ms_per_layer"] = chunk_table(gdn, a.commit,
                                                        doc.get("gdn_chunk_ms_per_layer", {}))
        elif gdn["fla"]:
            doc.setdefault("gdn_chunk_ms_per_layer", {})[f"fla_at_{a.commit}"] = gdn["fla"]
        if decode:
            doc["gdn_decode_us_per_layer"] = {"fla": decode, "commit": a.commit}
    for spec in a.gdn_decode:
        name, md = spec.split("=", 1)
        doc.setdefault("gdn_decode_us_per_layer", {"commit": a.commit})[name] = gdn_decode_ours(md)
    if a.serve:
        doc["serve_8k_1k"] = serve(a.serve, a.commit, a.date, a.serve_flags, doc.get("serve_8k_1k"))
    if a.offline:
        doc["offline_8k_1k"] = offline(a.offline, a.commit, doc.get("serve_8k_1k"))
    if a.decode_ctx:
        (dd, _, _), dctx = medians(a.decode_ctx)
        doc[f"decode_ms_ctx{dctx // 1024}k"] = {"commit": a.commit, **dd}
    if a.mixed:
        doc["mixed_step_ms"] = mixed(a.mixed, a.commit)
    if a.attn:
        doc["attention_prefill_tflops"] = attention(a.attn)
        doc["attention_prefill_tflops_8k"] = doc["attention_prefill_tflops"].get("1x8192")
        doc["attention_prefill_commit"] = a.commit
    path.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
