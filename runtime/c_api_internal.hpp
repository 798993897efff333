// Shared by the C ABI's translation units: the handle behind flashjit_runtime, the per-thread
// message channel, and the guard that keeps every C++ exception on this side of the ABI.
#pragma once

#include <flashjit/flashjit.h>
#include <flashjit/flashjit.hpp>

#include <exception>
#include <new>
#include <string>

struct flashjit_runtime_s {
  flashjit::Runtime runtime;
  explicit flashjit_runtime_s(const flashjit::Options &options) : runtime(options) {}
};

namespace flashjit::c_api {

// Stores the message flashjit_last_error() returns on this thread ("" on success).
flashjit_status record(const Status &status);

inline flashjit_status fail(flashjit_status code, const std::string &message) {
  return record(Status::error(code, message));
}

// Runs `body` and turns any C++ exception into a status, so none crosses the ABI.
template <typename Body> flashjit_status guarded(Body &&body) {
  try {
    return body();
  } catch (const std::bad_alloc &) {
    return fail(FLASHJIT_INTERNAL, "out of host memory");
  } catch (const std::exception &e) {
    return fail(FLASHJIT_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(FLASHJIT_INTERNAL, "internal error: unknown exception");
  }
}

} // namespace flashjit::c_api
