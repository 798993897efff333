#!/usr/bin/env bash
# Builds the fa2 prefill kernel with both backends (here, where LLVM/MLIR is) for a handful of sm_90a
# specs into build-device/mlir-parity-fa2: <tag>.mlir.cubin, <tag>.nvrtc.cubin (same spec, same plan)
# and <tag>.meta (what tests/mlir_parity/check_fa2.cpp needs of the plan and spec, one line:
# threads smem block_m dqk dv bf16 causal local softcap varlen page_size align_bytes). Needs a build
# with the MLIR backend in ${FLASHJIT_BUILD_DIR:-build} (libflashjit). Then, on the GPU machine:
#   g++ -std=c++17 -O2 tests/mlir_parity/check_fa2.cpp -I. -Itemplates -I/usr/local/cuda/include -lcuda -o /tmp/check_fa2 &&
#   for m in build-device/mlir-parity-fa2/*.meta; do /tmp/check_fa2 "${m%.meta}"; done
set -euo pipefail
cd "$(dirname "$0")/.."
build="${FLASHJIT_BUILD_DIR:-build}"
out=build-device/mlir-parity-fa2
rm -rf "$out" && mkdir -p "$out"
maker="$(mktemp -d)"
trap 'rm -rf "$maker"' EXIT

# The maker: spec words -> plan (plan_fa2_tuned) -> both backends' cubins + the .meta line.
cat >"$maker/make_fa2.cpp" <<'EOF'
#include "compiler/build.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa2_plan.hpp"
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
using namespace flashjit;
// make_fa2 <out/tag> <arch> <dqk> <dv> <bf16|fp16> [causal local softcap varlen paged=N al2 r16 r32 n=N s1]
int main(int argc, char **argv) {
  if (argc < 6) return 1;
  KernelSpec spec;
  spec.op = Op::prefill;
  spec.arch = *Arch::parse(argv[2]);
  spec.head_dim_qk = std::atoi(argv[3]);
  spec.head_dim_v = std::atoi(argv[4]);
  spec.dtype = std::string(argv[5]) == "fp16" ? FLASHJIT_FP16 : FLASHJIT_BF16;
  Fa2Tuning tuning;
  for (int i = 6; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "causal") spec.causal = true;
    else if (f == "local") spec.local = true;
    else if (f == "softcap") spec.softcap = true;
    else if (f == "varlen") spec.varlen = true;
    else if (f.rfind("paged=", 0) == 0) spec.page_size = std::atoi(f.c_str() + 6);
    else if (f == "al2") spec.align_bytes = 2;
    else if (f == "r16") tuning.rows_per_warp = 16;
    else if (f == "r32") tuning.rows_per_warp = 32;
    else if (f.rfind("n=", 0) == 0) tuning.block_n = std::atoi(f.c_str() + 2);
    else if (f == "s1") tuning.stages = 1;
    else { std::printf("unknown word %s\n", f.c_str()); return 1; }
  }
  Plan plan;
  std::string why;
  // The MLIR backend's plan, which both backends then build (parity compares one plan).
  if (!plan_fa2_tuned(spec, tuning, &plan, &why, FLASHJIT_BACKEND_MLIR)) { std::printf("plan: %s\n", why.c_str()); return 1; }
  const std::string base = argv[1];
  for (auto [backend, suffix] : {std::pair{FLASHJIT_BACKEND_MLIR, ".mlir"}, std::pair{FLASHJIT_BACKEND_NVRTC, ".nvrtc"}}) {
    CompiledKernel k;
    if (Status s = build_kernel(spec, plan, backend, &k); !s) { std::printf("%s\n", s.message.c_str()); return 1; }
    std::ofstream(base + suffix + ".cubin", std::ios::binary).write(k.cubin.data(), std::streamsize(k.cubin.size()));
    std::printf("%-44s %-6s %3d registers, spills %d/%d, %.0f ms\n", k.name.c_str(), suffix + 1, k.resources.registers,
                k.resources.spill_store_bytes, k.resources.spill_load_bytes, k.compile_seconds * 1e3);
  }
  std::ofstream(base + ".meta") << plan.threads << ' ' << plan.smem_bytes << ' ' << plan.block_m << ' '
                                << spec.head_dim_qk << ' ' << spec.head_dim_v << ' ' << int(spec.dtype == FLASHJIT_BF16)
                                << ' ' << int(spec.causal) << ' ' << int(spec.local) << ' ' << int(spec.softcap) << ' '
                                << int(spec.varlen) << ' ' << spec.page_size << ' ' << spec.align_bytes << '\n';
  return 0;
}
EOF
g++ -std=c++20 -O1 "$maker/make_fa2.cpp" -I. -Iinclude -Itemplates -isystem /usr/local/cuda/include \
  -L"$build" -lflashjit -Wl,-rpath,"$PWD/$build" -o "$maker/make_fa2"

# tag: spec words (the planner's default plan unless r16 / r32 / n= / s1 pin one). The default plans
# of d64, d80 and d128 (bf16, causal and not) first: 32 rows per warp with the widest key block,
# contiguous K/V through the KvStream copy; then pinned plans for what the defaults do not reach.
while read -r tag words; do
  "$maker/make_fa2" "$out/$tag" $words
done <<'SPECS'
d64.bf16                  sm90a 64 64 bf16
d64.bf16.causal           sm90a 64 64 bf16 causal
d80.bf16                  sm90a 80 80 bf16
d80.bf16.causal           sm90a 80 80 bf16 causal
d128.bf16                 sm90a 128 128 bf16
d128.bf16.causal          sm90a 128 128 bf16 causal
d64.fp16.causal.softcap   sm90a 64 64 fp16 causal softcap
d128.bf16.paged16.causal  sm90a 128 128 bf16 paged=16 causal
d72.bf16.unaligned        sm90a 72 72 bf16 al2
d128.fp16.single-buffer   sm90a 128 128 fp16 s1
d64.bf16.r32.n80          sm90a 64 64 bf16 r32 n=80
d128.bf16.causal.r16      sm90a 128 128 bf16 causal r16
d72.fp16.r16              sm90a 72 72 fp16 r16
d40.fp16.causal.r16       sm90a 40 40 fp16 causal r16
d192v128.bf16.causal.r16  sm90a 192 128 bf16 causal r16
d256.fp16                 sm90a 256 256 fp16
d128.bf16.local.softcap   sm90a 128 128 bf16 local softcap
d128.fp16.varlen.causal   sm90a 128 128 fp16 varlen causal
d128.bf16.paged16.causal.r16 sm90a 128 128 bf16 paged=16 causal r16
d64.fp16.paged1.causal    sm90a 64 64 fp16 paged=1 causal
d72.bf16.paged3.unaligned sm90a 72 72 bf16 paged=3 al2
d72.bf16.unaligned.r16    sm90a 72 72 bf16 al2 r16
d128.fp16.single-buffer.r16 sm90a 128 128 fp16 s1 r16
SPECS
ls "$out" | wc -l
