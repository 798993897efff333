// Library-wide logging: one line per event, to stderr unless a test installs a sink.
//
// The level comes from FLASHJIT_LOG (off | error | warn | info | debug), read once; the default is
// warn, so a normal run prints nothing unless something degraded (e.g. the disk cache is unusable).
#pragma once

#include <functional>
#include <string_view>

namespace flashjit {

enum class LogLevel { off, error, warn, info, debug };

// The threshold from FLASHJIT_LOG; messages above it are dropped.
LogLevel log_level();

// Writes "[flashjit] <level>: <message>" to stderr (or the sink). Thread-safe; lines never interleave.
void log(LogLevel level, std::string_view message);

// Routes every message that passes the threshold to `sink` instead of stderr (tests use this to
// count warnings). nullptr restores stderr. The sink runs under the logger's lock: it must not
// call log() itself.
void set_log_sink(std::function<void(LogLevel, std::string_view)> sink);

// "error", "warn", ... as used in the prefix and in FLASHJIT_LOG.
std::string_view log_level_name(LogLevel level);

} // namespace flashjit
