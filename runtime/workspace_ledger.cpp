#include "runtime/workspace_ledger.hpp"

namespace flashjit {

void WorkspaceLedger::set_schedule(const void *workspace, const DecodeSchedule &schedule) {
  std::lock_guard lock(mutex_);
  entries_[workspace] = Entry{schedule, 0};
}

std::optional<DecodeSchedule> WorkspaceLedger::schedule(const void *workspace) const {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(workspace);
  return it == entries_.end() ? std::nullopt : it->second.schedule;
}

bool WorkspaceLedger::tail_counters_zero(const void *workspace, size_t bytes, bool rezero) {
  std::lock_guard lock(mutex_);
  Entry &entry = entries_[workspace];
  if (!rezero && !entry.schedule && entry.zero_counter_bytes >= bytes)
    return true;
  entry = Entry{std::nullopt, bytes};
  return false;
}

void WorkspaceLedger::forget(const void *workspace) {
  std::lock_guard lock(mutex_);
  entries_.erase(workspace);
}

} // namespace flashjit
