// The C ABI's bundle calls (see "Bundles" in flashjit.h), over flashjit::Runtime. Same rules as
// c_api.cpp: a status code, the message for flashjit_last_error(), no exception crossing the ABI.
#include "runtime/c_api_internal.hpp"

namespace {

using flashjit::c_api::guarded;

flashjit_status report(const flashjit::Status &status) {
  return flashjit::c_api::record(status);
}

} // namespace

extern "C" {

flashjit_status flashjit_register_bundle(flashjit_runtime runtime, const char *path) {
  return guarded([&] {
    if (!runtime)
      return report(flashjit::Status::error(FLASHJIT_INVALID_ARGUMENT, "runtime: null handle"));
    if (!path || !*path)
      return report(flashjit::Status::error(FLASHJIT_INVALID_ARGUMENT, "path: null or empty"));
    return report(runtime->runtime.register_bundle(path));
  });
}

flashjit_status flashjit_is_served(flashjit_runtime runtime, const flashjit_problem *problem, const char *arch,
                                   int *served) {
  return guarded([&] {
    if (!runtime)
      return report(flashjit::Status::error(FLASHJIT_INVALID_ARGUMENT, "runtime: null handle"));
    if (!problem)
      return report(flashjit::Status::error(FLASHJIT_INVALID_ARGUMENT, "problem: null pointer"));
    if (!served)
      return report(flashjit::Status::error(FLASHJIT_INVALID_ARGUMENT, "served: null pointer"));
    *served = 0;
    bool found = false;
    // AttentionProblem adds no members to flashjit_problem.
    const auto &p = *static_cast<const flashjit::AttentionProblem *>(problem);
    flashjit::Status s = runtime->runtime.is_served(p, arch ? arch : "", &found);
    if (s)
      *served = found ? 1 : 0;
    return report(s);
  });
}

} // extern "C"
