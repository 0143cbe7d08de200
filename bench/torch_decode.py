#!/usr/bin/env python3
"""torch_decode.py: the yardsticks of generation. Times torch.nn.functional.scaled_dot_product_attention
with each of its CUDA backends (flash, cuDNN, efficient, math) on the decode shapes of
bench/bench_decode.sh, one query per head (N = 1) against a KV cache of N_kv positions with
grouped KV heads, and prints CSV rows in the project's columns (stage torch-flash, torch-cudnn,
torch-efficient, torch-math), progress on stderr.

Grouped heads: each backend is asked with enable_gqa=True first (K and V [B, H_kv, N_kv, d], as the
stages take them); where it refuses the shape (or this torch has no enable_gqa), K and V are
repeat_interleave'd to H heads once, outside the timed runs, as a model that stores its cache that
way would, and the row says so: column gqa is "native" or "repeated". The bandwidth columns of
bench_decode.sh count the bytes of K and V once at H_kv heads either way (the problem's bytes, not
what a backend chose to read).

Causal: with one query, causal masks nothing (the query is the last position and sees every key),
so the rows are not causal. (torch's is_causal is top-left aligned for N != N_kv, which is not the
generation mask: a causal decode with N > 1 would need an explicit attn_mask here.)

Timing as the stages': CUDA events around each call, median and minimum after warm-up, and before
each timed call the L2 is flushed as the stages' --flush-l2 does it, by reading (here: summing) a
buffer of max(2 x L2, 256 MiB): every run reads K and V from HBM, as a decoder does when other
layers ran in between; the L2 is left holding clean lines (a flush by writing would leave dirty
ones, whose write-back the timed call would pay); and the flush keeps the GPU busy longer than
Python takes to issue the call, so the events time the GPU and not the interpreter. Inputs are
uniform in [-1, 1] in fp16.
The columns are the header bench_decode.sh passes in --columns: each row fills them by name and
leaves any it has no value for empty."""
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


def time_ms(fn, warmup, iters, flush):
    for _ in range(warmup):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    stop = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush.sum()  # read, not written: see the docstring
        start[i].record()
        fn()
        stop[i].record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in zip(start, stop))
    med = t[len(t) // 2] if len(t) % 2 else 0.5 * (t[len(t) // 2 - 1] + t[len(t) // 2])
    return med, t[0]


def first_line(e):
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--kv-lens", type=int, nargs="+", default=[1024 << k for k in range(8)])
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=1)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--backends", nargs="+", default=["flash", "cudnn", "efficient", "math"])
    ap.add_argument("--columns", required=True, help="the CSV header the rows follow")
    a = ap.parse_args()
    columns = a.columns.split(",")
    for need in ("stage", "gpu", "batch", "heads", "seqlen", "kv_len", "kv_heads", "ms_median", "gqa"):
        if need not in columns:
            sys.exit(f"torch_decode.py: --columns has no {need} column: {a.columns}")
    if a.seqlen != 1:
        sys.exit("torch_decode.py: --seqlen 1 only (a decode step; see the docstring on causal masks)")
    if a.heads % a.kv_heads:
        sys.exit(f"torch_decode.py: --heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    all_backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                    "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
    gpu = slug(torch.cuda.get_device_name())
    commit = os.environ.get("FA_COMMIT", "unknown")
    props = torch.cuda.get_device_properties(0)
    l2 = getattr(props, "L2_cache_size", 0) or (50 << 20)
    flush = torch.zeros(max(2 * l2, 256 << 20) // 4, dtype=torch.int32, device="cuda")
    H, H_kv, d, n = a.heads, a.kv_heads, a.dim, a.seqlen
    G = H // H_kv
    shapes = [(b, nkv) for b in a.batches for nkv in a.kv_lens]
    total, k = len(shapes) * len(a.backends), 0
    print(f"torch_decode.py: torch {torch.__version__}, {torch.cuda.get_device_name()}, flush {(4 * flush.numel()) >> 20} MiB",
          file=sys.stderr)
    for B, N_kv in shapes:
        q = torch.rand(B, H, n, d, device="cuda", dtype=torch.float16) * 2 - 1
        kk, v = (torch.rand(B, H_kv, N_kv, d, device="cuda", dtype=torch.float16) * 2 - 1 for _ in range(2))
        repeated = None  # K and V over H heads, made on first need
        for name in a.backends:
            k += 1
            label = f"torch-{name} B={B} N_kv={N_kv}"
            result = None
            for gqa in ("native", "repeated"):
                try:
                    with sdpa_kernel(all_backends[name]):
                        if gqa == "native":
                            fn = lambda: F.scaled_dot_product_attention(q, kk, v, enable_gqa=True)
                        else:
                            if repeated is None:
                                repeated = (kk.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1))
                            k2, v2 = repeated
                            fn = lambda: F.scaled_dot_product_attention(q, k2, v2)
                        fn()  # refused shapes raise here, before any timing
                        torch.cuda.synchronize()
                        result = (gqa,) + time_ms(fn, a.warmup, a.iters, flush)
                    break
                except (RuntimeError, TypeError) as e:
                    why = first_line(e)
                    torch.cuda.synchronize()
                    continue
            if result is None:
                print(f"[{k}/{total}] {label} ... not supported: {why}", file=sys.stderr)
                continue
            gqa, ms, ms_min = result
            flops = 4.0 * B * H * n * N_kv * d
            kv_bytes = 2.0 * B * H_kv * N_kv * d * 2
            row = {"stage": f"torch-{name}", "direction": "fwd", "gpu": gpu, "dtype": "fp16", "batch": B, "heads": H,
                   "seqlen": n, "dim": d, "causal": 0, "ms_median": f"{ms:.4f}", "ms_min": f"{ms_min:.4f}",
                   "tflops": f"{flops / (ms * 1e-3) / 1e12:.3f}", "max_err": "", "check": "skip", "commit": commit,
                   "extra_bytes": 0, "threads": 1, "kv_len": N_kv, "kv_heads": H_kv, "splits": "", "gqa": gqa}
            print(",".join(str(row.get(c, "")) for c in columns))
            sys.stdout.flush()
            print(f"[{k}/{total}] {label} ... {ms * 1e3:.1f} us, {kv_bytes / (ms * 1e-3) / 1e9:.0f} GB/s of K, V "
                  f"(K, V {gqa})", file=sys.stderr)
        del q, kk, v, repeated
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
