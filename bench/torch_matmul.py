#!/usr/bin/env python3
"""torch_matmul.py: the ceiling. Times torch.matmul of two square matrices (8192 x 8192 by
default) in fp16 (or bf16 or fp8, --dtypes) on the GPU, as torch_sdpa.py times attention (a CUDA event
pair around each call; median and fastest of --iters after --warmup), and appends a row per dtype
to bench/data/<gpu>_matmul.csv: the rate of the tensor cores doing nothing but a matmul, which an
attention forward (its FLOPs all matmuls, plus a softmax) is measured against. Called by
bench/bench.sh after the attention rows, so that the ratio of a stage to it is one run's.
fp8: e4m3 inputs through torch._scaled_mm (scales 1, fp16 out), the ceiling of stage 19's FP8 tensor
cores; skipped with a note where this torch has no FP8 matmul for the GPU.
Columns: stage (torch-matmul), gpu, dtype, m, n, k, ms_median, ms_min, tflops (2 m n k / median),
commit (FA_COMMIT)."""
import argparse
import os
import sys

import torch

from torch_sdpa import slug, time_ms

COLUMNS = "stage,gpu,dtype,m,n,k,ms_median,ms_min,tflops,commit"


def fail(msg):
    print(f"torch_matmul.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192, help="m = n = k")
    ap.add_argument("--dtypes", nargs="+", default=["fp16"], choices=["fp16", "bf16", "fp8"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", help="the CSV to append to (default bench/data/<gpu>_matmul.csv)")
    a = ap.parse_args()
    if a.size < 1 or a.iters < 1 or a.warmup < 0:
        fail("--size and --iters must be at least 1, --warmup at least 0")
    gpu = slug(torch.cuda.get_device_name())
    out = a.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", f"{gpu}_matmul.csv")
    started = os.path.exists(out) and os.path.getsize(out) > 0
    if started:
        with open(out) as f:
            have = f.readline().strip()
        if have != COLUMNS:
            fail(f"{out} has another header than {COLUMNS}: {have}")
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}
    rows, s = [], a.size
    for t in a.dtypes:
        if t == "fp8":
            # _scaled_mm wants the first operand row-major and the second column-major: y.t() of a
            # row-major matrix
            x = torch.empty(s, s, device="cuda").uniform_(-1, 1).to(torch.float8_e4m3fn)
            y = torch.empty(s, s, device="cuda").uniform_(-1, 1).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            call = lambda: torch._scaled_mm(x, y, scale_a=one, scale_b=one, out_dtype=torch.float16)
            try:
                call()
            except (RuntimeError, AttributeError) as e:
                print(f"torch_matmul.py: no fp8 matmul here ({str(e).splitlines()[0]}): no fp8 row", file=sys.stderr)
                continue
        else:
            x = torch.empty(s, s, device="cuda", dtype=torch_dtype[t]).uniform_(-1, 1)
            y = torch.empty(s, s, device="cuda", dtype=torch_dtype[t]).uniform_(-1, 1)
            z = torch.empty(s, s, device="cuda", dtype=torch_dtype[t])
            call = lambda: torch.matmul(x, y, out=z)
        med, fastest = time_ms(call, a.warmup, a.iters)
        tflops = 2.0 * s * s * s / (med * 1e-3) / 1e12
        rows.append(f"torch-matmul,{gpu},{t},{s},{s},{s},{med:.4f},{fastest:.4f},{tflops:.1f},"
                    f"{os.environ.get('FA_COMMIT', 'unknown')}")
        print(f"torch-matmul {t} {s}^3 ... {tflops:.1f} TFLOP/s", file=sys.stderr)
        del x, y
    with open(out, "a") as f:
        if not started:
            f.write(COLUMNS + "\n")
        f.write("\n".join(rows) + "\n")
    print(f"torch_matmul.py: {len(rows)} rows appended to {os.path.relpath(out)}", file=sys.stderr)


if __name__ == "__main__":
    main()
