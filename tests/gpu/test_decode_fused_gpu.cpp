// Split-K decode with the merge of split units inside the decode grid (plan constant kFusedMerge:
// per-unit arrival counters, the last CTA of a unit merges it). The same planned step run three
// times back to back without a sync, then through a CUDA graph replay and once more after it, gives
// bitwise-equal outputs (a counter not put back to zero would skip or repeat a merge; a merge that
// raced its states would read stale partials); the fused plan's output equals the unfused plan's
// (fj_decode_combine in a second launch) bit for bit, O and LSE, and so does the TMA tile plan's
// (plan constant kTmaKv) the cp.async tile plan's. Skips without a GPU.
#include "compiler/build.hpp"
#include "compiler/plans/decode_plan.hpp"
#include "runtime/decode.hpp"
#include "runtime/driver.hpp"
#include "runtime/problem.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/harness/device_case.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace flashjit {
namespace {

constexpr unsigned char kNanByte = 0xFF; // 0xFFFF is a NaN in bf16, 0xFFFFFFFF in float32
constexpr int kBf16Bytes = 2;

class DecodeFusedGpu : public GpuTest {};

struct Shape {
  int batch, q_len, kv_len, heads_q, heads_kv, d;
  bool causal;
};

// Random bf16 inputs (never zeros), contiguous batch-mode layout, and any number of NaN-poisoned
// (O, LSE) output pairs.
struct Inputs {
  Shape shape;
  harness::DeviceBuffer q, k, v;
  std::vector<harness::DeviceBuffer> o, lse;

  size_t o_bytes() const { return size_t(shape.batch) * shape.q_len * shape.heads_q * shape.d * kBf16Bytes; }
  size_t lse_bytes() const { return size_t(shape.batch) * shape.heads_q * shape.q_len * sizeof(float); }

  static void fill_random(harness::DeviceBuffer *buffer, size_t elems, std::mt19937 &rng) {
    std::normal_distribution<float> normal;
    std::vector<uint16_t> bits(elems);
    for (uint16_t &b : bits)
      b = ref::to_bits(ref::Dtype::bf16, normal(rng));
    ASSERT_TRUE(buffer->allocate(elems * kBf16Bytes));
    ASSERT_TRUE(buffer->upload(bits.data(), elems * kBf16Bytes));
  }

  void make(const Shape &s, int outputs) {
    shape = s;
    std::mt19937 rng(11);
    fill_random(&q, size_t(s.batch) * s.q_len * s.heads_q * s.d, rng);
    fill_random(&k, size_t(s.batch) * s.kv_len * s.heads_kv * s.d, rng);
    fill_random(&v, size_t(s.batch) * s.kv_len * s.heads_kv * s.d, rng);
    o.resize(outputs);
    lse.resize(outputs);
    for (int i = 0; i < outputs; ++i) {
      ASSERT_TRUE(o[i].allocate(o_bytes()) && o[i].fill_bytes(kNanByte));
      ASSERT_TRUE(lse[i].allocate(lse_bytes()) && lse[i].fill_bytes(kNanByte));
    }
  }

  AttentionProblem problem(int output) const {
    AttentionProblem p;
    p.dtype = FLASHJIT_BF16;
    p.batch = shape.batch;
    p.seqlen_q = shape.q_len;
    p.seqlen_k = shape.kv_len;
    p.heads_q = shape.heads_q;
    p.heads_kv = shape.heads_kv;
    p.head_dim_qk = shape.d;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.o = o[output].get();
    p.lse = static_cast<float *>(lse[output].get());
    p.causal = shape.causal;
    return p;
  }

  // O and LSE of output `i`, as raw bytes (bitwise comparisons; NaN poison included).
  std::vector<char> result(int i) const {
    std::vector<char> bytes(o_bytes() + lse_bytes());
    EXPECT_TRUE(o[i].download(bytes.data(), o_bytes()));
    EXPECT_TRUE(lse[i].download(bytes.data() + o_bytes(), lse_bytes()));
    return bytes;
  }
  // Whether some element still holds the poison (an all-ones bf16 or float: never computed).
  bool poisoned(int i) const {
    const std::vector<char> bytes = result(i);
    constexpr uint16_t kPoison16 = 0xFFFF;
    constexpr uint32_t kPoison32 = 0xFFFFFFFF;
    for (size_t at = 0; at < o_bytes(); at += kBf16Bytes) {
      uint16_t x;
      std::memcpy(&x, bytes.data() + at, sizeof x);
      if (x == kPoison16)
        return true;
    }
    for (size_t at = o_bytes(); at < bytes.size(); at += sizeof(float)) {
      uint32_t x;
      std::memcpy(&x, bytes.data() + at, sizeof x);
      if (x == kPoison32)
        return true;
    }
    return false;
  }
};

// Long sequences over 8 kv heads: most units are split over several CTAs.
const Shape kSplitShape{2, 1, 20000, 32, 8, 128, false};

TEST_F(DecodeFusedGpu, BackToBackAndGraphReplayAreBitwiseEqual) {
  const driver::Api *api = driver::api();
  constexpr int kBackToBack = 3, kGraphOutput = 3, kAfterGraph = 4, kOutputs = 5;
  Inputs in;
  in.make(kSplitShape, kOutputs);
  Options options;
  options.strict = 1; // the split-K kernel itself
  Runtime runtime(options);
  AttentionProblem p = in.problem(0);
  size_t bytes = 0;
  ASSERT_TRUE(runtime.workspace_size(p, &bytes).ok());
  harness::DeviceBuffer workspace;
  ASSERT_TRUE(workspace.allocate(bytes));
  CUstream stream = nullptr;
  ASSERT_EQ(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  auto with_output = [&](int i) {
    AttentionProblem q = in.problem(i);
    q.workspace = workspace.get();
    q.workspace_bytes = bytes;
    return q;
  };
  Status planned = runtime.plan(with_output(0));
  ASSERT_TRUE(planned.ok()) << planned.message;
  Explanation explanation;
  ASSERT_TRUE(runtime.explain(with_output(0), &explanation).ok());
  std::cout << "kernel: " << explanation.kernel << "\n";

  for (int i = 0; i < kBackToBack; ++i) { // no sync in between: each step overlaps the last (PDL)
    Status s = runtime.forward(with_output(i), reinterpret_cast<flashjit_stream>(stream));
    ASSERT_TRUE(s.ok()) << s.message;
  }
  ASSERT_EQ(api->cuStreamSynchronize(stream), CUDA_SUCCESS);

  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  ASSERT_EQ(api->cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  Status captured = runtime.forward(with_output(kGraphOutput), reinterpret_cast<flashjit_stream>(stream));
  ASSERT_EQ(api->cuStreamEndCapture(stream, &graph), CUDA_SUCCESS);
  ASSERT_TRUE(captured.ok()) << captured.message;
  ASSERT_EQ(api->cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  constexpr int kReplays = 2;
  for (int r = 0; r < kReplays; ++r)
    ASSERT_EQ(api->cuGraphLaunch(exec, stream), CUDA_SUCCESS);
  Status after = runtime.forward(with_output(kAfterGraph), reinterpret_cast<flashjit_stream>(stream));
  ASSERT_TRUE(after.ok()) << after.message;
  ASSERT_EQ(api->cuStreamSynchronize(stream), CUDA_SUCCESS);
  api->cuGraphExecDestroy(exec);
  api->cuGraphDestroy(graph);
  api->cuStreamDestroy(stream);

  const std::vector<char> first = in.result(0);
  EXPECT_FALSE(in.poisoned(0)) << "an output element was never written";
  for (int i = 1; i < kOutputs; ++i)
    EXPECT_TRUE(in.result(i) == first) << "output " << i << " differs from the first step's";
}

// One KernelRecord built from `plan` (NVRTC), as the kernel store would load it.
void load_record(const KernelSpec &spec, const Plan &plan, KernelRecord *record) {
  CompiledKernel compiled;
  Status s = build_kernel(spec, plan, FLASHJIT_BACKEND_NVRTC, &compiled);
  ASSERT_TRUE(s.ok()) << s.message;
  record->choice.spec = spec;
  record->choice.plan = plan;
  record->choice.ok = true;
  record->name = kernel_name(spec, plan);
  record->backend = compiled.backend;
  ASSERT_TRUE(LoadedKernel::load(compiled.cubin, plan.entry, plan.smem_bytes, &record->kernel).ok());
  ASSERT_TRUE(LoadedKernel::load(compiled.cubin, "fj_decode_combine", 0, &record->companion).ok());
}

// Runs `shape` with two plans of its spec (the tunings), each on its own NaN-poisoned output and
// workspace, straight through the runtime's decode launch; both must split units (merges). True
// when both ran; `in` then holds output 0 (tunings[0]) and 1.
void run_two_plans(const Shape &shape, const DecodeTuning (&tunings)[2], Inputs *in, std::string *names) {
  driver::DeviceInfo device;
  ASSERT_TRUE(driver::current_device(&device).ok());
  const Arch arch = Arch::from_compute_capability(device.cc_major, device.cc_minor);
  LaunchContext ctx;
  ctx.sm_count = device.sm_count;
  ctx.l2_bytes = device.l2_bytes;
  in->make(shape, 2);
  NormalizedProblem n[2];
  KernelRecord records[2];
  harness::DeviceBuffer workspace[2];
  for (int which : {0, 1}) {
    AttentionProblem p = in->problem(which);
    ASSERT_TRUE(validate_problem(&p, &n[which]).ok());
    const KernelSpec spec = spec_for_problem(n[which], arch);
    ASSERT_EQ(spec.op, Op::decode);
    Plan plan;
    std::string why;
    ASSERT_TRUE(plan_decode_tuned(spec, tunings[which], &plan, &why)) << why;
    load_record(spec, plan, &records[which]);
    *names += (which == 0 ? "" : " vs ") + records[which].name;
    SplitKShape split_shape;
    SplitKLayout layout;
    ASSERT_TRUE(decode_layout(records[which], n[which], ctx, &split_shape, &layout).ok());
    ASSERT_TRUE(workspace[which].allocate(layout.total_bytes) && workspace[which].fill_bytes(kNanByte));
    n[which].p.workspace = workspace[which].get();
    n[which].p.workspace_bytes = layout.total_bytes;
    DecodeSchedule schedule;
    Status s = plan_decode_schedule(records[which], n[which], ctx, &schedule);
    ASSERT_TRUE(s.ok()) << s.message;
    EXPECT_GT(schedule.schedule.num_merges, 0) << "the case should split units";
    s = launch_decode(records[which], n[which], schedule, nullptr);
    ASSERT_TRUE(s.ok()) << s.message;
  }
  ASSERT_EQ(driver::api()->cuCtxSynchronize(), CUDA_SUCCESS);
}

TEST_F(DecodeFusedGpu, FusedEqualsUnfusedBitwise) {
  const Shape shapes[] = {kSplitShape, {3, 4, 3001, 8, 1, 64, true}, {1, 1, 50000, 8, 2, 256, false}};
  for (const Shape &shape : shapes) {
    DecodeTuning tunings[2];
    tunings[0].fused_merge = 1;
    tunings[1].fused_merge = 0;
    Inputs in;
    std::string names;
    run_two_plans(shape, tunings, &in, &names);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_FALSE(in.poisoned(0)) << names;
    EXPECT_TRUE(in.result(0) == in.result(1)) << names << ": fused and unfused merges differ";
  }
}

// K/V tiles by TMA (plan constant kTmaKv, the default on sm_90) against 16-byte cp.async copies:
// the same tiles in the same order of arithmetic, so the same bits, O and LSE; the TMA kernel's
// zeroed V rows past a piece's end keep the NaN-free padding exact (the lengths end mid-tile).
TEST_F(DecodeFusedGpu, TmaTilesEqualCpAsyncTilesBitwise) {
  const Shape shapes[] = {
      kSplitShape, {3, 4, 3001, 28, 4, 64, true}, {1, 1, 50001, 8, 2, 256, false}, {5, 2, 7777, 12, 2, 128, true}};
  for (const Shape &shape : shapes) {
    DecodeTuning tunings[2];
    tunings[0].tma_kv = 1;
    tunings[1].tma_kv = 0;
    Inputs in;
    std::string names;
    run_two_plans(shape, tunings, &in, &names);
    ASSERT_FALSE(HasFatalFailure());
    EXPECT_NE(names.find(".tma."), std::string::npos) << names;
    EXPECT_FALSE(in.poisoned(0)) << names;
    EXPECT_TRUE(in.result(0) == in.result(1)) << names << ": TMA and cp.async tiles differ";
  }
}

} // namespace
} // namespace flashjit
