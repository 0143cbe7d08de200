# FlashAttention, stage by stage. This Makefile holds the one list of stages.
#   make stageN && ./stageN     build and run one stage (binary at the repository root)
#   make all | deps | test | bench | bench-decode | bench-ring | bench-cpu | bench-ncu | plots | sanitize | gpu-suites | diffN | clean   (V=1 shows commands, DEBUG=1 -g + sanitizers)

# ---- the stages: NN_slug, the file is stages/NN_slug.c (CPU) or .cu (GPU) ----
CPU_STAGES := 01_naive 02_tiled_cpu 03_online_softmax
# The Hopper stages (wgmma, TMA, setmaxnreg) are compiled for sm_90a alone, which runs on compute
# capability 9.0 only (H100, H200): elsewhere they exit 3 and their tests skip. Otherwise they are
# GPU stages like the others.
HOPPER_STAGES := 11_wgmma 12_warp_specialized 13_pingpong 14_persistent 16_hopper_backward 17_conditional_rescale 18_exp2_two_pipes 19_fp8
# Stages written for generation, a few queries against a long KV cache: measured by make
# bench-decode, not on the FA-2 paper's grid (make bench, the charts and the README's table leave
# them out). Otherwise GPU stages like the others.
DECODE_STAGES := 15_split_kv
GPU_STAGES := 04_fa1 05_delayed_rescaling 06_loop_swap 07_warp_partition 08_seq_parallel 09_pipelined 10_backward \
              $(HOPPER_STAGES) $(DECODE_STAGES)

MAKEFLAGS += --no-builtin-rules
.SUFFIXES:

# ---- tools and flags ----
CC ?= cc
NVCC ?= nvcc
CFLAGS ?= -O2 -Wall -Wextra
# make runs a job per core unless told otherwise (a -j on the command line wins; -j1: one at a
# time). Several goals run side by side too, so that is for one goal, or for goals that only build:
# make clean all would race the build it cleans, make test bench time kernels under the suite.
NPROC := $(shell nproc 2>/dev/null || sysctl -n hw.ncpu 2>/dev/null || echo 2)
PARALLEL_GOALS := all test plots deps ablations tests/attn_tests stage% diff%
ifeq ($(MAKELEVEL)$(filter -j%,$(MAKEFLAGS)),0)
ifeq ($(if $(word 2,$(MAKECMDGOALS)),$(filter-out $(PARALLEL_GOALS),$(MAKECMDGOALS))),)
MAKEFLAGS += -j$(NPROC)
endif
endif
# The GPU architectures the GPU stages are compiled for, oldest first: machine code (SASS) for
# each, and the PTX of the last one too, which the driver JIT-compiles for a GPU newer than any
# listed. Unless named, this machine's own GPUs' (the compute capability nvidia-smi reports, else
# the one nvcc -arch=native finds; where this nvcc does not know one yet, the newest it knows below
# it, run through its PTX), else 80 alone: a machine without a GPU builds one architecture, enough
# to show every stage compiles. The first build says which it chose. The Hopper stages are sm_90a
# whatever this says. CUDA_ARCH="75 80 90" builds machine code for Turing (T4),
# Ampere (A100; RTX 30 and 40 cards run it) and Hopper in every program: slower to build, it runs
# anywhere. PTX_ONLY=1 embeds the PTX of each alone, compiled by the driver when a program starts:
# `make CUDA_ARCH=75 PTX_ONLY=1 BUILD=build75` runs Turing's code path on any GPU.
ifeq ($(origin CUDA_ARCH),undefined)
CUDA_ARCH := $(shell caps=$$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | tr -d '. ' | sort -un); \
               [ -n "$$caps" ] || { native=$$($(NVCC) -arch=native --dryrun -c -x cu /dev/null -o /dev/null 2>&1); \
                 case "$$native" in (*"valid GPU"*) ;; \
                   (*) caps=$$(printf '%s\n' "$$native" | grep -o 'arch=sm_[0-9]*' | sed 's/.*_//' | sort -un);; esac; }; \
               [ -n "$$caps" ] && known=$$($(NVCC) --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$$/\1/p' | sort -n); \
               for c in $$caps; do best=; for k in $$known; do [ "$$k" -le "$$c" ] && best=$$k; done; \
                 [ -n "$$best" ] && [ "$$best" -ge 75 ] && echo "$$best"; done | sort -un | tr '\n' ' ')
CUDA_ARCH_WHY := $(if $(strip $(CUDA_ARCH)),the GPU of this machine,no GPU found here: enough to compile every stage; \
                  make CUDA_ARCH="75 80 90" builds for every GPU the course runs on)
CUDA_ARCH := $(or $(strip $(CUDA_ARCH)),80)
export CUDA_ARCH CUDA_ARCH_WHY   # (make's own sub-makes, tests/diff_noise.sh's, need not ask again)
else ifneq ($(origin CUDA_ARCH),environment)
# (from the environment: a make above chose it and says why, or you did)
CUDA_ARCH_WHY := as given
endif
PTX_ONLY ?= 0
BUILD := build
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
CRITERION_LIBS := $(shell pkg-config --libs criterion 2>/dev/null || echo -lcriterion)

# ---- NCCL: stage 20 (ring attention across GPUs) needs it, and is built only where it is found ----
# Looked for in this order, nccl.h in the first directory and libnccl.so (or .so.2) in the second:
# NCCL_HOME (include/, lib/ or lib64/); the CUDA Toolkit's own, beside nvcc (include/, lib64/);
# the distribution's package, libnccl-dev (/usr/include, /usr/lib/x86_64-linux-gnu); the copy a
# PyTorch install carries, pip's nvidia-nccl-cu12/13 (site-packages/nvidia/nccl/include, lib/).
# Elsewhere stage 20 is left out of all, test and sanitize with one line saying what to install.
ifneq ($(HAVE_NVCC),)
ifndef NCCL_DIRS
NCCL_DIRS := $(shell cuda=$$(dirname "$$(dirname "$$(command -v $(NVCC))")"); \
               py=$$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null); \
               for pair in $(if $(NCCL_HOME),"$(NCCL_HOME)/include $(NCCL_HOME)/lib" "$(NCCL_HOME)/include $(NCCL_HOME)/lib64") \
                           "$$cuda/include $$cuda/lib64" "/usr/include /usr/lib/x86_64-linux-gnu" \
                           $${py:+"$$py/include $$py/lib"}; do \
                 set -- $$pair; \
                 if [ -f "$$1/nccl.h" ] && { [ -e "$$2/libnccl.so" ] || [ -e "$$2/libnccl.so.2" ]; }; then echo "$$1 $$2"; break; fi; \
               done)
export NCCL_DIRS
endif
endif
NCCL_INC := $(word 1,$(NCCL_DIRS))
NCCL_LIB := $(word 2,$(NCCL_DIRS))
# -lnccl where the library has its development link (libnccl.so), else the runtime's file itself (pip's
# wheel has libnccl.so.2 alone); an rpath where it is not in the linker's default path
NCCL_LDFLAGS = $(if $(wildcard $(NCCL_LIB)/libnccl.so),-L$(NCCL_LIB) -lnccl,$(NCCL_LIB)/libnccl.so.2) \
               $(if $(filter /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib,$(NCCL_LIB)),,-Xlinker -rpath -Xlinker $(NCCL_LIB))
NCCL_MISSING := stage20: NCCL not found (install libnccl-dev, or pip install nvidia-nccl-cu13; or set NCCL_HOME): not built
RING_STAGES := $(if $(NCCL_DIRS),20_ring)
GPU_STAGES += $(RING_STAGES)
ifeq ($(MAKELEVEL),0)
ifneq ($(HAVE_NVCC),)
ifeq ($(NCCL_DIRS),)
ifneq ($(filter all test sanitize gpu-suites tests/attn_tests,$(or $(MAKECMDGOALS),all)),)
$(info $(NCCL_MISSING))
endif
endif
endif
endif

ifeq ($(DEBUG),1)
# (with a GPU, AddressSanitizer needs ASAN_OPTIONS=protect_shadow_gap=0 next to the CUDA driver)
CFLAGS += -g -O0 -fsanitize=address,undefined
LDFLAGS += -fsanitize=address,undefined
NVDEBUG := -g
NVLDFLAGS := -Xcompiler=-fsanitize=address -Xcompiler=-fsanitize=undefined
endif
# OpenMP where the C compiler has it (Apple's clang, for one, has none without an extra library):
# without it the CPU stages build and run on one thread, and their summary says so. OPENMP=0
# builds that way on purpose.
ifndef OPENMP
OPENMP := $(shell printf 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null >/dev/null 2>&1 && echo 1 || echo 0)
export OPENMP
endif
OMP_CFLAGS := $(if $(filter 1,$(OPENMP)),-fopenmp,-Wno-unknown-pragmas)
OMP_LDFLAGS := $(if $(filter 1,$(OPENMP)),-fopenmp,)
ALL_CFLAGS := -std=gnu11 $(OMP_CFLAGS) -I. -MMD -MP $(CFLAGS)
# (--threads: nvcc compiles the architectures of one file side by side; -compress-all: the code
# of several architectures, the PTX and the line info take a fifth of the space compressed, and the
# driver unpacks a kernel when it loads it)
NVCC_THREADS ?= 4
NVCCFLAGS := -std=c++17 -O3 -lineinfo $(NVDEBUG) -I. -MMD -MP -Xcompiler -Wall,-Wextra --threads $(NVCC_THREADS) \
             -Xfatbin -compress-all
ifeq ($(PTX_ONLY),1)
NVCC_ARCH := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=compute_$(a))
else
NVCC_ARCH := $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_ARCH)),code=compute_$(lastword $(CUDA_ARCH))
endif
HOPPER_ARCH := -gencode arch=compute_90a,code=sm_90a
NVLINK := $(NVCC_ARCH) $(if $(OMP_LDFLAGS),-Xcompiler $(OMP_LDFLAGS))

Q := $(if $(filter 1,$(V)),,@)
num = $(patsubst 0%,%,$(firstword $(subst _, ,$(1))))
bin = stage$(call num,$(1))
CPU_BINS := $(foreach s,$(CPU_STAGES),$(call bin,$(s)))
GPU_BINS := $(foreach s,$(GPU_STAGES),$(call bin,$(s)))
DECODE_BINS := $(foreach s,$(DECODE_STAGES),$(call bin,$(s)))
RING_BINS := $(foreach s,$(RING_STAGES),$(call bin,$(s)))
# the GPU stages on the benchmark grid (the ring has its own: make bench-ring)
GRID_BINS := $(filter-out $(DECODE_BINS) $(RING_BINS),$(GPU_BINS))

COMMON_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard common/*.c))
COMMON_OBJS := $(filter-out $(BUILD)/common/main.o,$(COMMON_OBJS))
CUDA_OBJS := $(BUILD)/common/cuda/runner.o
REF_OBJ := $(BUILD)/stages/01_naive.o   # stage 1 is every stage's reference, linked into each
LINK_WITH_stage10 := $(BUILD)/stages/09_pipelined.o   # stage 10's forward is stage 9's
LINK_WITH_stage16 := $(BUILD)/stages/14_persistent.o  # stage 16's forward is stage 14's
# stage 20's blocks are stage 14's on compute capability 9.0, stage 9's elsewhere; and it links NCCL
LINK_WITH_stage20 := $(BUILD)/stages/09_pipelined.o $(BUILD)/stages/14_persistent.o
LIBS_stage20 = $(NCCL_LDFLAGS)
$(BUILD)/stages/20_ring.o: NVCCFLAGS += $(if $(filter /usr/include,$(NCCL_INC)),,-I$(NCCL_INC))
TEST_OBJS := $(patsubst %.c,$(BUILD)/%.o,$(wildcard tests/*.c)) $(BUILD)/registry.o
TEST_CUDA_OBJS := $(patsubst %.cu,$(BUILD)/%.o,$(wildcard tests/*.cu))   # GPU-side tests, with nvcc only
# compiled for sm_90a alone: the Hopper stages and the tests of their helpers (common/cuda/wgmma.cuh)
HOPPER_OBJS := $(foreach s,$(HOPPER_STAGES),$(BUILD)/stages/$(s).o) $(BUILD)/tests/test_wgmma.o $(BUILD)/tests/test_tma.o $(BUILD)/tests/test_fp8_quant.o

# stages the build can make here: GPU stages only where nvcc is installed
ifneq ($(HAVE_NVCC),)
BUILT_STAGES := $(CPU_STAGES) $(GPU_STAGES)
TEST_LINK = $(NVCC) $(NVLINK) $(NVLDFLAGS) -o $@ $(OBJS_IN) $(CRITERION_LIBS) $(if $(RING_STAGES),$(NCCL_LDFLAGS)) -lm
else
BUILT_STAGES := $(CPU_STAGES)
TEST_LINK = $(CC) $(OMP_LDFLAGS) $(LDFLAGS) -o $@ $(OBJS_IN) $(CRITERION_LIBS) -lm
endif
STAGE_OBJS := $(sort $(foreach s,$(BUILT_STAGES),$(BUILD)/stages/$(s).o))

.PHONY: deps deps-test deps-plots all ablations ablate test bench bench-ring bench-decode bench-cpu bench-ncu plots sanitize gpu-suites clean FORCE
all: $(foreach s,$(BUILT_STAGES),$(call bin,$(s))) tests/attn_tests

# ---- compiling ----
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC    $<")
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# The commit the CSV rows name, rewritten only when it changes (so report.o is rebuilt then).
$(BUILD)/commit.h: FORCE
	@mkdir -p $(dir $@)
	@echo '#define COMMIT "$(COMMIT)"' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv -f $@.tmp $@
$(BUILD)/common/report.o: $(BUILD)/commit.h
$(BUILD)/common/report.o: ALL_CFLAGS += -I$(BUILD)

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCCFLAGS) $(NVCC_ARCH) -c $< -o $@
$(HOPPER_OBJS): NVCC_ARCH := $(HOPPER_ARCH)

# A build's GPU objects remember the architectures they were compiled for: another CUDA_ARCH or
# PTX_ONLY in the same BUILD compiles them again (the sm_90a ones, Hopper stages and their
# ablations, stay as they are).
ARCH_STAMP := $(BUILD)/cuda-arch
$(ARCH_STAMP): FORCE
	@mkdir -p $(dir $@)
	@echo '$(NVCC_ARCH)' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || { mv -f $@.tmp $@; \
	  echo '  ARCH  CUDA_ARCH=$(CUDA_ARCH)$(if $(filter 1,$(PTX_ONLY)), PTX_ONLY=1) for the GPU stages ($(or $(CUDA_ARCH_WHY),as given))'; }
HOPPER_ABLATION_OBJS := $(foreach a,$(notdir $(wildcard bench/ablations/*.cu)),\
                          $(if $(filter $(call num,$(a))_%,$(HOPPER_STAGES)),$(BUILD)/bench/ablations/$(a:.cu=.o)))
$(filter-out $(HOPPER_OBJS) $(HOPPER_ABLATION_OBJS),\
             $(patsubst %.cu,$(BUILD)/%.o,$(wildcard stages/*.cu common/cuda/*.cu tests/*.cu bench/ablations/*.cu))): $(ARCH_STAMP)

$(BUILD)/main_stage%.o: common/main.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -DSTAGE_DESC=stage$*_desc -c $< -o $@

# ---- linking one binary per stage ----
# The programs live at the root whatever BUILD is. FLAVOR_STAMP names the build they were last
# linked from, and changes when another is made (another BUILD, CUDA_ARCH or PTX_ONLY), so that
# they are linked again from the objects of the build being made, not left from the other.
FLAVOR_STAMP := .build-flavor
$(FLAVOR_STAMP): FORCE
	@echo 'BUILD=$(BUILD) CUDA_ARCH=$(CUDA_ARCH) PTX_ONLY=$(PTX_ONLY)' > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv -f $@.tmp $@
OBJS_IN = $(filter-out $(FLAVOR_STAMP),$^)
define cpu_stage
$(call bin,$(1)): $(BUILD)/main_$(call bin,$(1)).o $(sort $(BUILD)/stages/$(1).o $(REF_OBJ)) $(COMMON_OBJS) $(FLAVOR_STAMP)
	@$(if $(Q),echo "  LD    $$@")
	$(Q)$(CC) $(OMP_LDFLAGS) $(LDFLAGS) -o $$@ $$(OBJS_IN) -lm
endef
define gpu_stage
ifneq ($(HAVE_NVCC),)
$(call bin,$(1)): $(BUILD)/main_$(call bin,$(1)).o $(BUILD)/stages/$(1).o $(LINK_WITH_$(call bin,$(1))) $(REF_OBJ) $(COMMON_OBJS) $(CUDA_OBJS) \
                  $(FLAVOR_STAMP)
	@$(if $(Q),echo "  LD    $$@")
	$(Q)$(NVCC) $(NVLINK) $(NVLDFLAGS) -o $$@ $$(OBJS_IN) $$(LIBS_$(call bin,$(1))) -lm
else
$(call bin,$(1)):
	@echo "$$@ is a GPU stage: it needs nvcc, the CUDA Toolkit's compiler (https://developer.nvidia.com/cuda-downloads)," \
	      "on the PATH or named with NVCC=/path/to/nvcc" >&2; exit 2
endif
endef
$(foreach s,$(CPU_STAGES),$(eval $(call cpu_stage,$(s))))
$(foreach s,$(GPU_STAGES),$(eval $(call gpu_stage,$(s))))
ifeq ($(RING_STAGES),)
stage20:
	@echo "$(if $(HAVE_NVCC),$(NCCL_MISSING),stage20 is a GPU stage: it needs nvcc, the CUDA Toolkit's compiler)" >&2; exit 2
endif

# ---- ablations: a stage's kernel with one piece taken out (bench/ablations/NN_what.cu, which
# includes stages/NN_*.cu; common/ablation.h), built here and timed beside the stage by
# bench/ablate.sh. A Hopper stage's ablations are compiled for sm_90a like the stage. ----
ABLATIONS := $(patsubst bench/ablations/%.cu,%,$(wildcard bench/ablations/*.cu))
ABLATION_BINS := $(addprefix bench/ablations/,$(ABLATIONS))
$(BUILD)/main_ablation_%.o: common/main.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -DSTAGE_DESC=ablation_$*_desc -c $< -o $@
define ablation
$(BUILD)/bench/ablations/$(1).o: NVCC_ARCH := $(if $(filter $(call num,$(1))_%,$(HOPPER_STAGES)),$(HOPPER_ARCH),$(NVCC_ARCH))
bench/ablations/$(1): $(BUILD)/main_ablation_$(1).o $(BUILD)/bench/ablations/$(1).o $(LINK_WITH_stage$(call num,$(1))) \
                      $(REF_OBJ) $(COMMON_OBJS) $(CUDA_OBJS)
	@$(if $(Q),echo "  LD    $$@")
	$(Q)$(NVCC) $(NVLINK) $(NVLDFLAGS) -o $$@ $$^ -lm
endef
$(foreach a,$(ABLATIONS),$(eval $(call ablation,$(a))))
ablations: $(ABLATION_BINS)
ablate: ablations $(GPU_BINS)
	FA_COMMIT=$(COMMIT) bench/ablate.sh

# ---- what the tests and the charts need: Criterion, pkg-config, gnuplot (tests/deps.sh) ----
deps:
	@tests/deps.sh all

# ---- tests: every stage this build makes, linked into one Criterion binary ----
# Rewritten only when the list changes (with or without nvcc, say), so it never goes stale.
$(BUILD)/registry.c: FORCE
	@mkdir -p $(dir $@)
	@{ echo '/* generated by the Makefile from its list of stages */'; \
	   echo '#include "common/harness.h"'; \
	   $(foreach s,$(BUILT_STAGES),echo 'extern const struct stage $(call bin,$(s))_desc;';) \
	   echo 'const struct stage *const all_stages[] = {'; \
	   $(foreach s,$(BUILT_STAGES),echo '    &$(call bin,$(s))_desc,';) \
	   echo '};'; \
	   echo 'const int n_all_stages = sizeof all_stages / sizeof *all_stages;'; } > $@.tmp
	@cmp -s $@.tmp $@ && rm -f $@.tmp || mv -f $@.tmp $@
FORCE:

$(BUILD)/registry.o: $(BUILD)/registry.c
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# Criterion first: installed by tests/deps.sh where this machine allows, else the line to run.
$(TEST_OBJS) $(TEST_CUDA_OBJS): | deps-test
deps-test:
	@tests/deps.sh test
# gnuplot first, the same way (make plots)
deps-plots:
	@tests/deps.sh plots
tests/attn_tests: $(TEST_OBJS) $(STAGE_OBJS) $(COMMON_OBJS) $(if $(HAVE_NVCC),$(CUDA_OBJS) $(TEST_CUDA_OBJS)) $(FLAVOR_STAMP)
	@$(if $(Q),echo "  LD    $@")
	$(Q)$(TEST_LINK)

# The suite runs the stage binaries too (command-line cases), so it needs them built.
# tests/diff_noise.sh: every make diffN shows its idea, not a renaming (at most 8 lines each).
test: all
	./tests/attn_tests --jobs=$(or $(JOBS),2)
	@tests/diff_noise.sh

# ---- GPU-only targets ----
# One shape also runs the counting build (--counters) of a forward stage; stage 10, a backward,
# has none and runs its --deterministic path there instead. ($(b) is the stage being sanitized.)
SANITIZE_FLAG = $(or $(SANITIZE_FLAG_$(b)),--counters)
SANITIZE_FLAG_stage10 := --deterministic
SANITIZE_FLAG_stage16 := --deterministic
SANITIZE_SHAPES = "--seqlen 1 --dim 64" "--seqlen 100 --dim 64 --causal $(SANITIZE_FLAG)" "--seqlen 77 --dim 128" \
                  "--seqlen 130 --dim 128 --causal --batch 2 --heads 3"
# stages that take more than the shapes above name their extra shapes here
# (the last: more heads than SMs, so --deterministic cuts each head's K/V tiles into one split and
# every dK/dV block sweeps several tiles)
SANITIZE_SHAPES_stage10 := "--seqlen 130 --dim 128 --dtype bf16 --deterministic" "--seqlen 200 --dim 128 --dtype bf16 --causal" \
                          "--seqlen 1000 --dim 64" "--seqlen 150 --dim 32 --causal" "--seqlen 77 --dim 256 --deterministic" \
                          "--seqlen 200 --dim 256 --dtype bf16 --causal" "--seqlen 90 --dim 64 --dtype bf16 --deterministic" \
                          "--seqlen 150 --dim 32 --dtype bf16" "--seqlen 300 --dim 64 --causal --deterministic --heads 140"
SANITIZE_SHAPES_stage9 := "--seqlen 200 --dim 32 --dtype bf16 --causal" "--seqlen 130 --dim 256" \
                          "--seqlen 300 --dim 128 --dtype bf16"
SANITIZE_SHAPES_stage11 := "--seqlen 200 --dim 64 --dtype bf16 --causal" "--seqlen 130 --dim 256" \
                           "--seqlen 300 --dim 256 --dtype bf16 --causal" "--seqlen 300 --dim 128 --dtype bf16"
SANITIZE_SHAPES_stage12 := "--seqlen 300 --dim 128 --dtype bf16 --causal" "--seqlen 193 --dim 128" "--seqlen 130 --dim 256 --dtype bf16"
SANITIZE_SHAPES_stage13 := "--seqlen 130 --dim 256 --dtype bf16 --causal" "--seqlen 300 --dim 64 --dtype bf16 --causal" \
                           "--seqlen 1000 --dim 128"
# stage 14 also where its blocks run many work items each (B * H * Q tiles well over one per SM)
# and where the work order has several L2 sections of heads (B * H heads of K and V over half the L2)
SANITIZE_SHAPES_stage14 := "--seqlen 130 --dim 256 --dtype bf16 --causal" "--seqlen 300 --dim 64 --dtype bf16 --causal" \
                           "--seqlen 1000 --dim 128" "--seqlen 100 --dim 128 --batch 4 --heads 150" \
                           "--seqlen 17 --dim 64 --causal --batch 2 --heads 400"
# stage 16: tails of its Q tiles (128 queries at d = 64, 64 at d = 128) and of its K/V tile (128
# keys), the diagonal crossing two Q tiles, --deterministic with many blocks per dQ tile
SANITIZE_SHAPES_stage16 := "--seqlen 257 --dim 128 --dtype bf16 --causal" "--seqlen 300 --dim 64 --deterministic" \
                           "--seqlen 1000 --dim 128 --causal --deterministic" "--seqlen 65 --dim 64 --dtype bf16 --causal"
SANITIZE_SHAPES_stage17 := $(SANITIZE_SHAPES_stage14)
SANITIZE_SHAPES_stage18 := $(SANITIZE_SHAPES_stage14)
# stage 19 takes fp8 alone, d = 64, 128 and 256: its own shapes (tails of the 128-row tiles and of the
# 64-row quantization blocks, the diagonal, --hadamard 0, many heads)
SANITIZE_BASE_stage19 := "--dtype fp8 --seqlen 1 --dim 128" "--dtype fp8 --seqlen 100 --dim 128 --causal --counters" \
                         "--dtype fp8 --seqlen 257 --dim 64 --causal" \
                         "--dtype fp8 --seqlen 77 --dim 256" "--dtype fp8 --seqlen 130 --dim 256 --causal" \
                         "--dtype fp8 --seqlen 300 --dim 128 --hadamard 0" "--dtype fp8 --seqlen 1000 --dim 128 --causal" \
                         "--dtype fp8 --seqlen 65 --dim 128 --batch 4 --heads 150"
# a stage that cannot take the shapes above (stage 15: at most 64 queries, no --counters) names its
# own instead of them (after --batch 1 --heads 2, so each names --kv-heads 1 or 2)
SANITIZE_BASE_stage15 := "--seqlen 1 --kv-len 1 --dim 64 --kv-heads 2" "--seqlen 1 --kv-len 3000 --dim 128 --kv-heads 1" \
                         "--seqlen 4 --kv-len 1000 --dim 128 --kv-heads 1 --causal --dtype bf16" \
                         "--seqlen 64 --kv-len 4097 --dim 64 --kv-heads 2 --causal" \
                         "--seqlen 1 --kv-len 777 --dim 128 --kv-heads 1 --splits 1" \
                         "--seqlen 3 --kv-len 200 --dim 64 --kv-heads 1 --splits 40" \
                         "--seqlen 1 --kv-len 5000 --dim 128 --kv-heads 1 --splits 65"
# stage 20: P ranks sharing the one GPU over the copy transport (tails of the 2P chunks, empty
# chunks at N = 1, the ragged chunk of a full problem cut into pieces, bf16)
SANITIZE_BASE_stage20 := "--gpus 2 --transport copy --seqlen 1 --dim 64" \
                         "--gpus 2 --transport copy --seqlen 100 --dim 64 --causal" \
                         "--gpus 4 --transport copy --seqlen 77 --dim 128" \
                         "--gpus 4 --transport copy --seqlen 130 --dim 128 --causal --batch 2 --heads 3" \
                         "--gpus 4 --transport copy --seqlen 1000 --dim 64 --dtype bf16 --causal"
# The runs go to tests/sanitize.sh, which makes SANITIZE_JOBS of them at a time, every one even
# after a failure, prints each output whole as the run ends, then a summary line.
SANITIZE_JOBS ?= 4
sanitize: $(GPU_BINS)
	@{ $(foreach b,$(GPU_BINS),for tool in memcheck racecheck synccheck; do \
	  for s in $(or $(SANITIZE_BASE_$(b)),$(SANITIZE_SHAPES)) $(SANITIZE_SHAPES_$(b)); do \
	    printf '%s\t%s\t%s\n' "$$tool" "$(b)" "$$s"; \
	done; done;) } | tests/sanitize.sh $(SANITIZE_JOBS)

# On a machine with a GPU, every GPU a course has (notes/gpus.md): the suite as built, under a 99
# KiB cap, and as the compute_75 PTX build (made in build75 if needed) under a 64 KiB cap, then
# compute-sanitizer on that build; a log per suite in build/gpu-suites, one PASS or FAIL line each.
gpu-suites: all
	tests/gpu_suites.sh

# the grid's GPU stages whose rows are forward: all but stages 10 and 16, which measure a backward (make
# bench-ncu runs these; the charts name the ones with no rows yet)
FWD_BINS = $(filter-out stage10 stage16,$(GRID_BINS))

# every GPU stage of the grid and PyTorch's SDPA (flash, cuDNN) over the FA-2 paper's grid, in one
# run, appended to bench/data/<gpu>.csv (stages 10 and 16's rows are their backward)
bench: $(GRID_BINS)
	FA_COMMIT=$(COMMIT) STAGES="$(GRID_BINS)" bench/bench.sh

# generation: the decode stages at B = 1 and 8, 32 query heads over 8 KV heads, d = 128, one query
# against N_kv = 1k .. 128k, beside the device's copy bandwidth (bench/copy_bw) and PyTorch's SDPA
# backends measured in the same run, appended to bench/data/<gpu>_decode.csv
bench-decode: $(DECODE_BINS) bench/copy_bw
	FA_COMMIT=$(COMMIT) STAGES="$(DECODE_BINS)" bench/bench_decode.sh

# across GPUs: stage 20 on P = 2, 4, 8 GPUs (as many as there are) at N = 128k .. 1M, beside its
# weak-scaling baseline on one GPU (bench/bench_ring.sh says which), appended to
# bench/data/<gpu>x<P>_ring.csv with the columns gpus and efficiency; the baseline is stage 14 or
# stage 9 (the forward each block of the ring runs), so both are built too
bench-ring: $(RING_BINS) $(if $(RING_BINS),$(call bin,09_pipelined) $(call bin,14_persistent))
	@$(if $(RING_BINS),FA_COMMIT=$(COMMIT) bench/bench_ring.sh,echo "$(NCCL_MISSING)" >&2; exit 2)

# the yardstick of a memory-bound stage: device-to-device cudaMemcpy bandwidth (bench/copy_bw.cu)
bench/copy_bw: bench/copy_bw.cu common/cuda/l2_flush.cuh common/cuda/mma.cuh common/cuda/cuda_check.h common/cuda/tma.cuh
	@$(if $(Q),echo "  NVCC  $@")
	$(Q)$(NVCC) -std=c++17 -O3 -I. $(NVCC_ARCH) -Xcompiler -Wall,-Wextra $< -o $@

# Nsight Compute's DRAM bytes for each forward GPU stage beside its formula (its --counters print
# the formula), into bench/data/<gpu>_hbm.csv
bench-ncu: $(FWD_BINS)
	FA_COMMIT=$(COMMIT) STAGES="$(FWD_BINS)" bench/bench_ncu.sh

# ---- on any machine ----
# the CPU stages over N, and the yardstick cpu-blas beside them (bench/cpu_blas, built here where
# OpenBLAS is installed; skipped with a note where it is not), into bench/data/cpu.csv (the CPU
# and memory charts are drawn from it). OpenBLAS is the benchmark's alone: all and test never
# need it.
bench-cpu: $(CPU_BINS)
	@if pkg-config --exists openblas 2>/dev/null || ldconfig -p 2>/dev/null | grep -q 'libopenblas\.so '; then \
	  $(MAKE) --no-print-directory bench/cpu_blas; \
	else rm -f bench/cpu_blas; fi # (bench_cpu.sh says, in a line, that cpu-blas was skipped)
	FA_COMMIT=$(COMMIT) STAGES="$(CPU_BINS)" bench/bench_cpu.sh

# the yardstick: unfused attention through OpenBLAS (bench/cpu_blas.c)
BLAS_LIBS = $(shell pkg-config --cflags --libs openblas 2>/dev/null || echo -lopenblas)
# (it links the harness's inputs, oracle, check, timing and report, and stage 1, which the harness
# checks against)
bench/cpu_blas: bench/cpu_blas.c $(COMMON_OBJS) $(REF_OBJ)
	@$(if $(Q),echo "  CC    $@")
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ $(BLAS_LIBS) -lm

# FP8's error before the FP8 stage: its arithmetic emulated on the CPU against the fp64 oracle, per
# way of quantizing (bench/fp8_error.c)
bench/fp8_error: bench/fp8_error.c $(COMMON_OBJS) $(REF_OBJ)
	@$(if $(Q),echo "  CC    $@")
	$(Q)$(CC) $(ALL_CFLAGS) $(LDFLAGS) $^ -o $@ -lm

# every chart (PNG and SVG, into plots/) and the README's results table, from bench/data/ alone;
# the stage lists name the stages not measured yet (README=FILE: the table into FILE instead)
plots: | deps-plots
	CPU_BINS="$(CPU_BINS)" GPU_BINS="$(GRID_BINS)" FWD_BINS="$(FWD_BINS)" plots/plot.sh

# ---- reading a stage: what changed from the one before ----
# (-b: a block that only moved in or out by a level of indentation reads as unchanged)
# A stage that builds on an earlier one than N-1 names it: stage 11 moves stage 9's forward to
# wgmma (stage 10 is the backward), so make diff11 is stage 9 against stage 11.
DIFF_BASE_11 := 9
# stage 15 takes stage 9's kernel to a new shape (a few queries, a long split KV cache)
DIFF_BASE_15 := 9
# stage 16 moves stage 10's backward to Hopper (11 to 15 are forwards)
DIFF_BASE_16 := 10
# stage 17 changes stage 14's softmax (16 is the backward on Hopper)
DIFF_BASE_17 := 14
# stage 20 spreads stage 15's split-and-merge of the keys across GPUs (both merge by logsumexp
# through common/cuda/merge.cuh); 16 to 19 are other ideas
DIFF_BASE_20 := 15
diff%:
	@n=$*; case "$$n" in ''|*[!0-9]*) echo "make diff$$n: say which stage, as a number: make diff5" >&2; exit 2;; esac; \
	n=$$(expr $$n + 0); base='$(DIFF_BASE_$(patsubst 0%,%,$*))'; \
	prev=$$(printf '%02d' $${base:-$$((n - 1))}); cur=$$(printf '%02d' $$n); \
	a=$$(ls stages/$${prev}_* 2>/dev/null | head -n1); b=$$(ls stages/$${cur}_* 2>/dev/null | head -n1); \
	if [ -z "$$a" ] || [ -z "$$b" ]; then echo "make diff$$n: needs stages/$${prev}_* and stages/$${cur}_*" >&2; exit 2; fi; \
	diff -u -b "$$a" "$$b"; test $$? -le 1

clean:
	rm -rf $(BUILD) tests/attn_tests $(CPU_BINS) $(GPU_BINS) $(ABLATION_BINS) bench/cpu_blas bench/copy_bw bench/fp8_error $(FLAVOR_STAMP)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
