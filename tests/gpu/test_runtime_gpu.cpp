// Runtime behaviour on the GPU: CUDA-graph capture, threads sharing one Runtime, determinism.
#include "runtime/driver.hpp"
#include "tests/gpu/gpu_test.hpp"
#include "tests/harness/device_case.hpp"

#include <gtest/gtest.h>

#include <thread>

namespace flashjit {
namespace {

class RuntimeGpu : public GpuTest {};

harness::CaseOptions small_case(int d, bool causal, int seqlen_q) {
  harness::CaseOptions c;
  c.problem = ref::Problem::dense(2, seqlen_q, 300, 8, 2, d, d);
  c.problem.causal = causal;
  return c;
}

// The hot path's device lookup: the same cached record on every call and on every thread, with the
// fields current_device reports.
TEST_F(RuntimeGpu, ContextDeviceIsCachedPerContext) {
  CUcontext context = nullptr;
  ASSERT_EQ(driver::api()->cuCtxGetCurrent(&context), CUDA_SUCCESS);
  const driver::DeviceInfo *first = nullptr, *again = nullptr, *other_thread = nullptr;
  ASSERT_TRUE(driver::context_device(context, &first).ok());
  ASSERT_TRUE(driver::context_device(context, &again).ok());
  std::thread([&] { ASSERT_TRUE(driver::context_device(context, &other_thread).ok()); }).join();
  EXPECT_EQ(first, again);
  EXPECT_EQ(first, other_thread);
  driver::DeviceInfo queried;
  ASSERT_TRUE(driver::current_device(&queried).ok());
  EXPECT_EQ(first->sm_count, queried.sm_count);
  EXPECT_EQ(first->cc_major, queried.cc_major);
  EXPECT_EQ(first->name, queried.name);
  EXPECT_GT(first->sm_count, 0);
  const driver::DeviceInfo *none = nullptr;
  const Status no_context = driver::context_device(nullptr, &none);
  EXPECT_EQ(no_context.code, FLASHJIT_DRIVER_ERROR);
  EXPECT_NE(no_context.message.find("no current CUDA context"), std::string::npos) << no_context.message;
}

TEST_F(RuntimeGpu, GraphReplayEqualsDirectLaunch) {
  for (int seqlen_q : {1, 4, 200}) { // decode-shaped and prefill-shaped
    Runtime runtime;
    harness::CaseOptions c = small_case(128, true, seqlen_q);
    const harness::CaseResult direct = harness::run_case(runtime, c);
    ASSERT_TRUE(direct.pass()) << direct.summary();
    c.graph_capture = true;
    const harness::CaseResult replay = harness::run_case(runtime, c);
    ASSERT_TRUE(replay.pass()) << replay.summary();
    EXPECT_EQ(direct.o_values, replay.o_values) << "graph replay differs from a direct launch, seqlen_q " << seqlen_q;
  }
}

TEST_F(RuntimeGpu, ThreadsShareOneRuntime) {
  Runtime runtime;
  CUcontext context = nullptr;
  driver::api()->cuCtxGetCurrent(&context);
  constexpr int kThreads = 4;
  std::vector<harness::CaseResult> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      driver::api()->cuCtxSetCurrent(context);
      harness::CaseOptions c = small_case(t % 2 ? 80 : 64, t >= 2, 257);
      c.seed = 100 + t;
      results[t] = harness::run_case(runtime, c); // same specs from two threads: built once
    });
  for (auto &thread : threads)
    thread.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_TRUE(results[t].pass()) << "thread " << t << ": " << results[t].summary();
}

TEST_F(RuntimeGpu, StrictModeRefusesFallbackOnTheDevice) {
  Options options;
  options.strict = 1;
  Runtime runtime(options);
  harness::CaseOptions c = small_case(64, false, 100);
  c.row_padding = 3; // rows not 16-byte aligned: fa3 (TMA) cannot run them
  const harness::CaseResult r = harness::run_case(runtime, c);
  EXPECT_EQ(r.status.code, FLASHJIT_FALLBACK_FORBIDDEN) << r.summary();
}

} // namespace
} // namespace flashjit
