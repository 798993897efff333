#include "runtime/disk_cache.hpp"

#include "runtime/log.hpp"

#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <thread>

namespace flashjit {
namespace fs = std::filesystem;
namespace {

// Bumping the format changes the folder (v1 -> v2), so old and new libraries never read each
// other's files.
constexpr const char *kFormatDir = "v1";
constexpr uint32_t kFormatVersion = 1;
constexpr std::array<char, 8> kMagic = {'F', 'J', 'C', 'A', 'C', 'H', 'E', '\0'};
constexpr const char *kEntrySuffix = ".fjc";
constexpr const char *kTempPrefix = ".tmp.";
constexpr uint64_t kChecksumSeed = 0;

// Header: magic, version (u32), key length (u32), cubin length (u64), metadata length (u64),
// checksum (u64); all little-endian.
constexpr size_t kVersionOffset = sizeof(kMagic);
constexpr size_t kKeyLengthOffset = kVersionOffset + sizeof(uint32_t);
constexpr size_t kCubinLengthOffset = kKeyLengthOffset + sizeof(uint32_t);
constexpr size_t kMetadataLengthOffset = kCubinLengthOffset + sizeof(uint64_t);
constexpr size_t kChecksumOffset = kMetadataLengthOffset + sizeof(uint64_t);
constexpr size_t kHeaderBytes = kChecksumOffset + sizeof(uint64_t);

// Keys are hex digests; the cap keeps file names under NAME_MAX (255) with the name part.
constexpr size_t kMaxKeyChars = 128;
constexpr size_t kMaxNameChars = 96;
// Temp files older than this belong to a writer that died; clear() removes them.
constexpr auto kStaleTempAge = std::chrono::hours(1);
constexpr mode_t kFileMode = 0644;
// Far above any cubin; a larger file is not ours and is not read into memory.
constexpr uint64_t kMaxEntryBytes = uint64_t{1} << 30;

void put_le(std::vector<char> &out, size_t offset, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) {
    out[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
  }
}

uint64_t get_le(const std::vector<char> &in, size_t offset, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[offset + i])) << (8 * i);
  }
  return value;
}

bool valid_key(const std::string &key_hex) {
  if (key_hex.empty() || key_hex.size() > kMaxKeyChars) {
    return false;
  }
  for (char c : key_hex) {
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) {
      return false;
    }
  }
  return true;
}

// The readable part of a file name: anything outside [A-Za-z0-9._-] becomes '_' (no '/' or
// leading-dot surprises), cut to a length that keeps the whole name legal.
std::string file_safe(const std::string &name) {
  std::string out;
  for (char c : name.substr(0, kMaxNameChars)) {
    const bool plain =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '.' || c == '_' || c == '-';
    out += plain ? c : '_';
  }
  if (out.empty() || out[0] == '.') {
    out.insert(out.begin(), 'k'); // dot-files are temp files
  }
  return out;
}

bool is_entry(const fs::path &path) {
  const std::string file = path.filename().string();
  return path.extension() == kEntrySuffix && !file.starts_with(kTempPrefix);
}

bool is_temp(const fs::path &path) {
  return path.filename().string().starts_with(kTempPrefix);
}

// Warn once per process for each root, however many DiskCache objects name it.
void warn_unusable_once(const fs::path &root, const std::string &why) {
  static std::mutex mutex;
  static auto *warned = new std::set<std::string>();
  {
    std::lock_guard lock(mutex);
    if (!warned->insert(root.string()).second) {
      return;
    }
  }
  log(LogLevel::warn, "disk cache disabled: " + why +
                          "; compiled kernels are kept in memory only (set "
                          "FLASHJIT_CACHE_DIR to a writable folder, or FLASHJIT_CACHE=off to silence this)");
}

std::string errno_text(int error) {
  return std::strerror(error);
}

// A name no other writer (thread, process, or host sharing the folder) will pick.
std::string temp_name(const std::string &key_hex) {
  thread_local std::mt19937_64 random(std::random_device{}() ^
                                      std::hash<std::thread::id>{}(std::this_thread::get_id()));
  constexpr size_t kKeyPrefixChars = 16;
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), ".%ld.%016llx", static_cast<long>(getpid()),
                static_cast<unsigned long long>(random()));
  return kTempPrefix + key_hex.substr(0, kKeyPrefixChars) + suffix;
}

bool write_all(int fd, const char *data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    data += written;
    size -= static_cast<size_t>(written);
  }
  return true;
}

bool read_all(int fd, char *data, size_t size) {
  while (size > 0) {
    const ssize_t got = ::read(fd, data, size);
    if (got < 0 && errno == EINTR) {
      continue;
    }
    if (got <= 0) {
      return false;
    }
    data += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

// Creates `dir` and proves it writable by creating and removing a file: access(W_OK) would lie
// on a read-only mount and to root.
bool probe_writable(const fs::path &dir, std::string *why) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    *why = "cannot create " + dir.string() + " (" + ec.message() + ")";
    return false;
  }
  const fs::path probe = dir / temp_name("probe");
  const int fd = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, kFileMode);
  if (fd < 0) {
    *why = "cannot write in " + dir.string() + " (" + errno_text(errno) + ")";
    return false;
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

} // namespace

DiskCache::DiskCache(fs::path root) : root_(std::move(root)) {
  if (root_.empty()) {
    warn_unusable_once(root_, "no cache folder (none of FLASHJIT_CACHE_DIR, XDG_CACHE_HOME, HOME is set)");
    return;
  }
  dir_ = root_ / kFormatDir;
  std::string why;
  usable_ = probe_writable(dir_, &why);
  if (!usable_) {
    warn_unusable_once(root_, why);
  }
}

fs::path DiskCache::default_root() {
  auto env = [](const char *name) -> std::string {
    const char *value = std::getenv(name);
    return value != nullptr ? value : "";
  };
  if (std::string dir = env("FLASHJIT_CACHE_DIR"); !dir.empty()) {
    return dir;
  }
  // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && fs::path(xdg).is_absolute()) {
    return fs::path(xdg) / "flashjit";
  }
  if (std::string home = env("HOME"); !home.empty()) {
    return fs::path(home) / ".cache" / "flashjit";
  }
  return {};
}

fs::path DiskCache::entry_path(const std::string &key_hex, const std::string &name) const {
  return dir_ / (file_safe(name) + "." + key_hex + kEntrySuffix);
}

std::optional<CacheEntry> DiskCache::load(const std::string &key_hex, const std::string &name) {
  if (!usable_ || !valid_key(key_hex)) {
    return std::nullopt;
  }
  const fs::path path = entry_path(key_hex, name);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) {
      log(LogLevel::debug, "disk cache: cannot open " + path.string() + " (" + errno_text(errno) + ")");
    }
    return std::nullopt;
  }
  struct stat info = {};
  std::vector<char> bytes;
  bool read_ok = ::fstat(fd, &info) == 0 && static_cast<uint64_t>(info.st_size) <= kMaxEntryBytes;
  if (read_ok) {
    bytes.resize(static_cast<size_t>(info.st_size));
    read_ok = read_all(fd, bytes.data(), bytes.size());
  }
  ::close(fd);

  // Every check a header could fail; the first that fails names the problem.
  auto corrupt_reason = [&]() -> std::string {
    if (!read_ok) {
      return "unreadable or too large";
    }
    if (bytes.size() < kHeaderBytes) {
      return "truncated header (" + std::to_string(bytes.size()) + " bytes)";
    }
    if (std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
      return "bad magic";
    }
    if (const uint64_t version = get_le(bytes, kVersionOffset, sizeof(uint32_t)); version != kFormatVersion) {
      return "format version " + std::to_string(version) + ", expected " + std::to_string(kFormatVersion);
    }
    const uint64_t key_length = get_le(bytes, kKeyLengthOffset, sizeof(uint32_t));
    const uint64_t cubin_length = get_le(bytes, kCubinLengthOffset, sizeof(uint64_t));
    const uint64_t metadata_length = get_le(bytes, kMetadataLengthOffset, sizeof(uint64_t));
    // Each length is checked against what is left, so a garbage length cannot overflow a sum.
    const uint64_t after_header = bytes.size() - kHeaderBytes;
    const bool lengths_fit = key_length <= after_header && cubin_length <= after_header - key_length &&
                             metadata_length == after_header - key_length - cubin_length;
    if (!lengths_fit) {
      return "lengths do not match the file size (" + std::to_string(bytes.size()) + " bytes; truncated?)";
    }
    if (key_length != key_hex.size() || std::memcmp(bytes.data() + kHeaderBytes, key_hex.data(), key_length) != 0) {
      return "it holds a different key";
    }
    const uint64_t stored = get_le(bytes, kChecksumOffset, sizeof(uint64_t));
    if (XXH64(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes, kChecksumSeed) != stored) {
      return "checksum mismatch";
    }
    return {};
  };
  if (std::string reason = corrupt_reason(); !reason.empty()) {
    // Remove it so the recompiled kernel can take its place, unless a writer has already renamed
    // a fresh file over it since we opened it.
    struct stat now = {};
    const bool same_file = ::stat(path.c_str(), &now) == 0 && now.st_ino == info.st_ino && now.st_dev == info.st_dev;
    if (same_file) {
      ::unlink(path.c_str());
    }
    log(LogLevel::warn, "disk cache entry " + path.string() + " is corrupt (" + reason + "); removed, recompiling");
    return std::nullopt;
  }

  const size_t cubin_begin = kHeaderBytes + key_hex.size();
  const size_t metadata_begin = cubin_begin + get_le(bytes, kCubinLengthOffset, sizeof(uint64_t));
  CacheEntry entry;
  entry.cubin.assign(bytes.begin() + static_cast<std::ptrdiff_t>(cubin_begin),
                     bytes.begin() + static_cast<std::ptrdiff_t>(metadata_begin));
  entry.metadata.assign(bytes.begin() + static_cast<std::ptrdiff_t>(metadata_begin), bytes.end());
  return entry;
}

bool DiskCache::store(const std::string &key_hex, const std::string &name, const CacheEntry &entry) {
  if (!usable_) {
    return false;
  }
  if (!valid_key(key_hex)) {
    log(LogLevel::warn, "disk cache: not storing " + name + ": key '" + key_hex + "' is not a hex digest");
    return false;
  }
  std::vector<char> bytes(kHeaderBytes);
  bytes.reserve(kHeaderBytes + key_hex.size() + entry.cubin.size() + entry.metadata.size());
  std::memcpy(bytes.data(), kMagic.data(), kMagic.size());
  put_le(bytes, kVersionOffset, kFormatVersion, sizeof(uint32_t));
  put_le(bytes, kKeyLengthOffset, key_hex.size(), sizeof(uint32_t));
  put_le(bytes, kCubinLengthOffset, entry.cubin.size(), sizeof(uint64_t));
  put_le(bytes, kMetadataLengthOffset, entry.metadata.size(), sizeof(uint64_t));
  bytes.insert(bytes.end(), key_hex.begin(), key_hex.end());
  bytes.insert(bytes.end(), entry.cubin.begin(), entry.cubin.end());
  bytes.insert(bytes.end(), entry.metadata.begin(), entry.metadata.end());
  put_le(bytes, kChecksumOffset, XXH64(bytes.data() + kHeaderBytes, bytes.size() - kHeaderBytes, kChecksumSeed),
         sizeof(uint64_t));

  const fs::path path = entry_path(key_hex, name);
  const fs::path temp = dir_ / temp_name(key_hex);
  auto fail = [&](const std::string &step) {
    const std::string why = errno_text(errno);
    ::unlink(temp.c_str());
    log(LogLevel::warn, "disk cache: could not store " + path.string() + " (" + step + ": " + why + ")");
    return false;
  };
  const int fd = ::open(temp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, kFileMode);
  if (fd < 0) {
    return fail("create");
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at an empty file.
  const bool written = write_all(fd, bytes.data(), bytes.size()) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!written) {
    errno = saved;
    return fail("write");
  }
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    return fail("rename");
  }
  log(LogLevel::debug, "disk cache: stored " + path.string() + " (" + std::to_string(bytes.size()) + " bytes)");
  return true;
}

DiskCache::Stats DiskCache::stats() const {
  Stats stats;
  if (!usable_) {
    return stats;
  }
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!is_entry(it->path())) {
      continue;
    }
    std::error_code size_ec;
    const uintmax_t size = it->file_size(size_ec);
    if (!size_ec) { // a file removed while we list is simply not counted
      ++stats.entries;
      stats.bytes += size;
    }
  }
  return stats;
}

size_t DiskCache::clear() {
  if (!usable_) {
    return 0;
  }
  size_t removed = 0;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path &path = it->path();
    std::error_code file_ec;
    if (is_entry(path)) {
      removed += fs::remove(path, file_ec) ? 1 : 0;
    } else if (is_temp(path)) {
      // A young temp file may belong to a writer still at work; leave it to finish its rename.
      const auto modified = it->last_write_time(file_ec);
      if (!file_ec && now - modified > kStaleTempAge) {
        fs::remove(path, file_ec);
      }
    }
  }
  return removed;
}

} // namespace flashjit
