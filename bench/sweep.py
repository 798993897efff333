#!/usr/bin/env python3
"""Many fa3 tunings per prefill row in one process (GPU machine): for each row, the planner's kernel,
one runtime per FLASHJIT_FA3_TUNING value (strict: a tuning the row cannot take is reported, not
replaced by fa2) and cuDNN SDPA are timed on the same tensors, their samples interleaved as in
bench/compare.py, so every figure of a row shares its clocks. Where bench/fa3_ab.sh pays a process
and a cuDNN graph per (rows, tuning) pair, this pays one per run.

  python3 bench/sweep.py --lib build-device/libflashjit.so --out sweep.json LIST
LIST: lines "ROWS TUNING|TUNING|..." (ROWS as compare.py's --prefill-rows: d<head_dim>s<seqlen>[c],
comma-separated; shapes B*S = 16384, heads*d ~ 2048), '#' comments. Prints one line per (row, kernel):
TFLOP/s, ratio to the planner's kernel and to cuDNN, max |O - cuDNN's O| (O poisoned with NaN first), the
kernel's name.
"""
import argparse
import ctypes
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (the C ABI mirror and the timing)


def read_list(path):
    lines = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            rows, _, tunings = line.partition(" ")
            lines.append((compare.parse_prefill_rows(rows), [t for t in tunings.strip().split("|") if t]))
    return lines


def sweep_row(runtimes, d, s, causal, dtype, iters):
    _, _, sets, flops = compare.prefill_inputs(d, s, causal, dtype)
    keep = []
    entries = []  # (label, kernel, fns)
    for label, fj in runtimes:
        try:
            problems = [fj.problem(q, k, v, o, causal) for q, k, v, o in sets]
            for p in problems:
                fj.attach_workspace(p, keep)
            fj.check(fj.lib.flashjit_prepare(fj.runtime, ctypes.byref(problems[0])))
            kernel = fj.explain(problems[0]).splitlines()[0].split()[-1]
            entries.append((label, kernel, [lambda fj=fj, p=p: fj.forward(p) for p in problems]))
        except RuntimeError as e:
            entries.append((label, "error: " + str(e).splitlines()[0][:160], None))
    timed = [e for e in entries if e[2] is not None]

    def cudnn_fn(q, k, v):
        return lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal)

    cudnn = [cudnn_fn(q, k, v) for q, k, v, _ in sets]
    fn_sets = [e[2] for e in timed] + [cudnn]
    contexts = [None] * len(timed) + [lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)]
    times = compare.median_ms_interleaved(fn_sets, iters, contexts=contexts)
    tflops = {e[0]: flops / (ms * 1e-3) / 1e12 for e, ms in zip(timed, times)}
    # Each kernel's output against cuDNN's, from NaN-poisoned O: a fast wrong kernel is no candidate.
    q, k, v, o = sets[0]
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ref = cudnn[0]().transpose(1, 2).float()
    diffs = {}
    for label, _, fns in timed:
        o.fill_(float("nan"))
        fns[0]()
        torch.cuda.synchronize()
        diffs[label] = (o.float() - ref).abs().max().item()
    cudnn_tflops = flops / (times[-1] * 1e-3) / 1e12
    base = tflops.get("planner")
    out = []
    for label, kernel, _ in entries:
        t = tflops.get(label)
        out.append({"row": f"d{d}s{s}{'c' if causal else ''}", "dtype": str(dtype).split(".")[-1], "tuning": label,
                    "kernel": kernel, "tflops": t, "cudnn_tflops": cudnn_tflops,
                    "vs_planner": t / base if t and base else None, "vs_cudnn": t / cudnn_tflops if t else None,
                    "max_abs_diff_vs_cudnn": diffs.get(label)})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("list")
    ap.add_argument("--lib", default="build-device/libflashjit.so")
    ap.add_argument("--out", default="sweep.json")
    ap.add_argument("--dtypes", default="bf16")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    planner = compare.FlashJit(args.lib)
    made = {}
    results = []
    for rows, tunings in read_list(args.list):
        runtimes = [("planner", planner)]
        for t in tunings:
            if t not in made:
                made[t] = compare.FlashJit(args.lib, fa3_tuning=t)
            runtimes.append((t, made[t]))
        for d, s, causal in rows:
            for name in args.dtypes.split(","):
                for r in sweep_row(runtimes, d, s, causal, dtypes[name], args.iters):
                    results.append(r)
                    t = f"{r['tflops']:7.1f}" if r["tflops"] else "      -"
                    vp = f"{r['vs_planner']:.3f}" if r["vs_planner"] else "  -  "
                    vc = f"{r['vs_cudnn']:.3f}" if r["vs_cudnn"] else "  -  "
                    diff = r["max_abs_diff_vs_cudnn"]
                    diff_text = f"{diff:.3g}" if diff is not None else "-"
                    print(f"{r['row']:>11} {r['dtype']:>8} {t} x{vp} planner x{vc} cudnn ({r['cudnn_tflops']:.1f})"
                          f" diff {diff_text:<9} [{r['tuning']}] {r['kernel']}", flush=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
