#include "runtime/launch.hpp"
#include "runtime/params.hpp"

namespace flashjit {

Fa2Launch fa2_launch(const KernelRecord &kernel, const NormalizedProblem &problem) {
  const Plan &plan = kernel.choice.plan;
  Fa2Launch l;
  l.params = make_attention_params(problem);
  l.params.num_m_blocks = (problem.p.seqlen_q + plan.block_m - 1) / plan.block_m;
  l.grid = Dim3{static_cast<unsigned>(l.params.num_m_blocks), static_cast<unsigned>(problem.p.heads_q),
                static_cast<unsigned>(problem.p.batch)};
  l.block = Dim3{static_cast<unsigned>(plan.threads)};
  l.smem_bytes = plan.smem_bytes;
  return l;
}

Status launch_fa2(const KernelRecord &kernel, const NormalizedProblem &problem, const LaunchContext &,
                  CUstream stream) {
  Fa2Launch l = fa2_launch(kernel, problem);
  void *args[] = {&l.params};
  return kernel.kernel.launch(l.grid, l.block, l.smem_bytes, stream, args);
}

} // namespace flashjit
