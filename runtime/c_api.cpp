// The C ABI over flashjit::Runtime: status codes and a per-thread message; no exception escapes.
#include "runtime/c_api_internal.hpp"
#include "runtime/kernel_store.hpp"

#include <algorithm>
#include <cstring>

namespace {

thread_local std::string last_error;

using flashjit::c_api::fail;
using flashjit::c_api::guarded;
using flashjit::c_api::record;

const flashjit::AttentionProblem &as_problem(const flashjit_problem *problem) {
  // AttentionProblem adds no members to flashjit_problem.
  return *static_cast<const flashjit::AttentionProblem *>(problem);
}

} // namespace

namespace flashjit::c_api {

flashjit_status record(const Status &status) {
  last_error = status.ok() ? std::string() : status.message;
  return status.code;
}

} // namespace flashjit::c_api

extern "C" {

void flashjit_problem_init(flashjit_problem *problem) {
  if (!problem)
    return;
  std::memset(problem, 0, sizeof(*problem));
  problem->struct_size = sizeof(flashjit_problem);
  problem->dtype = FLASHJIT_BF16;
  problem->batch = 1;
  problem->window_left = -1;
  problem->window_right = -1;
}

void flashjit_options_init(flashjit_options *options) {
  if (!options)
    return;
  std::memset(options, 0, sizeof(*options));
  options->struct_size = sizeof(flashjit_options);
  options->backend = FLASHJIT_BACKEND_AUTO;
  options->disk_cache = 1;
  options->jit = 1;
  options->strict = 0;
  options->variant = FLASHJIT_VARIANT_AUTO;
}

const char *flashjit_last_error(void) {
  return last_error.c_str();
}

const char *flashjit_status_name(flashjit_status status) {
  switch (status) {
  case FLASHJIT_OK: return "FLASHJIT_OK";
  case FLASHJIT_INVALID_ARGUMENT: return "FLASHJIT_INVALID_ARGUMENT";
  case FLASHJIT_UNSUPPORTED: return "FLASHJIT_UNSUPPORTED";
  case FLASHJIT_COMPILE_ERROR: return "FLASHJIT_COMPILE_ERROR";
  case FLASHJIT_DRIVER_ERROR: return "FLASHJIT_DRIVER_ERROR";
  case FLASHJIT_NOT_IN_BUNDLE: return "FLASHJIT_NOT_IN_BUNDLE";
  case FLASHJIT_OUT_OF_RESOURCES: return "FLASHJIT_OUT_OF_RESOURCES";
  case FLASHJIT_FALLBACK_FORBIDDEN: return "FLASHJIT_FALLBACK_FORBIDDEN";
  case FLASHJIT_INTERNAL: return "FLASHJIT_INTERNAL";
  }
  return "FLASHJIT_UNKNOWN_STATUS";
}

const char *flashjit_version(void) {
  return FLASHJIT_VERSION_STRING;
}

flashjit_status flashjit_runtime_create(const flashjit_options *options, flashjit_runtime *out) {
  return guarded([&] {
    if (!out)
      return fail(FLASHJIT_INVALID_ARGUMENT, "out: null pointer");
    *out = nullptr;
    flashjit::Options resolved;
    if (options) {
      if (options->struct_size < sizeof(flashjit_options))
        return fail(FLASHJIT_INVALID_ARGUMENT, "options.struct_size: expected sizeof(flashjit_options) "
                                               "(initialise with flashjit_options_init)");
      static_cast<flashjit_options &>(resolved) = *options;
      if (const std::string why = flashjit::options_error(resolved); !why.empty())
        return fail(FLASHJIT_INVALID_ARGUMENT, why);
    }
    *out = new flashjit_runtime_s(resolved);
    return record(flashjit::Status::success());
  });
}

void flashjit_runtime_destroy(flashjit_runtime runtime) {
  delete runtime;
}

flashjit_status flashjit_prepare(flashjit_runtime runtime, const flashjit_problem *problem) {
  return guarded([&] {
    if (!runtime)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime: null handle");
    if (!problem)
      return fail(FLASHJIT_INVALID_ARGUMENT, "problem: null pointer");
    return record(runtime->runtime.prepare(as_problem(problem)));
  });
}

flashjit_status flashjit_forward(flashjit_runtime runtime, const flashjit_problem *problem, flashjit_stream stream) {
  return guarded([&] {
    if (!runtime)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime: null handle");
    if (!problem)
      return fail(FLASHJIT_INVALID_ARGUMENT, "problem: null pointer");
    return record(runtime->runtime.forward(as_problem(problem), stream));
  });
}

flashjit_status flashjit_workspace_size(flashjit_runtime runtime, const flashjit_problem *problem, size_t *bytes) {
  return guarded([&] {
    if (!runtime || !problem || !bytes)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime/problem/bytes: null");
    return record(runtime->runtime.workspace_size(as_problem(problem), bytes));
  });
}

flashjit_status flashjit_plan(flashjit_runtime runtime, const flashjit_problem *problem) {
  return guarded([&] {
    if (!runtime || !problem)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime/problem: null");
    return record(runtime->runtime.plan(as_problem(problem)));
  });
}

void flashjit_merge_problem_init(flashjit_merge_problem *problem) {
  if (!problem)
    return;
  std::memset(problem, 0, sizeof(*problem));
  problem->struct_size = sizeof(flashjit_merge_problem);
  problem->dtype = FLASHJIT_BF16;
}

flashjit_status flashjit_merge_states(flashjit_runtime runtime, const flashjit_merge_problem *problem,
                                      flashjit_stream stream) {
  return guarded([&] {
    if (!runtime || !problem)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime/problem: null");
    return record(runtime->runtime.merge_states(*problem, stream));
  });
}

flashjit_status flashjit_explain(flashjit_runtime runtime, const flashjit_problem *problem, char *buffer,
                                 size_t capacity, size_t *length) {
  return guarded([&] {
    if (!runtime)
      return fail(FLASHJIT_INVALID_ARGUMENT, "runtime: null handle");
    if (!problem)
      return fail(FLASHJIT_INVALID_ARGUMENT, "problem: null pointer");
    flashjit::Explanation explanation;
    if (flashjit::Status s = runtime->runtime.explain(as_problem(problem), &explanation); !s)
      return record(s);
    if (length)
      *length = explanation.text.size();
    if (buffer && capacity > 0) {
      const size_t n = std::min(capacity - 1, explanation.text.size());
      std::memcpy(buffer, explanation.text.data(), n);
      buffer[n] = '\0';
    }
    return record(flashjit::Status::success());
  });
}

} // extern "C"
