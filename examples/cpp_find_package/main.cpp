// Embedding flashjit through find_package(flashjit): the C++ API from an installed copy. Without a
// GPU it asks which kernel a model's shape needs and whether it is pre-generated; with a GPU and a
// current CUDA context, prepare() and forward() would run it (see README.md).
#include <flashjit/flashjit.hpp>

#include <cstdio>

int main() {
  constexpr int kHeadDim = 128;
  constexpr int kHeadsQ = 32;
  constexpr int kHeadsKv = 8;
  constexpr int kSeqlen = 4096;

  flashjit::Options options;
  options.jit = 0; // an engine that must not compile at run time
  flashjit::Runtime runtime(options);

  flashjit::AttentionProblem p; // pointers stay null: only the shape matters for is_served
  p.dtype = FLASHJIT_BF16;
  p.seqlen_q = p.seqlen_k = kSeqlen;
  p.heads_q = kHeadsQ;
  p.heads_kv = kHeadsKv;
  p.head_dim_qk = kHeadDim;
  p.causal = 1;

  bool served = false;
  std::string origin;
  if (flashjit::Status s = runtime.is_served(p, "sm90a", &served, &origin); !s) {
    std::fprintf(stderr, "is_served: %s\n", s.message.c_str());
    return 1;
  }
  std::printf("flashjit %s: d%d causal bf16 on sm90a is %s\n  %s\n", flashjit_version(), kHeadDim,
              served ? "pre-generated" : "not pre-generated", origin.c_str());
  return 0;
}
