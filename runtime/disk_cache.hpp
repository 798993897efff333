// The on-disk cubin cache: one self-checking file per compiled kernel.
//
// Layout: <root>/v1/<name>.<key_hex>.fjc, where <name> is the readable kernel name (so `ls` tells
// what is cached) and <key_hex> the cache key (the identity). Each file is a fixed header (magic,
// format version, key length, payload lengths, xxh64 of key + payload), the key, the cubin, and
// the metadata JSON.
//
// Safe under concurrency without locks: a writer fills a private temp file in the same folder,
// fsyncs it and rename()s it into place, so a reader sees either the old file, the new one, or
// none, never a torn one; two writers of one key both succeed and one whole entry remains.
//
// Never an error: a missing, corrupt or truncated entry is a miss (a corrupt one is logged and
// removed); a root that cannot be created or written makes the cache unusable (one warning) and
// every call a miss or a no-op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace flashjit {

struct CacheEntry {
  std::vector<char> cubin;
  std::string metadata; // JSON text
};

class DiskCache {
public:
  explicit DiskCache(std::filesystem::path root);

  // FLASHJIT_CACHE_DIR, else $XDG_CACHE_HOME/flashjit, else $HOME/.cache/flashjit. Empty when none
  // of them is set (the cache is then unusable).
  static std::filesystem::path default_root();

  bool usable() const { return usable_; }
  const std::filesystem::path &root() const { return root_; }
  // Where the entry (key_hex, name) lives, whether or not it exists.
  std::filesystem::path entry_path(const std::string &key_hex, const std::string &name) const;

  std::optional<CacheEntry> load(const std::string &key_hex, const std::string &name);
  bool store(const std::string &key_hex, const std::string &name, const CacheEntry &entry);

  struct Stats {
    size_t entries = 0;
    uint64_t bytes = 0;
  };
  Stats stats() const;
  // Removes every entry (and temp files that crashed writers left behind); returns how many
  // entries it removed.
  size_t clear();

private:
  std::filesystem::path root_;
  std::filesystem::path dir_; // root_/v1
  bool usable_ = false;
};

} // namespace flashjit
