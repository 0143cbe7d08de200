#!/usr/bin/env bash
# tests/diff_noise.sh: each `make diffN` should show its stage's idea, not a renaming. Counts, per
# diff, the added lines that differ from a removed line only by a stage number (stage7 -> stage8,
# "stage 7" -> "stage 8", STAGE7_ -> STAGE8_), and fails when any diff has more than LIMIT.
#   tests/diff_noise.sh [LIMIT]      (default 8; one OK line, or a line per diff over it)
#   tests/diff_noise.sh -v [LIMIT]   a line per diff, the count of each
set -euo pipefail
cd "$(dirname "$0")/.."
verbose=0
if [ "${1:-}" = -v ]; then verbose=1; shift; fi
limit=${1:-8}
last=$(ls stages/[0-9][0-9]_* | sed -n '$s|stages/0*\([0-9]*\)_.*|\1|p')
fail=0
for ((n = 2; n <= last; n++)); do
    # a number with no stage file has no diff
    compgen -G "stages/$(printf '%02d' "$n")_*" > /dev/null || continue
    # (a make of its own, not the jobs of the make that runs this script)
    out=$(MAKEFLAGS= make -s --no-print-directory "diff$n" 2>/dev/null) || { echo "diff_noise: make diff$n failed" >&2; exit 1; }
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
    if ((count > limit)); then
        echo "diff_noise: make diff$n has $count changed lines that differ only by a stage number (at most $limit)" >&2
        fail=1
    elif ((verbose)); then
        printf 'diff%-3d %3d changed lines differ only by a stage number\n' "$n" "$count"
    fi
done
if ((fail)); then echo "diff_noise: rename those back, so that the diff shows the stage's idea (read it: make diffN)" >&2; exit 1; fi
echo "diff_noise: OK: each make diffN shows what its stage changes, not stage numbers renamed (at most $limit lines each)"
