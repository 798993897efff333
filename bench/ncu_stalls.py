#!/usr/bin/env python3
"""Reads Nsight Compute's source page as CSV on stdin (`ncu --import R.ncu-rep --page source --csv
--print-source sass`) and prints the SASS lines with the most warp-stall samples, each with its share
of all samples, so a profile says which instruction (which barrier, which wait) the warps sit on.
  ncu --import r.ncu-rep --page source --csv --print-source sass | python3 bench/ncu_stalls.py [--top N]
"""
import argparse
import csv
import sys


def column(header, *words):
    """The first column whose name holds every word (Nsight Compute's names vary between versions)."""
    for i, name in enumerate(header):
        if all(w.lower() in name.lower() for w in words):
            return i
    return None


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    rows = [r for r in csv.reader(sys.stdin) if r]
    start = next((i for i, r in enumerate(rows) if column(r, "source") is not None and
                  column(r, "stall", "sampling") is not None), None)
    if start is None:
        print("no source page with stall samples; first lines:")
        for r in rows[:5]:
            print(",".join(r)[:300])
        return 1
    header = rows[start]
    source = column(header, "source")
    address = column(header, "address")
    samples = column(header, "stall", "sampling", "all") or column(header, "stall", "sampling")
    lines = [r for r in rows[start + 1:] if len(r) == len(header)]
    total = sum(number(r[samples]) for r in lines) or 1.0
    print(f"{header[samples]}: {total:.0f} samples over {len(lines)} SASS lines")
    for r in sorted(lines, key=lambda r: number(r[samples]), reverse=True)[:args.top]:
        where = r[address] if address is not None else ""
        print(f"{100 * number(r[samples]) / total:6.2f}%  {where:>8}  {r[source].strip()[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
