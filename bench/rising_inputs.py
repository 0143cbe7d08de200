#!/usr/bin/env python3
"""rising_inputs.py: q.npy, k.npy, v.npy whose scores rise along the keys, the online softmax's
worst case: every K/V tile raises each row's max, so every tile rescales O.

Every query is a * u and key j is (j / N) u, u the vector of ones, so row i's score against key j
is a d (j / N) / sqrt(d) (times the default softmax scale 1/sqrt(d)): it grows linearly along
the keys. `a` is chosen so that the scores rise by RISE in log2 units (of exp2) over every 128
keys: with RISE > 8 even a stale max (stage 17's threshold) moves at every tile of 128 keys.
V is uniform in [-1, 1). Python's standard library only.

usage: bench/rising_inputs.py DIR [--batch B] [--heads H] [--seqlen N] [--dim d] [--rise R]
then:  ./stage17 --load DIR --counters
"""
import argparse
import math
import os
import random
import struct


def save_npy(path, shape, values):
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join("%d, " % s for s in shape)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%df" % len(values), *values))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--rise", type=float, default=12.0, help="log2 units of score per 128 keys (default 12)")
    a = p.parse_args()
    B, H, N, d = a.batch, a.heads, a.seqlen, a.dim
    if min(B, H, N, d) < 1 or a.rise <= 0:
        p.error("B, H, N, d and the rise must be positive")
    # score(i, j) = qa * d * (j / N) / sqrt(d); its rise over 128 keys, times log2(e), is RISE
    qa = a.rise * N / (128.0 * math.sqrt(d) * math.log2(math.e))
    os.makedirs(a.dir, exist_ok=True)
    rows = B * H * N
    save_npy(os.path.join(a.dir, "q.npy"), (B, H, N, d), [qa] * (rows * d))
    k = []
    for _ in range(B * H):
        for j in range(N):
            k.extend([j / N] * d)
    save_npy(os.path.join(a.dir, "k.npy"), (B, H, N, d), k)
    rng = random.Random(1)
    save_npy(os.path.join(a.dir, "v.npy"), (B, H, N, d), [rng.uniform(-1, 1) for _ in range(rows * d)])
    print("%s: q = %.4f * 1, k_j = j / %d * 1, v uniform: [%d, %d, %d, %d], a rise of %g log2 units per 128 keys"
          % (a.dir, qa, N, B, H, N, d, a.rise))


if __name__ == "__main__":
    main()
