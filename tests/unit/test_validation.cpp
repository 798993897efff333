// Every bad input is refused before anything is launched, with a message that names the parameter.
// No GPU or driver is needed: validation runs first, on the host, and touches no device memory
// (the pointers below are never dereferenced; several point at nothing).
#include "runtime/problem.hpp"
#include "tests/harness/scoped_env.hpp"

#include <flashjit/flashjit.h>
#include <flashjit/flashjit.hpp>

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace flashjit {
namespace {

constexpr uintptr_t kFakeDevicePointer = 0x7f0000000000ull; // 256-byte aligned, never dereferenced

AttentionProblem good_problem() {
  AttentionProblem p;
  p.batch = 2;
  p.seqlen_q = 100;
  p.seqlen_k = 120;
  p.heads_q = 8;
  p.heads_kv = 2;
  p.head_dim_qk = 80;
  p.q = reinterpret_cast<void *>(kFakeDevicePointer);
  p.k = reinterpret_cast<void *>(kFakeDevicePointer + (1 << 24));
  p.v = reinterpret_cast<void *>(kFakeDevicePointer + (2 << 24));
  p.o = reinterpret_cast<void *>(kFakeDevicePointer + (3 << 24));
  return p;
}

// The 1 x 32768 decode row of TARGETS.md: one query token, Hq 32, Hkv 8, d 128.
AttentionProblem decode_step_1x32768() {
  AttentionProblem p = good_problem();
  p.batch = 1;
  p.seqlen_q = 1;
  p.seqlen_k = 32768;
  p.heads_q = 32;
  p.heads_kv = 8;
  p.head_dim_qk = 128;
  return p;
}

struct BadInput {
  const char *what;
  std::function<void(AttentionProblem &)> spoil;
  const char *must_mention;
};

class Validation : public ::testing::TestWithParam<BadInput> {};

TEST(ValidationGood, AcceptsAndFillsDefaults) {
  NormalizedProblem n;
  const AttentionProblem p = good_problem();
  Status s = validate_problem(&p, &n);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(n.p.head_dim_v, 80);
  EXPECT_EQ(n.group, 4);
  EXPECT_EQ(n.p.q_strides.head, 80);
  EXPECT_EQ(n.p.q_strides.token, 8 * 80);
  EXPECT_EQ(n.p.q_strides.batch, 100 * 8 * 80);
  EXPECT_EQ(n.p.k_strides.batch, 120 * 2 * 80);
  EXPECT_FLOAT_EQ(n.p.scale, 1.0f / std::sqrt(80.0f));
  EXPECT_EQ(n.align_bytes, 16);
}

// The spec of a fixed-length d128 problem takes the short-key block where 1024 keys would leave the
// default block's last step 40% empty; longer and varlen problems keep the default.
TEST(ValidationGood, ShortKeyLengthsPickTheShortKeyBlock) {
  AttentionProblem p = good_problem();
  p.head_dim_qk = 128;
  p.heads_kv = p.heads_q;
  p.seqlen_q = p.seqlen_k = 1024;
  NormalizedProblem n;
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}).key_block, 128);
  EXPECT_EQ(spec_for_problem(n, Arch{80, false}).key_block, 0);
  p.seqlen_k = 4096;
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}).key_block, 0);
}

// A decode problem's key block comes from its static shape (batch x KV length, or the block table's
// capacity when paged, x KV heads), never from the step's lengths, so flashjit_plan and a captured
// graph agree on the kernel: the wide block for a short 1 x 32768 step, the planner's tiles for
// 1 x 131072.
TEST(ValidationGood, ShortDecodeStepsPickTheWideKeyBlock) {
  AttentionProblem p = decode_step_1x32768();
  NormalizedProblem n;
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  KernelSpec spec = spec_for_problem(n, Arch{90, true});
  EXPECT_EQ(spec.op, Op::decode);
  EXPECT_EQ(spec.key_block, 128);
  EXPECT_EQ(spec_for_problem(n, Arch{80, false}).key_block, 0);
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}, FLASHJIT_BACKEND_MLIR).key_block, 0);
  p.seqlen_k = 131072;
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}).key_block, 0);
  // Paged: the table's capacity counts, not seqlen_k.
  static int32_t table[4096];
  p.seqlen_k = 16;
  p.page_size = 16;
  p.num_pages = 4096;
  p.block_table = table;
  p.seqlens_k = table;
  p.max_pages_per_seq = 2048; // 32768 keys
  ASSERT_TRUE(validate_problem(&p, &n).ok()) << validate_problem(&p, &n).message;
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}).key_block, 128);
  p.max_pages_per_seq = 4096; // 65536 keys x 8 heads: past the wide block's reach
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  EXPECT_EQ(spec_for_problem(n, Arch{90, true}).key_block, 0);
}

// DESIGN.md promises arbitrary strides: the dimensions may nest in any order as long as no two rows
// overlap, e.g. PyTorch's head-major [B, H, S, D] and the sequence-minor [S, B, H, D].
TEST(ValidationGood, AcceptsHeadMajorAndSequenceMinorLayouts) {
  AttentionProblem p = good_problem();
  const int64_t d = 80;
  p.q_strides = {8 * 100 * d, d, 100 * d}; // [B, Hq, Sq, D]
  p.o_strides = p.q_strides;
  p.k_strides = {2 * 120 * d, d, 120 * d}; // [B, Hkv, Sk, D]
  p.v_strides = {2 * d, 2 * 2 * d, d};     // [Sk, B, Hkv, D]
  NormalizedProblem n;
  Status s = validate_problem(&p, &n);
  ASSERT_TRUE(s.ok()) << s.message;
  EXPECT_EQ(n.p.q_strides.token, d);
  EXPECT_EQ(n.p.k_strides.head, 120 * d);
  EXPECT_EQ(n.align_bytes, 16);
}

// Head-major with one element too little between heads: the heads' last token row runs into the
// next head's first.
TEST(ValidationGood, HeadMajorOverlapNamesTheHeadStride) {
  AttentionProblem p = good_problem();
  const int64_t d = 80;
  p.k_strides = {2 * 120 * d, d, 120 * d - 1};
  NormalizedProblem n;
  Status s = validate_problem(&p, &n);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message.find("k_strides.head = 9599: heads would overlap; expected >= 9600"), std::string::npos)
      << s.message;
  EXPECT_NE(s.message.find("(the extent of head_dim x tokens inside it)"), std::string::npos) << s.message;
}

// One sequence: its batch stride is never used, so any value is accepted.
TEST(ValidationGood, OneSequenceIgnoresTheBatchStride) {
  AttentionProblem p = good_problem();
  p.batch = 1;
  p.q_strides = {1, 8 * 80, 80};
  NormalizedProblem n;
  Status s = validate_problem(&p, &n);
  EXPECT_TRUE(s.ok()) << s.message;
}

TEST(ValidationGood, OddStridesSelectTheElementAlignedPath) {
  AttentionProblem p = good_problem();
  p.q_strides = {100 * (8 * 80 + 3), 8 * 80 + 3, 80};
  NormalizedProblem n;
  ASSERT_TRUE(validate_problem(&p, &n).ok());
  EXPECT_EQ(n.align_bytes, 2);
}

TEST_P(Validation, RefusesWithTheParameterNamed) {
  AttentionProblem p = good_problem();
  GetParam().spoil(p);
  NormalizedProblem n;
  Status s = validate_problem(&p, &n);
  EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT) << GetParam().what;
  EXPECT_NE(s.message.find(GetParam().must_mention), std::string::npos)
      << GetParam().what << ": message was \"" << s.message << "\"";
}

const int32_t kCuNonMonotone[] = {0, 50, 40, 100};
const int32_t kCuWrongTotal[] = {0, 50, 60, 90};
const int32_t kCuTooLong[] = {0, 150, 160, 170};
const int32_t kTableOutOfRange[] = {0, 1, 2, 99, 4, 5, 6, 7};
const int32_t kTableNegative[] = {0, 1, 2, 3, -1, 5, 6, 7};
const int32_t kLensOk[] = {60, 60};
const int32_t kLensTooLong[] = {60, 70};

void make_paged(AttentionProblem &p) {
  static const int32_t device_placeholder[8] = {};
  p.block_table = device_placeholder;
  p.seqlens_k = device_placeholder;
  p.page_size = 16;
  p.max_pages_per_seq = 4;
  p.num_pages = 8;
  p.seqlen_k = 60;
  p.seqlens_k_host = kLensOk;
}

void make_varlen(AttentionProblem &p, const int32_t *cu_q) {
  static const int32_t device_placeholder[4] = {};
  p.batch = 3;
  p.cu_seqlens_q = p.cu_seqlens_k = device_placeholder;
  p.total_q = p.total_k = 100;
  p.cu_seqlens_q_host = cu_q;
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, Validation,
    ::testing::Values(
        BadInput{"null q", [](AttentionProblem &p) { p.q = nullptr; }, "q: null"},
        BadInput{"null o", [](AttentionProblem &p) { p.o = nullptr; }, "o: null"},
        BadInput{"misaligned k", [](AttentionProblem &p) { p.k = reinterpret_cast<char *>(const_cast<void *>(p.k)) + 1; }, "k: pointer not aligned"},
        BadInput{"misaligned lse", [](AttentionProblem &p) { p.lse = reinterpret_cast<float *>(kFakeDevicePointer + 2); }, "lse"},
        BadInput{"head dim not multiple of 8", [](AttentionProblem &p) { p.head_dim_qk = 81; }, "head_dim_qk = 81"},
        BadInput{"head dim too large", [](AttentionProblem &p) { p.head_dim_qk = 264; }, "head_dim_qk = 264"},
        BadInput{"head dim v zero-ish", [](AttentionProblem &p) { p.head_dim_v = 4; }, "head_dim_v = 4"},
        BadInput{"heads not a multiple", [](AttentionProblem &p) { p.heads_kv = 3; }, "heads_kv = 3"},
        BadInput{"zero heads", [](AttentionProblem &p) { p.heads_q = 0; }, "heads_q/heads_kv"},
        BadInput{"unsupported dtype", [](AttentionProblem &p) { p.dtype = static_cast<flashjit_dtype>(7); }, "dtype = 7"},
        BadInput{"zero batch", [](AttentionProblem &p) { p.batch = 0; }, "batch = 0"},
        BadInput{"negative length", [](AttentionProblem &p) { p.seqlen_k = -5; }, "seqlen_q/seqlen_k"},
        BadInput{"overlapping heads", [](AttentionProblem &p) { p.q_strides = {100 * 640, 640, 40}; }, "q_strides.head = 40"},
        BadInput{"overlapping tokens", [](AttentionProblem &p) { p.k_strides = {120 * 160, 100, 80}; }, "k_strides.token = 100"},
        BadInput{"overlapping batches", [](AttentionProblem &p) { p.o_strides = {640, 640, 80}; }, "o_strides.batch = 640"},
        BadInput{"negative stride", [](AttentionProblem &p) { p.v_strides = {-1, 160, 80}; }, "v_strides"},
        BadInput{"tensor past the address space", [](AttentionProblem &p) { p.q_strides = {int64_t{1} << 60, 640, 80}; }, "q_strides: the tensor"},
        BadInput{"default strides past the address space", [](AttentionProblem &p) { p.seqlen_q = INT32_MAX; p.heads_q = 1 << 20; p.heads_kv = 1; }, "spans more than"},
        // Each sequence fits; the batch of them does not (2^30 x 2^16 tokens x 128 elements > 2^48).
        BadInput{"default strides past the address space by batch", [](AttentionProblem &p) { p.batch = 1 << 30; p.seqlen_q = p.seqlen_k = 1 << 16; p.heads_q = p.heads_kv = 1; }, "spans more than"},
        BadInput{"negative softcap", [](AttentionProblem &p) { p.softcap = -1; }, "softcap"},
        BadInput{"nan scale", [](AttentionProblem &p) { p.scale = std::nanf(""); }, "scale"},
        BadInput{"bad window", [](AttentionProblem &p) { p.window_left = -7; }, "window_left"},
        BadInput{"reserved flags", [](AttentionProblem &p) { p.flags = 1; }, "flags"},
        BadInput{"old struct size", [](AttentionProblem &p) { p.struct_size = 8; }, "struct_size"},
        BadInput{"only one cu_seqlens", [](AttentionProblem &p) { p.cu_seqlens_q = kCuWrongTotal; }, "cu_seqlens_q/cu_seqlens_k"},
        BadInput{"non-monotone cu_seqlens", [](AttentionProblem &p) { make_varlen(p, kCuNonMonotone); }, "not monotone"},
        BadInput{"cu_seqlens total", [](AttentionProblem &p) { make_varlen(p, kCuWrongTotal); }, "expected the total 100"},
        BadInput{"cu_seqlens beyond max", [](AttentionProblem &p) { make_varlen(p, kCuTooLong); }, "more than the declared maximum"},
        BadInput{"page size too large", [](AttentionProblem &p) { make_paged(p); p.page_size = 1024; }, "page_size = 1024"},
        BadInput{"page size zero", [](AttentionProblem &p) { make_paged(p); p.page_size = 0; }, "page_size = 0"},
        BadInput{"paged without lengths", [](AttentionProblem &p) { make_paged(p); p.seqlens_k = nullptr; }, "seqlens_k: null"},
        BadInput{"table does not cover", [](AttentionProblem &p) { make_paged(p); p.seqlen_k = 65; }, "exceeds what the block table covers"},
        BadInput{"length beyond table", [](AttentionProblem &p) { make_paged(p); p.seqlens_k_host = kLensTooLong; }, "seqlens_k[1] = 70"},
        BadInput{"page index out of range", [](AttentionProblem &p) { make_paged(p); p.block_table_host = kTableOutOfRange; }, "block_table[0][3] = 99"},
        BadInput{"negative page index", [](AttentionProblem &p) { make_paged(p); p.block_table_host = kTableNegative; }, "block_table[1][0] = -1"}),
    [](const ::testing::TestParamInfo<BadInput> &info) {
      std::string name = info.param.what;
      for (char &c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)))
          c = '_';
      return name;
    });

TEST(ValidationCApi, BadInputReturnsAStatusAndAThreadLocalMessage) {
  flashjit_runtime runtime = nullptr;
  ASSERT_EQ(flashjit_runtime_create(nullptr, &runtime), FLASHJIT_OK);
  AttentionProblem p = good_problem();
  p.head_dim_qk = 12;
  EXPECT_EQ(flashjit_forward(runtime, &p, nullptr), FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashjit_last_error()).find("head_dim_qk = 12"), std::string::npos);
  EXPECT_EQ(flashjit_forward(runtime, nullptr, nullptr), FLASHJIT_INVALID_ARGUMENT);
  EXPECT_EQ(flashjit_forward(nullptr, &p, nullptr), FLASHJIT_INVALID_ARGUMENT);
  EXPECT_STREQ(flashjit_status_name(FLASHJIT_INVALID_ARGUMENT), "FLASHJIT_INVALID_ARGUMENT");
  flashjit_runtime_destroy(runtime);
}

TEST(ValidationCApi, GoodInputWithoutADriverIsADriverErrorNotACrash) {
  flashjit_runtime runtime = nullptr;
  ASSERT_EQ(flashjit_runtime_create(nullptr, &runtime), FLASHJIT_OK);
  AttentionProblem p = good_problem();
  flashjit_status status = flashjit_forward(runtime, &p, nullptr);
  if (status == FLASHJIT_DRIVER_ERROR)
    EXPECT_FALSE(std::string(flashjit_last_error()).empty());
  else
    GTEST_SKIP() << "a driver is present; covered by tests/gpu";
  // explain works without a GPU: it plans for sm90a and says so.
  char text[2048];
  size_t length = 0;
  ASSERT_EQ(flashjit_explain(runtime, &p, text, sizeof(text), &length), FLASHJIT_OK) << flashjit_last_error();
  EXPECT_NE(std::string(text).find("prefill."), std::string::npos) << text;
  EXPECT_EQ(std::string(text).size(), length);
  flashjit_runtime_destroy(runtime);
}

// Explains `p` with `runtime`: false where a driver is present, whose GPU decides the plan (the
// tests then skip: tests/gpu covers that), true where it was explained for sm90a without one.
bool explained_for_sm90a(Runtime &runtime, const AttentionProblem &p, Explanation *e) {
  return runtime.explain(p, e).ok() && e->text.find("explained for sm90a") != std::string::npos;
}
constexpr const char *kDriverDecides = "a driver is present (its GPU decides); covered by tests/gpu";

// explain says how the decode kernel loads K/V: by TMA where the plan allows it, else by cp.async
// with the reason (head dims that are not multiples of 64 here); and when it runs the wide key block.
TEST(ValidationCApi, ExplainSaysHowDecodeLoadsKv) {
  Runtime runtime;
  AttentionProblem p = good_problem();
  p.seqlen_q = 1;
  p.workspace = reinterpret_cast<void *>(kFakeDevicePointer + (4 << 24));
  p.workspace_bytes = size_t{1} << 24;
  Explanation e;
  if (!explained_for_sm90a(runtime, p, &e))
    GTEST_SKIP() << kDriverDecides;
  EXPECT_NE(e.plan.find("K/V tiles by cp.async (no TMA: head dims are not multiples of 64"), std::string::npos)
      << e.kernel << ": " << e.plan;
  p.head_dim_qk = 128;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_NE(e.plan.find("K/V tiles by TMA"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find(".tma."), std::string::npos) << e.kernel;
  // A short step (2 x 120 keys x 2 KV heads) runs the wide key block, one CTA per SM; a long one
  // (2 x 2^17 keys x 2 KV heads) the planner's 64-key tiles.
  EXPECT_NE(e.plan.find("1 CTAs per SM, the wide key block"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find(".m16n128s"), std::string::npos) << e.kernel;
  p.seqlen_k = 1 << 17;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_EQ(e.plan.find("wide key block"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find(".m16n64s"), std::string::npos) << e.kernel;
}

// A short decode step without a workspace runs the prefill kernel with the prefill planner's tiles:
// decode's wide key block (a decode choice) must not become the prefill kernel's key block.
TEST(ValidationCApi, DecodeFallbackTakesThePrefillPlannersTiles) {
  Runtime runtime;
  const AttentionProblem p = decode_step_1x32768();
  Explanation e;
  if (!explained_for_sm90a(runtime, p, &e))
    GTEST_SKIP() << kDriverDecides;
  EXPECT_NE(e.kernel.find("prefill.fa3."), std::string::npos) << e.kernel;
  EXPECT_NE(e.kernel.find(".m128n160s"), std::string::npos) << e.kernel;
}

// explain names the unmasked key loop of fa3 plans without causal or window masking, and only theirs.
TEST(ValidationCApi, ExplainSaysWhenTheKeyLoopHasNoMask) {
  Runtime runtime;
  AttentionProblem p = good_problem();
  p.head_dim_qk = p.head_dim_v = 128;
  Explanation e;
  if (!explained_for_sm90a(runtime, p, &e))
    GTEST_SKIP() << kDriverDecides;
  EXPECT_NE(e.kernel.find(".um"), std::string::npos) << e.kernel;
  EXPECT_NE(e.plan.find("a key loop without mask code"), std::string::npos) << e.kernel << ": " << e.plan;
  p.causal = 1;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_EQ(e.kernel.find(".um"), std::string::npos) << e.kernel;
  EXPECT_EQ(e.plan.find("without mask code"), std::string::npos) << e.kernel << ": " << e.plan;
}

// explain names the lazy O rescale (d80: three warpgroups, fixed lengths) and says nothing of it for
// an eager plan (d128).
TEST(ValidationCApi, ExplainSaysWhenOIsRescaledLazily) {
  Runtime runtime;
  AttentionProblem p = good_problem();
  p.head_dim_qk = p.head_dim_v = 80;
  Explanation e;
  if (!explained_for_sm90a(runtime, p, &e))
    GTEST_SKIP() << kDriverDecides;
  EXPECT_NE(e.kernel.find(".lz"), std::string::npos) << e.kernel;
  EXPECT_NE(e.plan.find("lazy O rescale"), std::string::npos) << e.kernel << ": " << e.plan;
  p.head_dim_qk = p.head_dim_v = 128;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_EQ(e.kernel.find(".lz"), std::string::npos) << e.kernel;
  EXPECT_EQ(e.plan.find("lazy"), std::string::npos) << e.kernel << ": " << e.plan;
}

// Paged prefill on sm_90a: fa3 by default (fa2 where it is faster: pages fa3 would gather, at d64),
// and explain says how it reads the pages or why fa2 is preferred; with FLASHJIT_FA3_TUNING=paged=0,
// fa2 with the fallback's reason.
TEST(ValidationCApi, ExplainSaysHowPagedPrefillReadsThePages) {
  static int32_t table[64];
  AttentionProblem p = good_problem();
  p.head_dim_qk = p.head_dim_v = 128;
  p.causal = 1;
  p.seqlen_q = 300;
  p.seqlen_k = 900;
  p.page_size = 64;
  p.num_pages = 64;
  p.max_pages_per_seq = 32;
  p.block_table = table;
  p.seqlens_k = table;
  Explanation e;
  {
    std::optional<Runtime> fa2_runtime;
    {
      const testing::ScopedEnv fa2("FLASHJIT_FA3_TUNING", "paged=0"); // read when a runtime is made
      fa2_runtime.emplace();
    }
    if (!explained_for_sm90a(*fa2_runtime, p, &e))
      GTEST_SKIP() << kDriverDecides;
    EXPECT_EQ(e.variant, "fa2") << e.kernel;
    EXPECT_NE(e.fallback_reason.find("paged=0"), std::string::npos) << e.fallback_reason;
  }
  Runtime paged_runtime;
  ASSERT_TRUE(paged_runtime.explain(p, &e).ok());
  EXPECT_EQ(e.variant, "fa3") << e.kernel;
  EXPECT_NE(e.kernel.find(".page64."), std::string::npos) << e.kernel;
  EXPECT_NE(e.plan.find("through the block table in TMA boxes of 64 keys"), std::string::npos) << e.plan; // whole pages
  p.page_size = 1;
  p.max_pages_per_seq = 64;
  p.seqlen_k = 60;
  ASSERT_TRUE(paged_runtime.explain(p, &e).ok());
  EXPECT_EQ(e.variant, "fa3") << e.kernel;
  EXPECT_NE(e.kernel.find(".page1."), std::string::npos) << e.kernel;
  EXPECT_NE(e.kernel.find(".gather."), std::string::npos) << e.kernel;
  EXPECT_NE(e.plan.find("gathered through the block table by the producer warpgroup's cp.async"), std::string::npos)
      << e.plan;
  EXPECT_NE(e.plan.find("arriving on the block's barrier as they land"), std::string::npos) << e.plan;
  EXPECT_TRUE(e.preference_reason.empty()) << e.preference_reason;
  // At d64 fa2's paged stream reads such pages faster: fa2 is preferred (not a fallback), and says why.
  p.head_dim_qk = p.head_dim_v = 64;
  ASSERT_TRUE(paged_runtime.explain(p, &e).ok());
  EXPECT_EQ(e.variant, "fa2") << e.kernel;
  EXPECT_EQ(e.preferred_variant, "fa2") << e.kernel;
  EXPECT_TRUE(e.fallback_reason.empty()) << e.fallback_reason;
  EXPECT_NE(e.preference_reason.find("fa2's paged stream is faster"), std::string::npos) << e.preference_reason;
  EXPECT_NE(e.text.find("variant:  fa2 (preferred: page_size 1 is not a multiple of 8 keys"), std::string::npos)
      << e.text;
}

// explain names the short-sequence tiles: the short key block of an unmasked d128 problem whose keys
// the default block pads, the short causal tile of a causal problem up to 1024 tokens, neither past it,
// d192's narrower causal key block and d64's tile without the tail split.
TEST(ValidationCApi, ExplainNamesTheShortSequenceTiles) {
  Runtime runtime;
  AttentionProblem p = good_problem();
  p.head_dim_qk = p.head_dim_v = 128;
  p.seqlen_q = p.seqlen_k = 1000;
  Explanation e;
  if (!explained_for_sm90a(runtime, p, &e))
    GTEST_SKIP() << kDriverDecides;
  EXPECT_NE(e.plan.find("the short key block"), std::string::npos) << e.kernel << ": " << e.plan;
  p.causal = 1;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_NE(e.plan.find("the short causal tile"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find("causal.m128n128s2.wg2pp"), std::string::npos) << e.kernel;
  p.seqlen_q = p.seqlen_k = 2000;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_EQ(e.plan.find("the short"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find("causal.m192n80s2.wg3pp"), std::string::npos) << e.kernel;
  // d192 causal up to 1024 tokens: 96-key blocks, the same two warpgroups.
  p.head_dim_qk = p.head_dim_v = 192;
  p.seqlen_q = p.seqlen_k = 1024;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_NE(e.plan.find("the short causal key block"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_NE(e.kernel.find("causal.m128n96s2.wg2pp"), std::string::npos) << e.kernel;
  // d64 unmasked with at most 8 key blocks: the three-warpgroup tile without the tail split.
  p.causal = 0;
  p.head_dim_qk = p.head_dim_v = 64;
  ASSERT_TRUE(runtime.explain(p, &e).ok());
  EXPECT_NE(e.plan.find("no tail split"), std::string::npos) << e.kernel << ": " << e.plan;
  EXPECT_EQ(e.kernel.find(".ts"), std::string::npos) << e.kernel;
}

// Options whose enums hold no value of theirs: the C ABI refuses to create the runtime, a C++ runtime
// refuses every kernel request; both name the field.
TEST(ValidationCApi, OptionsOutOfRangeAreRefusedNamingTheField) {
  flashjit_options options;
  flashjit_options_init(&options);
  options.backend = static_cast<flashjit_backend>(7);
  flashjit_runtime runtime = nullptr;
  EXPECT_EQ(flashjit_runtime_create(&options, &runtime), FLASHJIT_INVALID_ARGUMENT);
  EXPECT_EQ(runtime, nullptr);
  EXPECT_NE(std::string(flashjit_last_error()).find("options.backend = 7"), std::string::npos) << flashjit_last_error();
  flashjit_options_init(&options);
  options.variant = static_cast<flashjit_variant>(-2);
  EXPECT_EQ(flashjit_runtime_create(&options, &runtime), FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashjit_last_error()).find("options.variant = -2"), std::string::npos)
      << flashjit_last_error();

  Options cpp_options;
  cpp_options.variant = static_cast<flashjit_variant>(9);
  Runtime cpp_runtime(cpp_options);
  const AttentionProblem p = good_problem();
  const Status s = cpp_runtime.prepare(p);
  EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(s.message.find("options.variant = 9"), std::string::npos) << s.message;
}

// merge_states refuses bad input on the host before it looks for a driver: each case names the field.
TEST(MergeStatesValidation, RefusesWithTheFieldNamed) {
  auto good = [] {
    flashjit_merge_problem m;
    flashjit_merge_problem_init(&m);
    m.dtype = FLASHJIT_BF16;
    m.num_states = 3;
    m.rows = 64;
    m.head_dim_v = 128;
    m.partial_o = reinterpret_cast<const float *>(kFakeDevicePointer);
    m.partial_lse = reinterpret_cast<const float *>(kFakeDevicePointer + (1 << 24));
    m.o = reinterpret_cast<void *>(kFakeDevicePointer + (2 << 24));
    return m;
  };
  struct BadMerge {
    std::function<void(flashjit_merge_problem &)> spoil;
    const char *must_mention;
  };
  const std::vector<BadMerge> cases = {
      {[](flashjit_merge_problem &m) { m.num_states = 0; }, "merge.num_states = 0"},
      {[](flashjit_merge_problem &m) { m.rows = -1; }, "merge.rows = -1"},
      {[](flashjit_merge_problem &m) { m.head_dim_v = 12; }, "merge.head_dim_v = 12"},
      {[](flashjit_merge_problem &m) { m.dtype = static_cast<flashjit_dtype>(9); }, "merge.dtype = 9"},
      {[](flashjit_merge_problem &m) { m.partial_lse = nullptr; }, "null pointer"},
      {[](flashjit_merge_problem &m) { m.partial_o = reinterpret_cast<const float *>(kFakeDevicePointer + 4); },
       "merge.partial_o"},
      {[](flashjit_merge_problem &m) { m.state_stride_o = 64; }, "states would overlap"},
      {[](flashjit_merge_problem &m) { m.o_row_stride = -128; }, "o_row_stride"},
      {[](flashjit_merge_problem &m) { m.state_stride_o = int64_t{1} << 60; }, "merge.partial_o (num_states 3"},
      {[](flashjit_merge_problem &m) { m.state_stride_lse = INT64_MAX; }, "merge.partial_lse (num_states 3"},
      {[](flashjit_merge_problem &m) {
         m.rows = INT32_MAX;
         m.o_row_stride = int64_t{1} << 40;
       },
       "merge.o (rows 2147483647"},
  };
  Runtime runtime;
  for (const BadMerge &c : cases) {
    flashjit_merge_problem m = good();
    c.spoil(m);
    const Status s = runtime.merge_states(m);
    EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT) << c.must_mention << ": " << s.message;
    EXPECT_NE(s.message.find(c.must_mention), std::string::npos) << s.message;
  }
}

__extension__ using Wide = __int128; // exact for any product of an int32 and an int64

// Extreme values for every size, length and stride field, in random combinations: validation
// either refuses (naming a parameter) or accepts a problem whose every tensor is addressable, its
// byte extent from the base pointer below 2^63. Run under UBSan by scripts/sanitize.sh, which also
// catches any signed overflow on the way.
TEST(ValidationFuzz, ExtremeSizesAndStridesAreRefusedOrAddressable) {
  constexpr int kRounds = 20000;
  constexpr uint32_t kSeed = 20261203;
  const int32_t ints[] = {0, 1, 2, 3, 7, 8, 64, 128, 256, 4096, 65535, 1 << 20, 1 << 30, INT32_MAX, -1, INT32_MIN};
  const int64_t strides[] = {0,
                             1,
                             8,
                             80,
                             640,
                             1 << 20,
                             int64_t{1} << 31,
                             int64_t{1} << 40,
                             int64_t{1} << 52,
                             int64_t{1} << 61,
                             int64_t{1} << 62,
                             INT64_MAX,
                             -8,
                             INT64_MIN};
  static const int32_t table[4] = {0, 0, 0, 0};
  static const int32_t lens_host[2] = {INT32_MAX, 3};
  static const int32_t cu_host[3] = {0, INT32_MAX, -5};
  std::mt19937 rng(kSeed);
  auto pick_int = [&] { return ints[rng() % std::size(ints)]; };
  auto pick_stride = [&] { return strides[rng() % std::size(strides)]; };
  int accepted = 0;
  for (int round = 0; round < kRounds; ++round) {
    AttentionProblem p = good_problem();
    const uint32_t fields = rng();
    if (fields & 1u << 0)
      p.batch = pick_int();
    if (fields & 1u << 1)
      p.seqlen_q = pick_int();
    if (fields & 1u << 2)
      p.seqlen_k = pick_int();
    if (fields & 1u << 3)
      p.heads_q = pick_int();
    if (fields & 1u << 4)
      p.heads_kv = pick_int();
    if (fields & 1u << 5)
      p.q_strides = {pick_stride(), pick_stride(), pick_stride()};
    if (fields & 1u << 6)
      p.k_strides = {pick_stride(), pick_stride(), pick_stride()};
    if (fields & 1u << 7)
      p.o_strides = {pick_stride(), pick_stride(), pick_stride()};
    if (fields & 1u << 8) {
      p.block_table = p.seqlens_k = table;
      p.page_size = pick_int();
      p.max_pages_per_seq = pick_int();
      p.num_pages = pick_int();
      if (fields & 1u << 9) {
        p.batch = 2; // the host copies hold batch entries
        p.seqlens_k_host = lens_host;
      }
    } else if (fields & 1u << 10) {
      p.cu_seqlens_q = p.cu_seqlens_k = table;
      p.total_q = pick_int();
      p.total_k = pick_int();
      if (fields & 1u << 11) {
        p.batch = 2;
        p.cu_seqlens_q_host = cu_host;
      }
    }
    NormalizedProblem n;
    const Status s = validate_problem(&p, &n);
    if (!s.ok()) {
      ASSERT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT) << s.message;
      ASSERT_FALSE(s.message.empty());
      continue;
    }
    ++accepted;
    const flashjit_problem &q = n.p;
    const int64_t q_rows = n.varlen ? q.total_q : q.seqlen_q,
                  k_rows = n.paged ? q.page_size : (n.varlen ? q.total_k : q.seqlen_k);
    const int64_t q_batches = n.varlen ? 1 : q.batch, kv_batches = n.paged ? q.num_pages : q_batches;
    struct Extent {
      flashjit_strides s;
      int64_t rows, heads, dim, batches;
    };
    for (const Extent &e : {Extent{q.q_strides, q_rows, q.heads_q, q.head_dim_qk, q_batches},
                            Extent{q.k_strides, k_rows, q.heads_kv, q.head_dim_qk, kv_batches},
                            Extent{q.v_strides, k_rows, q.heads_kv, q.head_dim_v, kv_batches},
                            Extent{q.o_strides, q_rows, q.heads_q, q.head_dim_v, q_batches}}) {
      Wide last = e.dim - 1; // the last element's offset, exactly
      last += static_cast<Wide>(std::max<int64_t>(e.rows - 1, 0)) * e.s.token;
      last += static_cast<Wide>(e.heads - 1) * e.s.head;
      last += static_cast<Wide>(e.batches - 1) * e.s.batch;
      ASSERT_LT(last * 2, static_cast<Wide>(INT64_MAX)) << "accepted a tensor past 2^63 bytes, round " << round;
    }
  }
  EXPECT_GT(accepted, 0) << "the fuzz never reached an accepted problem";
}

} // namespace
} // namespace flashjit
