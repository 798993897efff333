// Host-side costs of the runtime (Google Benchmark), on a GPU machine:
//   forward_hot:      problem -> launched, kernel already in memory (the per-call cost an engine pays)
//   resolve_hot:      forward_hot without the launch (validation, spec, driver queries, store hit)
//   context_queries:  the current context and its cached device, as each call asks for them
//   raw_launch_fa2:   one cuLaunchKernelEx of the same kernel, parameters made once (the floor)
//   raw_launch_fa3:   the same for forward_hot's fa3 kernel (its 896-byte parameter block, its cluster)
//   launch_fa3_hot:   launch_fa3 alone (parameter-cache lookup + launch), the problem resolved once
//   decode_forward_hot: a planned decode step (one launch: the split-K decode merges its splits)
//   decode_forward_new_kv: the same with K/V at a new address every call (TMA maps encoded each time)
//   prepare_disk_hit: problem -> loaded function with a cold memory cache and a warm disk cache
//   validate_and_spec: the CPU-only part of the hot path (no GPU needed)
#include "runtime/driver.hpp"
#include "runtime/kernel_store.hpp"
#include "runtime/launch.hpp"
#include "runtime/params.hpp"
#include "runtime/problem.hpp"
#include "tests/harness/device_case.hpp"

#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

namespace {

using namespace flashjit;

struct Fixture {
  harness::DeviceSession session;
  harness::DeviceBuffer q, k, v, o;
  AttentionProblem p;
  bool ok = false;

  Fixture() {
    if (Status s = session.open(0); !s) {
      std::cerr << "no GPU: " << s.message << "\n";
      return;
    }
    // Longer than the decode threshold (16 query tokens) so the prefill path is measured.
    constexpr int kTokens = 64, kHeads = 2, kDim = 128;
    const size_t bytes = size_t(kTokens) * kHeads * kDim * 2;
    for (harness::DeviceBuffer *b : {&q, &k, &v, &o})
      if (!b->allocate(bytes) || !b->fill_bytes(0x3c))
        return;
    p.seqlen_q = p.seqlen_k = kTokens;
    p.heads_q = p.heads_kv = kHeads;
    p.head_dim_qk = kDim;
    p.q = q.get();
    p.k = k.get();
    p.v = v.get();
    p.o = o.get();
    p.causal = 1;
    ok = true;
  }
};

std::string runtime_kernel(Runtime &runtime, const AttentionProblem &p) {
  Explanation e;
  return runtime.explain(p, &e) ? e.kernel : "?";
}

Fixture &fixture() {
  static Fixture f;
  return f;
}

// The shared GPU fixture, or null after marking the benchmark skipped.
Fixture *gpu_fixture(benchmark::State &state) {
  Fixture &f = fixture();
  if (!f.ok) {
    state.SkipWithError("no GPU");
    return nullptr;
  }
  return &f;
}

// Host time per call. Calls are timed in bursts on the host clock and the GPU is drained between
// bursts, outside the timing: an untimed loop of back-to-back launches fills the launch queue and then
// measures how fast the GPU retires the kernels, not what a call costs the caller (runs 1-8 did that).
constexpr int kBurst = 32;
// Bursts per benchmark. Fixed, not Google Benchmark's minimum time: that counts the manual (host)
// time only, ~4 us a call, while each burst also waits for its kernels, so a 0.5 s minimum took
// ~20 s of wall time per benchmark and the suite ran past the GPU machine's limits (runs 13-14).
constexpr int kHotBursts = 4000;

// Runs `call` kBurst times per iteration; false (benchmark marked failed) on the first error.
template <class Call> bool host_time_loop(benchmark::State &state, Call call) {
  for (auto _ : state) {
    if (CUresult r = driver::api()->cuCtxSynchronize(); r != CUDA_SUCCESS) {
      state.SkipWithError("cuCtxSynchronize failed");
      return false;
    }
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBurst; ++i)
      if (Status s = call(); !s) {
        state.SkipWithError(s.message.c_str());
        return false;
      }
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    state.SetIterationTime(elapsed.count() / kBurst);
  }
  return true;
}

bool forward_loop(benchmark::State &state, Runtime &runtime, const AttentionProblem &p) {
  return host_time_loop(state, [&] { return runtime.forward(p); });
}

void forward_hot(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Fixture &f = *fp;
  Runtime runtime;
  if (Status s = runtime.prepare(f.p); !s) {
    state.SkipWithError(s.message.c_str());
    return;
  }
  if (forward_loop(state, runtime, f.p))
    state.SetLabel(runtime_kernel(runtime, f.p));
}
BENCHMARK(forward_hot)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

// forward_hot without the launch: validation, spec, the driver queries and the kernel-store hit
// (Runtime::prepare). No GPU work, so Google Benchmark's own timing.
void resolve_hot(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Runtime runtime;
  if (Status s = runtime.prepare(fp->p); !s) {
    state.SkipWithError(s.message.c_str());
    return;
  }
  for (auto _ : state)
    if (Status s = runtime.prepare(fp->p); !s) {
      state.SkipWithError(s.message.c_str());
      return;
    }
}
BENCHMARK(resolve_hot)->Unit(benchmark::kNanosecond);

// The driver queries of each call: the current context and its (cached) device.
void context_queries(benchmark::State &state) {
  if (!gpu_fixture(state))
    return;
  for (auto _ : state) {
    CUcontext context = nullptr;
    driver::api()->cuCtxGetCurrent(&context);
    const driver::DeviceInfo *device = nullptr;
    Status s = driver::context_device(context, &device);
    benchmark::DoNotOptimize(device);
    benchmark::DoNotOptimize(s.code);
  }
}
BENCHMARK(context_queries)->Unit(benchmark::kNanosecond);

// The same kernel as forward_fa2_hot, launched straight through the driver with parameters made
// once: the floor that flashjit's own per-call work (validation, spec, lookup, params) adds to.
void raw_launch_fa2(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Fixture &f = *fp;
  Options options;
  options.variant = FLASHJIT_VARIANT_FA2;
  KernelStore store(store_config_from(options));
  NormalizedProblem n;
  CUcontext context = nullptr;
  driver::api()->cuCtxGetCurrent(&context);
  std::shared_ptr<const KernelRecord> record;
  if (!validate_problem(&f.p, &n) || !store.get(spec_for_problem(n, Arch{90, true}), context, &record)) {
    state.SkipWithError("could not prepare the kernel");
    return;
  }
  Fa2Launch launch = fa2_launch(*record, n); // parameters made once, as launch_fa2 makes them per call
  void *args[] = {&launch.params};
  host_time_loop(state,
                 [&] { return record->kernel.launch(launch.grid, launch.block, launch.smem_bytes, nullptr, args); });
}
BENCHMARK(raw_launch_fa2)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

// forward_hot's fa3 kernel, resolved once through a kernel store of its own.
struct Fa3Resolved {
  KernelStore store{store_config_from(Options{})};
  std::shared_ptr<const KernelRecord> record;
  NormalizedProblem problem;
  LaunchContext context;

  // False (the benchmark marked skipped) without a GPU or when the planner picks another kernel.
  bool resolve(benchmark::State &state) {
    Fixture *f = gpu_fixture(state);
    if (!f)
      return false;
    CUcontext cu_context = nullptr;
    driver::api()->cuCtxGetCurrent(&cu_context);
    driver::DeviceInfo device;
    if (!validate_problem(&f->p, &problem) || !driver::current_device(&device)) {
      state.SkipWithError("could not validate the problem");
      return false;
    }
    const Arch arch = Arch::from_compute_capability(device.cc_major, device.cc_minor);
    context = LaunchContext{device.sm_count, device.l2_bytes};
    if (!store.get(spec_for_problem(problem, arch), cu_context, &record) ||
        record->choice.plan.variant != Variant::fa3) {
      state.SkipWithError("no fa3 kernel for this problem on this device");
      return false;
    }
    return true;
  }
};

void raw_launch_fa3(benchmark::State &state) {
  Fa3Resolved r;
  if (!r.resolve(state))
    return;
  Fa3Launch launch;
  if (Status s = fa3_launch(*r.record, r.problem, r.context, &launch); !s) {
    state.SkipWithError(s.message.c_str());
    return;
  }
  void *args[] = {&launch.params};
  if (host_time_loop(state, [&] {
        return r.record->kernel.launch(launch.grid, launch.block, launch.smem_bytes, nullptr, args, launch.cluster);
      }))
    state.SetLabel(r.record->name + ", params " + std::to_string(sizeof(launch.params)) + " B, cluster " +
                   std::to_string(launch.cluster.x));
}
BENCHMARK(raw_launch_fa3)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

void launch_fa3_hot(benchmark::State &state) {
  Fa3Resolved r;
  if (r.resolve(state))
    host_time_loop(state, [&] { return launch_fa3(*r.record, r.problem, r.context, nullptr); });
}
BENCHMARK(launch_fa3_hot)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

void forward_fa2_hot(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Fixture &f = *fp;
  Options options;
  options.variant = FLASHJIT_VARIANT_FA2;
  Runtime runtime(options);
  forward_loop(state, runtime, f.p);
}
BENCHMARK(forward_fa2_hot)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

// Makes `p` a planned decode step (one query token, split-K with a workspace); false (benchmark
// marked skipped) on failure.
bool plan_decode_step(benchmark::State &state, Runtime &runtime, AttentionProblem *p,
                      harness::DeviceBuffer *workspace) {
  p->seqlen_q = 1;
  size_t bytes = 0;
  if (Status s = runtime.workspace_size(*p, &bytes); !s || !workspace->allocate(bytes)) {
    state.SkipWithError("workspace");
    return false;
  }
  p->workspace = workspace->get();
  p->workspace_bytes = bytes;
  if (Status s = runtime.plan(*p); !s) {
    state.SkipWithError(s.message.c_str());
    return false;
  }
  return true;
}

void decode_forward_hot(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Runtime runtime;
  AttentionProblem p = fp->p;
  harness::DeviceBuffer workspace;
  if (!plan_decode_step(state, runtime, &p, &workspace))
    return;
  if (forward_loop(state, runtime, p))
    state.SetLabel(runtime_kernel(runtime, p));
}
BENCHMARK(decode_forward_hot)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

// decode_forward_hot with K and V at another address on every call (kKvAddresses of them, more than
// the runtime's per-thread cache of TMA maps holds): the TMA tile kernel's maps are encoded each
// call, as for an engine's first step through its layers.
void decode_forward_new_kv(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  constexpr int kKvAddresses = 1024;
  constexpr size_t kAddressStep = 16; // TMA wants 16-byte aligned tensors
  harness::DeviceBuffer k, v;
  const size_t bytes = size_t(fp->p.seqlen_k) * fp->p.heads_kv * fp->p.head_dim_qk * 2;
  if (!k.allocate(bytes + kKvAddresses * kAddressStep) || !v.allocate(bytes + kKvAddresses * kAddressStep) ||
      !k.fill_bytes(0x3c) || !v.fill_bytes(0x3c)) {
    state.SkipWithError("K/V buffers");
    return;
  }
  Runtime runtime;
  AttentionProblem p = fp->p;
  p.k = k.get();
  p.v = v.get();
  harness::DeviceBuffer workspace;
  if (!plan_decode_step(state, runtime, &p, &workspace))
    return;
  int call = 0;
  const bool ran = host_time_loop(state, [&] {
    AttentionProblem q = p;
    const size_t offset = size_t(call++ % kKvAddresses) * kAddressStep;
    q.k = static_cast<const char *>(p.k) + offset;
    q.v = static_cast<const char *>(p.v) + offset;
    return runtime.forward(q);
  });
  if (ran)
    state.SetLabel(runtime_kernel(runtime, p));
}
BENCHMARK(decode_forward_new_kv)->Unit(benchmark::kMicrosecond)->UseManualTime()->Iterations(kHotBursts);

void prepare_disk_hit(benchmark::State &state) {
  Fixture *fp = gpu_fixture(state);
  if (!fp)
    return;
  Fixture &f = *fp;
  {
    Runtime warm; // fills the disk cache
    if (Status s = warm.prepare(f.p); !s) {
      state.SkipWithError(s.message.c_str());
      return;
    }
  }
  for (auto _ : state) {
    Runtime runtime; // empty memory cache
    if (Status s = runtime.prepare(f.p); !s) {
      state.SkipWithError(s.message.c_str());
      return;
    }
  }
}
BENCHMARK(prepare_disk_hit)->Unit(benchmark::kMillisecond)->Iterations(50);

void validate_and_spec(benchmark::State &state) {
  AttentionProblem p;
  p.seqlen_q = p.seqlen_k = 4096;
  p.heads_q = 32;
  p.heads_kv = 8;
  p.head_dim_qk = 128;
  p.q = p.k = p.v = p.o = reinterpret_cast<void *>(uintptr_t{1} << 40);
  for (auto _ : state) {
    NormalizedProblem n;
    Status s = validate_problem(&p, &n);
    KernelSpec spec = spec_for_problem(n, Arch{90, true});
    benchmark::DoNotOptimize(spec);
    benchmark::DoNotOptimize(s.code);
  }
}
BENCHMARK(validate_and_spec)->Unit(benchmark::kNanosecond);

} // namespace

BENCHMARK_MAIN();
