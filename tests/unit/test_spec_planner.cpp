// KernelSpec names and hashes, arch parsing, and the planner's choices and fallbacks.
#include "compiler/codegen.hpp"
#include "compiler/nvrtc/nvrtc_compiler.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

namespace flashjit {
namespace {

KernelSpec prefill(int d, bool causal, Arch arch = Arch{90, true}) {
  KernelSpec spec;
  spec.arch = arch;
  spec.head_dim_qk = spec.head_dim_v = d;
  spec.causal = causal;
  return spec;
}

TEST(Arch, ParsesEveryAcceptedSpelling) {
  EXPECT_EQ(Arch::parse("sm_90a")->name(), "sm90a");
  EXPECT_EQ(Arch::parse("sm90")->name(), "sm90a"); // wgmma needs the arch-specific target
  EXPECT_EQ(Arch::parse("80")->name(), "sm80");
  EXPECT_EQ(Arch::parse("sm_86")->nvrtc_target(), "sm_86");
  EXPECT_FALSE(Arch::parse("sm_75"));
  EXPECT_FALSE(Arch::parse("sm_80a"));
  EXPECT_FALSE(Arch::parse("banana"));
  EXPECT_EQ(Arch::from_compute_capability(9, 0).name(), "sm90a");
  EXPECT_EQ(Arch::from_compute_capability(8, 7).name(), "sm86");
}

TEST(KernelName, SpellsOutTheSpecAndPlan) {
  KernelSpec spec = prefill(80, true);
  Plan plan;
  plan.variant = Variant::fa2;
  plan.block_m = 128;
  plan.block_n = 64;
  plan.stages = 2;
  EXPECT_EQ(kernel_name(spec, plan), "prefill.fa2.sm90a.d80v80.bf16.causal.m128n64s2.al16");
  spec.local = spec.softcap = spec.varlen = true;
  spec.page_size = 16;
  spec.dtype = FLASHJIT_FP16;
  spec.head_dim_v = 128;
  EXPECT_EQ(kernel_name(spec, plan),
            "prefill.fa2.sm90a.d80v128.fp16.causal.window.softcap.varlen.page16.m128n64s2.al16");
  plan.add("kSubBlockN", 64); // one step per block: nothing to say
  EXPECT_EQ(kernel_name(spec, plan),
            "prefill.fa2.sm90a.d80v128.fp16.causal.window.softcap.varlen.page16.m128n64s2.al16");
  plan.constants.clear();
  plan.add("kSubBlockN", 32);
  EXPECT_EQ(kernel_name(spec, plan),
            "prefill.fa2.sm90a.d80v128.fp16.causal.window.softcap.varlen.page16.m128n64s2k32.al16");
}

TEST(KernelHash, IsStableAndSeparatesEveryField) {
  Plan plan;
  plan.block_m = 128;
  const KernelSpec base = prefill(128, false);
  // Stable across runs and builds: a fixed value for a fixed input.
  EXPECT_EQ(kernel_hash(base, plan), kernel_hash(base, plan));
  std::set<uint64_t> hashes;
  std::vector<KernelSpec> specs(12, base);
  specs[1].causal = true;
  specs[2].dtype = FLASHJIT_FP16;
  specs[3].head_dim_v = 64;
  specs[4].arch = Arch{80, false};
  specs[5].local = true;
  specs[6].softcap = true;
  specs[7].varlen = true;
  specs[8].page_size = 1;
  specs[9].align_bytes = 2;
  specs[10].head_dim_qk = 120;
  specs[11].op = Op::decode;
  for (const KernelSpec &s : specs)
    hashes.insert(kernel_hash(s, plan));
  EXPECT_EQ(hashes.size(), specs.size());
  Plan other = plan;
  other.add("kSmemOffsetV", 4096);
  EXPECT_NE(kernel_hash(base, plan), kernel_hash(base, other));
}

TEST(Planner, Fa2CoversEveryHeadDimOnEveryArchWithinSharedMemory) {
  for (Arch arch : {Arch{80, false}, Arch{86, false}, Arch{89, false}, Arch{90, true}})
    for (int d = 8; d <= 256; d += 8)
      for (int dv : {d, 128})
        for (bool causal : {false, true}) {
          KernelSpec spec = prefill(d, causal, arch);
          spec.head_dim_v = dv;
          Plan plan;
          std::string why;
          ASSERT_TRUE(plan_fa2(spec, &plan, &why)) << arch.name() << " d" << d << ": " << why;
          EXPECT_LE(plan.smem_bytes, max_shared_bytes_per_block(arch)) << kernel_name(spec, plan);
          EXPECT_GT(plan.threads, 0);
          EXPECT_EQ(plan.entry, "fj_fa2_prefill");
        }
}

// The fa2 key blocks of perf-notes "fa2: key blocks past the budget": the budget's tile everywhere,
// wider ones only for plain specs on sm_90a (and not causal d128), one QK -> softmax -> PV step per
// block, 16 rows per warp for featured specs from head dim 120.
TEST(Planner, Fa2KeyBlocksFollowTheMeasuredRule) {
  struct Expect {
    Arch arch;
    int d;
    bool causal, softcap;
    int block_n, rows_per_warp;
  };
  const Arch sm90a{90, true}, sm80{80, false};
  const Expect cases[] = {
      {sm90a, 64, false, false, 128, 32}, {sm90a, 64, true, false, 128, 32}, {sm90a, 128, false, false, 64, 32},
      {sm90a, 128, true, false, 64, 32},  {sm90a, 80, false, false, 64, 32}, {sm90a, 64, false, true, 80, 32},
      {sm80, 64, false, false, 80, 32},   {sm80, 128, false, false, 32, 32}, {sm90a, 112, false, true, 32, 32},
      {sm90a, 120, false, true, 128, 16}, {sm90a, 128, true, true, 128, 16}, {sm90a, 192, false, false, 64, 16},
  };
  for (const Expect &c : cases) {
    KernelSpec spec = prefill(c.d, c.causal, c.arch);
    spec.softcap = c.softcap;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa2(spec, &plan, &why)) << why;
    EXPECT_EQ(plan.block_n, c.block_n) << kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kRowsPerWarp"), c.rows_per_warp) << kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kSubBlockN"), plan.block_n) << kernel_name(spec, plan);
  }
}

// Causal d128 at 128x64 spills in the MLIR build only: the planner gives that backend 128x32, and
// the same plan as NVRTC's everywhere else.
TEST(Planner, Fa2KeyBlockOfCausalD128DependsOnTheBackend) {
  for (bool causal : {false, true}) {
    const KernelSpec spec = prefill(128, causal);
    Plan nvrtc, mlir, automatic;
    std::string why;
    ASSERT_TRUE(plan_fa2(spec, &nvrtc, &why, FLASHJIT_BACKEND_NVRTC)) << why;
    ASSERT_TRUE(plan_fa2(spec, &mlir, &why, FLASHJIT_BACKEND_MLIR)) << why;
    ASSERT_TRUE(plan_fa2(spec, &automatic, &why)) << why;
    EXPECT_EQ(nvrtc.block_n, 64);
    EXPECT_EQ(mlir.block_n, causal ? 32 : 64);
    EXPECT_EQ(kernel_name(spec, automatic), kernel_name(spec, nvrtc));
    const PlanChoice forced = choose_plan(spec, Variant::fa2, FLASHJIT_BACKEND_MLIR);
    ASSERT_TRUE(forced.ok) << forced.error;
    EXPECT_EQ(kernel_name(spec, forced.plan), kernel_name(spec, mlir));
  }
  // Other head dims: one plan for both backends.
  for (int d : {64, 80, 96}) {
    Plan nvrtc, mlir;
    std::string why;
    ASSERT_TRUE(plan_fa2(prefill(d, true), &nvrtc, &why, FLASHJIT_BACKEND_NVRTC)) << why;
    ASSERT_TRUE(plan_fa2(prefill(d, true), &mlir, &why, FLASHJIT_BACKEND_MLIR)) << why;
    EXPECT_EQ(kernel_name(prefill(d, true), nvrtc), kernel_name(prefill(d, true), mlir)) << d;
  }
}

// fa3 runs unmasked head dims >= 128 in CTA pairs that multicast K/V, with NVRTC, and odd multiples of 8
// from d72 (their K/V rows straddle L2 sectors); the MLIR backend, masked / varlen specs and other
// head dims get single-CTA tiles, of the same size where the warpgroup count is the same.
TEST(Planner, Fa3CtaPairsForUnmaskedWideHeads) {
  struct Case {
    int d;
    bool causal, varlen;
    flashjit_backend backend;
    int cluster_m, consumer_warpgroups;
  };
  for (const Case &c :
       {Case{128, false, false, FLASHJIT_BACKEND_AUTO, 2, 2}, Case{256, false, false, FLASHJIT_BACKEND_NVRTC, 2, 2},
        Case{192, false, false, FLASHJIT_BACKEND_MLIR, 1, 2}, Case{128, true, false, FLASHJIT_BACKEND_AUTO, 1, 3},
        Case{128, false, true, FLASHJIT_BACKEND_AUTO, 1, 2}, Case{96, false, false, FLASHJIT_BACKEND_AUTO, 1, 3},
        Case{112, false, false, FLASHJIT_BACKEND_AUTO, 1, 2}, Case{120, false, false, FLASHJIT_BACKEND_AUTO, 2, 2},
        Case{104, false, false, FLASHJIT_BACKEND_NVRTC, 2, 2}, Case{88, false, false, FLASHJIT_BACKEND_AUTO, 2, 3},
        Case{72, false, false, FLASHJIT_BACKEND_AUTO, 2, 3}, Case{56, false, false, FLASHJIT_BACKEND_AUTO, 1, 3},
        Case{104, false, false, FLASHJIT_BACKEND_MLIR, 1, 3}, Case{120, false, true, FLASHJIT_BACKEND_AUTO, 1, 3},
        Case{104, true, false, FLASHJIT_BACKEND_AUTO, 1, 3}, Case{136, false, false, FLASHJIT_BACKEND_AUTO, 2, 2}}) {
    KernelSpec spec = prefill(c.d, c.causal);
    spec.varlen = c.varlen;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(spec, &plan, &why, c.backend)) << why;
    EXPECT_EQ(plan.cluster_m, c.cluster_m) << kernel_name(spec, plan);
    EXPECT_EQ(plan.consumer_warpgroups, c.consumer_warpgroups) << kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kClusterM"), c.cluster_m);
    EXPECT_EQ(plan.constant("kKVRowsPerCta") * c.cluster_m, plan.block_n);
    Plan single;
    ASSERT_TRUE(plan_fa3(spec, &single, &why, FLASHJIT_BACKEND_MLIR)) << why;
    EXPECT_EQ(single.cluster_m, 1);
    if (single.consumer_warpgroups == plan.consumer_warpgroups) {
      EXPECT_EQ(single.block_n, plan.block_n) << "pairs must not change the tile";
      EXPECT_EQ(single.smem_bytes, plan.smem_bytes);
    }
  }
  Fa3Tuning pairs;
  pairs.cluster_m = 2;
  Plan plan;
  std::string why;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, true), pairs, &plan, &why)) << "a causal pair would walk different blocks";
  EXPECT_NE(why.find("causal"), std::string::npos) << why;
}

// Each thread keeps the last default tile fa3_key_block_for planned: interleaved specs and backends get
// the answers each gets in a fresh thread, whatever came before.
TEST(Planner, Fa3KeyBlockChoiceDependsOnItsSpecAlone) {
  struct Query {
    KernelSpec spec;
    flashjit_backend backend;
  };
  std::vector<Query> queries;
  for (int d : {64, 72, 104, 128, 192, 256}) // 72, 104: the backend changes their default tile
    for (bool causal : {false, true})
      for (flashjit_backend backend : {FLASHJIT_BACKEND_NVRTC, FLASHJIT_BACKEND_MLIR})
        queries.push_back({prefill(d, causal), backend});
  auto answer = [](const Query &q) { return fa3_key_block_for(q.spec, 1024, 1024, q.backend); };
  std::vector<int> fresh;
  for (const Query &q : queries) {
    int alone = -1;
    std::thread([&] { alone = answer(q); }).join();
    fresh.push_back(alone);
  }
  EXPECT_NE(std::count(fresh.begin(), fresh.end(), 0), std::ssize(fresh)) << "some spec must take a short block";
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < queries.size(); ++i) {
      const size_t at = pass == 0 ? i : queries.size() - 1 - i;
      EXPECT_EQ(answer(queries[at]), fresh[at]) << "query " << at << ", pass " << pass;
    }
}

// The short-key block: taken where the default block pads the key length by more than the short
// block's measured 2% cost per key, never for windowed, varlen or non-Hopper specs (causal: below);
// d192's narrow block; the tail-split tiles' short-sequence kernel.
TEST(Planner, Fa3ShortKeyBlockWhereTheDefaultPadsTheKeys) {
  const KernelSpec d128 = prefill(128, false);
  Plan default_plan, plan_for_narrow;
  std::string why;
  ASSERT_TRUE(plan_fa3(d128, &default_plan, &why)) << why;
  ASSERT_EQ(default_plan.block_n, 160) << "the cases below assume the d128 default";
  EXPECT_EQ(fa3_short_key_block(d128), 128);
  struct Case {
    int seqlen_k, key_block;
  };
  for (const Case &c : {Case{1024, 128}, Case{1000, 128}, Case{1536, 128}, Case{128, 128}, Case{4096, 0}, Case{2048, 0},
                        Case{640, 0}, Case{160, 0}, Case{100, 128}, Case{0, 0}})
    EXPECT_EQ(fa3_key_block_for(d128, 4096, c.seqlen_k), c.key_block) << c.seqlen_k << " keys";
  KernelSpec window = prefill(128, true), varlen = d128, ampere = prefill(128, false, Arch{80, false});
  window.local = true;
  varlen.varlen = true;
  for (const KernelSpec &spec : {window, varlen, ampere})
    EXPECT_EQ(fa3_key_block_for(spec, 1024, 1024), 0) << spec.head_dim_qk << (spec.causal ? " causal" : "");

  // d192's 112-key pair tile takes 96-key blocks where they pad less at their 3% higher cost per key
  // (S1024: 1056 keys against 1120), not at S2048 (2112 * 1.03 > 2128) or S4096; the MLIR plans keep 112.
  const KernelSpec d192 = prefill(192, false);
  ASSERT_TRUE(plan_fa3(d192, &default_plan, &why)) << why;
  ASSERT_EQ(default_plan.block_n, 112) << "the cases below assume the d192 default";
  EXPECT_EQ(fa3_short_key_block(d192), 96);
  EXPECT_EQ(fa3_short_key_block(d192, FLASHJIT_BACKEND_MLIR), 0);
  for (const Case &c : {Case{1024, 96}, Case{2048, 0}, Case{4096, 0}, Case{96, 96}, Case{112, 0}})
    EXPECT_EQ(fa3_key_block_for(d192, c.seqlen_k, c.seqlen_k), c.key_block) << "d192, " << c.seqlen_k << " keys";
  KernelSpec narrow = d192;
  narrow.key_block = 96;
  ASSERT_TRUE(plan_fa3(narrow, &plan_for_narrow, &why)) << why;
  EXPECT_EQ(plan_for_narrow.block_n, 96);
  EXPECT_EQ(plan_for_narrow.cluster_m, 2) << "96 keys split into two CTAs' swizzle atoms";

  // Causal d192 (two warpgroups of 112 keys) takes 96-key blocks for short sequences only.
  const KernelSpec d192_causal = prefill(192, true);
  EXPECT_EQ(fa3_key_block_for(d192_causal, 1024, 1024), 96);
  EXPECT_EQ(fa3_key_block_for(d192_causal, 1024, 1025), 0);
  EXPECT_EQ(fa3_key_block_for(d192_causal, 1024, 1024, FLASHJIT_BACKEND_MLIR), 0);

  // Three-warpgroup tiles with the tail split (d64: 128-key blocks) build a kernel without it for keys
  // that no split can shorten (at most 8 blocks a unit), and keep the split beyond.
  const KernelSpec d64 = prefill(64, false);
  ASSERT_TRUE(plan_fa3(d64, &default_plan, &why)) << why;
  ASSERT_EQ(default_plan.block_n, 128);
  ASSERT_EQ(default_plan.constant("kTailSplit"), 1);
  EXPECT_EQ(fa3_short_key_block(d64), 128);
  for (const Case &c : {Case{1024, 128}, Case{1000, 128}, Case{1025, 0}, Case{4096, 0}})
    EXPECT_EQ(fa3_key_block_for(d64, c.seqlen_k, c.seqlen_k), c.key_block) << "d64, " << c.seqlen_k << " keys";
  KernelSpec no_split = d64;
  no_split.key_block = 128;
  ASSERT_TRUE(plan_fa3(no_split, &plan_for_narrow, &why)) << why;
  EXPECT_EQ(plan_for_narrow.block_n, 128);
  EXPECT_EQ(plan_for_narrow.constant("kTailSplit"), 0);
  EXPECT_NE(kernel_name(no_split, plan_for_narrow), kernel_name(d64, default_plan));
  EXPECT_EQ(fa3_short_key_block(d64, FLASHJIT_BACKEND_MLIR), 0) << "the MLIR plans have no tail split";

  KernelSpec short_keys = d128;
  short_keys.key_block = 128;
  Plan plan;
  ASSERT_TRUE(plan_fa3(short_keys, &plan, &why)) << why;
  EXPECT_EQ(plan.block_n, 128);
  EXPECT_EQ(plan.constant("kKStepsPV"), 128 / 16);
  EXPECT_EQ(plan.cluster_m, 2) << "the short block keeps the CTA pairs";
  EXPECT_NE(kernel_name(short_keys, plan), kernel_name(d128, default_plan));
  Fa3Tuning tuned;
  tuned.block_n = 144;
  ASSERT_TRUE(plan_fa3_tuned(short_keys, tuned, &plan, &why)) << why;
  EXPECT_EQ(plan.block_n, 144) << "a tuned block wins over the spec's";
  short_keys.key_block = 120;
  EXPECT_FALSE(plan_fa3(short_keys, &plan, &why));
  EXPECT_NE(why.find("key block"), std::string::npos) << why;
}

// Short causal sequences (both lengths up to 1024) of head dims whose causal tile has three consumer
// warpgroups take the short-sequence tile: two warpgroups, O in its own region, 128-key blocks. Not
// with the MLIR backend, not where the causal default already has two warpgroups (d256).
TEST(Planner, Fa3ShortCausalSequencesTakeTwoWarpgroups) {
  for (int d : {64, 80, 128}) {
    const KernelSpec causal = prefill(d, true);
    EXPECT_EQ(fa3_short_key_block(causal), 128) << d;
    EXPECT_EQ(fa3_short_key_block(causal, FLASHJIT_BACKEND_MLIR), 0) << d;
    struct Case {
      int seqlen_q, seqlen_k, key_block;
    };
    for (const Case &c : {Case{1024, 1024, 128}, Case{1, 1024, 128}, Case{1000, 300, 128}, Case{1025, 1025, 0},
                          Case{512, 2048, 0}, Case{2048, 512, 0}, Case{100, 0, 0}})
      EXPECT_EQ(fa3_key_block_for(causal, c.seqlen_q, c.seqlen_k), c.key_block)
          << "d" << d << " " << c.seqlen_q << " x " << c.seqlen_k;
    EXPECT_EQ(fa3_key_block_for(causal, 1024, 1024, FLASHJIT_BACKEND_MLIR), 0);
    Plan default_plan, short_plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(causal, &default_plan, &why)) << why;
    EXPECT_EQ(default_plan.consumer_warpgroups, 3) << d;
    KernelSpec short_seq = causal;
    short_seq.key_block = 128;
    ASSERT_TRUE(plan_fa3(short_seq, &short_plan, &why)) << why;
    EXPECT_EQ(short_plan.consumer_warpgroups, 2) << d;
    EXPECT_EQ(short_plan.block_m, 128);
    EXPECT_EQ(short_plan.block_n, 128);
    EXPECT_EQ(short_plan.constant("kSeparateO"), 1);
    EXPECT_EQ(short_plan.cluster_m, 1) << "causal tiles run single CTAs";
    EXPECT_NE(kernel_name(short_seq, short_plan), kernel_name(causal, default_plan));
  }
  EXPECT_EQ(fa3_short_key_block(prefill(256, true)), 0) << "the d256 causal tile already has two warpgroups";
  EXPECT_EQ(fa3_key_block_for(prefill(256, true), 1024, 1024), 0);
}

// Causal head dims up to 128 run three consumer warpgroups (M = 192); unmasked d128 keeps two.
TEST(Planner, Fa3ThreeWarpgroupsForCausalUpTo128) {
  struct Case {
    int d;
    bool causal;
    int warpgroups, block_n;
  };
  for (const Case &c : {Case{128, true, 3, 80}, Case{112, true, 3, 96}, Case{96, false, 3, 96},
                        Case{128, false, 2, 160}, Case{136, true, 2, 112}}) {
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(prefill(c.d, c.causal), &plan, &why)) << why;
    EXPECT_EQ(plan.consumer_warpgroups, c.warpgroups) << c.d;
    EXPECT_EQ(plan.block_m, 64 * c.warpgroups) << c.d;
    EXPECT_EQ(plan.block_n, c.block_n) << c.d;
  }
  KernelSpec window = prefill(128, false);
  window.local = true;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(window, &plan, &why)) << why;
  EXPECT_EQ(plan.consumer_warpgroups, 2) << "sliding windows were not measured with three";
}

// The lazy O rescale where it measured faster (NVRTC only: the MLIR generator renders eager rescaling).
TEST(Planner, Fa3LazyRescaleWhereItMeasuredFaster) {
  struct Case {
    int d;
    bool causal;
    flashjit_backend backend;
    bool lazy;
  };
  for (const Case &c : {Case{80, false, FLASHJIT_BACKEND_AUTO, true}, Case{72, true, FLASHJIT_BACKEND_NVRTC, true},
                        Case{256, false, FLASHJIT_BACKEND_AUTO, true}, Case{192, false, FLASHJIT_BACKEND_AUTO, true},
                        Case{256, true, FLASHJIT_BACKEND_AUTO, true}, Case{192, true, FLASHJIT_BACKEND_AUTO, true},
                        Case{256, true, FLASHJIT_BACKEND_MLIR, false}, Case{160, true, FLASHJIT_BACKEND_AUTO, false},
                        Case{128, false, FLASHJIT_BACKEND_AUTO, false}, Case{64, false, FLASHJIT_BACKEND_AUTO, false},
                        Case{96, false, FLASHJIT_BACKEND_AUTO, false}, Case{80, false, FLASHJIT_BACKEND_MLIR, false},
                        Case{256, false, FLASHJIT_BACKEND_MLIR, false}, Case{128, true, FLASHJIT_BACKEND_AUTO, true},
                        Case{96, true, FLASHJIT_BACKEND_AUTO, true}, Case{64, true, FLASHJIT_BACKEND_AUTO, false},
                        Case{128, true, FLASHJIT_BACKEND_MLIR, false}}) {
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(prefill(c.d, c.causal), &plan, &why, c.backend)) << why;
    EXPECT_EQ(plan.constant("kLazyRescale"), c.lazy ? 1 : 0) << kernel_name(prefill(c.d, c.causal), plan);
    EXPECT_EQ(kernel_name(prefill(c.d, c.causal), plan).find(".lz") != std::string::npos, c.lazy);
  }
  // Varlen and paged specs rescale lazily where fixed lengths do, always with the top rounding (plain
  // lazy failed a d64 varlen case, run 29j); fixed lengths keep plain lazy (`.lz`).
  for (const KernelSpec &fixed : {prefill(128, true), prefill(80, false), prefill(80, true), prefill(256, false),
                                  prefill(64, false), prefill(128, false)}) {
    Plan fixed_plan, plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(fixed, &fixed_plan, &why)) << why;
    EXPECT_EQ(fixed_plan.constant("kLazyTopRounding"), 0) << kernel_name(fixed, fixed_plan);
    for (const bool paged : {false, true}) {
      KernelSpec varying = fixed;
      varying.varlen = !paged;
      varying.page_size = paged ? 16 : 0;
      ASSERT_TRUE(plan_fa3(varying, &plan, &why)) << why;
      const std::string name = kernel_name(varying, plan);
      EXPECT_EQ(plan.constant("kLazyRescale"), fixed_plan.constant("kLazyRescale")) << name;
      EXPECT_EQ(plan.constant("kLazyTopRounding"), fixed_plan.constant("kLazyRescale")) << name;
      EXPECT_EQ(name.find(".lzt") != std::string::npos, fixed_plan.constant("kLazyRescale") == 1) << name;
    }
  }
}

// The top rounding of lazy rescaling (kLazyTopRounding, `.lzt`): off by default for fixed lengths (it
// timed 0.4-2.6% below plain lazy there, run 31), on for varlen/paged specs (the test above); a tuning
// turns it on where the plan rescales lazily and is refused where it rescales eagerly; with the tail
// split, each thread's state gains one float4 for the rounding shares.
TEST(Planner, Fa3LazyTopRoundingOnlyWithLazyRescaling) {
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(prefill(80, false), &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kLazyRescale"), 1);
  EXPECT_EQ(plan.constant("kLazyTopRounding"), 0) << "fixed lengths keep plain lazy rescaling";
  Fa3Tuning rounded;
  ASSERT_TRUE(parse_fa3_tuning("lazy_top_rounding=1", &rounded, &why)) << why;
  EXPECT_EQ(rounded.lazy_top_rounding, 1);
  for (const KernelSpec &spec : {prefill(80, false), prefill(128, true), prefill(256, false)}) {
    ASSERT_TRUE(plan_fa3_tuned(spec, rounded, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kLazyTopRounding"), 1) << kernel_name(spec, plan);
    EXPECT_NE(kernel_name(spec, plan).find(".lzt"), std::string::npos) << kernel_name(spec, plan);
  }
  // d80 non-causal has the tail split by default: O, max and sum shares, and the rounding shares.
  ASSERT_TRUE(plan_fa3_tuned(prefill(80, false), rounded, &plan, &why)) << why;
  ASSERT_EQ(plan.constant("kTailSplit"), 1);
  EXPECT_EQ(plan.constant("kTailSlotFloats"), plan.consumer_warpgroups * 128 * (80 / 2 + 4 + 4));
  // Eager plans: the default d128 tile, varlen or not, unless lazy_rescale=1 too.
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), rounded, &plan, &why));
  EXPECT_NE(why.find("lazy_top_rounding"), std::string::npos) << why;
  KernelSpec varlen = prefill(128, false);
  varlen.varlen = true;
  EXPECT_FALSE(plan_fa3_tuned(varlen, rounded, &plan, &why));
  rounded.lazy_rescale = 1;
  ASSERT_TRUE(plan_fa3_tuned(varlen, rounded, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kLazyTopRounding"), 1);
  rounded.lazy_rescale = 0;
  EXPECT_FALSE(plan_fa3_tuned(prefill(80, false), rounded, &plan, &why)) << "eager rescaling has nothing to round";
  // The top p comes from MUFU's exp2: not with exponentials on the polynomial.
  rounded.lazy_rescale = -1;
  rounded.exp2_poly_every = 2;
  EXPECT_FALSE(plan_fa3_tuned(prefill(80, false), rounded, &plan, &why));
  EXPECT_NE(why.find("exp2_poly_every"), std::string::npos) << why;
}

// Paged KV on fa3 (kPageSize > 0, the default since run 31; paged=0 keeps fa2): single CTAs, no tail
// split, lazy rescaling only with the top rounding (lengths vary per sequence, as with varlen), each
// K/V block landing in boxes of the largest row count that divides both the page and the block, key
// blocks of whole 64-key boxes where the pages are multiples of 64 keys (kPagedWholeBlockKeys), but
// for d96/d104, whose 96-key blocks already land in 32-row boxes and would lose a third (run 33); pages
// that are not whole swizzle atoms (multiples of 8 keys) gathered by cp.async; the MLIR backend
// refused with the reason.
TEST(Planner, Fa3PagedKvBoxesAndItsRefusals) {
  Plan plan;
  std::string why;
  KernelSpec spec = prefill(128, false);
  spec.page_size = 16;
  EXPECT_TRUE(plan_fa3(spec, &plan, &why)) << "the default since run 31: " << why;
  Fa3Tuning fa2_instead;
  ASSERT_TRUE(parse_fa3_tuning("paged=0", &fa2_instead, &why)) << why;
  EXPECT_FALSE(plan_fa3_tuned(spec, fa2_instead, &plan, &why));
  EXPECT_NE(why.find("paged=0"), std::string::npos) << why;
  Fa3Tuning paged;
  ASSERT_TRUE(parse_fa3_tuning("paged=1", &paged, &why)) << why;
  EXPECT_EQ(paged.paged, 1);
  struct Case {
    int d;
    bool causal;
    int page_size, box_rows, block_n, consumer_warpgroups;
  };
  for (const Case &c :
       {Case{128, false, 16, 16, 160, 2}, Case{128, false, 64, 64, 128, 2}, Case{128, false, 512, 128, 128, 2},
        Case{128, true, 16, 16, 80, 3}, Case{128, true, 64, 64, 128, 2}, Case{128, true, 192, 64, 128, 2},
        Case{64, true, 8, 8, 128, 3}, Case{80, true, 256, 64, 64, 3}, Case{80, true, 32, 16, 112, 3},
        Case{256, false, 24, 8, 80, 2}, Case{256, false, 64, 64, 64, 2}, Case{256, true, 128, 64, 64, 2},
        Case{96, false, 64, 32, 96, 3}, Case{104, true, 128, 32, 96, 3}, Case{192, false, 64, 64, 64, 2}}) {
    spec = prefill(c.d, c.causal);
    spec.page_size = c.page_size;
    ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << why;
    const std::string name = kernel_name(spec, plan);
    EXPECT_EQ(plan.cluster_m, 1) << name;
    EXPECT_EQ(plan.constant("kTailSplit"), 0) << name;
    EXPECT_EQ(plan.constant("kLazyTopRounding"), plan.constant("kLazyRescale")) << name;
    EXPECT_EQ(plan.block_n, c.block_n) << name;
    EXPECT_EQ(plan.consumer_warpgroups, c.consumer_warpgroups) << name;
    EXPECT_EQ(plan.constant("kPagedBoxRows"), c.box_rows) << name << " (kBlockN " << plan.block_n << ")";
    EXPECT_EQ(plan.block_n % c.box_rows, 0) << name;
    EXPECT_EQ(plan.constant("kPagedGather"), 0) << name;
    EXPECT_NE(name.find(".page" + std::to_string(c.page_size) + "."), std::string::npos) << name;
  }
  // Pages that boxes of whole swizzle atoms cannot tile are gathered by cp.async: the same tile as
  // the boxes' (and the unpaged varlen kernel's), no boxes, no TMA maps for K/V.
  Plan boxed;
  spec = prefill(128, false);
  spec.page_size = 16;
  ASSERT_TRUE(plan_fa3_tuned(spec, paged, &boxed, &why)) << why;
  for (int page_size : {1, 4, 7, 12, 20}) {
    spec = prefill(128, false);
    spec.page_size = page_size;
    ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << page_size << ": " << why;
    const std::string name = kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kPagedGather"), 1) << name;
    EXPECT_EQ(plan.constant("kPagedBoxRows"), 0) << name;
    EXPECT_EQ(plan.block_n, boxed.block_n) << name;
    EXPECT_EQ(plan.threads, boxed.threads) << name;
    EXPECT_NE(name.find(".gather."), std::string::npos) << name;
    // The planner's choice (since run 31).
    const PlanChoice choice = choose_plan(spec);
    ASSERT_TRUE(choice.ok) << choice.error;
    EXPECT_EQ(choice.plan.variant, Variant::fa3) << page_size;
    EXPECT_NE(kernel_name(spec, choice.plan).find(".gather."), std::string::npos) << page_size;
  }
  // paged_gather=1 gathers pages boxes could tile too (an A/B); 0 takes boxes only.
  Fa3Tuning gather = paged;
  ASSERT_TRUE(parse_fa3_tuning("paged=1,paged_gather=1", &gather, &why)) << why;
  spec = prefill(128, false);
  spec.page_size = 64;
  ASSERT_TRUE(plan_fa3_tuned(spec, gather, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kPagedGather"), 1);
  EXPECT_EQ(plan.constant("kPagedBoxRows"), 0);
  Fa3Tuning boxes_only = paged;
  boxes_only.paged_gather = 0;
  ASSERT_TRUE(plan_fa3_tuned(spec, boxes_only, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kPagedGather"), 0);
  spec.page_size = 12;
  EXPECT_FALSE(plan_fa3_tuned(spec, boxes_only, &plan, &why));
  EXPECT_NE(why.find("multiple of 8"), std::string::npos) << why;
  Fa3Tuning overlap = paged;
  overlap.cross_tile_overlap = 1;
  overlap.separate_o = 1;
  EXPECT_FALSE(plan_fa3_tuned(spec, overlap, &plan, &why));
  EXPECT_NE(why.find("paged"), std::string::npos) << why;
  spec = prefill(128, false);
  spec.page_size = 16;
  EXPECT_FALSE(plan_fa3_tuned(spec, paged, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("NVRTC"), std::string::npos) << why;
  Fa3Tuning pairs = paged;
  pairs.cluster_m = 2;
  EXPECT_FALSE(plan_fa3_tuned(spec, pairs, &plan, &why));
  EXPECT_NE(why.find("paged"), std::string::npos) << why;
  Fa3Tuning split = paged;
  split.tail_split = 1;
  EXPECT_FALSE(plan_fa3_tuned(spec, split, &plan, &why));
  EXPECT_NE(why.find("paged"), std::string::npos) << why;
  // Unpaged plans have no page boxes (the tuning changes nothing there).
  Plan unpaged;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), paged, &unpaged, &why)) << why;
  EXPECT_EQ(unpaged.constant("kPagedBoxRows"), 0);
}

// Every paged fa3 plan the planner makes satisfies what the producer asserts (templates/kernels/fa3/
// producer.cuh): boxes of whole swizzle atoms that divide the page and the block, at most one per
// lane of the producer warp, single CTAs; every head dim, both masks, every page size it takes.
TEST(Planner, Fa3PagedPlansKeepTheProducersInvariants) {
  Fa3Tuning paged;
  paged.paged = 1;
  constexpr int kSwizzleAtomRows = 8, kWarpLanes = 32, kMaxBoxRows = 256, kMaxPageSize = 512;
  int plans = 0;
  for (int d = 8; d <= 256; d += 8)
    for (bool causal : {false, true})
      for (int page_size = kSwizzleAtomRows; page_size <= kMaxPageSize; page_size += kSwizzleAtomRows) {
        KernelSpec spec = prefill(d, causal);
        spec.page_size = page_size;
        Plan plan;
        std::string why;
        ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << "d" << d << " page " << page_size << ": " << why;
        const int64_t box = plan.constant("kPagedBoxRows");
        ASSERT_GT(box, 0);
        EXPECT_EQ(box % kSwizzleAtomRows, 0) << kernel_name(spec, plan);
        EXPECT_EQ(page_size % box, 0) << kernel_name(spec, plan);
        EXPECT_EQ(plan.block_n % box, 0) << kernel_name(spec, plan);
        EXPECT_LE(plan.block_n / box, kWarpLanes) << kernel_name(spec, plan);
        EXPECT_LE(box, kMaxBoxRows) << kernel_name(spec, plan);
        EXPECT_EQ(plan.cluster_m, 1) << kernel_name(spec, plan);
        EXPECT_EQ(plan.constant("kTailSplit"), 0) << kernel_name(spec, plan);
        ++plans;
      }
  EXPECT_EQ(plans, 32 * 2 * 64);
}

// Every page size the boxes cannot tile (1..511, not a multiple of 8) is gathered, with what the
// gathering producer asserts: single CTAs, no tail split, two or more ring stages (a slot's release
// never waits for the block issued last), and a whole producer warpgroup.
TEST(Planner, Fa3GatheredPagesKeepTheProducersInvariants) {
  Fa3Tuning paged;
  paged.paged = 1;
  constexpr int kSwizzleAtomRows = 8, kMaxPageSize = 512, kWarpgroupThreads = 128;
  int plans = 0;
  for (int d = 8; d <= 256; d += 8)
    for (bool causal : {false, true})
      for (int page_size = 1; page_size < kMaxPageSize; page_size += 1 + (page_size > 32 ? 10 : 0)) {
        if (page_size % kSwizzleAtomRows == 0)
          continue;
        KernelSpec spec = prefill(d, causal);
        spec.page_size = page_size;
        Plan plan;
        std::string why;
        ASSERT_TRUE(plan_fa3_tuned(spec, paged, &plan, &why)) << "d" << d << " page " << page_size << ": " << why;
        const std::string name = kernel_name(spec, plan);
        EXPECT_EQ(plan.constant("kPagedGather"), 1) << name;
        EXPECT_EQ(plan.constant("kPagedBoxRows"), 0) << name;
        EXPECT_GE(plan.stages, 2) << name;
        EXPECT_EQ(plan.cluster_m, 1) << name;
        EXPECT_EQ(plan.constant("kTailSplit"), 0) << name;
        EXPECT_EQ(plan.threads, kWarpgroupThreads * (1 + plan.consumer_warpgroups)) << name;
        ++plans;
      }
  EXPECT_GT(plans, 32 * 2 * 40);
}

// The tuning `stages` (an A/B for the gather's copies in flight): a deeper ring whose key block
// shrinks where shared memory binds it, whose mbarriers (3 + 4 a stage) fit their region, and whose
// kernel name says so; NVRTC only, 2 to 4.
TEST(Planner, Fa3StagesTuningDeepensTheRing) {
  constexpr int kMbarrierBytes = 8, kFixedBarriers = 3, kBarriersPerStage = 4, kAlign = 1024;
  Fa3Tuning tuning;
  std::string why;
  for (const auto &[d, causal, page_size] :
       {std::tuple{64, true, 1}, std::tuple{128, false, 0}, std::tuple{128, true, 3}, std::tuple{256, false, 0}}) {
    KernelSpec spec = prefill(d, causal);
    spec.page_size = page_size;
    Plan two;
    tuning.stages = 0;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &two, &why)) << why;
    EXPECT_EQ(two.stages, 2);
    for (int stages : {3, 4}) {
      tuning.stages = stages;
      Plan plan;
      ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << "d" << d << " stages " << stages << ": " << why;
      const std::string name = kernel_name(spec, plan);
      EXPECT_EQ(plan.stages, stages) << name;
      EXPECT_EQ(plan.constant("kStages"), stages) << name;
      EXPECT_NE(name.find("s" + std::to_string(stages) + "."), std::string::npos) << name;
      EXPECT_LE(plan.block_n, two.block_n) << name;
      EXPECT_LE(plan.constant("kSmemOffsetBarriers") + kMbarrierBytes * (kFixedBarriers + kBarriersPerStage * stages) +
                    kAlign,
                plan.smem_bytes)
          << name;
      EXPECT_LE(plan.smem_bytes, max_shared_bytes_per_block(spec.arch)) << name;
    }
  }
  // d128 unmasked fills shared memory with two stages (N160): three take a smaller key block.
  KernelSpec spec = prefill(128, false);
  tuning.stages = 3;
  Plan plan;
  ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
  EXPECT_LT(plan.block_n, 160) << kernel_name(spec, plan);
  for (int bad : {-1, 1, 5}) {
    tuning.stages = bad;
    EXPECT_FALSE(plan_fa3_tuned(spec, tuning, &plan, &why)) << bad;
    EXPECT_NE(why.find("stages"), std::string::npos) << why;
  }
  tuning.stages = 3;
  EXPECT_FALSE(plan_fa3_tuned(spec, tuning, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("NVRTC"), std::string::npos) << why;
  ASSERT_TRUE(parse_fa3_tuning("stages=4", &tuning, &why)) << why;
  EXPECT_EQ(tuning.stages, 4);
}

// The gather's copies arrive on the full barrier as they land (kGatherNoincArrive) by default since
// session 32; gather_noinc=0 keeps the fenced publication (an A/B). Pages in boxes have no gather.
TEST(Planner, Fa3GatherNoincByDefaultOnGatheredPagesOnly) {
  Fa3Tuning fenced_tuning;
  std::string why;
  ASSERT_TRUE(parse_fa3_tuning("gather_noinc=0", &fenced_tuning, &why)) << why;
  EXPECT_EQ(fenced_tuning.gather_noinc, 0);
  for (const auto &[page_size, gathered] :
       {std::pair{1, true}, std::pair{12, true}, std::pair{16, false}, std::pair{0, false}}) {
    KernelSpec spec = prefill(128, true);
    spec.page_size = page_size;
    Plan plan;
    ASSERT_TRUE(plan_fa3(spec, &plan, &why)) << page_size << ": " << why;
    const std::string name = kernel_name(spec, plan);
    EXPECT_EQ(plan.constant("kGatherNoincArrive"), gathered ? 1 : 0) << name;
    EXPECT_EQ(name.find(".gather.noinc.") != std::string::npos, gathered) << name;
    Plan fenced;
    ASSERT_TRUE(plan_fa3_tuned(spec, fenced_tuning, &fenced, &why)) << why;
    const std::string fenced_name = kernel_name(spec, fenced);
    EXPECT_EQ(fenced.constant("kGatherNoincArrive"), 0) << fenced_name;
    EXPECT_EQ(fenced_name.find(".noinc."), std::string::npos) << fenced_name;
    EXPECT_EQ(fenced_name.find(".gather.") != std::string::npos, gathered) << fenced_name;
  }
  Fa3Tuning bad;
  bad.gather_noinc = 2;
  Plan plan;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, true), bad, &plan, &why));
  EXPECT_NE(why.find("gather_noinc"), std::string::npos) << why;
}

// Pages fa3 would gather go to fa2 at head dims up to 64, where fa2's paged stream measured faster
// (run 33e), as the planner's preference (not a fallback: strict mode takes it) with its reason; fa3
// keeps them from d72, keeps pages in boxes at every head dim, and keeps everything with the tuning
// paged=1 or paged_gather=1; a forced fa3 still runs them.
TEST(Planner, Fa2PreferredForGatheredPagesAtSmallHeadDims) {
  struct Case {
    int d_qk, d_v, page_size;
    bool fa2;
  };
  for (const Case &c : {Case{64, 64, 1, true}, Case{32, 32, 3, true}, Case{48, 64, 12, true}, Case{64, 64, 7, true},
                        Case{72, 72, 1, false}, Case{64, 128, 1, false}, Case{128, 128, 1, false},
                        Case{64, 64, 16, false}, Case{64, 64, 8, false}, Case{64, 64, 0, false}}) {
    for (const bool causal : {false, true}) {
      KernelSpec spec = prefill(c.d_qk, causal);
      spec.head_dim_v = c.d_v;
      spec.page_size = c.page_size;
      const PlanChoice choice = choose_plan(spec);
      ASSERT_TRUE(choice.ok) << choice.error;
      const std::string name = kernel_name(spec, choice.plan);
      EXPECT_EQ(choice.plan.variant, c.fa2 ? Variant::fa2 : Variant::fa3) << name;
      EXPECT_EQ(choice.preferred, choice.plan.variant) << name;
      EXPECT_TRUE(choice.fallback_reason.empty()) << name << ": " << choice.fallback_reason;
      EXPECT_EQ(choice.preference_reason.empty(), !c.fa2) << name << ": " << choice.preference_reason;
      if (c.fa2) {
        EXPECT_NE(choice.preference_reason.find("page_size " + std::to_string(c.page_size)), std::string::npos)
            << choice.preference_reason;
        EXPECT_NE(choice.preference_reason.find("fa2's paged stream is faster"), std::string::npos)
            << choice.preference_reason;
        for (const char *keep_fa3 : {"paged=1", "paged_gather=1"}) {
          Fa3Tuning tuning;
          std::string why;
          ASSERT_TRUE(parse_fa3_tuning(keep_fa3, &tuning, &why)) << why;
          const PlanChoice tuned = choose_plan(spec, std::nullopt, FLASHJIT_BACKEND_AUTO, &tuning);
          ASSERT_TRUE(tuned.ok) << tuned.error;
          EXPECT_EQ(tuned.plan.variant, Variant::fa3) << keep_fa3 << " " << name;
          EXPECT_NE(kernel_name(spec, tuned.plan).find(".gather.noinc."), std::string::npos) << keep_fa3;
        }
        const PlanChoice forced = choose_plan(spec, Variant::fa3);
        ASSERT_TRUE(forced.ok) << forced.error;
        EXPECT_EQ(forced.plan.variant, Variant::fa3) << name;
      }
    }
  }
  // The MLIR backend renders no paged fa3 kernel: fa2 without a preference to explain where fa3 would
  // box the pages (a fallback), with one where it would gather them.
  KernelSpec spec = prefill(64, true);
  spec.page_size = 1;
  EXPECT_FALSE(choose_plan(spec, std::nullopt, FLASHJIT_BACKEND_MLIR).preference_reason.empty());
  spec.page_size = 16;
  const PlanChoice boxed_mlir = choose_plan(spec, std::nullopt, FLASHJIT_BACKEND_MLIR);
  EXPECT_TRUE(boxed_mlir.preference_reason.empty());
  EXPECT_NE(boxed_mlir.fallback_reason.find("template form only"), std::string::npos) << boxed_mlir.fallback_reason;
}

TEST(Fa3Tuning, ParsesTheOverrideAndNamesWhatItCannotParse) {
  Fa3Tuning tuning;
  std::string error;
  ASSERT_TRUE(parse_fa3_tuning("consumer_warpgroups=2,block_n=128,lazy_rescale=0", &tuning, &error)) << error;
  EXPECT_EQ(tuning.consumer_warpgroups, 2);
  EXPECT_EQ(tuning.block_n, 128);
  EXPECT_EQ(tuning.lazy_rescale, 0);
  EXPECT_EQ(tuning.pingpong, -1) << "unnamed fields keep the planner's choice";
  EXPECT_EQ(tuning.cluster_m, 0);
  ASSERT_TRUE(parse_fa3_tuning("row_max_partials=4", &tuning, &error)) << error;
  EXPECT_EQ(tuning.row_max_partials, 4);
  ASSERT_TRUE(parse_fa3_tuning("", &tuning, &error));
  EXPECT_EQ(tuning.block_n, 0);
  for (const char *bad : {"warpgroups=2", "block_n", "block_n=", "block_n=12x", "pingpong=on"}) {
    error.clear();
    EXPECT_FALSE(parse_fa3_tuning(bad, &tuning, &error)) << bad;
    EXPECT_NE(error.find(bad), std::string::npos) << error;
  }
}

TEST(Fa3Tuning, ReplacesTheDefaultsAndDeclinesWhatASpecCannotTake) {
  Fa3Tuning two;
  two.consumer_warpgroups = 2;
  PlanChoice tuned = choose_plan(prefill(128, true), std::nullopt, FLASHJIT_BACKEND_AUTO, &two);
  ASSERT_TRUE(tuned.ok) << tuned.error;
  EXPECT_EQ(tuned.plan.variant, Variant::fa3);
  EXPECT_EQ(tuned.plan.consumer_warpgroups, 2);
  EXPECT_EQ(choose_plan(prefill(128, true)).plan.consumer_warpgroups, 3) << "the default this tuning replaces";
  Fa3Tuning pairs;
  pairs.cluster_m = 2; // CTA pairs need unmasked tiles
  PlanChoice declined = choose_plan(prefill(128, true), std::nullopt, FLASHJIT_BACKEND_AUTO, &pairs);
  ASSERT_TRUE(declined.ok) << declined.error;
  EXPECT_EQ(declined.plan.variant, Variant::fa2);
  EXPECT_NE(declined.fallback_reason.find("CTA pairs"), std::string::npos) << declined.fallback_reason;
  PlanChoice forced = choose_plan(prefill(128, true), Variant::fa3, FLASHJIT_BACKEND_AUTO, &pairs);
  EXPECT_FALSE(forced.ok) << "a forced fa3 with a tuning it cannot take is an error";
}

TEST(Fa3Tuning, RowMaxPartialsArePowersOfTwoThatFitTheBlock) {
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(prefill(128, false), &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kRowMaxPartials"), 4) << "the measured default with two consumer warpgroups";
  ASSERT_TRUE(plan_fa3(prefill(128, true), &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kRowMaxPartials"), 1) << "three consumer warpgroups: one chain measured faster";
  Fa3Tuning small;
  small.block_n = 16; // two column groups
  ASSERT_TRUE(plan_fa3_tuned(prefill(256, false), small, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kRowMaxPartials"), 2) << "no more partials than column groups";
  for (int partials : {2, 4, 8}) {
    Fa3Tuning tuning;
    tuning.row_max_partials = partials;
    ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kRowMaxPartials"), partials);
  }
  Fa3Tuning three;
  three.row_max_partials = 3;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), three, &plan, &why));
  EXPECT_NE(why.find("row_max_partials"), std::string::npos) << why;
  Fa3Tuning wide;
  wide.row_max_partials = 16; // d256's 80-key block has 10 column groups
  EXPECT_FALSE(plan_fa3_tuned(prefill(256, false), wide, &plan, &why));
}

// Partial row sums (kRowSumPartials, `.rsN`): one chain by default, so the default kernels keep
// their names and their sums' order; 2, 4 or 8 as a tuning, powers of two up to the column groups,
// NVRTC only (the MLIR generator sums in one chain).
TEST(Fa3Tuning, RowSumPartialsAreATemplateTuning) {
  Plan plan;
  std::string why;
  for (bool causal : {false, true}) {
    ASSERT_TRUE(plan_fa3(prefill(64, causal), &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kRowSumPartials"), 1);
    EXPECT_EQ(kernel_name(prefill(64, causal), plan).find(".rs"), std::string::npos);
  }
  Fa3Tuning tuning;
  ASSERT_TRUE(parse_fa3_tuning("row_sum_partials=4", &tuning, &why)) << why;
  EXPECT_EQ(tuning.row_sum_partials, 4);
  ASSERT_TRUE(plan_fa3_tuned(prefill(64, true), tuning, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kRowSumPartials"), 4);
  EXPECT_NE(kernel_name(prefill(64, true), plan).find(".rs4."), std::string::npos);
  EXPECT_FALSE(plan_fa3_tuned(prefill(64, true), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("row_sum_partials has a template form only"), std::string::npos) << why;
  for (int bad : {3, -1, 16}) { // d256's 80-key block has 10 column groups
    Fa3Tuning wrong;
    wrong.row_sum_partials = bad;
    EXPECT_FALSE(plan_fa3_tuned(prefill(256, false), wrong, &plan, &why)) << bad;
    EXPECT_NE(why.find("row_sum_partials must be a power of two up to kBlockN / 8 (10), got " + std::to_string(bad)),
              std::string::npos)
        << why;
  }
}

// Cross-tile overlap measured slower (session 8): off by default, a tuning where O has its own
// region (the next Q loads under this tile), NVRTC only.
TEST(Fa3Tuning, CrossTileOverlapIsATuningWhereOHasItsOwnRegion) {
  for (int d : {64, 128, 256}) {
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(prefill(d, false), &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kCrossTileOverlap"), 0) << "the measured default";
    EXPECT_EQ(kernel_name(prefill(d, false), plan).find(".xt"), std::string::npos);
  }
  Fa3Tuning on;
  on.cross_tile_overlap = 1;
  Plan plan;
  std::string why;
  for (bool causal : {false, true}) {
    ASSERT_TRUE(plan_fa3_tuned(prefill(128, causal), on, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kCrossTileOverlap"), 1);
    EXPECT_EQ(plan.constant("kSeparateO"), 1) << "the next Q loads while this O is staged";
    EXPECT_NE(kernel_name(prefill(128, causal), plan).find(".xt"), std::string::npos);
  }
  EXPECT_FALSE(plan_fa3_tuned(prefill(256, false), on, &plan, &why)) << "d256 stages O in Q's region";
  EXPECT_NE(why.find("separate"), std::string::npos) << why;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), on, &plan, &why, FLASHJIT_BACKEND_MLIR));
  Fa3Tuning off;
  off.cross_tile_overlap = 0;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), off, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kCrossTileOverlap"), 0);
}

// Dynamic tiles (kDynamicTiles): an A/B, off by default; NVRTC only; single CTAs with TMA K/V walking
// whole tiles one at a time (no CTA pairs, tail split, cross-tile walk or paged K/V); the tile ring's
// barriers and indices in the barrier region.
// The drawn default costs no plan its tile: wherever the snake's plan of a causal spec exists (every
// head dim pair, the short key blocks, varlen, deeper rings), the default plan exists with the same
// key block and ring, its tile ring fitting in the barrier region's slack.
TEST(Fa3Tuning, DrawnTilesKeepTheSnakesTile) {
  int drawn_plans = 0;
  for (int dqk = 32; dqk <= 256; dqk += 8)
    for (int dv : {dqk, 128, 64})
      for (bool varlen : {false, true})
        for (int stages : {0, 3, 4})
          for (bool short_block : {false, true}) {
            KernelSpec spec = prefill(dqk, true);
            spec.head_dim_v = dv;
            spec.varlen = varlen;
            if (short_block) {
              spec.key_block = fa3_short_key_block(spec, FLASHJIT_BACKEND_NVRTC);
              if (spec.key_block == 0)
                continue;
            }
            Fa3Tuning snake_tuning, default_tuning;
            snake_tuning.dynamic_tiles = 0;
            snake_tuning.stages = default_tuning.stages = stages;
            Plan snake, drawn;
            std::string why;
            if (!plan_fa3_tuned(spec, snake_tuning, &snake, &why))
              continue;
            const std::string where = "d" + std::to_string(dqk) + "/" + std::to_string(dv) + (varlen ? " varlen" : "") +
                                      " stages " + std::to_string(stages) + " key block " +
                                      std::to_string(spec.key_block);
            ASSERT_TRUE(plan_fa3_tuned(spec, default_tuning, &drawn, &why)) << where << ": " << why;
            EXPECT_EQ(drawn.block_n, snake.block_n) << where;
            EXPECT_EQ(drawn.block_m, snake.block_m) << where;
            EXPECT_EQ(drawn.constant("kStages"), snake.constant("kStages")) << where;
            drawn_plans += drawn.constant("kDynamicTiles") != 0;
          }
  EXPECT_GT(drawn_plans, 0);
}

// Drawn tiles: the planner's choice for causal walks of contiguous K/V with the NVRTC backend (not a
// window, not the short causal tile from d72 to d128, run 35b-c); a tuning elsewhere.
TEST(Fa3Tuning, DynamicTilesForCausalWalksAndATuningForSingleCtas) {
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(prefill(192, false), &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDynamicTiles"), 0);
  EXPECT_EQ(plan.constant("kTileSlots"), 0);
  for (int d : {64, 128, 192, 256}) {
    ASSERT_TRUE(plan_fa3(prefill(d, true), &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kDynamicTiles"), 1) << "d" << d;
    EXPECT_NE(kernel_name(prefill(d, true), plan).find(".dt"), std::string::npos);
  }
  for (int d : {64, 96, 128, 192}) {
    KernelSpec short_causal = prefill(d, true);
    short_causal.key_block = fa3_short_key_block(short_causal, FLASHJIT_BACKEND_NVRTC);
    ASSERT_GT(short_causal.key_block, 0) << "d" << d;
    ASSERT_TRUE(plan_fa3(short_causal, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kDynamicTiles"), d == 64 || d > 128 ? 1 : 0) << "d" << d << ", the short causal tile";
  }
  KernelSpec window = prefill(128, true);
  window.local = true;
  window.causal = false;
  ASSERT_TRUE(plan_fa3(window, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDynamicTiles"), 0) << "windows keep the snake (not measured)";
  ASSERT_TRUE(plan_fa3(prefill(128, true), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
  EXPECT_EQ(plan.constant("kDynamicTiles"), 0) << "the MLIR backend has no drawn form";
  Fa3Tuning off;
  off.dynamic_tiles = 0;
  ASSERT_TRUE(plan_fa3_tuned(prefill(192, true), off, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDynamicTiles"), 0);
  EXPECT_EQ(kernel_name(prefill(192, true), plan).find(".dt"), std::string::npos);
  Fa3Tuning on;
  on.dynamic_tiles = 1;
  Plan snake;
  ASSERT_TRUE(plan_fa3_tuned(prefill(192, true), off, &snake, &why)) << why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(192, true), on, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDynamicTiles"), 1);
  EXPECT_EQ(plan.constant("kTileSlots"), 2);
  EXPECT_NE(kernel_name(prefill(192, true), plan).find(".dt"), std::string::npos);
  EXPECT_EQ(plan.block_n, snake.block_n) << "the ring fits the barrier region's slack at two stages";
  EXPECT_GE(plan.smem_bytes, snake.smem_bytes);
  EXPECT_FALSE(plan_fa3_tuned(prefill(192, true), on, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("dynamic_tiles"), std::string::npos) << why;
  // Unmasked d128 plans CTA pairs and the tail split by default: both must be turned off first.
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), on, &plan, &why));
  EXPECT_NE(why.find("dynamic_tiles"), std::string::npos) << why;
  Fa3Tuning single = on;
  single.cluster_m = 1;
  single.tail_split = 0;
  EXPECT_TRUE(plan_fa3_tuned(prefill(128, false), single, &plan, &why)) << why;
  Fa3Tuning crossing = on;
  crossing.cross_tile_overlap = 1;
  crossing.separate_o = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(192, true), crossing, &plan, &why));
  KernelSpec paged = prefill(128, true);
  paged.page_size = 16;
  Fa3Tuning paged_on = on;
  paged_on.paged = 1;
  EXPECT_FALSE(plan_fa3_tuned(paged, paged_on, &plan, &why));
  EXPECT_NE(why.find("contiguous"), std::string::npos) << why;
  Fa3Tuning parsed;
  ASSERT_TRUE(parse_fa3_tuning("dynamic_tiles=1", &parsed, &why)) << why;
  EXPECT_EQ(parsed.dynamic_tiles, 1);
}

// The tail split: for tiles of equal cost only (no causal, window or varlen), NVRTC only, not with
// the cross-tile walk; on by default where sessions 10 and 14 measured it worth its compile time
// (three consumer warpgroups: d <= 96; two up to d128 with the default key block), a tuning elsewhere.
TEST(Fa3Tuning, TailSplitIsATuningForTilesOfEqualCost) {
  for (int d : {64, 80, 96, 104, 112, 120, 128, 136, 192, 256}) {
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(prefill(d, false), &plan, &why)) << why;
    const bool expected = d <= 128;
    EXPECT_EQ(plan.consumer_warpgroups == 3, d <= 96) << "d" << d;
    EXPECT_EQ(plan.constant("kTailSplit"), expected ? 1 : 0) << "d" << d;
    EXPECT_EQ(kernel_name(prefill(d, false), plan).find(".ts") != std::string::npos, expected) << "d" << d;
    ASSERT_TRUE(plan_fa3(prefill(d, true), &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kTailSplit"), 0) << "causal d" << d;
    ASSERT_TRUE(plan_fa3(prefill(d, false), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
    EXPECT_EQ(plan.constant("kTailSplit"), 0) << "MLIR d" << d;
  }
  Plan plan;
  std::string why;
  KernelSpec short_keys = prefill(128, false);
  short_keys.key_block = fa3_short_key_block(short_keys);
  ASSERT_TRUE(plan_fa3(short_keys, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kTailSplit"), 0) << "the short key block keeps whole tiles";
  Fa3Tuning on;
  on.tail_split = 1;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), on, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kTailSplit"), 1);
  EXPECT_NE(kernel_name(prefill(128, false), plan).find(".ts"), std::string::npos);
  // Every consumer thread's O accumulators, row maxima and sum shares.
  EXPECT_EQ(plan.constant("kTailSlotFloats"), plan.consumer_warpgroups * 128 * (128 / 2 + 4));
  EXPECT_GT(plan.constant("kBarrierTail"), plan.constant("kBarrierEpilogue") + plan.consumer_warpgroups - 1)
      << "its own named barrier";
  EXPECT_LT(plan.constant("kBarrierTail"), 16);
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, true), on, &plan, &why)) << "causal tiles differ in cost";
  EXPECT_NE(why.find("tail_split"), std::string::npos) << why;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), on, &plan, &why, FLASHJIT_BACKEND_MLIR));
  Fa3Tuning both = on;
  both.cross_tile_overlap = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), both, &plan, &why));
  Fa3Tuning parsed;
  ASSERT_TRUE(parse_fa3_tuning("tail_split=1", &parsed, &why)) << why;
  EXPECT_EQ(parsed.tail_split, 1);
}

// Q's wgmma descriptors rebuilt per k-step (kQDescPerStep): two consumer warpgroups (d > 96), NVRTC
// only; three keep the hoisted form; the tuning q_desc_per_step picks either (session 10's A/B).
TEST(Fa3Tuning, QDescriptorsPerStepWithTwoWarpgroups) {
  for (int d : {64, 96, 128, 192, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      const bool expected = plan.consumer_warpgroups == 2;
      EXPECT_EQ(plan.constant("kQDescPerStep"), expected ? 1 : 0) << "d" << d << (causal ? " causal" : "");
      EXPECT_EQ(kernel_name(prefill(d, causal), plan).find(".qs") != std::string::npos, expected) << "d" << d;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
      EXPECT_EQ(plan.constant("kQDescPerStep"), 0) << "MLIR renders the hoisted form";
    }
  Fa3Tuning hoisted;
  std::string why;
  ASSERT_TRUE(parse_fa3_tuning("q_desc_per_step=0", &hoisted, &why)) << why;
  Plan plan;
  ASSERT_TRUE(plan_fa3_tuned(prefill(256, false), hoisted, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kQDescPerStep"), 0);
  Fa3Tuning per_step;
  per_step.q_desc_per_step = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), per_step, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("q_desc_per_step"), std::string::npos) << why;
}

// Q in registers (kQInRegisters): a tuning (session 12 measures it), NVRTC only, and not with the
// cross-tile stream; the kernel name says `.qr`. On by default only for the short causal tile of
// contiguous K/V up to d64 (run 36d), whichever walk it takes; off for that tile's window, paged and
// MLIR forms, for its larger head dims, and for every other tile.
TEST(Fa3Tuning, QInRegistersIsATuning) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      EXPECT_EQ(plan.constant("kQInRegisters"), 0) << "d" << d << (causal ? " causal" : "");
    }
  for (int d : {32, 48, 64, 80, 128}) {
    KernelSpec short_causal = prefill(d, true);
    short_causal.key_block = fa3_short_key_block(short_causal, FLASHJIT_BACKEND_NVRTC);
    ASSERT_GT(short_causal.key_block, 0) << "d" << d;
    const bool small = d <= 64;
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_fa3(short_causal, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kQInRegisters"), small ? 1 : 0) << "d" << d;
    Fa3Tuning snake;
    snake.dynamic_tiles = 0;
    ASSERT_TRUE(plan_fa3_tuned(short_causal, snake, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kQInRegisters"), small ? 1 : 0) << "d" << d << " snake";
    if (!small)
      continue;
    Fa3Tuning off;
    off.q_in_registers = 0;
    ASSERT_TRUE(plan_fa3_tuned(short_causal, off, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kQInRegisters"), 0) << "d" << d << " q_in_registers=0";
    ASSERT_TRUE(plan_fa3(short_causal, &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
    EXPECT_EQ(plan.constant("kQInRegisters"), 0) << "d" << d << " MLIR";
    KernelSpec window = short_causal;
    window.local = true;
    ASSERT_TRUE(plan_fa3(window, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kQInRegisters"), 0) << "d" << d << " window";
    KernelSpec paged = short_causal;
    paged.page_size = 16;
    if (plan_fa3(paged, &plan, &why)) {
      EXPECT_EQ(plan.constant("kQInRegisters"), 0) << "d" << d << " paged";
    }
  }
  Fa3Tuning tuning;
  std::string why;
  ASSERT_TRUE(parse_fa3_tuning("q_in_registers=1,block_n=128", &tuning, &why)) << why;
  EXPECT_EQ(tuning.q_in_registers, 1);
  Plan plan;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kQInRegisters"), 1);
  EXPECT_NE(kernel_name(prefill(128, false), plan).find(".qr"), std::string::npos);
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("q_in_registers"), std::string::npos) << why;
  tuning.cross_tile_overlap = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why));
  EXPECT_NE(why.find("cross_tile_overlap"), std::string::npos) << why;
}

// Each GEMM's wgmma descriptors advanced from its first (kDescAdvance, kernel suffix `.da`): the
// NVRTC default at every head dim, walk and page size but the short causal tile's (measured slower
// there, runs 37e-f); desc_advance=0 builds each from its address, desc_advance=1 advances them in the
// short tile too; the MLIR generator has no such form, so it neither takes the default nor accepts
// the tuning.
TEST(Fa3Tuning, DescAdvanceIsTheTemplateDefault) {
  for (int d : {32, 64, 96, 128, 192, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      EXPECT_EQ(plan.constant("kDescAdvance"), 1) << "d" << d << (causal ? " causal" : "");
      EXPECT_NE(kernel_name(prefill(d, causal), plan).find(".da"), std::string::npos) << "d" << d;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
      EXPECT_EQ(plan.constant("kDescAdvance"), 0) << "d" << d << " MLIR";
      EXPECT_EQ(kernel_name(prefill(d, causal), plan).find(".da"), std::string::npos) << "d" << d << " MLIR";
    }
  KernelSpec paged = prefill(128, true);
  paged.page_size = 16;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(paged, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDescAdvance"), 1) << "paged";
  Fa3Tuning on;
  on.desc_advance = 1;
  for (int d : {64, 96, 128}) {
    KernelSpec short_causal = prefill(d, true);
    short_causal.key_block = fa3_short_key_block(short_causal, FLASHJIT_BACKEND_NVRTC);
    ASSERT_GT(short_causal.key_block, 0) << "d" << d;
    ASSERT_TRUE(plan_fa3(short_causal, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kDescAdvance"), 0) << "d" << d << " short causal tile";
    ASSERT_TRUE(plan_fa3_tuned(short_causal, on, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kDescAdvance"), 1) << "d" << d << " short causal tile, desc_advance=1";
  }
  Fa3Tuning tuning;
  ASSERT_TRUE(parse_fa3_tuning("desc_advance=0", &tuning, &why)) << why;
  EXPECT_EQ(tuning.desc_advance, 0);
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kDescAdvance"), 0);
  EXPECT_EQ(kernel_name(prefill(128, false), plan).find(".da"), std::string::npos);
  tuning.desc_advance = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("desc_advance"), std::string::npos) << why;
}

// An NVRTC-only tuning off by default: no default plan (d 64 / 128 / 256, causal or not) sets
// `constant` or has `suffix` in its kernel name; `key`=1 parses into `field`, and the d128 plan it
// tunes sets the constant to 1 and takes the suffix; an MLIR plan refuses it, naming the key.
// Returns the parsed tuning for the caller's own refusals.
Fa3Tuning expect_nvrtc_tuning_off_by_default(const std::string &key, int Fa3Tuning::*field, const char *constant,
                                             const char *suffix) {
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      EXPECT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      EXPECT_EQ(plan.constant(constant), 0) << "d" << d << (causal ? " causal" : "");
      EXPECT_EQ(kernel_name(prefill(d, causal), plan).find(suffix), std::string::npos) << "d" << d;
    }
  Fa3Tuning tuning;
  std::string why;
  EXPECT_TRUE(parse_fa3_tuning(key + "=1", &tuning, &why)) << why;
  EXPECT_EQ(tuning.*field, 1) << key;
  Plan plan;
  EXPECT_TRUE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why)) << why;
  EXPECT_EQ(plan.constant(constant), 1) << key;
  EXPECT_NE(kernel_name(prefill(128, false), plan).find(suffix), std::string::npos) << key;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR)) << key;
  EXPECT_NE(why.find(key), std::string::npos) << why;
  return tuning;
}

// A QK's first wgmma descriptors built before the K wait (kEarlyQkDesc, `.eqd`, session 44).
TEST(Fa3Tuning, EarlyQkDescIsATuningOffByDefault) {
  expect_nvrtc_tuning_off_by_default("early_qk_desc", &Fa3Tuning::early_qk_desc, "kEarlyQkDesc", ".eqd");
}

// The timeline (kTimeline, `.tl`, session 45): a diagnostic, never the planner's choice, NVRTC only;
// its kernels alone are compiled with FJ_FA3_TIMELINE, which defines the module global they write.
TEST(Fa3Tuning, TimelineIsADiagnosticOffByDefault) {
  const Fa3Tuning tuning = expect_nvrtc_tuning_off_by_default("timeline", &Fa3Tuning::timeline, "kTimeline", ".tl");
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      for (const std::string &option : nvrtc_options(prefill(d, causal).arch, plan))
        EXPECT_EQ(option.find("FJ_FA3_TIMELINE"), std::string::npos) << "d" << d;
    }
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), tuning, &plan, &why)) << why;
  const std::vector<std::string> options = nvrtc_options(prefill(128, false).arch, plan);
  EXPECT_NE(std::find(options.begin(), options.end(), "-DFJ_FA3_TIMELINE"), options.end());
}

// A pingpong turn over the QK only (kTurnOverQk, `.tq`, session 44): it needs turns over the GEMMs
// (refused without pingpong or with pingpong_softmax).
TEST(Fa3Tuning, TurnOverQkIsATuningOffByDefault) {
  const Fa3Tuning tuning =
      expect_nvrtc_tuning_off_by_default("turn_over_qk", &Fa3Tuning::turn_over_qk, "kTurnOverQk", ".tq");
  Plan plan;
  std::string why;
  Fa3Tuning without_pingpong = tuning;
  without_pingpong.pingpong = 0;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), without_pingpong, &plan, &why));
  EXPECT_NE(why.find("turn_over_qk"), std::string::npos) << why;
  Fa3Tuning softmax_turns = tuning;
  softmax_turns.pingpong_softmax = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), softmax_turns, &plan, &why));
  EXPECT_NE(why.find("turn_over_qk"), std::string::npos) << why;
}

// S awaited before the PV is issued (kSBeforePv, `.sbp`, session 46; 15-19% slower at d128, run 47a).
TEST(Fa3Tuning, SBeforePvIsATuningOffByDefault) {
  expect_nvrtc_tuning_off_by_default("s_before_pv", &Fa3Tuning::s_before_pv, "kSBeforePv", ".sbp");
}

// Exponentials before the block's max (kExpBeforeMax, `.ebm`, session 47): off by default, NVRTC only;
// it needs eager rescaling on MUFU and the prologue's own first block, takes the jump its 16-bit P can
// hold (15 in fp16, 64 in bf16) and a vote barrier per consumer warpgroup after the tail's.
TEST(Fa3Tuning, ExpBeforeMaxIsATuningOffByDefault) {
  const Fa3Tuning tuning =
      expect_nvrtc_tuning_off_by_default("exp_before_max", &Fa3Tuning::exp_before_max, "kExpBeforeMax", ".ebm");
  Plan plan;
  std::string why;
  for (flashjit_dtype dtype : {FLASHJIT_FP16, FLASHJIT_BF16}) {
    KernelSpec spec = prefill(128, false);
    spec.dtype = dtype;
    ASSERT_TRUE(plan_fa3_tuned(spec, tuning, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kExpJumpLog2"), dtype == FLASHJIT_FP16 ? 15 : 64);
    const int64_t wgs = plan.consumer_warpgroups;
    EXPECT_EQ(plan.constant("kBarrierVote"), plan.constant("kBarrierTail") + 1);
    EXPECT_LE(plan.constant("kBarrierVote") + wgs, 16) << "16 named barriers per CTA";
  }
  // d256 rescales lazily by default: refused there, planned with lazy_rescale=0.
  EXPECT_FALSE(plan_fa3_tuned(prefill(256, false), tuning, &plan, &why));
  EXPECT_NE(why.find("exp_before_max needs eager rescaling"), std::string::npos) << why;
  Fa3Tuning eager = tuning;
  eager.lazy_rescale = 0;
  EXPECT_TRUE(plan_fa3_tuned(prefill(256, false), eager, &plan, &why)) << why;
  for (const char *other : {"first_block_in_loop=1", "exp2_poly_every=4", "pingpong_softmax=1"}) {
    Fa3Tuning both;
    ASSERT_TRUE(parse_fa3_tuning(std::string("exp_before_max=1,") + other, &both, &why)) << why;
    EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), both, &plan, &why)) << other;
    EXPECT_NE(why.find("exp_before_max"), std::string::npos) << other << ": " << why;
  }
}

// Three softmax forms, tunings off by default (session 37): the pingpong's turn over the softmax
// (kPingpongSoftmax, `.pps`; only with pingpong), the exponent as (s - max) * c (kExpSubtractFirst,
// `.es`) and the prologue block's masked chunks without exponentials (kSkipMaskedGroups, `.skm`).
// None has an MLIR form: MLIR plans get 0 and refuse 1.
TEST(Fa3Tuning, SoftmaxFormsAreTunings) {
  Plan plan;
  std::string why;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      EXPECT_EQ(plan.constant("kPingpongSoftmax"), 0) << "d" << d;
      EXPECT_EQ(plan.constant("kExpSubtractFirst"), 0) << "d" << d;
      EXPECT_EQ(plan.constant("kSkipMaskedGroups"), 0) << "d" << d;
      const std::string name = kernel_name(prefill(d, causal), plan);
      for (const char *suffix : {".pps", ".es", ".skm"})
        EXPECT_EQ(name.find(suffix), std::string::npos) << name;
    }
  Fa3Tuning tuning;
  ASSERT_TRUE(parse_fa3_tuning("pingpong_softmax=1,exp_subtract_first=1,skip_masked_groups=1", &tuning, &why)) << why;
  EXPECT_EQ(tuning.pingpong_softmax, 1);
  EXPECT_EQ(tuning.exp_subtract_first, 1);
  EXPECT_EQ(tuning.skip_masked_groups, 1);
  ASSERT_TRUE(plan_fa3_tuned(prefill(64, true), tuning, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kPingpongSoftmax"), 1);
  EXPECT_EQ(plan.constant("kExpSubtractFirst"), 1);
  EXPECT_EQ(plan.constant("kSkipMaskedGroups"), 1);
  const std::string name = kernel_name(prefill(64, true), plan);
  for (const char *suffix : {".pps", ".es", ".skm"})
    EXPECT_NE(name.find(suffix), std::string::npos) << name;
  // The MLIR refusal names each knob in turn, the first still set.
  const std::pair<const char *, int Fa3Tuning::*> knobs[] = {{"pingpong_softmax", &Fa3Tuning::pingpong_softmax},
                                                             {"exp_subtract_first", &Fa3Tuning::exp_subtract_first},
                                                             {"skip_masked_groups", &Fa3Tuning::skip_masked_groups}};
  for (const auto &[key, field] : knobs) {
    EXPECT_FALSE(plan_fa3_tuned(prefill(64, true), tuning, &plan, &why, FLASHJIT_BACKEND_MLIR)) << key;
    EXPECT_NE(why.find(key), std::string::npos) << why;
    tuning.*field = -1;
  }
  Fa3Tuning without_pingpong;
  without_pingpong.pingpong = 0;
  without_pingpong.pingpong_softmax = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), without_pingpong, &plan, &why));
  EXPECT_NE(why.find("pingpong_softmax needs pingpong"), std::string::npos) << why;
}

// ptxas_opt_level (`.oN`): a lowered ptxas level is a plan constant that names the kernel and lands
// in the NVRTC options (so in the cache key); the default adds neither, so default sources and keys
// stay as they were. MLIR plans refuse it; 4 and -1 are no level.
TEST(Fa3Tuning, PtxasOptLevelIsAnOptionOfItsKernel) {
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), Fa3Tuning{}, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kPtxasOptLevel", 0), 0);
  const std::string default_name = kernel_name(prefill(128, false), plan);
  const size_t default_options = nvrtc_options(prefill(128, false).arch, plan).size();
  Fa3Tuning lowered;
  ASSERT_TRUE(parse_fa3_tuning("ptxas_opt_level=1", &lowered, &why)) << why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), lowered, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kPtxasOptLevel"), 1);
  EXPECT_EQ(kernel_name(prefill(128, false), plan), default_name.substr(0, default_name.size() - 5) + ".o1.al16");
  const std::vector<std::string> options = nvrtc_options(prefill(128, false).arch, plan);
  ASSERT_EQ(options.size(), default_options + 1);
  EXPECT_EQ(options.back(), "--ptxas-options=-O1");
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), lowered, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("ptxas_opt_level is an NVRTC option only"), std::string::npos) << why;
  for (int level : {4, -1}) {
    Fa3Tuning bad;
    bad.ptxas_opt_level = level;
    EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), bad, &plan, &why)) << level;
    EXPECT_NE(why.find("ptxas_opt_level must be 0"), std::string::npos) << why;
  }
}

// The skipped chunks' width is the plan's (kSkipChunkGroups, which the template's live-group count
// and softmax both read): 16 columns, which tile every key block (block_n is a multiple of 16).
TEST(Fa3Tuning, SkipChunksTileTheKeyBlock) {
  Plan plan;
  std::string why;
  Fa3Tuning chunks;
  ASSERT_TRUE(parse_fa3_tuning("skip_masked_groups=1", &chunks, &why)) << why;
  for (int d : {64, 96, 192, 256}) {
    ASSERT_TRUE(plan_fa3_tuned(prefill(d, true), chunks, &plan, &why)) << why;
    const int chunk_cols = static_cast<int>(plan.constant("kSkipChunkGroups")) * 8;
    EXPECT_EQ(chunk_cols, 16) << "d" << d;
    EXPECT_EQ(plan.block_n % chunk_cols, 0) << "d" << d << " block_n " << plan.block_n;
  }
}

// skip_masked_groups=2 (`.skh`) halves the prologue block's softmax, so it needs key blocks of a
// multiple of 32 (whole 16-column chunks per half): d64's 128 and d96's 96 take it, d256 causal's 80
// is refused by name; 3 and -2 are no form.
TEST(Fa3Tuning, SkipMaskedHalvesNeedWholeChunks) {
  Plan plan;
  std::string why;
  Fa3Tuning halves;
  ASSERT_TRUE(parse_fa3_tuning("skip_masked_groups=2", &halves, &why)) << why;
  for (int d : {64, 96}) {
    ASSERT_TRUE(plan_fa3_tuned(prefill(d, true), halves, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kSkipMaskedGroups"), 2) << "d" << d;
    EXPECT_EQ(plan.block_n % 32, 0) << "d" << d;
    const std::string name = kernel_name(prefill(d, true), plan);
    EXPECT_NE(name.find(".skh"), std::string::npos) << name;
    EXPECT_EQ(name.find(".skm"), std::string::npos) << name;
  }
  EXPECT_FALSE(plan_fa3_tuned(prefill(256, true), halves, &plan, &why));
  EXPECT_NE(why.find("skip_masked_groups=2 halves key blocks of a multiple of 32 keys, got 80"), std::string::npos)
      << why;
  for (int form : {3, -2}) {
    Fa3Tuning bad;
    bad.skip_masked_groups = form;
    EXPECT_FALSE(plan_fa3_tuned(prefill(64, true), bad, &plan, &why)) << form;
    EXPECT_NE(why.find("skip_masked_groups must be 0 (off), 1 (chunks) or 2 (halves)"), std::string::npos) << why;
  }
}

// A tile's first key block as the key loop's first step (kFirstBlockInLoop, kernel suffix `.fl`):
// the NVRTC default where the kernel runs without pingpong (non-causal d > 128, runs 23b-c), a
// tuning elsewhere; MLIR plans and the cross-tile stream keep the prologue block.
// A programmatic launch (kProgrammaticLaunch, `.pdl`) is a tuning, off by default, NVRTC only.
TEST(Fa3Tuning, ProgrammaticLaunchIsATuning) {
  Plan plan;
  std::string why;
  for (int d : {64, 128, 256}) {
    ASSERT_TRUE(plan_fa3(prefill(d, false), &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kProgrammaticLaunch"), 0) << "d" << d;
  }
  Fa3Tuning programmatic;
  ASSERT_TRUE(parse_fa3_tuning("programmatic_launch=1", &programmatic, &why)) << why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, true), programmatic, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kProgrammaticLaunch"), 1);
  EXPECT_NE(kernel_name(prefill(128, true), plan).find(".pdl"), std::string::npos);
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), programmatic, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("programmatic_launch"), std::string::npos) << why;
}

// The first block in the key loop (kFirstBlockInLoop, `.fl`) is a tuning: run 25 measured the prologue
// form with the unmasked key loop faster at d192 and d256, the kernels without pingpong.
TEST(Fa3Tuning, FirstBlockInLoopIsATuning) {
  for (int d : {64, 80, 128, 192, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      EXPECT_EQ(plan.pingpong, causal || d <= 128) << "d" << d << (causal ? " causal" : "");
      EXPECT_EQ(plan.constant("kFirstBlockInLoop"), 0) << "d" << d << (causal ? " causal" : "");
      EXPECT_EQ(kernel_name(prefill(d, causal), plan).find(".fl"), std::string::npos) << "d" << d;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
      EXPECT_EQ(plan.constant("kFirstBlockInLoop"), 0) << "MLIR renders its own loop";
    }
  Fa3Tuning in_loop;
  std::string why;
  ASSERT_TRUE(parse_fa3_tuning("first_block_in_loop=1", &in_loop, &why)) << why;
  EXPECT_EQ(in_loop.first_block_in_loop, 1);
  Plan plan;
  for (bool causal : {false, true}) {
    ASSERT_TRUE(plan_fa3_tuned(prefill(128, causal), in_loop, &plan, &why)) << why;
    EXPECT_EQ(plan.constant("kFirstBlockInLoop"), 1);
    EXPECT_NE(kernel_name(prefill(128, causal), plan).find(".fl"), std::string::npos);
  }
  Fa3Tuning prologue;
  prologue.first_block_in_loop = 0;
  ASSERT_TRUE(plan_fa3_tuned(prefill(256, false), prologue, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kFirstBlockInLoop"), 0);
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), in_loop, &plan, &why, FLASHJIT_BACKEND_MLIR));
  EXPECT_NE(why.find("first_block_in_loop"), std::string::npos) << why;
  in_loop.cross_tile_overlap = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), in_loop, &plan, &why));
  EXPECT_NE(why.find("cross_tile_overlap"), std::string::npos) << why;
}

// Without causal or window masking the prologue form's key loop carries no mask code
// (kUnmaskedKeyLoop, `.um`): the plans of every head dim and both backends (all keep the prologue by
// default).
TEST(Fa3Tuning, UnmaskedKeyLoopWithoutMasking) {
  for (int d : {64, 80, 128, 192, 256})
    for (bool causal : {false, true}) {
      Plan plan;
      std::string why;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why)) << why;
      const bool expected = !causal && plan.constant("kFirstBlockInLoop") == 0;
      EXPECT_EQ(plan.constant("kUnmaskedKeyLoop"), expected ? 1 : 0) << "d" << d << (causal ? " causal" : "");
      EXPECT_EQ(kernel_name(prefill(d, causal), plan).find(".um") != std::string::npos, expected) << "d" << d;
      ASSERT_TRUE(plan_fa3(prefill(d, causal), &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
      EXPECT_EQ(plan.constant("kUnmaskedKeyLoop"), causal ? 0 : 1) << "MLIR plans take it too (run 26b)";
    }
  KernelSpec window = prefill(128, false);
  window.local = true;
  Plan plan;
  std::string why;
  ASSERT_TRUE(plan_fa3(window, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kUnmaskedKeyLoop"), 0) << "a window hides keys in every block";

  Fa3Tuning unmasked;
  ASSERT_TRUE(parse_fa3_tuning("unmasked_key_loop=1", &unmasked, &why)) << why;
  EXPECT_EQ(unmasked.unmasked_key_loop, 1);
  for (const KernelSpec &spec : {prefill(128, true), window}) {
    EXPECT_FALSE(plan_fa3_tuned(spec, unmasked, &plan, &why));
    EXPECT_NE(why.find("unmasked_key_loop"), std::string::npos) << why;
  }
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), unmasked, &plan, &why, FLASHJIT_BACKEND_MLIR)) << why;
  EXPECT_EQ(plan.constant("kUnmaskedKeyLoop"), 1) << "the MLIR generator renders it too";
  Fa3Tuning in_loop = unmasked;
  in_loop.first_block_in_loop = 1;
  EXPECT_FALSE(plan_fa3_tuned(prefill(128, false), in_loop, &plan, &why));
  EXPECT_NE(why.find("first_block_in_loop"), std::string::npos) << why;
  Fa3Tuning masked_loop;
  ASSERT_TRUE(parse_fa3_tuning("unmasked_key_loop=0", &masked_loop, &why)) << why;
  ASSERT_TRUE(plan_fa3_tuned(prefill(128, false), masked_loop, &plan, &why)) << why;
  EXPECT_EQ(plan.constant("kUnmaskedKeyLoop"), 0);
  EXPECT_EQ(kernel_name(prefill(128, false), plan).find(".um"), std::string::npos);
}

TEST(Planner, PrefersFa3OnHopperAndFa2Elsewhere) {
  PlanChoice hopper = choose_plan(prefill(128, false));
  ASSERT_TRUE(hopper.ok) << hopper.error;
  EXPECT_EQ(hopper.preferred, Variant::fa3);
  PlanChoice ampere = choose_plan(prefill(128, false, Arch{80, false}));
  ASSERT_TRUE(ampere.ok);
  EXPECT_EQ(ampere.plan.variant, Variant::fa2);
  EXPECT_EQ(ampere.preferred, Variant::fa2);
  EXPECT_TRUE(ampere.fallback_reason.empty());
}

TEST(Planner, RecordsWhyItFallsBackFromFa3) {
  KernelSpec spec = prefill(128, false);
  spec.align_bytes = 2; // TMA needs 16-byte aligned rows
  PlanChoice choice = choose_plan(spec);
  ASSERT_TRUE(choice.ok) << choice.error;
  EXPECT_EQ(choice.preferred, Variant::fa3);
  EXPECT_EQ(choice.plan.variant, Variant::fa2);
  EXPECT_NE(choice.fallback_reason.find("fa3"), std::string::npos) << choice.fallback_reason;
  spec = prefill(64, false);
  spec.page_size = 16; // paged fa3 is the default since run 31
  choice = choose_plan(spec);
  ASSERT_TRUE(choice.ok);
  EXPECT_EQ(choice.plan.variant, Variant::fa3);
  EXPECT_TRUE(choice.fallback_reason.empty()) << choice.fallback_reason;
}

TEST(Planner, ForcedVariantThatCannotRunIsAnErrorNotAFallback) {
  KernelSpec spec = prefill(64, false);
  spec.align_bytes = 2;
  PlanChoice choice = choose_plan(spec, Variant::fa3);
  EXPECT_FALSE(choice.ok);
  EXPECT_NE(choice.error.find("fa3"), std::string::npos);
  choice = choose_plan(prefill(128, true), Variant::fa2);
  ASSERT_TRUE(choice.ok);
  EXPECT_EQ(choice.plan.variant, Variant::fa2);
}

TEST(Codegen, RendersEverySpecAndPlanConstant) {
  KernelSpec spec = prefill(72, true);
  PlanChoice choice = choose_plan(spec, Variant::fa2);
  ASSERT_TRUE(choice.ok);
  const std::string source = render_source(choice.spec, choice.plan);
  EXPECT_NE(source.find("static constexpr int kHeadDimQK = 72;"), std::string::npos);
  EXPECT_NE(source.find("static constexpr bool kCausal = true;"), std::string::npos);
  EXPECT_NE(source.find("#include \"kernels/fa2_prefill.cuh\""), std::string::npos);
  for (const PlanConstant &c : choice.plan.constants)
    EXPECT_NE(source.find(" " + c.name + " = "), std::string::npos) << c.name;
}

} // namespace
} // namespace flashjit
