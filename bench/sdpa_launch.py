#!/usr/bin/env python3
"""Launches PyTorch SDPA (one backend) on compare.py's shapes a few times, for a profiler to catch one
launch (bench/ncu_profile.sh's cudnn_* profiles). No timing here.
  python3 bench/sdpa_launch.py --backend cudnn --decode 64x4096
  python3 bench/sdpa_launch.py --backend cudnn --prefill d128s4096
  python3 bench/sdpa_launch.py --backend cudnn --prefill d128s1024c   (causal)
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="cudnn")
    shape = ap.add_mutually_exclusive_group(required=True)
    shape.add_argument("--decode", help="BATCHxKV_LEN (Hq 32, Hkv 8, d 128, one query token)")
    shape.add_argument("--prefill", help="d<head_dim>s<seqlen>[c] (B*S = 16384, heads*d = 2048; c: causal)")
    ap.add_argument("-n", "--launches", type=int, default=8)
    args = ap.parse_args()
    dtype = torch.bfloat16
    if args.decode:
        batch, kv_len = (int(x) for x in args.decode.split("x"))
        q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, kv_len, 8, 128, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(2))
        kwargs = {"enable_gqa": True}
    else:
        causal = args.prefill.endswith("c")
        d, s = (int(x) for x in args.prefill[1:].rstrip("c").split("s"))
        b, h = 16384 // s, max(1, round(2048 / d))
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype).transpose(1, 2) for _ in range(3))
        kwargs = {"is_causal": causal}
    with sdpa_kernel(BACKENDS[args.backend]):
        for _ in range(args.launches):
            F.scaled_dot_product_attention(q, k, v, **kwargs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
