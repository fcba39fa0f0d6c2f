#!/usr/bin/env python3
"""Kernel-by-kernel table of one step from an ncu CSV (gpu_run.sh's ncudecode stage).

usage: tools/ncu_step.py NCU_CSV [--step N] [--list]

The CSV is `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum` over gpu_bench. Steps
are cut at each launch of the sampling kernel (the last kernel of every step); --step picks one,
counted from the end (-1 the last step, the default -5: gpu_bench's last eager decode step when it
ran three prefills after its decode table). Prints every kernel's time and DRAM bytes read with
--list, then the step's kernels grouped by name: count, total us, MB read and TB/s. ncu serializes
kernels and flushes caches between them, so these are bodies without launch gaps or overlap.
"""
import argparse
import collections
import csv
import re
import sys

TIME = "gpu__time_duration.sum"
DRAM = "dram__bytes_read.sum"


def kernels(path):
    """[(name, grid, {metric: value})] in launch order."""
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if not rows:
        sys.exit(f"ncu_step: no CSV rows in {path}")
    hdr = rows[0]
    col = {k: hdr.index(k) for k in ("ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Value")}
    by_id = collections.OrderedDict()
    for r in rows[1:]:
        k = by_id.setdefault(int(r[col["ID"]]), (r[col["Kernel Name"]], r[col["Grid Size"]], {}))
        k[2][r[col["Metric Name"]]] = float(r[col["Metric Value"]].replace(",", ""))
    return [by_id[i] for i in sorted(by_id)]


def short(name):
    name = re.sub(r"deltaserve::(<unnamed>::|cuda::)?", "", name)
    return re.sub(r"\(.*", "", name).replace("void ", "")[:60]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=-5)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    ks = kernels(a.csv)
    ends = [i for i, k in enumerate(ks) if "sample_kernel" in k[0]]
    if a.step >= 0 or -a.step > len(ends):
        sys.exit(f"ncu_step: --step must be in [-{len(ends)}, -1] ({len(ends)} steps)")
    first = ends[a.step - 1] + 1 if -a.step < len(ends) else 0
    step = ks[first:ends[a.step] + 1]
    groups = collections.OrderedDict()
    for name, grid, m in step:
        us, mb = m.get(TIME, 0.0) / 1e3, m.get(DRAM, 0.0) / 1e6
        if a.list:
            print(f"{short(name):60s} {grid:>14s} {us:9.2f} us {mb:9.2f} MB")
        g = groups.setdefault(short(name), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += us
        g[2] += mb
    total = sum(g[1] for g in groups.values())
    print(f"{len(step)} kernels, {total:.1f} us of kernel bodies")
    print("| kernel | launches | us | MB read | TB/s |")
    print("|---|---|---|---|---|")
    for n, (c, us, mb) in sorted(groups.items(), key=lambda x: -x[1][1]):
        print(f"| {n} | {c} | {us:.1f} | {mb:.1f} | {mb / us if us else 0:.2f} |")


if __name__ == "__main__":
    main()
