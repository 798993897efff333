// The split-K decode's merge of split units (plan constant kFusedMerge), in the PTX: fused, the
// decode entry arrives on a per-unit counter (release fence + acq_rel add, bar.red broadcast) and
// reads the partial states through L2 (ld.global.cg), never through the non-coherent read-only path
// (ld.global.nc), which may serve stale data for memory written during the grid; unfused, the
// decode entry has none of that and fj_decode_combine merges. Both compile without spills, with
// NVRTC and with the MLIR backend (when built in). No GPU needed.
#include "compiler/build.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/decode_plan.hpp"

#include "tests/compile/compile_matrix.hpp"
#include "tests/compile/file_check.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace flashjit {
namespace {

// The PTX of one entry: from its `.entry` line to the next entry (or the end).
std::string entry_ptx(const std::string &ptx, const std::string &entry) {
  const size_t begin = ptx.find(".entry " + entry + "(");
  if (begin == std::string::npos)
    return "";
  const size_t end = ptx.find(".entry ", begin + 1);
  return ptx.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

// False (and a skip message) when `backend` is not in this build.
bool build(const KernelSpec &spec, int fused_merge, flashjit_backend backend, CompiledKernel *kernel) {
  DecodeTuning tuning;
  tuning.fused_merge = fused_merge;
  Plan plan;
  std::string why;
  EXPECT_TRUE(plan_decode_tuned(spec, tuning, &plan, &why, backend)) << why;
  Status s = build_kernel(spec, plan, backend, kernel);
  if (s.code == FLASHJIT_UNSUPPORTED && backend == FLASHJIT_BACKEND_MLIR)
    return false;
  EXPECT_TRUE(s.ok()) << s.message;
  return s.ok();
}

const Arch kSm90a{90, true};
const Arch kSm80{80, false};

// Release, arrival, counter reset (the last arrival), broadcast, acquire, coherent state loads.
const std::vector<std::string> kArrival = {"fence.acq_rel.gpu",         "atom.acq_rel.gpu.global.add.s32",
                                           "st.relaxed.gpu.global.s32", "bar.red.or.pred",
                                           "fence.acq_rel.gpu",         "ld.global.cg.f32",
                                           "ld.global.cg.v4.f32"};
// The state loads of the merge path through the read-only path (LSE scalars, O rows), as NVRTC
// spells them; the MLIR backend's read-only loads are untyped (.b32), so there the check counts.
const std::vector<std::string> kNonCoherentStateLoads = {"ld.global.nc.f32", "ld.global.nc.v4.f32"};
// Read-only loads the fused merge may add to the decode entry: integers the host wrote (the state
// map and the merge entry, read while a piece's first tiles load, and decode_unit's KV length); a
// bound with room, not an exact count.
constexpr int kFusedMergeIntLoads = 5;

int count(const std::string &text, const std::string &pattern) {
  int n = 0;
  for (size_t at = text.find(pattern); at != std::string::npos; at = text.find(pattern, at + 1))
    ++n;
  return n;
}

TEST(DecodePlan, FusedMergeIsTheDefault) {
  const KernelSpec spec = testing::decode_spec(kSm90a, 128, FLASHJIT_BF16, 4, 1);
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_decode(spec, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kFusedMerge"), 1);
  DecodeTuning out_of_range;
  out_of_range.fused_merge = 2;
  EXPECT_FALSE(plan_decode_tuned(spec, out_of_range, &plan, &why));
  DecodeTuning unfused;
  unfused.fused_merge = 0;
  ASSERT_TRUE(plan_decode_tuned(spec, unfused, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kFusedMerge"), 0);
  // Same kernel otherwise: every other constant is the default plan's.
  Plan defaults;
  ASSERT_TRUE(plan_decode(spec, &defaults, &why)) << why;
  EXPECT_EQ(plan.constants.size(), defaults.constants.size());
  EXPECT_EQ(plan.smem_bytes, defaults.smem_bytes);
  EXPECT_EQ(plan.threads, defaults.threads);
}

// The A/B tunings of the tile shape (DecodeTuning::warps / warp_keys): 128-key tiles either way, one
// CTA per SM, compiled without spills; out-of-range values are refused with the knob's name.
TEST(DecodePlan, TileShapeTunings) {
  const KernelSpec spec = testing::decode_spec(kSm90a, 128, FLASHJIT_BF16, 4, 1);
  for (const auto &[warps, warp_keys] : {std::pair{8, 0}, std::pair{0, 32}}) {
    DecodeTuning tuning;
    tuning.warps = warps;
    tuning.warp_keys = warp_keys;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_decode_tuned(spec, tuning, &plan, &why)) << why;
    EXPECT_EQ(plan.block_n, 128);
    EXPECT_EQ(plan.constant("kWarpN"), warp_keys > 0 ? warp_keys : 16);
    EXPECT_EQ(plan.threads, (warps > 0 ? warps : 4) * 32);
    EXPECT_EQ(plan.constant("kCtasPerSm"), 1);
    CompiledKernel kernel;
    ASSERT_TRUE(build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &kernel).ok());
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
    EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name;
  }
  Plan plan;
  std::string why;
  DecodeTuning bad_warps;
  bad_warps.warps = 3;
  EXPECT_FALSE(plan_decode_tuned(spec, bad_warps, &plan, &why));
  EXPECT_NE(why.find("warps"), std::string::npos) << why;
  DecodeTuning bad_keys;
  bad_keys.warp_keys = 24;
  EXPECT_FALSE(plan_decode_tuned(spec, bad_keys, &plan, &why));
  EXPECT_NE(why.find("warp_keys"), std::string::npos) << why;
}

// The wide key block (KernelSpec::key_block 128, which decode_key_block_for picks for short steps):
// 4 warps x 32 keys, one CTA per SM, TMA tiles and a ring of at least 3 stages, compiled without
// spills, contiguous and paged; the same plan as the A/B tuning warp_keys = 32. Another key block
// is refused with the parameter's name; a tuning of the tile shape wins over the spec's block.
TEST(DecodePlan, WideKeyBlock) {
  for (int page_size : {0, 16, 64}) {
    KernelSpec spec = testing::decode_spec(kSm90a, 128, FLASHJIT_BF16, 4, 1, page_size);
    ASSERT_EQ(decode_wide_key_block(spec), 128);
    spec.key_block = 128;
    Plan plan, tuned;
    std::string why;
    ASSERT_TRUE(plan_decode(spec, &plan, &why)) << why;
    const std::string name = kernel_name(spec, plan);
    EXPECT_EQ(plan.block_n, 128) << name;
    EXPECT_EQ(plan.constant("kWarpN"), 32) << name;
    EXPECT_EQ(plan.threads, 4 * 32) << name;
    EXPECT_EQ(plan.constant("kCtasPerSm"), 1) << name;
    EXPECT_GE(plan.stages, 3) << name;
    EXPECT_EQ(plan.constant("kTmaKv"), 1) << name;
    KernelSpec plain = spec;
    plain.key_block = 0;
    DecodeTuning k32;
    k32.warp_keys = 32;
    ASSERT_TRUE(plan_decode_tuned(plain, k32, &tuned, &why)) << why;
    EXPECT_EQ(plan.constants, tuned.constants) << name;
    CompiledKernel kernel;
    ASSERT_TRUE(build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &kernel).ok());
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
    EXPECT_EQ(kernel.resources.spill_load_bytes, 0) << kernel.name;
    DecodeTuning narrow;
    narrow.warp_keys = 16;
    ASSERT_TRUE(plan_decode_tuned(spec, narrow, &tuned, &why)) << why;
    EXPECT_EQ(tuned.block_n, 64) << name;
  }
  KernelSpec spec = testing::decode_spec(kSm90a, 128, FLASHJIT_BF16, 4, 1);
  spec.key_block = 64;
  Plan plan;
  std::string why;
  EXPECT_FALSE(plan_decode(spec, &plan, &why));
  EXPECT_NE(why.find("key_block"), std::string::npos) << why;
}

// Which decode specs have the wide block, and which problems take it: TMA-eligible specs up to d128
// with one m16 tile of query rows (not on the MLIR backend: no TMA tiles), and problems of at most
// 2^18 keys x KV heads.
TEST(DecodePlan, WideKeyBlockOnlyForShortStepsOfMeasuredSpecs) {
  const KernelSpec base = testing::decode_spec(kSm90a, 128, FLASHJIT_BF16, 4, 1);
  constexpr int64_t kKvHeads = 8;
  EXPECT_EQ(decode_key_block_for(base, 1 * 32768 * kKvHeads), 128);
  EXPECT_EQ(decode_key_block_for(base, 1 * 32769 * kKvHeads), 0);
  EXPECT_EQ(decode_key_block_for(base, 8 * 8192 * kKvHeads), 0);
  EXPECT_EQ(decode_key_block_for(base, 1 * 131072 * kKvHeads), 0);
  EXPECT_EQ(decode_key_block_for(base, 64 * 4096 * kKvHeads), 0);
  EXPECT_EQ(decode_key_block_for(base, 0), 0);
  auto with = [&](auto change) {
    KernelSpec spec = base;
    change(spec);
    return decode_key_block_for(spec, 1024);
  };
  EXPECT_EQ(with([](KernelSpec &s) { s.page_size = 16; }), 128);
  EXPECT_EQ(with([](KernelSpec &s) { s.head_dim_qk = s.head_dim_v = 64; }), 128);
  EXPECT_EQ(with([](KernelSpec &s) { s.gqa_group = 8, s.q_len = 2; }), 128);
  EXPECT_EQ(with([](KernelSpec &s) { s.head_dim_qk = s.head_dim_v = 256; }), 0); // no ring of 3 at 1 CTA
  EXPECT_EQ(with([](KernelSpec &s) { s.gqa_group = 8, s.q_len = 4; }), 0);       // two m16 tiles of rows
  EXPECT_EQ(with([](KernelSpec &s) { s.page_size = 8; }), 0);                    // no TMA boxes
  EXPECT_EQ(with([](KernelSpec &s) { s.head_dim_qk = s.head_dim_v = 80; }), 0);  // no TMA panels
  EXPECT_EQ(with([](KernelSpec &s) { s.align_bytes = 2; }), 0);                  // no TMA
  EXPECT_EQ(with([](KernelSpec &s) { s.arch = kSm80; }), 0);                     // no TMA
  EXPECT_EQ(with([](KernelSpec &s) { s.op = Op::prefill; }), 0);
  EXPECT_EQ(decode_key_block_for(base, 1024, FLASHJIT_BACKEND_NVRTC), 128);
  EXPECT_EQ(decode_key_block_for(base, 1024, FLASHJIT_BACKEND_MLIR), 0); // renders cp.async tiles only
}

// TMA tiles (plan constant kTmaKv) wherever the spec allows them: sm_90, 16-byte aligned rows,
// head dims of whole 64-column panels, contiguous KV or pages of whole 16-key boxes without a
// window, the NVRTC backend. Everywhere else the cp.async plan, and a forced tma_kv names why.
TEST(DecodePlan, TmaTilesWhereTheSpecAllows) {
  struct Case {
    Arch arch;
    int dqk, dv, page_size;
    bool local;
    int align;
    flashjit_backend backend;
    bool tma;
  };
  const flashjit_backend nvrtc = FLASHJIT_BACKEND_AUTO, mlir = FLASHJIT_BACKEND_MLIR;
  for (const Case &c :
       {Case{kSm90a, 128, 128, 0, false, 16, nvrtc, true}, Case{kSm90a, 128, 128, 16, false, 16, nvrtc, true},
        Case{kSm90a, 64, 64, 48, false, 16, nvrtc, true}, Case{kSm90a, 192, 128, 512, false, 16, nvrtc, true},
        Case{kSm90a, 256, 256, 0, true, 16, nvrtc, true}, Case{kSm90a, 128, 128, 16, true, 16, nvrtc, false},
        Case{kSm90a, 128, 128, 1, false, 16, nvrtc, false}, Case{kSm90a, 128, 128, 8, false, 16, nvrtc, false},
        Case{kSm90a, 80, 80, 0, false, 16, nvrtc, false}, Case{kSm90a, 128, 96, 0, false, 16, nvrtc, false},
        Case{kSm90a, 128, 128, 0, false, 2, nvrtc, false}, Case{kSm80, 128, 128, 0, false, 16, nvrtc, false},
        Case{kSm90a, 128, 128, 16, false, 16, mlir, false}}) {
    KernelSpec spec = testing::decode_spec(c.arch, c.dqk, FLASHJIT_BF16, 4, 1, c.page_size);
    spec.head_dim_v = c.dv;
    spec.local = c.local;
    spec.align_bytes = c.align;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_decode(spec, &plan, &why, c.backend)) << why;
    const std::string name = kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kTmaKv"), c.tma ? 1 : 0) << name;
    EXPECT_EQ(name.find(".tma.") != std::string::npos, c.tma) << name;
    DecodeTuning forced;
    forced.tma_kv = 1;
    EXPECT_EQ(plan_decode_tuned(spec, forced, &plan, &why, c.backend), c.tma) << name;
    if (!c.tma) {
      EXPECT_NE(why.find("tma_kv"), std::string::npos) << why;
    }
  }
}

// The TMA plan puts every stage and V half on a 1024-byte swizzle atom and leaves room for the stage
// barriers and the kernel's rounding of its shared-memory base. From head dim 128 it keeps the
// cp.async plan's tiles, ring depth and CTAs per SM (the configuration run 21 measured); at d64 its
// extra ~3 KB per CTA moves the planner from 3 CTAs x 4 stages to 2 x 6 (paged: 5 stages to 6).
TEST(DecodePlan, TmaPlanKeepsTheMeasuredRing) {
  for (int page_size : {0, 16, 64})
    for (int dim : {64, 128, 256})
      for (int group : {1, 4, 8}) {
        const KernelSpec spec = testing::decode_spec(kSm90a, dim, FLASHJIT_BF16, group, 1, page_size);
        DecodeTuning cp_async;
        cp_async.tma_kv = 0;
        Plan tma, plain;
        std::string why;
        ASSERT_TRUE(plan_decode(spec, &tma, &why)) << why;
        ASSERT_TRUE(plan_decode_tuned(spec, cp_async, &plain, &why)) << why;
        const std::string name = kernel_name(spec, tma);
        ASSERT_EQ(tma.constant("kTmaKv"), 1) << name;
        EXPECT_EQ(plain.constant("kTmaKv"), 0) << name;
        for (const char *constant : {"kBlockM", "kBlockN", "kMTiles", "kSmemStageBytes"})
          EXPECT_EQ(tma.constant(constant), plain.constant(constant)) << name << " " << constant;
        constexpr int kMeasuredFromDim = 128;
        if (dim >= kMeasuredFromDim) {
          EXPECT_EQ(tma.constant("kStages"), plain.constant("kStages")) << name;
          EXPECT_EQ(tma.constant("kCtasPerSm"), plain.constant("kCtasPerSm")) << name;
        }
        constexpr int kAtom = 1024, kStageBarrierBytes = 8;
        for (const char *offset : {"kSmemOffsetKV", "kSmemStageBytes", "kSmemOffsetVInStage"})
          EXPECT_EQ(tma.constant(offset) % kAtom, 0) << name << " " << offset;
        EXPECT_LE(tma.constant("kSmemOffsetPages") + tma.stages * kStageBarrierBytes + kAtom, tma.smem_bytes) << name;
        EXPECT_LE(tma.smem_bytes * tma.constant("kCtasPerSm"), 227 * 1024) << name;
      }
}

// TMA tiles in the PTX: 4-D tensor loads credited to an mbarrier (arrive.expect_tx, try_wait), no
// 16-byte cp.async copies beyond Q's; no spills. The cp.async plan of the same spec has no tensor
// loads.
TEST(DecodeTmaTiles, LoadTilesByTensorCopies) {
  for (int page_size : {0, 16})
    for (int dim : {64, 128, 256}) {
      const KernelSpec spec = testing::decode_spec(kSm90a, dim, FLASHJIT_BF16, 4, 1, page_size);
      CompiledKernel tma, plain;
      ASSERT_TRUE(build(spec, -1, FLASHJIT_BACKEND_NVRTC, &tma));
      ASSERT_NE(tma.name.find(".tma."), std::string::npos) << tma.name;
      EXPECT_EQ(tma.resources.spill_store_bytes, 0) << tma.name << "\n" << tma.log;
      EXPECT_EQ(tma.resources.spill_load_bytes, 0) << tma.name;
      const std::string decode = entry_ptx(tma.ptx, "fj_decode_splitk");
      EXPECT_TRUE(testing::check_in_order(decode, {"mbarrier.init.shared", "mbarrier.arrive.expect_tx",
                                                   "cp.async.bulk.tensor.4d.shared::cluster.global",
                                                   "mbarrier.try_wait.parity"}))
          << tma.name;
      const int tma_copies = count(decode, "cp.async.cg.shared.global"); // Q's rows only

      DecodeTuning cp_async;
      cp_async.tma_kv = 0;
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_decode_tuned(spec, cp_async, &plan, &why)) << why;
      ASSERT_TRUE(build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &plain).ok());
      const std::string plain_decode = entry_ptx(plain.ptx, "fj_decode_splitk");
      EXPECT_TRUE(testing::check_not(plain_decode, {"cp.async.bulk.tensor"})) << plain.name;
      const int plain_copies = count(plain_decode, "cp.async.cg.shared.global");
      EXPECT_GT(plain_copies, tma_copies) << plain.name;
      std::printf("  %-64s registers %3d, cp.async %2d (cp.async tiles: %3d, %2d)\n", tma.name.c_str(),
                  tma.resources.registers, tma_copies, plain.resources.registers, plain_copies);
    }
}

struct FusedCase {
  Arch arch;
  int dim, group, q_len, page_size;
  flashjit_backend backend;
};

class DecodeFusedMerge : public ::testing::TestWithParam<FusedCase> {};

TEST_P(DecodeFusedMerge, ArrivesAndReadsStatesCoherently) {
  const FusedCase &c = GetParam();
  const KernelSpec spec = testing::decode_spec(c.arch, c.dim, FLASHJIT_BF16, c.group, c.q_len, c.page_size);
  CompiledKernel fused, unfused;
  if (!build(spec, 1, c.backend, &fused))
    GTEST_SKIP() << "no MLIR backend in this build";
  ASSERT_FALSE(fused.cubin.empty());
  EXPECT_EQ(fused.resources.spill_store_bytes, 0) << fused.name << "\n" << fused.log;
  EXPECT_EQ(fused.resources.spill_load_bytes, 0) << fused.name;
  const std::string decode = entry_ptx(fused.ptx, "fj_decode_splitk");
  ASSERT_FALSE(decode.empty()) << testing::excerpt(fused.ptx);
  EXPECT_TRUE(testing::check_in_order(decode, kArrival));
  if (c.backend == FLASHJIT_BACKEND_NVRTC) {
    EXPECT_TRUE(testing::check_not(decode, kNonCoherentStateLoads));
  }
  // The standalone merge stays in the cubin and keeps the read-only path (its states come from an
  // earlier grid).
  const std::string combine = entry_ptx(fused.ptx, "fj_decode_combine");
  ASSERT_FALSE(combine.empty());
  EXPECT_TRUE(testing::check_in_order(combine, {"ld.global.nc.v4"}));
  EXPECT_TRUE(testing::check_not(combine, {"atom.", "ld.global.cg"}));

  ASSERT_TRUE(build(spec, 0, c.backend, &unfused));
  const std::string plain = entry_ptx(unfused.ptx, "fj_decode_splitk");
  ASSERT_FALSE(plain.empty());
  EXPECT_TRUE(testing::check_not(plain, {"atom.", "fence.acq_rel", "bar.red", "ld.global.cg"}));
  EXPECT_LE(count(decode, "ld.global.nc"), count(plain, "ld.global.nc") + kFusedMergeIntLoads)
      << "a partial state is read through the read-only path";
  std::printf("  %-60s registers fused %3d, unfused %3d\n", fused.name.c_str(), fused.resources.registers,
              unfused.resources.registers);
}

std::vector<FusedCase> fused_cases() {
  std::vector<FusedCase> cases;
  for (flashjit_backend backend : {FLASHJIT_BACKEND_NVRTC, FLASHJIT_BACKEND_MLIR})
    for (FusedCase c : {FusedCase{kSm90a, 128, 4, 1, 0}, FusedCase{kSm90a, 128, 4, 1, 16},
                        FusedCase{kSm80, 64, 8, 4, 0}, FusedCase{kSm90a, 256, 4, 2, 16}}) {
      c.backend = backend;
      cases.push_back(c);
    }
  return cases;
}

// Element-aligned rows (align 2) load each chunk through registers: no spills either (d128 g4 on
// sm_90a spilled 96 bytes before its copy unroll was capped for that path).
TEST(DecodeElementAligned, CompilesWithoutSpills) {
  struct Case {
    Arch arch;
    int dim, group, q_len, page_size;
  };
  for (const Case &c : {Case{kSm90a, 128, 4, 1, 0}, Case{kSm90a, 256, 8, 1, 0}, Case{kSm90a, 80, 4, 1, 16},
                        Case{kSm80, 128, 4, 1, 0}}) {
    KernelSpec spec = testing::decode_spec(c.arch, c.dim, FLASHJIT_BF16, c.group, c.q_len, c.page_size);
    spec.align_bytes = 2;
    CompiledKernel kernel;
    ASSERT_TRUE(build(spec, 1, FLASHJIT_BACKEND_NVRTC, &kernel));
    EXPECT_EQ(kernel.resources.spill_store_bytes, 0) << kernel.name << "\n" << kernel.log;
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, DecodeFusedMerge, ::testing::ValuesIn(fused_cases()),
                         [](const ::testing::TestParamInfo<FusedCase> &info) {
                           const FusedCase &c = info.param;
                           return backend_name(c.backend) + "_" + c.arch.name() + "_d" + std::to_string(c.dim) + "_g" +
                                  std::to_string(c.group) + "_q" + std::to_string(c.q_len) + "_page" +
                                  std::to_string(c.page_size);
                         });

} // namespace
} // namespace flashjit
