// flashjit C++ API: describe an attention problem, get a kernel specialized for exactly it.
//
//   flashjit::Runtime rt;                      // owns the kernel cache and options
//   flashjit::AttentionProblem p;              // pointers, shapes, strides, flags (see flashjit.h)
//   ...
//   if (auto s = rt.prepare(p); !s) { ... }    // compile + load ahead of time (e.g. before graph capture)
//   if (auto s = rt.forward(p, stream); !s) { std::cerr << s.message; }
//
// forward() allocates nothing, never synchronizes and reads no device memory on the host, so it
// can be captured in a CUDA graph once prepare() has run. All methods are thread-safe.
#pragma once

#include <flashjit/flashjit.h>

#include <memory>
#include <string>
#include <vector>

namespace flashjit {

using DType = flashjit_dtype;
using Backend = flashjit_backend;

struct AttentionProblem : flashjit_problem {
  AttentionProblem() : flashjit_problem{} { flashjit_problem_init(this); }
};

struct Options : flashjit_options {
  Options() : flashjit_options{} { flashjit_options_init(this); }
};

// Result of a call: a status code plus a message that names the offending parameter.
struct [[nodiscard]] Status {
  flashjit_status code = FLASHJIT_OK;
  std::string message;

  static Status success() { return {}; }
  static Status error(flashjit_status code, std::string message) { return {code, std::move(message)}; }
  bool ok() const { return code == FLASHJIT_OK; }
  explicit operator bool() const { return ok(); }
};

// What explain() reports about the kernel a problem maps to.
struct Explanation {
  std::string kernel;            // canonical spec name, e.g. prefill.fa2.sm90a.d80v80.bf16.causal...
  std::string variant;           // fa2 | fa3 | decode_splitk
  std::string preferred_variant; // what the planner wanted before any fallback
  std::string fallback_reason;   // empty when variant == preferred_variant
  std::string preference_reason; // why the planner prefers preferred_variant to the arch's usual first choice
                                 // (e.g. fa2 over fa3 on sm_90a where fa2 measured faster); empty if it does not
  std::string plan;              // tiles, stages, warps, grid
  std::string origin;            // memory | bundle | disk | jit | not loaded
  std::string backend;           // nvrtc | mlir
  int registers = -1;            // from ptxas, -1 when not compiled yet
  int spill_bytes = -1;
  int shared_bytes = -1;
  std::string text; // all of the above, for people
};

class Runtime {
public:
  explicit Runtime(const Options &options = Options());
  ~Runtime();
  Runtime(const Runtime &) = delete;
  Runtime &operator=(const Runtime &) = delete;

  Status prepare(const AttentionProblem &problem);
  Status forward(const AttentionProblem &problem, flashjit_stream stream = nullptr);
  Status explain(const AttentionProblem &problem, Explanation *out);

  // Workspace (see "Workspace: plan once, run many" in flashjit.h): bytes for this problem's shape,
  // and plan: a decode's schedule for its lengths, or the fa3 tail split's counters zeroed, in
  // problem.workspace.
  Status workspace_size(const AttentionProblem &problem, size_t *bytes);
  Status plan(const AttentionProblem &problem);

  // Merges partial attention states (ring / context-parallel attention). See flashjit.h.
  Status merge_states(const flashjit_merge_problem &problem, flashjit_stream stream = nullptr);

  /* Bundles */
  // See flashjit_register_bundle / flashjit_is_served in flashjit.h. `arch` "" means the current device;
  // `origin` (optional) receives where the kernel would come from: memory, bundle:<path>, disk, or why not.
  Status register_bundle(const std::string &path);
  Status is_served(const AttentionProblem &problem, const std::string &arch, bool *served,
                   std::string *origin = nullptr);

  /* Diagnostics (developers) */
  // Copies the `__device__` global `symbol` out of the module of the kernel that serves `problem`, after
  // the device's work so far (e.g. fj_fa3_timeline of a kernel built with FLASHJIT_FA3_TUNING=timeline=1;
  // `flashjit bench --timeline`).
  Status read_kernel_global(const AttentionProblem &problem, const std::string &symbol,
                            std::vector<unsigned char> *out);

  struct Impl;
  Impl &impl() { return *impl_; }

private:
  std::unique_ptr<Impl> impl_;
};

} // namespace flashjit
