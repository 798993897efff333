#include "runtime/log.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace flashjit {
namespace {

constexpr LogLevel kDefaultLevel = LogLevel::warn;
constexpr std::array kLevelNames = {std::string_view("off"), std::string_view("error"), std::string_view("warn"),
                                    std::string_view("info"), std::string_view("debug")};

LogLevel parse_level(const char *text) {
  if (text == nullptr) {
    return kDefaultLevel;
  }
  for (size_t i = 0; i < kLevelNames.size(); ++i) {
    if (kLevelNames[i] == text) {
      return static_cast<LogLevel>(i);
    }
  }
  // An unknown value must not silence errors: keep the default and say so once.
  std::fprintf(stderr, "[flashjit] warn: FLASHJIT_LOG=%s is not one of off|error|warn|info|debug; using warn\n", text);
  return kDefaultLevel;
}

struct Logger {
  std::mutex mutex;
  std::function<void(LogLevel, std::string_view)> sink;
};

Logger &logger() {
  // Leaked on purpose: destructors of other static objects may still log at exit.
  static Logger *instance = new Logger();
  return *instance;
}

} // namespace

std::string_view log_level_name(LogLevel level) {
  const auto index = static_cast<size_t>(level);
  return index < kLevelNames.size() ? kLevelNames[index] : std::string_view("?");
}

LogLevel log_level() {
  static const LogLevel level = parse_level(std::getenv("FLASHJIT_LOG"));
  return level;
}

void log(LogLevel level, std::string_view message) {
  if (level == LogLevel::off || level > log_level()) {
    return;
  }
  Logger &state = logger();
  std::lock_guard lock(state.mutex);
  if (state.sink) {
    state.sink(level, message);
    return;
  }
  // One fwrite per line, built first, so lines from other processes sharing stderr do not mix.
  std::string line = "[flashjit] ";
  line += log_level_name(level);
  line += ": ";
  line += message;
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
}

void set_log_sink(std::function<void(LogLevel, std::string_view)> sink) {
  Logger &state = logger();
  std::lock_guard lock(state.mutex);
  state.sink = std::move(sink);
}

} // namespace flashjit
