#!/usr/bin/env python3
"""A kernel's time by phase from ncu's source-level counters (gpu_run.sh's ncusrc stage).

usage: tools/ncu_phases.py SASS_CSV [--top N]

The CSV is `ncu -i REPORT --page source --csv --print-source sass` of one kernel launch profiled
with `--set full --import-source yes`. A phase is the SASS between two block barriers (BAR.SYNC /
BAR.RED / BAR.ARV), in address order: for kernels written as barrier-separated steps (the GDN chunk
prep, the state pass) that is one step of the source each. Prints the warp stall reasons over the
whole kernel, then each phase's share of the warp samples (with the samples of the barrier's wait,
which ncu charges to the instruction after it, at the start of the next phase), its executed warp
instructions and its main instruction classes; then the --top instructions by samples. Samples are
where warps stalled or issued: a phase's share is its share of the kernel's warp time.
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
CLASSES = ("HMMA", "MUFU", "FFMA", "FMUL", "FADD", "LDS", "STS", "LDG", "STG", "LDGSTS", "SHFL",
           "UTMALDG", "UTMASTG", "SYNCS", "DEPBAR", "STL", "LDL")


def rows(path):
    """(header index, [row]) of the SASS table (the file's first line names the kernel)."""
    with open(path, newline="") as f:
        table = list(csv.reader(f))
    for i, r in enumerate(table):
        if "Address" in r and "Source" in r and SAMPLES in r:
            hdr = {h: k for k, h in enumerate(r)}
            return hdr, [x for x in table[i + 1:] if len(x) >= len(r)]
    sys.exit(f"ncu_phases: no SASS table with '{SAMPLES}' in {path}")


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def number(text):
    try:
        return int(float(text or 0))
    except ValueError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    hdr, data = rows(a.csv)
    stalls = [h for h in hdr if h.startswith("stall_") and "(Not Issued)" not in h]
    total = sum(number(r[hdr[SAMPLES]]) for r in data) or 1
    print(f"warp samples: {total}")
    by_reason = {s: sum(number(r[hdr[s]]) for r in data) for s in stalls}
    print("| stall | share |\n|---|---|")
    for s, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:10]:
        print(f"| {s[6:]} | {100 * v / total:.1f}% |")
    phases, cur = [], None
    for r in data:
        if cur is None:
            cur = {"first": r[hdr["Address"]], "samples": 0, "executed": 0,
                   "mix": collections.Counter()}
        op = opcode(r[hdr["Source"]])
        cur["samples"] += number(r[hdr[SAMPLES]])
        cur["executed"] += number(r[hdr[EXECUTED]])
        if op in CLASSES and number(r[hdr[EXECUTED]]) > 0:
            cur["mix"][op] += number(r[hdr[EXECUTED]])
        cur["last"] = r[hdr["Address"]]
        if op == "BAR":
            phases.append(cur)
            cur = None
    if cur is not None:
        phases.append(cur)
    print("\n| phase | addresses | share of samples | warp instructions | main classes |")
    print("|---|---|---|---|---|")
    for i, p in enumerate(phases):
        mix = ", ".join(f"{k} {v}" for k, v in p["mix"].most_common(4))
        print(f"| {i} | {p['first'][-6:]}-{p['last'][-6:]} | {100 * p['samples'] / total:.1f}% "
              f"| {p['executed']} | {mix} |")
    print(f"\n| samples | address | instruction |\n|---|---|---|")
    top = sorted(data, key=lambda r: -number(r[hdr[SAMPLES]]))[:a.top]
    for r in top:
        print(f"| {number(r[hdr[SAMPLES]])} | {r[hdr['Address']][-6:]} | "
              f"`{r[hdr['Source']].strip()[:70]}` |")


if __name__ == "__main__":
    main()
