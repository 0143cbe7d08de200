#!/usr/bin/env bash
# tests/gpu_suites.sh: on a machine with a GPU, the suites that say every GPU a course has runs the
# stages (notes/gpus.md), each with its own log and one line PASS or FAIL:
#   (a)        the suite as built (every stage; the default build: sm_75, sm_80, sm_90 code);
#   (b)        the suite under ATTN_SMEM_CAP_KB=99 (the tiles of an RTX 30, 40 or 50 card);
#   (c)        the suite of the compute_75 PTX build under ATTN_SMEM_CAP_KB=64 (a T4's code path
#              and tiles, `make CUDA_ARCH=75 PTX_ONLY=1 BUILD=build75`);
#   sanitize   compute-sanitizer (memcheck, racecheck, synccheck) on the stages of (c), over the
#              shapes `make sanitize` runs for each (the Makefile's SANITIZE_* lists).
# (b), (c) and sanitize take the stages GPU_SUITES_STAGES lists (default 4-10,15: the stages that
# run on any GPU the build targets; the Hopper stages 11 to 14 have one configuration per head dim
# and would fail under a cap, by design).
#
#   tests/gpu_suites.sh [LOGDIR] [a] [b] [c] [sanitize]     (default: all four; LOGDIR: build/gpu-suites)
#
# The programs of each build (stage1 .. stage15 and attn_tests, in one directory or as `make`
# leaves them: stages at the root, tests/attn_tests), found in this order:
#   default build:  $GPU_SUITES_BIN, .gpu/ if it holds attn_tests, else the repository root;
#   compute_75:     $GPU_SUITES_BIN75, .gpu75/ if it holds attn_tests, else build75/bin/, built
#                   here when missing (nvcc needed; the root programs are relinked to the default
#                   build afterwards).
# $GPU_SUITES_LIB (default .gpu/lib where it exists): shared libraries the programs need that the
# machine lacks (Criterion and its dependencies, as a bundle of programs carries them).
# $GPU_SUITES_TIMEOUT: seconds a suite may run before it is stopped and fails (default: no limit;
# the sanitizer starts no case after it and stops those running).
# Exit status: 0 when every suite asked for passed, 1 when one failed, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
root=$(pwd)

logdir=build/gpu-suites
suites=()
for arg in "$@"; do
    case $arg in
        a | b | c | sanitize) suites+=("$arg") ;;
        -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "gpu_suites.sh: unknown option $arg (usage: tests/gpu_suites.sh [LOGDIR] [a] [b] [c] [sanitize])" >&2; exit 2 ;;
        *) logdir=$arg ;;
    esac
done
[ ${#suites[@]} -gt 0 ] || suites=(a b c sanitize)
if ! mkdir -p "$logdir" || ! logdir=$(cd "$logdir" && pwd); then echo "gpu_suites.sh: cannot write $logdir" >&2; exit 2; fi
stages=${GPU_SUITES_STAGES:-4-10,15}
# (nproc honours OMP_NUM_THREADS, which a caller may have set for the oracle: the cores, without it)
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

# ---- the environment every suite runs in ----
# Criterion runs each test in a process of its own, --jobs at a time; the fp64 oracle that checks
# them spreads over OpenMP threads, two each, so that the jobs share the cores rather than each
# starting one thread per core.
export OMP_NUM_THREADS=2
# Every one of those processes loads the CUDA modules of the stages it runs. A build of PTX alone
# (suite c) has no machine code for the GPU: the driver JIT-compiles the PTX when a process loads
# it, and keeps what it compiled in its cache, where the next process finds it. The cache holds 256
# MiB by default, less than the machine code of every stage's kernels; without room for all of it
# (or without a cache it may write), every forked test compiles the same PTX again, seconds to
# minutes of CPU each: the likely reason the compute_75 suite once ran past 230 s. So: the largest
# cache the driver takes (4 GiB), somewhere writable, kept between runs.
export CUDA_CACHE_MAXSIZE=4294967296
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-${TMPDIR:-/tmp}/attn-cuda-cache}
lib=${GPU_SUITES_LIB:-}
[ -z "$lib" ] && [ -d .gpu/lib ] && lib=$root/.gpu/lib
if [ -n "$lib" ]; then
    lib=$(cd "$lib" && pwd) || exit 2
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The directory a build's programs are run from (the tests start ./stageN from there) and its
# test program, for `cd "$dir" && "$tests"`.
tests_in() { if [ -x "$1/attn_tests" ]; then echo "$1/attn_tests"; else echo "$1/tests/attn_tests"; fi; }

bin=${GPU_SUITES_BIN:-}
[ -z "$bin" ] && { [ -x .gpu/attn_tests ] && bin=.gpu || bin=.; }
bin75=${GPU_SUITES_BIN75:-}
[ -z "$bin75" ] && { [ -x .gpu75/attn_tests ] && bin75=.gpu75 || bin75=build75/bin; }

# The compute_75 programs in build75/bin, made (or brought up to date) here where there is nvcc:
# the Makefile links the programs of the build it makes at the root, so they are copied aside and
# the default build's linked back.
need75=0
for s in "${suites[@]}"; do [ "$s" = c ] || [ "$s" = sanitize ] && need75=1; done
have_nvcc=0
command -v "${NVCC:-nvcc}" >/dev/null 2>&1 && have_nvcc=1
if [ $need75 = 1 ] && { [ "$bin75" = build75/bin ] && [ $have_nvcc = 1 ] || [ ! -x "$(tests_in "$bin75")" ]; }; then
    if [ "$bin75" != build75/bin ] || [ $have_nvcc = 0 ]; then
        echo "gpu_suites.sh: no compute_75 programs in $bin75 (and no nvcc here to build them): build them with" \
             "make CUDA_ARCH=75 PTX_ONLY=1 BUILD=build75 all, and copy stage* and tests/attn_tests to build75/bin" >&2
        exit 2
    fi
    echo "== the compute_75 PTX programs (build75/bin): make CUDA_ARCH=75 PTX_ONLY=1 BUILD=build75 all"
    if ! { make -j"$jobs" CUDA_ARCH=75 PTX_ONLY=1 BUILD=build75 all && mkdir -p build75/bin &&
           cp -f stage[0-9] stage[0-9][0-9] tests/attn_tests build75/bin/ && make -j"$jobs" all; } > "$logdir/build75.log" 2>&1; then
        echo "gpu_suites.sh: the build failed: $logdir/build75.log" >&2
        exit 1
    fi
fi
need=0
for s in "${suites[@]}"; do [ "$s" = a ] || [ "$s" = b ] && need=1; done
if [ $need = 1 ] && [ "$bin" = . ] && [ $have_nvcc = 1 ]; then
    echo "== the default build: make all"
    make -j"$jobs" all > "$logdir/build.log" 2>&1 || { echo "gpu_suites.sh: the build failed: $logdir/build.log" >&2; exit 1; }
fi
if [ $need = 1 ] && [ ! -x "$(tests_in "$bin")" ]; then
    echo "gpu_suites.sh: no test program in $bin: make -j all (or bundle the programs, GPU_SUITES_BIN)" >&2
    exit 2
fi

failed=0
summary=()
# One line for a suite: PASS or FAIL, what it was, the time, Criterion's synthesis, the log.
report() { # NAME RC SECONDS LOG WHAT
    local verdict=PASS synth
    [ "$2" = 0 ] || { verdict=FAIL; failed=1; }
    synth=$(grep -a "Synthesis:" "$4" | tail -1 | sed 's/.*Synthesis: //')
    [ "$2" = 124 ] && synth="stopped at GPU_SUITES_TIMEOUT=${GPU_SUITES_TIMEOUT:-0} s"
    summary+=("$verdict ($1) $5, $3 s | ${synth:-rc $2: $(tail -1 "$4")} | $4")
    echo "${summary[-1]}"
}

# suite NAME DIR LOG WHAT [VAR=value ...]: the test program of DIR, from DIR, in that environment.
suite() {
    local name=$1 dir=$2 log=$3 what=$4
    shift 4
    local t0=$SECONDS tests rc
    tests=$(cd "$(dirname "$(tests_in "$dir")")" && pwd)/attn_tests
    echo "== ($name) $what: $* $tests --jobs=$jobs" | tee "$log"
    (cd "$dir" && env "$@" timeout "${GPU_SUITES_TIMEOUT:-0}" "$tests" --jobs="$jobs") >> "$log" 2>&1
    rc=$?
    report "$name" $rc $((SECONDS - t0)) "$log" "$what"
}

# The stage numbers of a list such as 4-10,15, one a line.
stage_numbers() {
    local part
    for part in ${1//,/ }; do
        if [[ $part == *-* ]]; then seq "${part%-*}" "${part#*-}"; else echo "$part"; fi
    done
}

# compute-sanitizer on the compute_75 programs under the 64 KiB cap, every case a process of its
# own, --jobs at a time. A case passes with exit 0; exit 2 is the stage refusing the case in one
# line, as designed on this device (bf16 on Turing's code, --deterministic where its dQ kernel does
# not fit, d = 256's backward): counted as refused, its line in the log; anything else fails, and
# so does a run where no case passed. A case may run 300 s (less where GPU_SUITES_TIMEOUT ends first).
sanitize() {
    local t0=$SECONDS log=$logdir/sanitize.log
    local bins cases san_bin
    bins=$(stage_numbers "$stages" | sed 's/^/stage/' | paste -sd ' ')
    echo "== (sanitize) compute-sanitizer on $bins of $bin75, ATTN_SMEM_CAP_KB=64" | tee "$log"
    if ! command -v compute-sanitizer >/dev/null 2>&1; then
        echo "compute-sanitizer is not on the PATH" >> "$log"
        report sanitize 1 0 "$log" "compute-sanitizer, compute_75 PTX, 64 KiB"
        return
    fi
    # the shapes `make sanitize` runs for each stage, as the Makefile lists them
    # shellcheck disable=SC2016 # $(...) are make's, expanded by make
    cases=$(MAKEFLAGS= make -s --no-print-directory --eval 'gpu-suites-sanitize-cases: ; @$(foreach b,'"$bins"',for s in $(or $(SANITIZE_BASE_$(b)),$(SANITIZE_SHAPES)) $(SANITIZE_SHAPES_$(b)); do echo "$(b) $$s"; done;)' \
            gpu-suites-sanitize-cases) || { echo "GNU make could not list the sanitize shapes (make is needed for the Makefile's SANITIZE_* lists)" >> "$log"; report sanitize 1 0 "$log" "compute-sanitizer"; return; }
    san_bin=$(cd "$bin75" && pwd) || return
    # GPU_SUITES_TIMEOUT bounds the whole: a case gets what is left of it, and one that has nothing
    # left does not start (tests/sanitize.sh, which `make sanitize` runs its cases through too)
    local deadline=0 rc
    [ "${GPU_SUITES_TIMEOUT:-0}" -gt 0 ] && deadline=$(($(date +%s) + GPU_SUITES_TIMEOUT))
    while read -r b shape; do
        for tool in memcheck racecheck synccheck; do printf '%s\t%s\t%s\n' "$tool" "$b" "$shape"; done
    done <<< "$cases" |
        ATTN_SMEM_CAP_KB=64 SANITIZE_DIR=$san_bin SANITIZE_REFUSED=1 SANITIZE_LIMIT=300 SANITIZE_DEADLINE=$deadline \
            "$root/tests/sanitize.sh" "$jobs" >> "$log" 2>&1
    rc=$?
    report sanitize $rc $((SECONDS - t0)) "$log" "compute-sanitizer on $bins, compute_75 PTX, 64 KiB"
}

for s in "${suites[@]}"; do
    case $s in
        a) suite a "$bin" "$logdir/a.log" "the suite as built" ;;
        b) suite b "$bin" "$logdir/b.log" "the suite at 99 KiB, stages $stages" ATTN_SMEM_CAP_KB=99 ATTN_TEST_STAGES="$stages" ;;
        c) suite c "$bin75" "$logdir/c.log" "the compute_75 PTX suite at 64 KiB, stages $stages" ATTN_SMEM_CAP_KB=64 \
                 ATTN_TEST_STAGES="$stages" ;;
        sanitize) sanitize ;;
    esac
done
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$logdir/summary.txt"
exit $failed
