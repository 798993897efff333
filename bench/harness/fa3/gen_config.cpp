// Prints the generated translation unit (KernelConfig + #include) for one fa3 spec, using the
// real planner (compiler/plans/fa3_plan.cpp) and generator (compiler/codegen.cpp).
// usage: gen_config dqk dv bf16(0/1) causal local softcap varlen [block_n pingpong exp2_poly wgs separate_o
//        rescale_before_pv cluster_m lazy_rescale]  (tuning knobs of compiler/plans/fa3_plan.hpp; 0 / -1 = the planner's)
#include "compiler/codegen.hpp"
#include "compiler/planner.hpp"
#include "compiler/plans/fa3_plan.hpp"
#include <cstdio>
#include <cstdlib>
using namespace flashjit;
int main(int argc, char **argv) {
  if (argc < 8) return 2;
  KernelSpec s;
  s.head_dim_qk = atoi(argv[1]); s.head_dim_v = atoi(argv[2]);
  s.dtype = atoi(argv[3]) ? FLASHJIT_BF16 : FLASHJIT_FP16;
  s.causal = atoi(argv[4]); s.local = atoi(argv[5]); s.softcap = atoi(argv[6]); s.varlen = atoi(argv[7]);
  Plan p; std::string why;
  Fa3Tuning tu;
  if (argc > 8) tu.block_n = atoi(argv[8]);
  if (argc > 9) tu.pingpong = atoi(argv[9]);
  if (argc > 10) tu.exp2_poly_every = atoi(argv[10]);
  if (argc > 11) tu.consumer_warpgroups = atoi(argv[11]);
  if (argc > 12) tu.separate_o = atoi(argv[12]);
  if (argc > 13) tu.rescale_before_pv = atoi(argv[13]);
  if (argc > 14) tu.cluster_m = atoi(argv[14]);
  if (argc > 15) tu.lazy_rescale = atoi(argv[15]);
  if (!plan_fa3_tuned(s, tu, &p, &why)) { fprintf(stderr, "refused: %s\n", why.c_str()); return 1; }
  printf("%s", render_source(s, p).c_str());
  fprintf(stderr, "%s threads=%d smem=%d N=%d pingpong=%d cluster=%d\n", kernel_name(s, p).c_str(), p.threads, p.smem_bytes, p.block_n, p.pingpong, p.cluster_m);
}
