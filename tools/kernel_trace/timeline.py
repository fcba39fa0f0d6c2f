#!/usr/bin/env python3
"""Each kernel's share of a CUDA-graph replay, from kernel_trace.so's CSV.

Usage: timeline.py TRACE.csv [--kernels N] [--replay last|median] [--top 25] [--eager-gap-us G]

A replay is the kernels of one graph launch (one correlation id) with N kernels (default: the most
any replay has). With --eager-gap-us, the replays are eager steps instead: the kernels launched
outside graphs, split wherever the GPU idles for more than G us between two of them (the host
waiting on a step), e.g. gpu_bench's timed prefills. Kernels overlap (programmatic dependent launches start before their
predecessor ends), so a kernel's share of the step is how far it moves the step's end: its end
minus the latest end before it, in start order (zero when it ends under an earlier kernel). The
shares add up to the replay's span. Printed: the span, the shares summed by kind of kernel, and the
kernels with the largest shares.
"""
import argparse
import collections
import csv
import re
import statistics

KINDS = [  # (kind, regex on the mangled name), first match wins
    ("gemm (weight-streaming)", r"skinny_gemm"),
    ("gemv", r"gemv"),
    ("gemm (cuBLASLt)", r"nvjet|sm90_xmma|cutlass|gemm|Kernel2"),
    ("split-K reduce (cuBLASLt)", r"splitKreduce"),
    ("gated rms norm", r"gated_rms"),
    ("rms norm", r"rms_norm"),
    ("gdn decode", r"gdn_decode|decode_split"),
    ("gdn chunk prep", r"gdn_chunk.*prep_kernel"),
    ("gdn chunk state pass", r"pass_kernel"),
    ("gdn conv", r"gdn_conv|conv_state"),
    ("attention (prefill)", r"attn_prefill"),
    ("attention (split-KV)", r"attn_split"),
    ("attention combine", r"attn_combine"),
    ("attention prep", r"attn_prep|prep_vec"),
    ("silu mul", r"silu"),
    ("sampling", r"row_stats|sampl|argmax|greedy"),
    ("embedding / gather", r"embed|gather"),
]


def kind_of(name):
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other: " + name[:60]


def replays(rows):
    by_launch = collections.defaultdict(list)
    for r in rows:
        if int(r["graph_id"]) != 0:
            by_launch[int(r["correlation"])].append(r)
    return [sorted(k, key=lambda r: int(r["start"])) for k in by_launch.values()]


def eager_steps(rows, gap_ns):
    kernels = sorted((r for r in rows if int(r["graph_id"]) == 0), key=lambda r: int(r["start"]))
    steps, latest = [], None
    for r in kernels:
        if latest is None or int(r["start"]) - latest > gap_ns:
            steps.append([])
        steps[-1].append(r)
        latest = int(r["end"]) if latest is None else max(latest, int(r["end"]))
    return steps


def shares(kernels):
    out, latest = [], None
    t0 = int(kernels[0]["start"])
    for r in kernels:
        start, end = int(r["start"]), int(r["end"])
        base = t0 if latest is None else latest
        out.append((max(0, end - base), end - start, r))
        latest = end if latest is None else max(latest, end)
    return out, latest - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--kernels", type=int, default=0)
    ap.add_argument("--replay", choices=["last", "median"], default="median")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--eager-gap-us", type=float, default=0.0)
    a = ap.parse_args()
    with open(a.trace) as f:
        rows = list(csv.DictReader(f))
    reps = eager_steps(rows, a.eager_gap_us * 1e3) if a.eager_gap_us > 0 else replays(rows)
    if not reps:
        raise SystemExit("no kernels of that kind in " + a.trace)
    want = a.kernels or max(len(k) for k in reps)
    reps = [k for k in reps if len(k) == want]
    spans = [shares(k)[1] for k in reps]
    pick = reps[-1] if a.replay == "last" else reps[spans.index(sorted(spans)[len(spans) // 2])]
    items, span = shares(pick)
    print(f"{len(reps)} replays of {want} kernels; span median {statistics.median(spans) / 1e3:.1f} us, "
          f"this one {span / 1e3:.1f} us")
    by_kind = collections.defaultdict(lambda: [0, 0, 0])
    for share, dur, r in items:
        k = by_kind[kind_of(r["name"])]
        k[0] += 1
        k[1] += share
        k[2] += dur
    print("| kind | kernels | share of the step us | share % | summed durations us |")
    print("|---|---|---|---|---|")
    for kind, (n, share, dur) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"| {kind} | {n} | {share / 1e3:.1f} | {100 * share / span:.1f} | {dur / 1e3:.1f} |")
    print(f"\n| top kernels by share | grid | share us | duration us |\n|---|---|---|---|")
    for share, dur, r in sorted(items, key=lambda t: -t[0])[: a.top]:
        grid = f"{r['grid_x']}x{r['grid_y']}x{r['grid_z']}"
        print(f"| {kind_of(r['name'])}: {r['name'][:70]} | {grid} | {share / 1e3:.1f} | {dur / 1e3:.1f} |")


if __name__ == "__main__":
    main()
