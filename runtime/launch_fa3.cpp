#include "runtime/driver.hpp"
#include "runtime/launch.hpp"
#include "runtime/params.hpp"
#include "runtime/tma_desc.hpp"

#include "params_fa3.h"

namespace flashjit {

Status launch_fa3(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &ctx,
                  CUstream stream) {
  const KernelSpec &spec = kernel.choice.spec;
  const Plan &plan = kernel.choice.plan;
  fj_fa3_params params{};
  params.base = make_attention_params(problem);
  const int total_k = problem.varlen ? problem.p.total_k : problem.p.batch * problem.p.seqlen_k;
  std::string why_not;
  if (!fa3_encode_tensor_maps(spec, plan, total_k, driver::api()->cuTensorMapEncodeTiled, &params, &why_not))
    return Status::error(FLASHJIT_INVALID_ARGUMENT, kernel.name + ": TMA cannot address this layout: " + why_not);
  const int grid = fa3_fill_schedule(spec, plan, ctx.sm_count, ctx.l2_bytes, &params);
  void *args[] = {&params};
  return kernel.kernel.launch(Dim3{static_cast<unsigned>(grid)}, Dim3{static_cast<unsigned>(plan.threads)},
                              plan.smem_bytes, stream, args);
}

} // namespace flashjit
