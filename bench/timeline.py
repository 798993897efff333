#!/usr/bin/env python3
"""Reads an fa3 timeline (`flashjit bench --timeline FILE` with FLASHJIT_FA3_TUNING=timeline=1) and says
where one CTA's consumer warpgroups spend a key-loop step, and how far apart their QKs end at each
pingpong hand-off (how long the tensor cores stood idle there, given the GEMMs' length at peak).

The file is the module global fj_fa3_timeline (templates/kernels/fa3/timeline.cuh): little-endian u64,
[4 slots][rows][8 points]; slots 0..2 are consumer warpgroups, the producer's slot follows the last
consumer. Points are SM cycles (%clock64); point 7 is the row's kind (1 step, 2 a tile's first block,
3 a tile's last PV, 4 a producer row), 0 for a row not written.

  python3 bench/timeline.py FILE [--rows N] [--gemm-cycles C]
  (N: print the first N rows of each warpgroup, default 0; C: one warpgroup's QK + PV at the pipe's peak)
"""
import argparse
import statistics
import struct
import sys

SLOTS = 4
POINTS = 8
KIND = 7
STEP, FIRST, LAST, PRODUCER = 1, 2, 3, 4
K_WAIT, TURN, ISSUED, S_READY, SOFTMAX, PV_DONE, EPILOGUE = range(7)
K_START, K_ISSUED, V_START, V_ISSUED = range(4)


def load(path):
    data = open(path, "rb").read()
    words = struct.unpack("<%dQ" % (len(data) // 8), data)
    rows = len(words) // (SLOTS * POINTS)
    table = [[list(words[(s * rows + r) * POINTS:(s * rows + r + 1) * POINTS]) for r in range(rows)]
             for s in range(SLOTS)]
    return table


def written(slot_rows, kinds):
    return [r for r in slot_rows if r[KIND] in kinds]


def median(values):
    return statistics.median(values) if values else float("nan")


def pct(values, q):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file")
    parser.add_argument("--rows", type=int, default=0)
    parser.add_argument("--gemm-cycles", type=int, default=0,
                        help="one warpgroup's QK + PV at the tensor pipe's peak, in cycles (0: not estimated)")
    args = parser.parse_args()
    table = load(args.file)
    consumers = [s for s in range(SLOTS) if written(table[s], (STEP, FIRST, LAST))]
    producer = [s for s in range(SLOTS) if written(table[s], (PRODUCER,))]
    if not consumers:
        sys.exit("no consumer rows: was the kernel built with timeline=1 (`.tl`)?")
    origin = min(r[K_WAIT] for s in consumers for r in written(table[s], (STEP, FIRST, LAST)))

    for s in consumers:
        for i, r in enumerate(table[s][:args.rows]):
            if r[KIND]:
                times = " ".join("%7d" % (r[p] - origin if r[p] else -1) for p in range(7))
                print("wg%d row %3d kind %d  %s" % (s, i, r[KIND], times))

    # Per warpgroup, the steady steps (with a PV) phase by phase, in cycles.
    print("consumer steps (cycles, median / 90th percentile):")
    phases = [("K wait + turn wait", K_WAIT, TURN), ("issue (turn held)", TURN, ISSUED),
              ("S latency", ISSUED, S_READY), ("softmax", S_READY, SOFTMAX), ("PV wait + rescale", SOFTMAX, PV_DONE)]
    steps = {s: written(table[s], (STEP,)) for s in consumers}
    for s in consumers:
        line = ["wg%d (%d steps)" % (s, len(steps[s]))]
        for name, a, b in phases:
            d = [r[b] - r[a] for r in steps[s] if r[a] and r[b]]
            line.append("%s %.0f / %.0f" % (name, median(d), pct(d, 0.9)))
        rows = table[s]
        period = [rows[i + 1][K_WAIT] - rows[i][K_WAIT] for i in range(len(rows) - 1)
                  if rows[i][KIND] == STEP and rows[i + 1][KIND] == STEP]
        line.append("step period %.0f / %.0f" % (median(period), pct(period, 0.9)))
        print("  " + "; ".join(line))
    lasts = [r[EPILOGUE] - r[PV_DONE] for s in consumers for r in written(table[s], (LAST,)) if r[EPILOGUE]]
    if lasts:
        print("  epilogue %.0f / %.0f cycles over %d tiles" % (median(lasts), pct(lasts, 0.9), len(lasts)))

    # The tensor cores between hand-offs: S ready marks when a warpgroup's QK ended, and from one
    # warpgroup's S ready to the next warpgroup's the pipe ran the first one's PV and the second one's QK.
    # The spacing, per direction, against that work at the pipe's peak (--gemm-cycles: one warpgroup's
    # QK + PV, e.g. 64 x 160 x 128 x 2 x 2 / 4096 = 1280 for d128 N160) says where it stood idle. (A queue
    # model timed from the last wgmma's issue, session 45's, read 91% idle: issue blocks while the
    # queue is full, so S latency after it is no GEMM's length.)
    ready = sorted((r[S_READY], s) for s in consumers for r in steps[s] if r[S_READY])
    spacing = {}
    for (t0, a), (t1, b) in zip(ready, ready[1:]):
        if a != b:
            spacing.setdefault((a, b), []).append(t1 - t0)
    if spacing:
        parts = ["wg%d -> wg%d %.0f / %.0f" % (a, b, median(d), pct(d, 0.9)) for (a, b), d in sorted(spacing.items())]
        print("S ready to the next warpgroup's S ready (cycles, median / 90th): " + "; ".join(parts))
        if args.gemm_cycles:
            period = sum(median(d) for d in spacing.values())
            idle = max(0.0, period - len(spacing) * args.gemm_cycles)
            print("  against %d cycles of GEMMs per hand-off: the pipe idle ~%.0f of %.0f cycles (%.1f%%)" %
                  (args.gemm_cycles, idle, period, 100.0 * idle / period))

    for s in producer:
        rows = written(table[s], (PRODUCER,))
        k_wait = [r[K_ISSUED] - r[K_START] for r in rows if r[K_ISSUED]]
        v_wait = [r[V_ISSUED] - r[V_START] for r in rows if r[V_ISSUED]]
        print("producer: %d blocks; K slot wait %.0f / %.0f, V slot wait %.0f / %.0f cycles (median / 90th)" %
              (len(rows), median(k_wait), pct(k_wait, 0.9), median(v_wait), pct(v_wait, 0.9)))
    kwaits = [r[TURN] - r[K_WAIT] for s in consumers for r in steps[s] if r[TURN]]
    print("consumers' K + turn wait: median %.0f, 90th %.0f cycles" % (median(kwaits), pct(kwaits, 0.9)))


if __name__ == "__main__":
    main()
