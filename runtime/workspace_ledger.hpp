// What flashjit has left in each caller workspace it used: a decode schedule (flashjit_plan) or the
// fa3 tail split's arrival counters. The tail split's kernel leaves its counters at zero (the CTA
// that completes a count resets it), so they are zeroed once per workspace, not per launch; a
// decode plan writes over them and a tail split over a decode schedule, so each use forgets the
// other's.
#pragma once

#include "runtime/decode.hpp"

#include <mutex>
#include <optional>
#include <unordered_map>

namespace flashjit {

class WorkspaceLedger {
public:
  void set_schedule(const void *workspace, const DecodeSchedule &schedule);
  std::optional<DecodeSchedule> schedule(const void *workspace) const;

  // True when the first `bytes` of `workspace` are tail-split counters left at zero. Otherwise
  // records them as such (the caller zeroes them before its launch, on the same stream) and
  // forgets any decode schedule there. `rezero` (flashjit_plan: the memory may have been written
  // since) records them and returns false whatever was known.
  bool tail_counters_zero(const void *workspace, size_t bytes, bool rezero = false);
  // Nothing known about `workspace` (the zeroing that tail_counters_zero asked for failed).
  void forget(const void *workspace);

private:
  struct Entry {
    std::optional<DecodeSchedule> schedule;
    size_t zero_counter_bytes = 0;
  };
  mutable std::mutex mutex_;
  std::unordered_map<const void *, Entry> entries_;
};

} // namespace flashjit
