/* Embedding flashjit from C: only <flashjit/flashjit.h>. Without a GPU it checks which shapes a
 * bundle serves (pass the bundle as argv[1]); with a GPU and a current context the same runtime
 * would run them through flashjit_prepare / flashjit_forward. */
#include <flashjit/flashjit.h>

#include <stdio.h>

int main(int argc, char **argv) {
  enum { kHeadDim = 64, kHeads = 16, kSeqlen = 2048 };
  flashjit_options options;
  flashjit_runtime runtime = NULL;
  flashjit_problem problem;
  flashjit_status status;
  int served = 0;

  flashjit_options_init(&options);
  options.jit = 0; /* serve only pre-generated kernels */
  if (flashjit_runtime_create(&options, &runtime) != FLASHJIT_OK) {
    fprintf(stderr, "runtime: %s\n", flashjit_last_error());
    return 1;
  }

  /* A missing bundle is refused with a status, not a crash. */
  status = flashjit_register_bundle(runtime, "/nonexistent/bundle.fjb");
  printf("register /nonexistent/bundle.fjb: %s %s\n", flashjit_status_name(status), flashjit_last_error());
  if (status == FLASHJIT_OK)
    return 1;
  if (argc > 1 && flashjit_register_bundle(runtime, argv[1]) != FLASHJIT_OK) {
    fprintf(stderr, "register %s: %s\n", argv[1], flashjit_last_error());
    return 1;
  }

  flashjit_problem_init(&problem);
  problem.dtype = FLASHJIT_FP16;
  problem.seqlen_q = problem.seqlen_k = kSeqlen;
  problem.heads_q = problem.heads_kv = kHeads;
  problem.head_dim_qk = kHeadDim;
  problem.causal = 1;
  status = flashjit_is_served(runtime, &problem, "sm90a", &served);
  if (status != FLASHJIT_OK) {
    fprintf(stderr, "is_served: %s: %s\n", flashjit_status_name(status), flashjit_last_error());
    return 1;
  }
  printf("flashjit %s: fp16 d%d causal on sm90a: %s\n", flashjit_version(), kHeadDim,
         served ? "served from a bundle or cache" : "not pre-generated (JIT is off)");
  flashjit_runtime_destroy(runtime);
  return 0;
}
