#!/usr/bin/env python3
"""Side-by-side benchmark on the GPU machine: flashjit (through its C ABI) against PyTorch SDPA's
flash (FA-2) and cuDNN backends, on the same tensors, in the same process.

Prefill rows report TFLOP/s (4*B*H*Sq*Sk*D, halved for causal); decode rows report TB/s of KV read.
Timing: CUDA events around at least 4 back-to-back launches, queued behind a spin kernel so that the
host's time to issue them is not counted (see QUEUE_AHEAD_CYCLES_PER_LAUNCH); warm-up first, median of
--iters samples, inputs rotated among enough copies that L2 (50 MB) does not serve them; flashjit's samples alternate with the SDPA
backends' (one of each in turn), so drift within a run weighs on all three alike. Each row also
checks flashjit against cuDNN's output.

--alt-tuning TUNING (an A/B of fa3 plans): a second runtime made with FLASHJIT_FA3_TUNING=TUNING (e.g.
consumer_warpgroups=2) and strict mode is timed beside the planner's kernels, all four samples alternating;
--alt-lib PATH (an A/B of two builds, e.g. the templates before and after a change): that second runtime
comes from another libflashjit.so instead (its kernels, its templates; with --alt-tuning, tuned too);
--rows d128s4096,d128s16384c,1x32768 limits the run to those rows.

--mlir-bundle FILE.fjb (made where LLVM is, e.g. by scripts/make-mlir-parity.sh): a second runtime with
JIT off serves kernels from that bundle (built by the MLIR backend), timed on the same tensors right after
the NVRTC-built ones (issue 5: the MLIR kernel of the same plan within 10% of the NVRTC one).
"""
import argparse
import contextlib
import ctypes
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# (head_dim, seqlen, causal) rows of TARGETS.md; tokens B*S = 16384, heads*head_dim = 2048.
PREFILL_ROWS = [(64, 4096, False), (64, 16384, True), (80, 4096, False), (80, 16384, True), (96, 4096, False),
                (128, 1024, False), (128, 4096, False), (128, 16384, True), (192, 4096, False), (256, 4096, False),
                (256, 16384, True)]
# (batch, kv_len) rows; Hq = 32, Hkv = 8, d = 128, one query token.
DECODE_ROWS = [(1, 32768), (8, 8192), (64, 4096), (1, 131072)]
# Timing: CUDA events; kernels under ~1 ms are timed in back-to-back batches (see median_ms).


class Strides(ctypes.Structure):
    _fields_ = [("batch", ctypes.c_int64), ("token", ctypes.c_int64), ("head", ctypes.c_int64)]


class Problem(ctypes.Structure):
    """Mirror of flashjit_problem in include/flashjit/flashjit.h (initialised by flashjit_problem_init)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("dtype", ctypes.c_int), ("batch", ctypes.c_int32),
                ("seqlen_q", ctypes.c_int32), ("seqlen_k", ctypes.c_int32), ("heads_q", ctypes.c_int32),
                ("heads_kv", ctypes.c_int32), ("head_dim_qk", ctypes.c_int32), ("head_dim_v", ctypes.c_int32),
                ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
                ("lse", ctypes.c_void_p), ("q_strides", Strides), ("k_strides", Strides), ("v_strides", Strides),
                ("o_strides", Strides), ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p),
                ("total_q", ctypes.c_int32), ("total_k", ctypes.c_int32), ("cu_seqlens_q_host", ctypes.c_void_p),
                ("cu_seqlens_k_host", ctypes.c_void_p), ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float), ("scale", ctypes.c_float),
                ("block_table", ctypes.c_void_p), ("seqlens_k", ctypes.c_void_p), ("seqlens_k_host", ctypes.c_void_p),
                ("block_table_host", ctypes.c_void_p), ("page_size", ctypes.c_int32),
                ("max_pages_per_seq", ctypes.c_int32), ("num_pages", ctypes.c_int32), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_size_t), ("flags", ctypes.c_uint64)]


class Options(ctypes.Structure):
    """Mirror of flashjit_options in include/flashjit/flashjit.h."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("backend", ctypes.c_int), ("disk_cache", ctypes.c_int32),
                ("jit", ctypes.c_int32), ("strict", ctypes.c_int32), ("cache_dir", ctypes.c_char_p),
                ("variant", ctypes.c_int)]


VARIANTS = {"auto": 0, "fa2": 1, "fa3": 2}
BACKEND_MLIR = 2  # FLASHJIT_BACKEND_MLIR


class FlashJit:
    def __init__(self, path, variant="auto", bundle=None, fa3_tuning=None):
        self.lib = ctypes.CDLL(path)
        self.lib.flashjit_last_error.restype = ctypes.c_char_p
        self.lib.flashjit_explain.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem), ctypes.c_char_p,
                                              ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        self.lib.flashjit_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem), ctypes.c_void_p]
        self.lib.flashjit_prepare.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem)]
        self.lib.flashjit_plan.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem)]
        self.lib.flashjit_workspace_size.argtypes = [ctypes.c_void_p, ctypes.POINTER(Problem),
                                                     ctypes.POINTER(ctypes.c_size_t)]
        self.runtime = ctypes.c_void_p()
        options = Options()
        self.lib.flashjit_options_init(ctypes.byref(options))
        assert options.struct_size == ctypes.sizeof(Options), "bench/compare.py Options is out of date"
        options.variant = VARIANTS[variant]
        if bundle:  # serve from the bundle alone: a kernel missing there is an error, never a JIT build
            options.jit = 0  # nor a disk-cache hit (that would be an NVRTC build of the same name)
            options.disk_cache = 0
            options.backend = BACKEND_MLIR  # the planner's MLIR plans (a few fa2 tiles differ by backend)
        if fa3_tuning:  # read when the runtime is made; strict: a tuning fa3 cannot take is an error, not fa2
            options.strict = 1
            previous = os.environ.get("FLASHJIT_FA3_TUNING")
            os.environ["FLASHJIT_FA3_TUNING"] = fa3_tuning
        try:
            self.check(self.lib.flashjit_runtime_create(ctypes.byref(options), ctypes.byref(self.runtime)))
        finally:
            if fa3_tuning:
                if previous is None:
                    del os.environ["FLASHJIT_FA3_TUNING"]
                else:
                    os.environ["FLASHJIT_FA3_TUNING"] = previous
        for path in (bundle or "").split(","):
            if path:
                self.check(self.lib.flashjit_register_bundle(self.runtime, path.encode()))
        assert ctypes.sizeof(Problem) >= 8

    def check(self, status):
        if status != 0:
            raise RuntimeError("flashjit: " + self.lib.flashjit_last_error().decode())

    def problem(self, q, k, v, o, causal, lse=None):
        """q/k/v/o are [B, S, H, D] (any strides with a contiguous last dim)."""
        p = Problem()
        self.lib.flashjit_problem_init(ctypes.byref(p))
        assert p.struct_size == ctypes.sizeof(Problem), "bench/compare.py Problem is out of date with flashjit.h"
        p.dtype = 1 if q.dtype == torch.bfloat16 else 0
        p.batch, p.seqlen_q, p.heads_q, p.head_dim_qk = q.shape
        p.seqlen_k, p.heads_kv, p.head_dim_v = k.shape[1], k.shape[2], v.shape[3]
        for name, t in (("q", q), ("k", k), ("v", v), ("o", o)):
            setattr(p, name, t.data_ptr())
            setattr(p, name + "_strides", Strides(t.stride(0), t.stride(1), t.stride(2)))
        p.causal = 1 if causal else 0
        if lse is not None:
            p.lse = lse.data_ptr()
        return p

    def attach_workspace(self, p, keep):
        """Allocate the workspace this runtime's kernel asks for and plan it (once per step in an engine):
        the split-K decode's schedule, the fa3 tail split's scratch (plan zeroes its counters)."""
        size = ctypes.c_size_t()
        self.check(self.lib.flashjit_workspace_size(self.runtime, ctypes.byref(p), ctypes.byref(size)))
        ws = torch.empty(max(size.value, 256), dtype=torch.uint8, device="cuda")
        keep.append(ws)
        p.workspace, p.workspace_bytes = ws.data_ptr(), size.value
        self.check(self.lib.flashjit_plan(self.runtime, ctypes.byref(p)))

    def explain(self, p):
        buf = ctypes.create_string_buffer(4096)
        self.check(self.lib.flashjit_explain(self.runtime, ctypes.byref(p), buf, 4096, None))
        return buf.value.decode()

    def forward(self, p):
        self.check(self.lib.flashjit_forward(self.runtime, ctypes.byref(p),
                                             ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)))


# A spin kernel ahead of each sample's start event, long enough for the host to queue the event, the
# sample's launches and the stop event behind it: the GPU then runs them back to back without idling,
# so a sample is GPU time only. Without it (--queue-ahead-cycles 0, the timing before run 13), every
# sample began with the GPU idle for the host's time to issue the first launch, and a backend whose
# host time per call exceeds its GPU time was timed at its host speed. Run 13 measured PyTorch SDPA's
# host time per prefill call at 170-260 us (flash and cuDNN alike; flashjit's forward is ~5 us), so
# the spin is at least QUEUE_AHEAD_MIN_CYCLES (~0.5 ms at the top clock) and grows with the launches.
QUEUE_AHEAD_CYCLES_PER_LAUNCH = 150_000
QUEUE_AHEAD_MIN_CYCLES = 1_000_000
MAX_SM_CLOCK_HZ = 1.98e9  # the H200's top clock: the spin is shortest there


# Launches a sample times back to back at least. Four keep the GPU busy long enough for its clocks
# to settle under the board's power cap, as in a model's run of layers (run 13f against 13c/d: with
# one launch after an idle GPU, cuDNN's kernels read 2-5% faster and ours about 1%).
MIN_LAUNCHES_PER_SAMPLE = 4


def set_timing(cycles_per_launch, min_launches):
    global QUEUE_AHEAD_CYCLES_PER_LAUNCH, MIN_LAUNCHES_PER_SAMPLE
    QUEUE_AHEAD_CYCLES_PER_LAUNCH = cycles_per_launch
    MIN_LAUNCHES_PER_SAMPLE = min_launches


def queue_ahead_cycles(launches):
    if not QUEUE_AHEAD_CYCLES_PER_LAUNCH:
        return 0
    return max(QUEUE_AHEAD_MIN_CYCLES, QUEUE_AHEAD_CYCLES_PER_LAUNCH * (launches + 1))


def median_ms(fns, iters, per_sample=None):
    """Median time of one launch. Each sample times `per_sample` back-to-back launches (rotating
    inputs) between two events, behind a spin kernel (queue_ahead_cycles); by default as many as run
    in about 1 ms, at least MIN_LAUNCHES_PER_SAMPLE."""
    return median_ms_interleaved([fns], iters, per_sample)[0]


def median_ms_interleaved(fn_sets, iters, per_sample=None, contexts=None):
    """median_ms of several implementations, their samples alternating (A B A B ...), so that clock
    or temperature drift over a long run weighs on all of them alike rather than on the later one.
    contexts: per set, None or a factory of the context its samples run in (an SDPA backend),
    entered outside the two events so it costs the timing nothing."""
    contexts = contexts or [None] * len(fn_sets)

    def entered(context):
        return context() if context else contextlib.nullcontext()

    for fns, context in zip(fn_sets, contexts):
        with entered(context):
            for f in fns[:3]:
                f()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if per_sample is None:
        with entered(contexts[0]):
            start.record()
            fn_sets[0][0]()
            stop.record()
            stop.synchronize()
        per_sample = max(MIN_LAUNCHES_PER_SAMPLE, min(20, int(1.0 / max(start.elapsed_time(stop), 1e-3))))
    times = [[] for _ in fn_sets]
    issue_s = [[] for _ in fn_sets]  # the host's time to issue a sample, against the spin's length
    spin_cycles = queue_ahead_cycles(per_sample)
    for i in range(iters):
        for fns, context, samples, issues in zip(fn_sets, contexts, times, issue_s):
            with entered(context):
                if spin_cycles:
                    torch.cuda._sleep(spin_cycles)
                issue_start = time.perf_counter()
                start.record()
                for j in range(per_sample):
                    fns[(i * per_sample + j) % len(fns)]()
                stop.record()
                issues.append(time.perf_counter() - issue_start)
                stop.synchronize()
            samples.append(start.elapsed_time(stop) / per_sample)
    for k, (issues, samples) in enumerate(zip(issue_s, times)):
        # The GPU idles inside a sample when the host needs longer to issue it than the spin plus the
        # launches before the last take to run.
        budget_s = spin_cycles / MAX_SM_CLOCK_HZ + statistics.median(samples) * 1e-3 * (per_sample - 1)
        if spin_cycles and statistics.median(issues) > budget_s:
            print(f"warning: implementation {k} took {statistics.median(issues) * 1e6:.0f} us to issue a sample, longer "
                  f"than the {budget_s * 1e6:.0f} us the GPU had queued: its time includes host time", file=sys.stderr)
    return [statistics.median(samples) for samples in times]


SDPA_BACKENDS = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))


def time_side_by_side(result, ours, sets, iters, extra=(), **sdpa_args):
    """flashjit (`ours`: launches over the rotated inputs), the (name, launches) pairs of `extra` and
    PyTorch's flash and cuDNN SDPA backends on `sets` (q, k, v as [B, S, H, D]), their samples
    interleaved, into result[name + "_ms"]. A backend that refuses the shape is left out with its error."""
    names, fn_sets, contexts = ["flashjit"], [ours], [None]
    for name, fns in extra:
        names.append(name)
        fn_sets.append(fns)
        contexts.append(None)
    for name, backend in SDPA_BACKENDS:
        fns = [lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), **sdpa_args) for q, k, v, _ in sets]
        context = lambda backend=backend: sdpa_kernel(backend)
        try:
            with context():
                fns[0]()
            torch.cuda.synchronize()
        except Exception as e:  # a backend that refuses the shape
            result[name + "_error"] = str(e).splitlines()[0][:200]
            continue
        names.append(name)
        fn_sets.append(fns)
        contexts.append(context)
    for name, ms in zip(names, median_ms_interleaved(fn_sets, iters, contexts=contexts)):
        result[name + "_ms"] = ms


def copies_for(bytes_per_copy):
    return max(2, min(8, int(2 * 64e6 // max(bytes_per_copy, 1)) + 1))


def time_mlir(fj, mlir, result, problems, mlir_problems, iters, prepare=None):
    """Times the MLIR-built kernel of the same spec (served by the bundle runtime) and, again, the
    NVRTC-built one, their samples interleaved; both times replace nothing but add mlir_* fields
    (flashjit_ms stays the NVRTC time measured beside the SDPA backends)."""
    if mlir is None:
        return
    try:
        if prepare:
            prepare()
        mlir.check(mlir.lib.flashjit_prepare(mlir.runtime, ctypes.byref(mlir_problems[0])))  # load it: explain names its builder
        explained = mlir.explain(mlir_problems[0])
        backend = next((line.split(":", 1)[1].strip() for line in explained.splitlines() if line.startswith("backend:")), "")
        if not backend.startswith("mlir"):
            raise RuntimeError(f"the bundle runtime was served a '{backend}' kernel, not an MLIR-built one")
        result["mlir_kernel"] = explained.splitlines()[0].split()[-1]
        result["mlir_backend"] = backend
        nvrtc_ms, mlir_ms = median_ms_interleaved([[lambda p=p: fj.forward(p) for p in problems],
                                                   [lambda p=p: mlir.forward(p) for p in mlir_problems]], iters)
        result["mlir_ms"], result["nvrtc_interleaved_ms"] = mlir_ms, nvrtc_ms
        result["mlir_vs_nvrtc"] = nvrtc_ms / mlir_ms
    except RuntimeError as e:
        result["mlir_error"] = str(e).splitlines()[0][:200]


def prefill_inputs(d, s, causal, dtype):
    """A prefill row's shape (B*S = 16384, heads*d ~ 2048), enough [B, S, H, D] copies of Q, K, V and O
    that L2 does not serve consecutive launches, and its FLOPs (halved for causal)."""
    tokens, width = 16384, 2048
    b, h = tokens // s, max(1, round(width / d))
    n = copies_for(3 * b * s * h * d * 2)
    sets = []
    for _ in range(n):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype) for _ in range(3))
        sets.append((q, k, v, torch.empty_like(q)))
    return b, h, sets, 4 * b * h * s * s * d / (2 if causal else 1)


def prefill_row(fj, d, s, causal, dtype, iters, mlir=None, alt=None):
    b, h, sets, flops = prefill_inputs(d, s, causal, dtype)
    result = {"op": "prefill", "dtype": str(dtype).split(".")[-1], "head_dim": d, "seqlen": s, "batch": b,
              "heads": h, "causal": causal}
    problems = [fj.problem(q, k, v, o, causal) for q, k, v, o in sets]
    workspaces = []  # alive as long as the problems that point at them
    try:
        for p in problems:  # the fa3 tail split's scratch, as an engine gives it (none for other kernels)
            fj.attach_workspace(p, workspaces)
        fj.check(fj.lib.flashjit_prepare(fj.runtime, ctypes.byref(problems[0])))
        result["kernel"] = fj.explain(problems[0]).splitlines()[0].split()[-1]
        extra = []
        if alt is not None:
            try:
                alt_problems = [alt.problem(q, k, v, o, causal) for q, k, v, o in sets]
                for p in alt_problems:  # the alternative kernel's own scratch
                    alt.attach_workspace(p, workspaces)
                alt.check(alt.lib.flashjit_prepare(alt.runtime, ctypes.byref(alt_problems[0])))
                result["alt_kernel"] = alt.explain(alt_problems[0]).splitlines()[0].split()[-1]
                extra.append(("alt", [lambda p=p: alt.forward(p) for p in alt_problems]))
            except RuntimeError as e:
                result["alt_error"] = str(e).splitlines()[0][:200]
        time_side_by_side(result, [lambda p=p: fj.forward(p) for p in problems], sets, iters, extra,
                          is_causal=causal)
    except RuntimeError as e:
        result["kernel"] = "error: " + str(e)[:200]
        return result
    time_mlir(fj, mlir, result, problems, problems, iters)
    if "flashjit_ms" in result and "cudnn_ms" in result:
        q, k, v, o = sets[0]
        o.fill_(float("nan"))
        fj.forward(problems[0])
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal).transpose(1, 2)
        torch.cuda.synchronize()
        result["max_abs_diff_vs_cudnn"] = (o.float() - ref.float()).abs().max().item()
        if "alt_ms" in result:
            o.fill_(float("nan"))
            alt.forward(alt_problems[0])  # with the alternative kernel's own workspace
            torch.cuda.synchronize()
            result["alt_max_abs_diff_vs_cudnn"] = (o.float() - ref.float()).abs().max().item()
        if "mlir_ms" in result:
            o.fill_(float("nan"))
            mlir.forward(problems[0])
            torch.cuda.synchronize()
            result["mlir_max_abs_diff_vs_cudnn"] = (o.float() - ref.float()).abs().max().item()
    for name in ("flashjit", "alt", "flash", "cudnn"):
        if name + "_ms" in result:
            result[name + "_tflops"] = flops / (result[name + "_ms"] * 1e-3) / 1e12
    if "cudnn_tflops" in result and "flashjit_tflops" in result:
        result["ratio_vs_cudnn"] = result["flashjit_tflops"] / result["cudnn_tflops"]
    if "alt_tflops" in result and "flashjit_tflops" in result:
        result["alt_vs_planner"] = result["alt_tflops"] / result["flashjit_tflops"]
    return result


def paginate(k, v, page_size, keep):
    """[B, L, H, D] -> pages [B*L/page, page, H, D] in shuffled order plus the block table."""
    b, length, h, d = k.shape
    per_seq = (length + page_size - 1) // page_size
    perm = torch.randperm(b * per_seq, device="cuda")
    table = perm.view(b, per_seq).to(torch.int32).contiguous()
    pages_k = torch.empty(b * per_seq, page_size, h, d, device="cuda", dtype=k.dtype)
    pages_v = torch.empty_like(pages_k)
    pad = per_seq * page_size - length
    kk = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).view(b * per_seq, page_size, h, d)
    vv = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).view(b * per_seq, page_size, h, d)
    pages_k[perm] = kk
    pages_v[perm] = vv
    table_host = (ctypes.c_int32 * table.numel())(*table.flatten().tolist())
    lens = torch.full((b,), length, dtype=torch.int32, device="cuda")
    lens_host = (ctypes.c_int32 * b)(*([length] * b))
    keep.extend([pages_k, pages_v, table, lens, table_host, lens_host])
    return pages_k, pages_v, table, lens, table_host, lens_host, per_seq


def decode_row(fj, batch, kv_len, dtype, iters, page_size=0, mlir=None, kv_layout="bshd"):
    hq, hkv, d = 32, 8, 128
    kv_bytes = 2 * batch * kv_len * hkv * d * 2
    n = copies_for(kv_bytes)
    sets = []
    for _ in range(n):
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=dtype)
        if kv_layout == "bhsd":  # [B, S, H, D] views of [B, H, S, D] storage: each KV head's keys contiguous
            k, v = (torch.randn(batch, hkv, kv_len, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(2))
        else:
            k, v = (torch.randn(batch, kv_len, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        sets.append((q, k, v, torch.empty_like(q)))
    result = {"op": "decode", "dtype": str(dtype).split(".")[-1], "batch": batch, "kv_len": kv_len, "heads_q": hq,
              "heads_kv": hkv, "head_dim": d, "page_size": page_size, "kv_layout": kv_layout}
    keep = []
    problems = []
    for q, k, v, o in sets:
        p = fj.problem(q, k, v, o, False)
        if page_size:
            pk, pv, table, lens, table_host, lens_host, per_seq = paginate(k, v, page_size, keep)
            p.k, p.v = pk.data_ptr(), pv.data_ptr()
            p.k_strides = Strides(pk.stride(0), pk.stride(1), pk.stride(2))
            p.v_strides = Strides(pv.stride(0), pv.stride(1), pv.stride(2))
            p.block_table, p.seqlens_k = table.data_ptr(), lens.data_ptr()
            p.block_table_host = ctypes.cast(table_host, ctypes.c_void_p)
            p.seqlens_k_host = ctypes.cast(lens_host, ctypes.c_void_p)
            p.page_size, p.max_pages_per_seq, p.num_pages = page_size, per_seq, pk.shape[0]
        problems.append(p)
    try:
        for p in problems:
            fj.attach_workspace(p, keep)
        result["kernel"] = fj.explain(problems[0]).splitlines()[0].split()[-1]
        ours = [lambda p=p: fj.forward(p) for p in problems]
        if page_size:  # PyTorch has no paged mode: its rows are the contiguous ones
            result["flashjit_ms"] = median_ms(ours, iters)
        else:
            time_side_by_side(result, ours, sets, iters, enable_gqa=True)
        q, k, v, o = sets[0]
        o.fill_(float("nan"))  # the check sees this launch's output, not the timing loop's
        fj.forward(problems[0])
        ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                             v.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
        torch.cuda.synchronize()
        result["max_abs_diff_vs_fp32"] = (o.float() - ref).abs().max().item()
    except RuntimeError as e:
        result["kernel"] = "error"
        result["flashjit_error"] = str(e)[:300]
    if mlir is not None:  # its own workspaces: a plan belongs to one runtime's kernel
        mlir_problems = [Problem.from_buffer_copy(p) for p in problems]
        time_mlir(fj, mlir, result, problems, mlir_problems, iters,
                  prepare=lambda: [mlir.attach_workspace(p, keep) for p in mlir_problems])
        if "mlir_ms" in result:
            result["mlir_tbps"] = kv_bytes / (result["mlir_ms"] * 1e-3) / 1e12
            if "max_abs_diff_vs_fp32" in result:
                o = sets[0][3]
                o.fill_(float("nan"))
                mlir.forward(mlir_problems[0])
                torch.cuda.synchronize()
                result["mlir_max_abs_diff_vs_fp32"] = (o.float() - ref).abs().max().item()
    for name in ("flashjit", "flash", "cudnn"):
        if name + "_ms" in result:
            result[name + "_tbps"] = kv_bytes / (result[name + "_ms"] * 1e-3) / 1e12
    return result


def parse_prefill_rows(text):
    """'d72s4096,d112s16384c' -> [(72, 4096, False), (112, 16384, True)]."""
    rows = []
    for item in text.split(","):
        causal = item.endswith("c")
        d, s = item.rstrip("c").lstrip("d").split("s")
        rows.append((int(d), int(s), causal))
    return rows


def mlir_note(r):
    if "mlir_ms" in r:
        diff = r.get("mlir_max_abs_diff_vs_cudnn", r.get("mlir_max_abs_diff_vs_fp32", -1))
        speed = f"{r['mlir_vs_nvrtc']:.3f}x nvrtc speed" if r.get("mlir_vs_nvrtc") else "no nvrtc time"
        return f"  | mlir {r['mlir_ms'] * 1e3:.1f} us ({speed}, diff {diff:.3g})"
    return f"  | mlir: {r['mlir_error']}" if "mlir_error" in r else ""


def alt_note(r):
    if "alt_ms" in r:
        return (f"  | alt {r['alt_tflops']:6.1f} TFLOP/s ({r['alt_vs_planner']:.3f}x the planner's, diff "
                f"{r.get('alt_max_abs_diff_vs_cudnn', -1):.3g}) {r['alt_kernel']}")
    return f"  | alt: {r['alt_error']}" if "alt_error" in r else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default="build/libflashjit.so")
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--ops", default="prefill,decode")
    ap.add_argument("--variant", default="auto", choices=sorted(VARIANTS),
                    help="force a prefill kernel family (fa2 rows answer issue 2's fa2 >= PyTorch FA-2)")
    ap.add_argument("--mlir-bundle", help="also time the kernels of these MLIR-built bundles (comma-separated; JIT off)")
    ap.add_argument("--alt-tuning", help="also time prefill rows with FLASHJIT_FA3_TUNING=ALT_TUNING (strict mode)")
    ap.add_argument("--alt-lib", help="also time prefill rows with this other build of libflashjit.so")
    ap.add_argument("--decode-kv-layout", default="bshd", choices=("bshd", "bhsd"),
                    help="contiguous decode rows' K/V storage: bshd ([B, S, H, D], the TARGETS rows) or bhsd "
                         "([B, H, S, D]: each KV head's keys contiguous)")
    ap.add_argument("--decode-pages", default="0,16,64", help="page sizes of the decode rows (0: contiguous KV)")
    ap.add_argument("--prefill-rows", help="prefill rows to run instead of TARGETS.md's: d<head_dim>s<seqlen>[c], "
                                           "comma-separated (e.g. d72s4096,d112s16384c for head dims fixed libraries pad)")
    ap.add_argument("--rows", help="only these rows: d<head_dim>s<seqlen>[c] (c: causal) and <batch>x<kv_len>")
    ap.add_argument("--queue-ahead-cycles", type=int, default=QUEUE_AHEAD_CYCLES_PER_LAUNCH,
                    help="spin-kernel cycles per launch queued ahead of each sample's start event (0: none, the old timing)")
    ap.add_argument("--min-launches-per-sample", type=int, default=MIN_LAUNCHES_PER_SAMPLE,
                    help="back-to-back launches a sample times at least")
    args = ap.parse_args()
    set_timing(args.queue_ahead_cycles, args.min_launches_per_sample)
    meta_timing = {"queue_ahead_cycles_per_launch": QUEUE_AHEAD_CYCLES_PER_LAUNCH,
                   "min_launches_per_sample": MIN_LAUNCHES_PER_SAMPLE}
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # makes the primary context current for flashjit
    fj = FlashJit(args.lib, args.variant)
    mlir = FlashJit(args.lib, args.variant, args.mlir_bundle) if args.mlir_bundle else None
    alt = (FlashJit(args.alt_lib or args.lib, args.variant, fa3_tuning=args.alt_tuning)
           if args.alt_tuning or args.alt_lib else None)
    wanted = set(args.rows.split(",")) if args.rows else None

    def selected(name):
        return wanted is None or name in wanted

    rows = []
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "commit": os.environ.get("FLASHJIT_COMMIT", ""), **meta_timing}

    def save():  # after every row: a kernel that kills the CUDA context keeps the rows before it
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)

    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    for dname in args.dtypes.split(","):
        dtype = dtypes[dname]
        if "prefill" in args.ops:
            for d, s, causal in (parse_prefill_rows(args.prefill_rows) if args.prefill_rows else PREFILL_ROWS):
                if not selected(f"d{d}s{s}{'c' if causal else ''}"):
                    continue
                r = prefill_row(fj, d, s, causal, dtype, args.iters, mlir, alt)
                rows.append(r)
                save()
                print(f"prefill {dname} d{d} S{s} {'causal' if causal else 'full  '}: flashjit "
                      f"{r.get('flashjit_tflops', 0):6.1f}  flash {r.get('flash_tflops', 0):6.1f}  cudnn "
                      f"{r.get('cudnn_tflops', 0):6.1f} TFLOP/s  x{r.get('ratio_vs_cudnn', 0):.2f}  "
                      f"diff {r.get('max_abs_diff_vs_cudnn', -1):.3g}  {r['kernel']}{mlir_note(r)}{alt_note(r)}",
                      flush=True)
        if "decode" in args.ops and dname == "bf16":
            for batch, kv in DECODE_ROWS:
                if not selected(f"{batch}x{kv}"):
                    continue
                for page_size in (int(x) for x in args.decode_pages.split(",")):
                    r = decode_row(fj, batch, kv, dtype, args.iters, page_size, mlir, args.decode_kv_layout)
                    rows.append(r)
                    save()
                    print(f"decode {dname} {batch}x{kv} {args.decode_kv_layout} page {page_size:2d}: flashjit {r.get('flashjit_tbps', 0):.2f}  "
                          f"flash {r.get('flash_tbps', 0):.2f}  cudnn {r.get('cudnn_tbps', 0):.2f} TB/s  "
                          f"diff {r.get('max_abs_diff_vs_fp32', -1):.3g}  {r['kernel']} {r.get('flashjit_error', '')}"
                          f"{mlir_note(r)}",
                          flush=True)
    save()


if __name__ == "__main__":
    sys.exit(main())
