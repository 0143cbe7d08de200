#!/usr/bin/env bash
# tests/diff_noise.sh: each `make diffN` should show its stage's idea, not a renaming. Counts, per
# diff, the added lines that differ from a removed line only by a stage number (stage7 -> stage8,
# "stage 7" -> "stage 8", STAGE7_ -> STAGE8_), and fails when any diff has more than LIMIT.
#   tests/diff_noise.sh [LIMIT]      (default 8; prints one line per diff)
set -euo pipefail
cd "$(dirname "$0")/.."
limit=${1:-8}
last=$(ls stages/[0-9][0-9]_* | sed -n '$s|stages/0*\([0-9]*\)_.*|\1|p')
fail=0
for ((n = 2; n <= last; n++)); do
    # a number with no stage (yet: stage 14 is written before 12 and 13) has no diff
    compgen -G "stages/$(printf '%02d' "$n")_*" > /dev/null || continue
    out=$(make -s "diff$n" 2>/dev/null) || { echo "make diff$n failed" >&2; exit 1; }
    count=$(printf '%s\n' "$out" | awk '
        function norm(s) { gsub(/[Ss][Tt][Aa][Gg][Ee] ?[0-9]+/, "stage#", s); return s }
        /^(\+\+\+|---) / { next }
        /^-/ { s = substr($0, 2); removed[norm(s)]++; raw[norm(s) SUBSEP s]++; next }
        /^\+/ { added[++na] = substr($0, 2); next }
        END {
            c = 0
            for (k = 1; k <= na; k++) {
                s = added[k]; m = norm(s)
                if ((m SUBSEP s) in raw && raw[m SUBSEP s] > 0) continue   # the same line moved: not a renaming
                if (removed[m] > 0 && m != s) { removed[m]--; c++ }
            }
            print c
        }')
    printf 'diff%-3d %3d changed lines differ only by a stage number\n' "$n" "$count"
    if ((count > limit)); then fail=1; fi
done
if ((fail)); then echo "diff_noise: some diff has more than $limit renaming-only lines (show them: make diffN)" >&2; exit 1; fi
