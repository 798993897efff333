// Sets (or, with nullptr, unsets) one environment variable for a scope and restores it after: for
// tests of what the library reads from the environment (FLASHJIT_FA3_TUNING, cache directories).
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace flashjit::testing {

class ScopedEnv {
public:
  ScopedEnv(const char *name, const char *value) : name_(name) {
    if (const char *old = std::getenv(name))
      old_ = old;
    value != nullptr ? setenv(name, value, 1) : unsetenv(name);
  }
  ~ScopedEnv() { old_ ? setenv(name_, old_->c_str(), 1) : unsetenv(name_); }
  ScopedEnv(const ScopedEnv &) = delete;
  ScopedEnv &operator=(const ScopedEnv &) = delete;

private:
  const char *name_;
  std::optional<std::string> old_;
};

} // namespace flashjit::testing
