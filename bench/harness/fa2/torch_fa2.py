# Scratch (fa2perf): PyTorch's FA-2 backend at the harness's timing shapes (bf16, S = 4096,
# B*S = 16384, heads = 2048 // d), median of 20 launches after 3 warm-ups, same FLOP count.
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

S, TOKENS, WIDTH = 4096, 16384, 2048
for d in (64, 80, 96, 128):
    for causal in (False, True):
        B, H = TOKENS // S, WIDTH // d
        q, k, v = (torch.randn(B, S, H, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for _ in range(3):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.cuda.synchronize()
            times = []
            for _ in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
        ms = sorted(times)[10]
        flops = 4.0 * B * H * S * S * d / (2 if causal else 1)
        print(f"TORCH FA2 d{d} bf16{' causal' if causal else ''} B={B} S={S} H={H}: median {ms:.3f} ms = "
              f"{flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s")
