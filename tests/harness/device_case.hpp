// One attention problem on the GPU, end to end: random inputs (never zeros), NaN-poisoned outputs,
// a launch through the public API, every element compared with the float64 reference. Used by
// `flashjit check`/`bench` and by tests/gpu. Talks to the GPU through flashjit's own driver table.
#pragma once

#include "tests/reference/fa3_numerics.hpp"
#include "tests/reference/reference.hpp"

#include <flashjit/flashjit.hpp>

#include <cuda.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace flashjit::harness {

// Makes device `ordinal`'s primary context current for the calling thread (released on destruction).
class DeviceSession {
public:
  DeviceSession() = default;
  ~DeviceSession();
  DeviceSession(const DeviceSession &) = delete;
  DeviceSession &operator=(const DeviceSession &) = delete;
  Status open(int ordinal = 0);
  bool open_ok() const { return context_ != nullptr; }
  std::string name() const { return name_; }

private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  std::string name_;
};

// Owns a device allocation.
class DeviceBuffer {
public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer &&other) noexcept;
  DeviceBuffer &operator=(DeviceBuffer &&other) noexcept;
  Status allocate(size_t bytes);
  Status upload(const void *host, size_t bytes);
  Status upload_at(size_t offset, const void *host, size_t bytes); // into [offset, offset + bytes)
  Status download(void *host, size_t bytes) const;
  Status fill_bytes(unsigned char value);
  void *get() const { return reinterpret_cast<void *>(ptr_); }
  size_t size() const { return bytes_; }

private:
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

struct CaseOptions {
  ref::Problem problem; // shapes, lengths (one per sequence), mask, softcap, scale
  ref::Dtype dtype = ref::Dtype::bf16;
  bool varlen = false;           // packed rows through cu_seqlens; else batch mode (equal lengths)
  int page_size = 0;             // > 0: K/V through a shuffled block table
  bool page_garbage_nan = false; // paged: the cache's unused slots hold NaN (else large finite values)
  size_t page_gap_bytes = 0;     // paged, pages [num_pages, page, heads, dim]: bytes left unwritten between pages
                                 // (a multiple of 16; past 2^31 bytes a page stride needs 64-bit addressing)
  int row_padding = 0;           // extra elements between tokens (non-contiguous strides; odd -> unaligned path)
  bool head_major = false;       // Q, K, V, O stored [batch, heads, tokens, dim] (PyTorch's layout; batch mode),
                                 // pages [num_pages, heads, page, dim]
  bool with_lse = true;
  bool with_workspace = false;    // allocate flashjit_workspace_size bytes and plan (split-K decode, fa3 tail split)
  size_t workspace_shortfall = 0; // tests: allocate this many bytes less than asked for
  bool graph_capture = false;     // prepare, capture forward() into a CUDA graph on a new stream, replay it
  int forwards = 1;       // forward() calls on the same workspace, with O and LSE poisoned again before each: the
                          // last is checked (a kernel must leave its workspace counters as it found them)
  bool fa3_model = false; // an fa3 kernel (no softcap): also check the CPU model of its arithmetic (fa3_numerics)
  uint64_t seed = 1;
  // Overwrites (parts of) the random inputs before they are rounded to the dtype and uploaded, for a
  // constructed case (reference layouts: Q [total_q, heads_q, dqk], K/V [total_k, heads_kv, d]).
  std::function<void(std::vector<float> &q, std::vector<float> &k, std::vector<float> &v)> shape_inputs;
};

// The problem's shapes, mask, scale and every stride (elements) as `run_case` gives them for
// `options`, without data: the pointers, lengths and tables are left to the caller.
void describe_problem(const CaseOptions &options, AttentionProblem *p);

struct CaseResult {
  Status status; // launch status (the check is meaningful only when ok)
  ref::CheckResult o;
  ref::CheckResult lse;
  std::string kernel;          // explain().kernel
  std::vector<float> o_values; // the output as computed, [total_q, heads_q, head_dim_v]
  ref::CheckResult model;      // fa3_model: the model's O against the same references (count 0: not run)
  bool pass() const { return status.ok() && o.pass && (lse.count == 0 || lse.pass); }
  std::string summary() const;
};

// The arithmetic of an fa3 kernel, read from its name (`.m<M>n<N>s<S>`: the key block; `.lz` / `.lzt`:
// lazy rescaling, with the top rounding), for the CPU model; nothing for other kernels.
std::optional<ref::Fa3Numerics> fa3_numerics_of_kernel(std::string_view kernel);

// Runs and checks one case. `runtime` must belong to the current context's thread.
CaseResult run_case(Runtime &runtime, const CaseOptions &options);

struct BenchResult {
  Status status;
  double median_ms = 0;
  double tflops = 0; // 4 * sum(sq * sk) * heads * d (halved for causal)
  std::string kernel;
  std::vector<unsigned char> global; // the kernel's global `read_global` after the last launch
};

// The fa3 timeline's module global (templates/kernels/fa3/timeline.cuh), a `read_global` of bench_case.
constexpr const char *kFa3TimelineSymbol = "fj_fa3_timeline";

// Times `forward` with driver events (warm-up, then the median of `iterations`), rotating among
// enough input copies that L2 does not serve them. Inputs are random, never zeros. `read_global`
// (optional): a `__device__` global of the kernel to copy out after the last launch (a diagnostic).
BenchResult bench_case(Runtime &runtime, const CaseOptions &options, int iterations,
                       const std::string &read_global = "");

// FLOPs by the usual convention: sum over sequences of 2 * sq * sk * heads * (dqk + dv), halved for causal.
double attention_flops(const ref::Problem &problem);

} // namespace flashjit::harness
