#!/usr/bin/env python3
"""torch_sdpa.py: the yardsticks. Times torch.nn.functional.scaled_dot_product_attention with its
flash (FlashAttention-2) and cuDNN backends on the benchmark grid and prints CSV rows in the
project's columns (stage torch-flash / torch-cudnn, direction fwd and bwd), progress on stderr.
The columns are the header a stage's --csv prints (common/report.c), passed in --columns: each
row fills them by name, in that order, and leaves any it has no value for empty.
Inputs are uniform in [-1, 1] in fp16 (or bf16, --dtypes), as the stages' are. Called by
bench/bench.sh."""
import argparse
import os
import re
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def slug(name):
    for drop in ("NVIDIA ", "GeForce ", "Tesla "):
        if name.startswith(drop):
            name = name[len(drop):]
    return re.sub(r"[^a-z0-9]", "-", name.lower()).rstrip("-")


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        start[i].record()
        fn()
        stop[i].record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    med = t[len(t) // 2] if len(t) % 2 else 0.5 * (t[len(t) // 2 - 1] + t[len(t) // 2])
    return med, t[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=["fp16"], choices=["fp16", "bf16"])
    ap.add_argument("--directions", nargs="+", default=["fwd", "bwd"], choices=["fwd", "bwd"],
                    help="fwd alone skips the backward (a benchmark of forward stages only)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--columns", required=True,
                    help="the CSV header the rows follow, as a stage's --csv prints it")
    a = ap.parse_args()
    columns = a.columns.split(",")
    for need in ("stage", "direction", "gpu", "seqlen", "dim", "causal", "ms_median", "tflops", "commit"):
        if need not in columns:
            sys.exit(f"torch_sdpa.py: --columns has no {need} column: {a.columns}")
    gpu = slug(torch.cuda.get_device_name())
    commit = os.environ.get("FA_COMMIT", "unknown")
    backends = [("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)]
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}
    shapes = [(t, d, n, c) for t in a.dtypes for d in a.dims for n in a.seqlens for c in (0, 1)]
    total, k = len(backends) * len(shapes), 0
    for name, backend in backends:
        for t, d, n, causal in shapes:
            k += 1
            B, H = 16384 // n, 2048 // d
            flops = 4.0 * B * H * n * n * d / (2 if causal else 1)
            q, kk, v = (torch.rand(B, H, n, d, device="cuda", dtype=torch_dtype[t]) * 2 - 1 for _ in range(3))
            for x in (q, kk, v):
                x.requires_grad_(True)
            label = f"{name} {t} d={d} N={n} {'causal' if causal else 'full'}"
            try:
                with sdpa_kernel(backend):
                    fwd = lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=bool(causal))
                    ms, ms_min = time_ms(fwd, a.warmup, a.iters)
                    out = fwd()
                    dout = torch.rand_like(out) * 2 - 1
                    bwd = lambda: torch.autograd.grad(out, (q, kk, v), dout, retain_graph=True)
                    bms, bms_min = time_ms(bwd, a.warmup, a.iters) if "bwd" in a.directions else (float("nan"),) * 2
            except RuntimeError as e:
                print(f"[{k}/{total}] {label} ... not supported: {str(e).splitlines()[0]}", file=sys.stderr)
                continue
            for direction, m, mn, f in (("fwd", ms, ms_min, flops), ("bwd", bms, bms_min, 2.5 * flops)):
                if direction not in a.directions:
                    continue
                tf = f / (m * 1e-3) / 1e12
                row = {"stage": name, "direction": direction, "gpu": gpu, "dtype": t, "batch": B, "heads": H,
                       "seqlen": n, "dim": d, "causal": causal, "ms_median": f"{m:.4f}", "ms_min": f"{mn:.4f}",
                       "tflops": f"{tf:.3f}", "max_err": "", "check": "skip", "commit": commit,
                       "extra_bytes": 0, "threads": 1, "kv_len": n, "kv_heads": H, "splits": ""}
                print(",".join(str(row.get(c, "")) for c in columns))
            print(f"[{k}/{total}] {label} ... fwd {flops / (ms * 1e-3) / 1e12:.1f} TFLOP/s"
                  + (f", bwd {2.5 * flops / (bms * 1e-3) / 1e12:.1f} TFLOP/s" if "bwd" in a.directions else ""),
                  file=sys.stderr)
            sys.stdout.flush()
            del q, kk, v, out, dout


if __name__ == "__main__":
    main()
