// Deployment: serve a model's attention from a pre-generated bundle, with JIT off.
//
//   flashjit aot --specs model_shapes.json --bundle model.fjb     # once, offline, no GPU
//   FLASHJIT_JIT=off ./flashjit_example_deploy model.fjb          # at start-up
//
// At start-up the engine registers the bundle and checks that every shape it will serve is covered,
// so a missing kernel is an error now rather than a compile (or a failure) in the middle of serving.
// Without a GPU the check names the arch; with a GPU and a current context, prepare() then loads
// each kernel from the bundle and forward() runs it; nothing is compiled (NVRTC is never loaded).
#include <flashjit/flashjit.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr int kHeadDim = 64;
constexpr int kHeadsQ = 16;
constexpr int kHeadsKv = 4;
constexpr int kPrefillTokens = 2048;
constexpr int kContextTokens = 8192;
constexpr int kDecodeBatch = 32;
constexpr const char *kArch = "sm90a";

struct Shape {
  const char *what;
  flashjit::AttentionProblem problem;
};

std::vector<Shape> model_shapes() {
  flashjit::AttentionProblem base;
  base.dtype = FLASHJIT_BF16;
  base.heads_q = kHeadsQ;
  base.heads_kv = kHeadsKv;
  base.head_dim_qk = kHeadDim;
  Shape prefill{"prefill", base};
  prefill.problem.seqlen_q = prefill.problem.seqlen_k = kPrefillTokens;
  prefill.problem.causal = 1;
  Shape decode{"decode", base};
  decode.problem.batch = kDecodeBatch;
  decode.problem.seqlen_q = 1;
  decode.problem.seqlen_k = kContextTokens;
  decode.problem.causal = 1;
  return {prefill, decode};
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s BUNDLE (a .fjb file or a bundle directory)\n", argv[0]);
    return 2;
  }
  flashjit::Options options;
  options.jit = 0;
  flashjit::Runtime runtime(options);
  if (flashjit::Status s = runtime.register_bundle(argv[1]); !s) {
    std::fprintf(stderr, "%s\n", s.message.c_str());
    return 1;
  }
  int missing = 0;
  for (const Shape &shape : model_shapes()) {
    bool served = false;
    std::string origin;
    if (flashjit::Status s = runtime.is_served(shape.problem, kArch, &served, &origin); !s) {
      std::fprintf(stderr, "%s: %s\n", shape.what, s.message.c_str());
      return 1;
    }
    std::printf("%-8s %s: %s\n", shape.what, served ? "served" : "MISSING", origin.c_str());
    missing += served ? 0 : 1;
  }
  if (missing) {
    std::fprintf(stderr, "%d shape(s) are not in the bundle; add them to the spec list and rerun flashjit aot\n",
                 missing);
    return 1;
  }
  std::printf("every shape is served from the bundle on %s without a compiler\n", kArch);
  return 0;
}
