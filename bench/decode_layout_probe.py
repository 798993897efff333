#!/usr/bin/env python3
"""Does the KV cache's memory layout limit decode bandwidth? (GPU machine; a probe, not a benchmark row.)

compare.py's decode rows store K/V as [B, L, Hkv, D] (token-major: a kv head's 64-key tile is 64 rows of
256 bytes, 2 KB apart). This times flashjit's decode and cuDNN SDPA on the same values stored token-major
and head-major ([B, Hkv, L, D] viewed as [B, L, Hkv, D]: a tile is one contiguous 16 KB run), samples of
the four alternating, with compare.py's timing. flashjit takes either through its strides.
  python3 bench/decode_layout_probe.py --lib build-device/libflashjit.so [--rows 64x4096,1x32768]
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from compare import FlashJit, copies_for, median_ms_interleaved


def layouts(batch, kv_len, hkv, d, dtype):
    """The same K (or V) values token-major and head-major, both as [B, L, Hkv, D] views."""
    token_major = torch.randn(batch, kv_len, hkv, d, device="cuda", dtype=dtype)
    head_major = token_major.transpose(1, 2).contiguous().transpose(1, 2)
    return token_major, head_major


def probe(fj, batch, kv_len, iters):
    hq, hkv, d, dtype = 32, 8, 128, torch.bfloat16
    kv_bytes = 2 * batch * kv_len * hkv * d * 2
    keep, sets = [], {"token": [], "head": []}
    for _ in range(copies_for(kv_bytes)):
        q = torch.randn(batch, 1, hq, d, device="cuda", dtype=dtype)
        (k_tok, k_head), (v_tok, v_head) = (layouts(batch, kv_len, hkv, d, dtype) for _ in range(2))
        sets["token"].append((q, k_tok, v_tok, torch.empty_like(q)))
        sets["head"].append((q, k_head, v_head, torch.empty_like(q)))
        keep += [k_tok, k_head, v_tok, v_head]
    names, fn_sets, contexts, problems = [], [], [], {}
    for layout, tensors in sets.items():
        problems[layout] = [fj.problem(q, k, v, o, False) for q, k, v, o in tensors]
        for p in problems[layout]:
            fj.attach_workspace(p, keep)
        names.append(f"flashjit {layout}-major")
        fn_sets.append([lambda p=p: fj.forward(p) for p in problems[layout]])
        contexts.append(None)
        names.append(f"cudnn {layout}-major")
        fn_sets.append([lambda q=q, k=k, v=v: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True) for q, k, v, _ in tensors])
        contexts.append(lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    times = median_ms_interleaved(fn_sets, iters, contexts=contexts)
    q, k, v, _ = sets["token"][0]
    ref = F.scaled_dot_product_attention(q.transpose(1, 2).float(), k.transpose(1, 2).float(),
                                         v.transpose(1, 2).float(), enable_gqa=True).transpose(1, 2)
    diffs = {}
    for layout in sets:
        o = sets[layout][0][3]
        o.fill_(float("nan"))  # the check sees this launch's output, not the timing loop's
        fj.forward(problems[layout][0])
        torch.cuda.synchronize()
        diffs[layout] = (o.float() - ref).abs().max().item()
    line = "  ".join(f"{name} {kv_bytes / (ms * 1e-3) / 1e12:.2f}" for name, ms in zip(names, times))
    print(f"decode bf16 {batch}x{kv_len} TB/s: {line}  | flashjit max diff vs fp32: "
          f"token {diffs['token']:.3g}, head {diffs['head']:.3g}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lib", default="build/libflashjit.so")
    ap.add_argument("--rows", default="64x4096,1x32768,1x131072")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # makes the primary context current for flashjit
    fj = FlashJit(args.lib)
    for row in args.rows.split(","):
        batch, kv_len = (int(x) for x in row.split("x"))
        probe(fj, batch, kv_len, args.iters)


if __name__ == "__main__":
    main()
