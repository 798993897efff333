#include "runtime/launch.hpp"
#include "runtime/params.hpp"

namespace flashjit {

Status launch_fa2(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &,
                  CUstream stream) {
  const Plan &plan = kernel.choice.plan;
  fj_attention_params params = make_attention_params(problem);
  params.num_m_blocks = (problem.p.seqlen_q + plan.block_m - 1) / plan.block_m;
  void *args[] = {&params};
  const Dim3 grid{static_cast<unsigned>(params.num_m_blocks), static_cast<unsigned>(problem.p.heads_q),
                  static_cast<unsigned>(problem.p.batch)};
  return kernel.kernel.launch(grid, Dim3{static_cast<unsigned>(plan.threads)}, plan.smem_bytes, stream, args);
}

} // namespace flashjit
