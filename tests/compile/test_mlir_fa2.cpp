// The MLIR backend's fa2 prefill kernel (compiler/mlir/gen_fa2.cpp): string checks per stage in the
// manner of FileCheck, the NVRTC parameter block (fj_attention_params, 272 bytes) and launch bounds,
// ptxas (whole-program, as NVRTC's) accepting every covered specialization with no spills (as the
// NVRTC compile tests require), registers within ~10% of the NVRTC kernel of the same plan, and a clear error for a
// plan the kernel cannot use. No GPU needed.
//
// Cases use the planner's default plan unless they pin one with Fa2Tuning to cover a warp shape
// (16 rows where the default is 32) or a schedule (one stage) that the defaults do not reach.
#include "compiler/build.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa2_plan.hpp"

#ifdef FLASHJIT_WITH_MLIR
#include "compiler/mlir/mlir_backend.hpp"
#include "compiler/mlir/ptxas_tool.hpp"
#endif

#include "kernel_params.h"

#include "tests/compile/compile_matrix.hpp"
#include "tests/compile/file_check.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace flashjit {
namespace {

const Arch kSm90a{90, true};
const Arch kSm80{80, false};
const Arch kSm86{86, false};
constexpr int kRows16 = 16;
constexpr int kSingleBufferBlockN = 32;                     // d128 under the planner's register budget
constexpr int kSteppedBlockN = 128, kSteppedSubBlockN = 64; // d64: two steps of 64 keys
constexpr int kRows32 = 32;
constexpr int kMaxHeadDim = 256;
constexpr int kChunkElems = 8; // 16-bit values per 16-byte cp.async

struct Fa2Case {
  Arch arch;
  int dim_qk, dim_v;
  flashjit_dtype dtype;
  bool causal = false, local = false, softcap = false, varlen = false;
  int page_size = 0, align_bytes = 16;
  int rows_per_warp = 0, block_n = 0, stages = 0, sub_block_n = 0; // 0: the planner's choice
};

KernelSpec spec_of(const Fa2Case &c) {
  KernelSpec spec;
  spec.op = Op::prefill;
  spec.arch = c.arch;
  spec.head_dim_qk = c.dim_qk;
  spec.head_dim_v = c.dim_v;
  spec.dtype = c.dtype;
  spec.causal = c.causal;
  spec.local = c.local;
  spec.softcap = c.softcap;
  spec.varlen = c.varlen;
  spec.page_size = c.page_size;
  spec.align_bytes = c.align_bytes;
  return spec;
}

Plan plan_of(const Fa2Case &c) {
  Fa2Tuning tuning;
  tuning.rows_per_warp = c.rows_per_warp;
  tuning.block_n = c.block_n;
  tuning.stages = c.stages;
  tuning.sub_block_n = c.sub_block_n;
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_fa2_tuned(spec_of(c), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
  return plan;
}

#ifndef FLASHJIT_WITH_MLIR
TEST(MlirFa2, NotInThisBuild) {
  const Fa2Case c{kSm90a, 128, 128, FLASHJIT_BF16};
  CompiledKernel kernel;
  Status s = build_kernel(spec_of(c), plan_of(c), FLASHJIT_BACKEND_MLIR, &kernel);
  EXPECT_EQ(s.code, FLASHJIT_UNSUPPORTED);
  GTEST_SKIP() << "built without FLASHJIT_WITH_MLIR (no LLVM/MLIR 22)";
}
#else

using testing::check_in_order;
using testing::check_not;

void PrintTo(const Fa2Case &c, std::ostream *out) {
  *out << c.arch.name() << " d" << c.dim_qk << "/" << c.dim_v << (c.dtype == FLASHJIT_FP16 ? " fp16" : " bf16")
       << (c.causal ? " causal" : "") << (c.local ? " local" : "") << (c.softcap ? " softcap" : "")
       << (c.varlen ? " varlen" : "") << (c.page_size ? " paged" + std::to_string(c.page_size) : "")
       << (c.align_bytes < 16 ? " al" + std::to_string(c.align_bytes) : "")
       << (c.rows_per_warp ? " r" + std::to_string(c.rows_per_warp) : "")
       << (c.block_n ? " n" + std::to_string(c.block_n) : "") << (c.stages ? " s" + std::to_string(c.stages) : "")
       << (c.sub_block_n ? " k" + std::to_string(c.sub_block_n) : "");
}

const std::string kParamDecl =
    ".param .align 8 .b8 fj_fa2_prefill_param_0[" + std::to_string(sizeof(fj_attention_params)) + "]";

mlirgen::Stages stages_of(const Fa2Case &c) {
  mlirgen::Stages stages;
  Status s = mlirgen::generate(spec_of(c), plan_of(c), {}, &stages);
  EXPECT_TRUE(s.ok()) << s.message;
  return stages;
}

// --- one check per generator stage --------------------------------------------------------------

const Fa2Case kStageCase{kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/true};

TEST(MlirFa2Stages, BuiltIr) {
  const mlirgen::Stages stages = stages_of(kStageCase);
  EXPECT_TRUE(check_in_order(stages.built, {
                                               "gpu.module @flashjit [#nvvm.target<O = 3, chip = \"sm_90a\"",
                                               "llvm.mlir.global external @fj_fa2_smem()",
                                               "addr_space = 3",
                                               "gpu.func @fj_fa2_prefill(%arg0: !llvm.ptr) kernel",
                                               "known_block_size = array<i32: 128, 1, 1>",
                                               "nvvm.read.ptx.sreg.ctaid.z", // batch
                                               "nvvm.read.ptx.sreg.ctaid.y", // head
                                               "nvvm.read.ptx.sreg.ctaid.x", // query tile
                                               "scf.if",                     // the tile is inside its sequence
                                               "scf.for",                    // empty tile: O = 0
                                               "nvvm.cp.async.shared.global",
                                               "nvvm.cp.async.commit.group", // Q
                                               "nvvm.cp.async.commit.group", // K0
                                               "nvvm.cp.async.commit.group", // V0
                                               "nvvm.cp.async.wait.group 0", // ring of two: K_j, V_j landed
                                               "nvvm.barrier0",
                                               "nvvm.ldmatrix",
                                               "nvvm.mma.sync",
                                               "llvm.nvvm.ex2.approx.ftz.f32",
                                               "nvvm.shfl.sync  bfly",
                                               "layout = #nvvm.mma_layout<col>", // V: ldmatrix .trans
                                               "nvvm.cp.async.wait.group 0",
                                               "arith.divf", // 1 / row sum, IEEE as in the template
                                               "llvm.nvvm.lg2.approx.ftz.f",
                                               "gpu.return",
                                           }));
}

TEST(MlirFa2Stages, LoweredIr) {
  const mlirgen::Stages stages = stages_of(kStageCase);
  EXPECT_TRUE(check_in_order(stages.lowered, {"llvm.func @fj_fa2_prefill(%arg0: !llvm.ptr {llvm.align = 8 : i64, "
                                              "llvm.byval = !llvm.struct<(struct<(ptr, i64, i64, i64)>",
                                              "nvvm.grid_constant}", "nvvm.kernel",
                                              "nvvm.maxntid = array<i32: 128, 1, 1>", "nvvm.minctasm = 1"}));
  EXPECT_TRUE(check_not(stages.lowered, {"scf.", "arith.", "gpu.func", "vector.", "unrealized_conversion_cast"}));
}

TEST(MlirFa2Stages, Ptx) {
  const mlirgen::Stages stages = stages_of(kStageCase);
  EXPECT_TRUE(check_in_order(stages.ptx, {".target sm_90a", ".extern .shared .align 16 .b8 fj_fa2_smem[]",
                                          ".visible .entry fj_fa2_prefill(", kParamDecl, ".maxntid 128, 1, 1",
                                          ".minnctapersm 1", "%ctaid.z"}));
  for (const char *op :
       {"cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group", "bar.sync",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "ex2.approx.ftz.f32", "shfl.sync.bfly.b32",
        "cvt.rn.bf16x2.f32", "lg2.approx.ftz.f32", "st.global.v4.b32", "ld.shared.v4"})
    EXPECT_NE(stages.ptx.find(op), std::string::npos) << op;
  EXPECT_TRUE(check_not(stages.ptx, {".local", "__nv_", "griddepcontrol"}));
}

// head_dim_v = 8 (mod 16) ends P V with an ldmatrix .x2; head_dim_qk = 8 (mod 16) zero-pads Q K^T.
TEST(MlirFa2Stages, OddTilesAndFoldedScale) {
  const mlirgen::Stages odd = stages_of({kSm80, 72, 40, FLASHJIT_FP16});
  EXPECT_TRUE(check_in_order(odd.ptx, {".target sm_80", "st.shared.v4.b32", // zero_qk_padding
                                       "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"}));
  EXPECT_NE(odd.ptx.find("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"), std::string::npos);
  // 32 rows per warp (the default up to head dim 128) without softcap folds the scale into the
  // exponent's fma.rn.
  const mlirgen::Stages folded = stages_of({kSm90a, 64, 64, FLASHJIT_BF16});
  EXPECT_TRUE(check_in_order(folded.ptx, {".maxntid 128, 1, 1", "fma.rn.f32"}));
}

// Contiguous 16-byte K/V go through the fixed per-thread KvStream (kernels/fa2/kv_stream.cuh): every K or V
// load site unrolls into one cp.async per pass for full blocks (source size 16, no row predicate)
// and one per pass for the partial last block. Load sites: Q (a loop), then K and V in the prologue
// and in the ring.
TEST(MlirFa2Stages, KvStreamUnrollsFullAndPartialBlocks) {
  auto count = [](const std::string &text, const std::string &what) { return int(testing::count_of(text, what)); };
  constexpr int kLoadSites = 2 * 2; // (prologue + ring) x (K + V)
  const Plan plan = plan_of(kStageCase);
  const int passes = int(plan.constant("kBlockN") / (plan.threads / (kStageCase.dim_qk / kChunkElems)));
  const mlirgen::Stages streamed = stages_of(kStageCase);
  EXPECT_EQ(count(streamed.ptx, "cp.async.cg.shared.global"), 1 + kLoadSites * 2 * passes);
  EXPECT_EQ(count(streamed.ptx, ", 16, 16;"), kLoadSites * passes); // full blocks: no zero fill
  // Paged K/V take the same stream (since session 30): every pass unrolled at every site, its row's
  // page from the table (ld.global.nc) and its address by mul.wide where the byte strides fit 32
  // bits (LLVM shares parts of the 32- and 64-bit forms, so at least one copy a pass and site).
  Fa2Case paged = kStageCase;
  paged.page_size = 16;
  const mlirgen::Stages paged_stages = stages_of(paged);
  EXPECT_GE(count(paged_stages.ptx, "cp.async.cg.shared.global"), 1 + kLoadSites * passes);
  EXPECT_GE(count(paged_stages.ptx, "ld.global.nc.s32"), kLoadSites * passes);
  EXPECT_NE(paged_stages.ptx.find("mul.wide.s32"), std::string::npos);
}

// --- ptxas accepts every covered specialization without spilling ------------------------------

std::vector<Fa2Case> fa2_cases() {
  std::vector<Fa2Case> cases;
  const std::pair<int, int> dims[] = {{64, 64},   {72, 72},   {80, 80},   {96, 96},
                                      {128, 128}, {256, 256}, {192, 128}, {40, 40}};
  for (Arch arch : {kSm90a, kSm80})
    for (auto [dqk, dv] : dims)
      for (flashjit_dtype dtype : {FLASHJIT_BF16, FLASHJIT_FP16}) {
        // both dtypes, causal on one of them (alternating between the archs)
        const bool causal = (dtype == FLASHJIT_BF16) == (arch == kSm90a);
        cases.push_back({arch, dqk, dv, dtype, causal});
      }
  Fa2Case c{kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/false, /*local=*/true, /*softcap=*/true};
  cases.push_back(c);
  c = {kSm90a, 64, 64, FLASHJIT_FP16, /*causal=*/true, false, false, /*varlen=*/true};
  cases.push_back(c);
  c = {kSm80, 128, 128, FLASHJIT_FP16, /*causal=*/true, /*local=*/true, /*softcap=*/true, /*varlen=*/true};
  cases.push_back(c);
  c = {kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/true};
  c.page_size = 16; // paged K/V: load_tile, not the KvStream
  cases.push_back(c);
  c = {kSm90a, 72, 72, FLASHJIT_BF16};
  c.align_bytes = 2;
  cases.push_back(c);
  c = {kSm86, 128, 128, FLASHJIT_BF16, /*causal=*/true}; // 99 KB: the single-buffer schedule
  cases.push_back(c);
  c = {kSm90a, 128, 128, FLASHJIT_FP16};
  c.stages = 1;
  c.block_n = kSingleBufferBlockN; // the budget's key block: the wide sm_90a one is a two-stage tile
  cases.push_back(c);
  c = {kSm80, 64, 64, FLASHJIT_FP16, false, false, /*softcap=*/true};
  cases.push_back(c);
  // A key block run as several QK -> softmax -> PV steps (Fa2Tuning::sub_block_n), causal and not.
  for (bool causal : {false, true}) {
    c = {kSm90a, 64, 64, FLASHJIT_BF16, causal};
    c.block_n = kSteppedBlockN;
    c.sub_block_n = kSteppedSubBlockN;
    cases.push_back(c);
  }
  // 16 rows per warp where the default is 32: the one-row-block warp shape, streamed, paged, unaligned
  // and single-buffered.
  for (int dim : {64, 128}) {
    c = {kSm90a, dim, dim, FLASHJIT_BF16, /*causal=*/dim == 128};
    c.rows_per_warp = kRows16;
    cases.push_back(c);
  }
  c = {kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/true};
  c.page_size = 16;
  c.rows_per_warp = kRows16;
  cases.push_back(c);
  c = {kSm90a, 72, 72, FLASHJIT_FP16};
  c.align_bytes = 2;
  c.rows_per_warp = kRows16;
  cases.push_back(c);
  c = {kSm90a, 128, 128, FLASHJIT_FP16};
  c.stages = 1;
  c.rows_per_warp = kRows16;
  cases.push_back(c);
  return cases;
}

CompiledKernel compile_mlir(const Fa2Case &c, Status *status) {
  CompiledKernel kernel;
  *status = build_kernel(spec_of(c), plan_of(c), FLASHJIT_BACKEND_MLIR, &kernel);
  return kernel;
}

// Without a toolkit ptxas the backend assembles through nvJitLink's relocatable mode, which
// allocates registers differently from NVRTC: resource checks would compare unlike things.
bool whole_program_ptxas() {
  return !ptxas::path().empty();
}

class MlirFa2Compile : public ::testing::TestWithParam<Fa2Case> {};

TEST_P(MlirFa2Compile, PtxasAcceptsWithinTheSpillRule) {
  const Fa2Case &c = GetParam();
  if (!whole_program_ptxas())
    GTEST_SKIP() << "no ptxas in the toolkit";
  Status s;
  CompiledKernel kernel = compile_mlir(c, &s);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(kernel.entry, "fj_fa2_prefill");
  ASSERT_FALSE(kernel.cubin.empty());
  EXPECT_GT(kernel.resources.registers, 0) << "no ptxas report in the log:\n" << kernel.log;
  std::printf("  %-60s %3d registers, spills %d/%d\n", kernel.name.c_str(), kernel.resources.registers,
              kernel.resources.spill_store_bytes, kernel.resources.spill_load_bytes);
  EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_EQ(kernel.resources.stack_frame_bytes, 0) << kernel.name << "\n" << kernel.log;
  EXPECT_TRUE(kernel.resources.warnings.empty()) << kernel.log;
  EXPECT_NE(kernel.ptx.find("fj_fa2_prefill_param_0[" + std::to_string(sizeof(fj_attention_params)) + "]"),
            std::string::npos);
  EXPECT_NE(kernel.ptx.find(".minnctapersm 1"), std::string::npos);
  EXPECT_NE(kernel.ptx.find("mma.sync.aligned.m16n8k16"), std::string::npos);
  EXPECT_NE(kernel.ptx.find("ldmatrix"), std::string::npos);
  EXPECT_NE(kernel.ptx.find("cp.async"), std::string::npos); // Q / K / V, or only its group bookkeeping
  if (c.align_bytes >= 16)
    EXPECT_NE(kernel.ptx.find("cp.async.cg.shared.global"), std::string::npos);
  else
    EXPECT_EQ(kernel.ptx.find("cp.async.cg.shared.global"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(CoveredFa2, MlirFa2Compile, ::testing::ValuesIn(fa2_cases()));

// --- registers next to the NVRTC kernel of the same plan ----------------------------------------

TEST(MlirFa2, RegistersWithinTenPercentOfNvrtc) {
  constexpr double kSlack = 1.10;
  if (!whole_program_ptxas())
    GTEST_SKIP() << "no ptxas in the toolkit";
  Fa2Case narrow{kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/true};
  narrow.rows_per_warp = kRows16;
  const Fa2Case cases[] = {{kSm90a, 128, 128, FLASHJIT_BF16, /*causal=*/true},
                           {kSm90a, 64, 64, FLASHJIT_BF16},
                           {kSm90a, 72, 72, FLASHJIT_FP16},
                           {kSm90a, kMaxHeadDim, kMaxHeadDim, FLASHJIT_BF16},
                           {kSm90a, 128, 128, FLASHJIT_BF16, false, /*local=*/true, /*softcap=*/true},
                           {kSm80, 128, 128, FLASHJIT_FP16},
                           {kSm80, kMaxHeadDim, kMaxHeadDim, FLASHJIT_BF16},
                           narrow};
  for (const Fa2Case &c : cases) {
    Status s;
    CompiledKernel mlir = compile_mlir(c, &s);
    ASSERT_TRUE(s.ok()) << s.message;
    CompiledKernel nvrtc;
    s = build_kernel(spec_of(c), plan_of(c), FLASHJIT_BACKEND_NVRTC, &nvrtc);
    ASSERT_TRUE(s.ok()) << s.message;
    std::printf("  %-52s registers mlir %3d, nvrtc %3d; spill stores mlir %3d, nvrtc %3d\n", mlir.name.c_str(),
                mlir.resources.registers, nvrtc.resources.registers, mlir.resources.spill_store_bytes,
                nvrtc.resources.spill_store_bytes);
    EXPECT_LE(mlir.resources.registers, nvrtc.resources.registers * kSlack) << mlir.name;
  }
}

// --- a plan the kernel cannot use is an error with the reason, not a wrong kernel ---------------

TEST(MlirFa2, BrokenPlanIsRefusedWithTheReason) {
  const Fa2Case c{kSm90a, 128, 128, FLASHJIT_BF16};
  Plan missing = plan_of(c);
  std::erase_if(missing.constants, [](const PlanConstant &k) { return k.name == "kSmemStrideK"; });
  Plan broken = plan_of(c);
  for (PlanConstant &k : broken.constants)
    if (k.name == "kSmemStrideV")
      k.value = c.dim_v - kRows16; // narrower than a V row
  const std::pair<Plan, const char *> plans[] = {{missing, "kSmemStrideK"}, {broken, "invariants"}};
  for (const auto &[plan, reason] : plans) {
    CompiledKernel kernel;
    Status s = build_kernel(spec_of(c), plan, FLASHJIT_BACKEND_MLIR, &kernel);
    EXPECT_EQ(s.code, FLASHJIT_INTERNAL) << s.message;
    EXPECT_NE(s.message.find(reason), std::string::npos) << s.message;
    EXPECT_TRUE(kernel.cubin.empty());
  }
}

#endif

} // namespace
} // namespace flashjit
