// The disk cache: round trip, every kind of damaged entry is a miss, an unusable root degrades to
// a warning, and concurrent writers (threads and processes) leave one whole entry.
#include "runtime/disk_cache.hpp"
#include "runtime/log.hpp"
#include "tests/harness/scoped_env.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using flashjit::CacheEntry;
using flashjit::DiskCache;
using flashjit::LogLevel;
using flashjit::testing::ScopedEnv;

namespace {

const std::string kKey = "0123456789abcdef0123456789abcdef";
const std::string kOtherKey = "fedcba9876543210fedcba9876543210";
const std::string kName = "prefill.fa2.sm90a.d80v80.bf16.causal";

// A fresh folder per test, removed afterwards.
class TempDir {
public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flashjit-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  const fs::path &path() const { return path_; }

private:
  fs::path path_;
};

// Collects the log lines of a test; restores stderr when done.
class CapturedLog {
public:
  CapturedLog() {
    flashjit::set_log_sink([this](LogLevel level, std::string_view message) {
      std::lock_guard lock(mutex_);
      lines_.push_back({level, std::string(message)});
    });
  }
  ~CapturedLog() { flashjit::set_log_sink(nullptr); }
  size_t count(LogLevel level) {
    std::lock_guard lock(mutex_);
    size_t n = 0;
    for (const auto &line : lines_) {
      n += line.first == level ? 1 : 0;
    }
    return n;
  }
  std::string all() {
    std::lock_guard lock(mutex_);
    std::string text;
    for (const auto &line : lines_) {
      text += line.second + "\n";
    }
    return text;
  }

private:
  std::mutex mutex_;
  std::vector<std::pair<LogLevel, std::string>> lines_;
};

CacheEntry make_entry(int seed, size_t cubin_bytes = 4096) {
  CacheEntry entry;
  entry.cubin.resize(cubin_bytes);
  for (size_t i = 0; i < cubin_bytes; ++i) {
    entry.cubin[i] = static_cast<char>((i * 131 + static_cast<size_t>(seed) * 7) & 0xff);
  }
  entry.metadata = R"({"writer":)" + std::to_string(seed) + R"(,"entry":"_Z4attn","registers":128})";
  return entry;
}

std::vector<char> read_file(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path &path, const std::vector<char> &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

size_t count_files(const fs::path &dir, bool temp) {
  size_t n = 0;
  for (const auto &file : fs::directory_iterator(dir)) {
    n += file.path().filename().string().starts_with(".tmp.") == temp ? 1 : 0;
  }
  return n;
}

bool warnings_reach_sink() {
  return flashjit::log_level() >= LogLevel::warn;
}

} // namespace

TEST(DiskCache, RoundTrip) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.usable());
  const CacheEntry entry = make_entry(1);
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  ASSERT_TRUE(cache.store(kKey, kName, entry));

  const fs::path path = cache.entry_path(kKey, kName);
  EXPECT_EQ(path, dir.path() / "v1" / (kName + "." + kKey + ".fjc"));
  ASSERT_TRUE(fs::exists(path));

  std::optional<CacheEntry> loaded = cache.load(kKey, kName);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->cubin, entry.cubin);
  EXPECT_EQ(loaded->metadata, entry.metadata);

  // A new object on the same root (a new process, in effect) sees it too.
  DiskCache again(dir.path());
  ASSERT_TRUE(again.load(kKey, kName).has_value());

  const DiskCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.entries, 1u);
  EXPECT_EQ(stats.bytes, fs::file_size(path));

  EXPECT_EQ(cache.clear(), 1u);
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_EQ(cache.stats().entries, 0u);
}

TEST(DiskCache, EmptyPayloadsAndOverwrite) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.store(kKey, kName, CacheEntry{}));
  std::optional<CacheEntry> loaded = cache.load(kKey, kName);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_TRUE(loaded->cubin.empty());
  EXPECT_TRUE(loaded->metadata.empty());

  const CacheEntry entry = make_entry(2);
  ASSERT_TRUE(cache.store(kKey, kName, entry));
  loaded = cache.load(kKey, kName);
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->cubin, entry.cubin);
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(DiskCache, NamesAreMadeFileSafeAndKeysMustBeHex) {
  TempDir dir;
  DiskCache cache(dir.path());
  const std::string odd_name = "../../etc/passwd name";
  ASSERT_TRUE(cache.store(kKey, odd_name, make_entry(3)));
  const fs::path path = cache.entry_path(kKey, odd_name);
  EXPECT_EQ(path.parent_path(), dir.path() / "v1");
  EXPECT_TRUE(cache.load(kKey, odd_name).has_value());

  CapturedLog log;
  EXPECT_FALSE(cache.store("../evil", kName, make_entry(3)));
  EXPECT_FALSE(cache.store("", kName, make_entry(3)));
  EXPECT_FALSE(cache.load("../evil", kName).has_value());
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(DiskCache, CorruptByteIsAMissAndIsRemoved) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.store(kKey, kName, make_entry(4)));
  const fs::path path = cache.entry_path(kKey, kName);
  std::vector<char> bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x5a; // inside the cubin
  write_file(path, bytes);

  CapturedLog log;
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_FALSE(fs::exists(path));
  if (warnings_reach_sink()) {
    EXPECT_EQ(log.count(LogLevel::warn), 1u) << log.all();
    EXPECT_NE(log.all().find("checksum"), std::string::npos) << log.all();
  }
  // The next store replaces it and is served again.
  ASSERT_TRUE(cache.store(kKey, kName, make_entry(4)));
  EXPECT_TRUE(cache.load(kKey, kName).has_value());
}

TEST(DiskCache, CorruptMetadataByteIsAMiss) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.store(kKey, kName, make_entry(5)));
  const fs::path path = cache.entry_path(kKey, kName);
  std::vector<char> bytes = read_file(path);
  bytes.back() ^= 0x01;
  write_file(path, bytes);
  CapturedLog log;
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_FALSE(fs::exists(path));
}

TEST(DiskCache, TruncatedEntryIsAMiss) {
  TempDir dir;
  DiskCache cache(dir.path());
  const fs::path path = cache.entry_path(kKey, kName);
  CapturedLog log;
  // Cut inside the payload, inside the header, and to nothing at all.
  for (size_t keep : {size_t{3000}, size_t{20}, size_t{0}}) {
    ASSERT_TRUE(cache.store(kKey, kName, make_entry(6)));
    std::vector<char> bytes = read_file(path);
    ASSERT_GT(bytes.size(), keep);
    bytes.resize(keep);
    write_file(path, bytes);
    EXPECT_FALSE(cache.load(kKey, kName).has_value()) << "kept " << keep << " bytes";
    EXPECT_FALSE(fs::exists(path)) << "kept " << keep << " bytes";
  }
  if (warnings_reach_sink()) {
    EXPECT_EQ(log.count(LogLevel::warn), 3u) << log.all();
  }
}

// Any one byte flipped in the header and the key after it (magic, version, lengths, checksum) is a
// miss: no length read from the file is trusted before it is checked against the file's size.
TEST(DiskCache, EveryHeaderByteFlippedIsAMiss) {
  constexpr size_t kHeaderBytes = 8 + 4 + 4 + 8 + 8 + 8; // magic, version, key/cubin/metadata lengths, checksum
  const size_t kHeaderAndKeyBytes = kHeaderBytes + kKey.size();
  TempDir dir;
  DiskCache cache(dir.path());
  const fs::path path = cache.entry_path(kKey, kName);
  CapturedLog log;
  for (size_t at = 0; at < kHeaderAndKeyBytes; ++at)
    for (const unsigned char flip : {0x01, 0x80, 0xff}) {
      ASSERT_TRUE(cache.store(kKey, kName, make_entry(8, 256)));
      std::vector<char> bytes = read_file(path);
      ASSERT_GT(bytes.size(), kHeaderAndKeyBytes);
      bytes[at] = static_cast<char>(bytes[at] ^ flip);
      write_file(path, bytes);
      EXPECT_FALSE(cache.load(kKey, kName).has_value()) << "byte " << at << " ^ " << int(flip);
    }
}

TEST(DiskCache, TrailingBytesAreAMiss) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.store(kKey, kName, make_entry(7)));
  const fs::path path = cache.entry_path(kKey, kName);
  std::vector<char> bytes = read_file(path);
  bytes.push_back('x');
  write_file(path, bytes);
  CapturedLog log;
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
}

TEST(DiskCache, WrongKeyInHeaderIsAMiss) {
  TempDir dir;
  DiskCache cache(dir.path());
  ASSERT_TRUE(cache.store(kKey, kName, make_entry(8)));
  // A whole, valid entry of another key, found under this key's file name.
  fs::copy_file(cache.entry_path(kKey, kName), cache.entry_path(kOtherKey, kName));
  CapturedLog log;
  EXPECT_FALSE(cache.load(kOtherKey, kName).has_value());
  EXPECT_FALSE(fs::exists(cache.entry_path(kOtherKey, kName)));
  if (warnings_reach_sink()) {
    EXPECT_NE(log.all().find("different key"), std::string::npos) << log.all();
  }
  EXPECT_TRUE(cache.load(kKey, kName).has_value()); // the original is untouched
}

TEST(DiskCache, ForeignFileIsAMiss) {
  TempDir dir;
  DiskCache cache(dir.path());
  const fs::path path = cache.entry_path(kKey, kName);
  write_file(path, std::vector<char>(200, 'z'));
  CapturedLog log;
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_FALSE(fs::exists(path));
}

TEST(DiskCache, UnwritableRootDisablesTheCacheWithOneWarning) {
  TempDir dir;
  fs::path root;
  if (geteuid() == 0) {
    // chmod does not stop root; a folder below a regular file can never be created.
    write_file(dir.path() / "a-file", {'x'});
    root = dir.path() / "a-file" / "sub";
  } else {
    root = dir.path() / "read-only";
    fs::create_directories(root);
    ASSERT_EQ(chmod(root.c_str(), 0500), 0);
  }

  CapturedLog log;
  DiskCache cache(root);
  EXPECT_FALSE(cache.usable());
  EXPECT_FALSE(cache.store(kKey, kName, make_entry(9)));
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.clear(), 0u);
  DiskCache second(root); // same root again: no second warning
  EXPECT_FALSE(second.usable());
  EXPECT_FALSE(second.store(kKey, kName, make_entry(9)));
  if (warnings_reach_sink()) {
    EXPECT_EQ(log.count(LogLevel::warn), 1u) << log.all();
    EXPECT_NE(log.all().find(root.string()), std::string::npos) << log.all();
  }
}

TEST(DiskCache, EmptyRootIsUnusable) {
  CapturedLog log;
  DiskCache cache{fs::path()};
  EXPECT_FALSE(cache.usable());
  EXPECT_FALSE(cache.load(kKey, kName).has_value());
  EXPECT_FALSE(cache.store(kKey, kName, make_entry(10)));
}

// Several processes, each with several writer threads and a reader thread, store the same key at
// once. Every store must succeed, no reader may ever see a damaged entry, and what remains is one
// whole entry (cubin and metadata of the same writer) with no temp files left behind.
TEST(DiskCache, ConcurrentWritersOfOneKeyLeaveOneGoodEntry) {
  constexpr int kProcesses = 6;
  constexpr int kWriterThreads = 4;
  constexpr int kStoresPerThread = 20;
  constexpr size_t kCubinBytes = 256 * 1024; // large enough that writes are not instantaneous
  constexpr int kExitStoreFailed = 1;
  constexpr int kExitBadRead = 2;
  constexpr int kExitWarning = 3;
  TempDir dir;
  DiskCache(dir.path()); // creates v1/ before the race

  int start_pipe[2];
  ASSERT_EQ(pipe(start_pipe), 0);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(start_pipe[1]);
      char go = 0;
      if (read(start_pipe[0], &go, 1) != 1) {
        _exit(kExitStoreFailed);
      }
      std::atomic<int> warnings{0};
      flashjit::set_log_sink([&](LogLevel level, std::string_view) { warnings += level <= LogLevel::warn ? 1 : 0; });
      DiskCache cache(dir.path());
      std::atomic<bool> failed{false};
      std::atomic<bool> bad_read{false};
      std::atomic<bool> writing{true};
      std::vector<std::thread> threads;
      for (int t = 0; t < kWriterThreads; ++t) {
        threads.emplace_back([&, writer = p * kWriterThreads + t] {
          const CacheEntry entry = make_entry(writer, kCubinBytes);
          for (int i = 0; i < kStoresPerThread; ++i) {
            failed = failed || !cache.store(kKey, kName, entry);
          }
        });
      }
      std::thread reader([&] {
        while (writing) {
          if (std::optional<CacheEntry> got = cache.load(kKey, kName)) {
            const int writer = std::stoi(got->metadata.substr(got->metadata.find(':') + 1));
            bad_read = bad_read || got->cubin != make_entry(writer, kCubinBytes).cubin;
          }
        }
      });
      for (auto &thread : threads) {
        thread.join();
      }
      writing = false;
      reader.join();
      _exit(failed ? kExitStoreFailed : bad_read ? kExitBadRead : warnings > 0 ? kExitWarning : 0);
    }
    children.push_back(pid);
  }
  close(start_pipe[0]);
  const std::string go(kProcesses, 'g');
  ASSERT_EQ(write(start_pipe[1], go.data(), go.size()), static_cast<ssize_t>(go.size()));
  close(start_pipe[1]);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: a store failed, 2: a reader saw a damaged entry, 3: a warning";
  }

  DiskCache cache(dir.path());
  const fs::path v1 = dir.path() / "v1";
  EXPECT_EQ(count_files(v1, /*temp=*/true), 0u);
  EXPECT_EQ(count_files(v1, /*temp=*/false), 1u);
  EXPECT_EQ(cache.stats().entries, 1u);
  std::optional<CacheEntry> got = cache.load(kKey, kName);
  ASSERT_TRUE(got.has_value());
  const int writer = std::stoi(got->metadata.substr(got->metadata.find(':') + 1));
  EXPECT_EQ(got->cubin, make_entry(writer, kCubinBytes).cubin);
}

TEST(DiskCache, DefaultRootPrecedence) {
  ScopedEnv cache_dir("FLASHJIT_CACHE_DIR", "/opt/fj-cache");
  ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
  ScopedEnv home("HOME", "/home/user");
  EXPECT_EQ(DiskCache::default_root(), fs::path("/opt/fj-cache"));
  unsetenv("FLASHJIT_CACHE_DIR");
  EXPECT_EQ(DiskCache::default_root(), fs::path("/xdg/flashjit"));
  setenv("FLASHJIT_CACHE_DIR", "", 1); // empty counts as unset
  EXPECT_EQ(DiskCache::default_root(), fs::path("/xdg/flashjit"));
  setenv("XDG_CACHE_HOME", "relative/dir", 1); // the XDG spec says to ignore a relative path
  EXPECT_EQ(DiskCache::default_root(), fs::path("/home/user/.cache/flashjit"));
  unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(DiskCache::default_root(), fs::path("/home/user/.cache/flashjit"));
  unsetenv("HOME");
  EXPECT_TRUE(DiskCache::default_root().empty());
}
