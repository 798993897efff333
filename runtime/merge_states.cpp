// Runtime::merge_states: validation of a merge problem and the launch of the combine kernel.
#include "runtime/driver.hpp"
#include "runtime/kernel_store.hpp"
#include "runtime/problem.hpp"

#include "kernel_params.h"

#include <flashjit/flashjit.hpp>

#include <algorithm>
#include <string>

namespace flashjit {
namespace {

constexpr int kMaxHeadDimV = 256;
constexpr int kHeadDimGranule = 8;
constexpr uintptr_t kFloat4Bytes = 16; // the combine kernel reads partial O as float4
constexpr int kOutputElementBytes = 2; // fp16 / bf16

Status invalid(const std::string &message) {
  return Status::error(FLASHJIT_INVALID_ARGUMENT, message);
}

bool aligned(const void *ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

} // namespace

// Declared in flashjit.hpp; defined here to keep runtime.cpp about attention problems.
Status merge_states_impl(KernelStore &store, const flashjit_merge_problem &m, flashjit_stream stream) {
  if (m.struct_size < sizeof(flashjit_merge_problem))
    return invalid("merge.struct_size: expected sizeof(flashjit_merge_problem) (use flashjit_merge_problem_init)");
  if (m.dtype != FLASHJIT_FP16 && m.dtype != FLASHJIT_BF16)
    return invalid("merge.dtype = " + std::to_string(static_cast<int>(m.dtype)) + ": expected FP16 or BF16");
  if (m.num_states < 1)
    return invalid("merge.num_states = " + std::to_string(m.num_states) + ": expected >= 1");
  if (m.rows < 0)
    return invalid("merge.rows = " + std::to_string(m.rows) + ": expected >= 0");
  if (m.head_dim_v < kHeadDimGranule || m.head_dim_v > kMaxHeadDimV || m.head_dim_v % kHeadDimGranule != 0)
    return invalid("merge.head_dim_v = " + std::to_string(m.head_dim_v) + ": expected a multiple of 8 up to 256");
  if (!m.partial_o || !m.partial_lse || !m.o)
    return invalid("merge.partial_o/partial_lse/o: null pointer");
  const int64_t state_o = m.state_stride_o ? m.state_stride_o : int64_t(m.rows) * m.head_dim_v;
  const int64_t state_lse = m.state_stride_lse ? m.state_stride_lse : m.rows;
  const int64_t o_row = m.o_row_stride ? m.o_row_stride : m.head_dim_v;
  if (!aligned(m.partial_o, kFloat4Bytes) || state_o % 4 != 0)
    return invalid("merge.partial_o: expected 16-byte alignment and a state stride that is a multiple of 4");
  if (state_o < int64_t(m.rows) * m.head_dim_v || state_lse < m.rows)
    return invalid("merge.state_stride_o/state_stride_lse: states would overlap");
  if (!aligned(m.partial_lse, sizeof(float)) || (m.lse && !aligned(m.lse, sizeof(float))))
    return invalid("merge.partial_lse/lse: expected float alignment");
  if (!aligned(m.o, kOutputElementBytes) || o_row < m.head_dim_v)
    return invalid("merge.o / o_row_stride: expected 2-byte alignment and a row stride >= head_dim_v");
  auto too_large = [](const std::string &what) {
    return invalid(what + ": spans more than " + std::to_string(kMaxTensorBytes) +
                   " bytes; expected a tensor that fits in device memory");
  };
  if (!fits_in_device_memory(m.num_states, state_o, int64_t(m.rows) * m.head_dim_v, sizeof(float)))
    return too_large("merge.partial_o (num_states " + std::to_string(m.num_states) + " x state_stride_o " +
                     std::to_string(state_o) + ")");
  if (!fits_in_device_memory(m.num_states, state_lse, m.rows, sizeof(float)))
    return too_large("merge.partial_lse (num_states " + std::to_string(m.num_states) + " x state_stride_lse " +
                     std::to_string(state_lse) + ")");
  if (!fits_in_device_memory(std::max(m.rows, 1), o_row, m.head_dim_v, kOutputElementBytes))
    return too_large("merge.o (rows " + std::to_string(m.rows) + " x o_row_stride " + std::to_string(o_row) + ")");
  if (m.rows == 0)
    return Status::success();

  std::string error;
  const driver::Api *api = driver::api(&error);
  if (!api)
    return Status::error(FLASHJIT_DRIVER_ERROR, error);
  CUcontext context = nullptr;
  if (CUresult r = api->cuCtxGetCurrent(&context); r != CUDA_SUCCESS || !context)
    return Status::error(FLASHJIT_DRIVER_ERROR, "no current CUDA context on this thread");
  driver::DeviceInfo device;
  if (Status s = driver::current_device(&device); !s)
    return s;
  KernelSpec spec;
  spec.op = Op::combine;
  spec.arch = Arch::from_compute_capability(device.cc_major, device.cc_minor);
  spec.dtype = m.dtype;
  spec.head_dim_qk = spec.head_dim_v = m.head_dim_v;
  spec.align_bytes = aligned(m.o, 16) && o_row % 8 == 0 ? 16 : 2;
  std::shared_ptr<const KernelRecord> record;
  if (Status s = store.get(spec, context, &record); !s)
    return s;
  fj_combine_params params{};
  params.partial_o = m.partial_o;
  params.partial_lse = m.partial_lse;
  params.state_stride_o = state_o;
  params.state_stride_lse = state_lse;
  params.o = m.o;
  params.o_row_stride = o_row;
  params.maybe_lse = m.lse;
  params.num_states = m.num_states;
  params.rows = m.rows;
  params.head_dim_v = m.head_dim_v;
  const Plan &plan = record->choice.plan;
  void *args[] = {&params};
  const unsigned grid = static_cast<unsigned>(device.sm_count * plan.constant("kCombineGridPerSm", 1));
  return record->kernel.launch(Dim3{grid}, Dim3{static_cast<unsigned>(plan.threads)}, 0,
                               reinterpret_cast<CUstream>(stream), args);
}

} // namespace flashjit
