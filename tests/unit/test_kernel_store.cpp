// The kernel store's offline path (no GPU): compile -> disk cache -> reuse, keys, JIT off, strict.
#include "compiler/build.hpp"
#include "runtime/bundle.hpp"
#include "runtime/disk_cache.hpp"
#include "runtime/kernel_store.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unistd.h>
#include <vector>

namespace flashjit {
namespace {

class KernelStoreTest : public ::testing::Test {
protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("flashjit-store-" + std::to_string(getpid()) + "-" +
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  StoreConfig config() const {
    StoreConfig c;
    c.cache_dir = dir_;
    c.variant = Variant::fa2; // cheapest to compile; the store does not care which
    return c;
  }

  static KernelSpec spec() {
    KernelSpec s;
    s.arch = Arch{80, false};
    s.head_dim_qk = s.head_dim_v = 64;
    return s;
  }

  size_t entries() const {
    size_t n = 0;
    if (std::filesystem::exists(dir_ / "v1"))
      for (const auto &e : std::filesystem::directory_iterator(dir_ / "v1"))
        n += e.path().extension() == ".fjc";
    return n;
  }

  std::filesystem::path dir_;
};

TEST_F(KernelStoreTest, CompilesOnceThenServesFromDisk) {
  CompiledKernel first, second;
  PlanChoice choice;
  std::string origin;
  {
    KernelStore store(config());
    ASSERT_TRUE(store.compile(spec(), &first, &choice, &origin).ok());
    EXPECT_EQ(origin, "jit");
  }
  EXPECT_EQ(entries(), 1u);
  KernelStore again(config());
  ASSERT_TRUE(again.compile(spec(), &second, &choice, &origin).ok());
  EXPECT_EQ(origin, "disk");
  EXPECT_EQ(first.cubin, second.cubin);
  EXPECT_EQ(second.entry, "fj_fa2_prefill");
  EXPECT_EQ(second.resources.registers, first.resources.registers);
}

TEST_F(KernelStoreTest, DumpDirReceivesSourceAndPtx) {
  const std::filesystem::path dump = dir_ / "dump";
  setenv("FLASHJIT_DUMP_DIR", dump.c_str(), 1);
  StoreConfig c = config();
  c.disk_cache = false;
  KernelStore store(c);
  CompiledKernel k;
  PlanChoice choice;
  std::string origin;
  const Status s = store.compile(spec(), &k, &choice, &origin);
  unsetenv("FLASHJIT_DUMP_DIR");
  ASSERT_TRUE(s.ok()) << s.message;
  std::ifstream source(dump / (k.name + ".cu")), ptx(dump / (k.name + ".ptx"));
  std::string first_line;
  ASSERT_TRUE(std::getline(source, first_line)) << "no dumped source";
  EXPECT_NE(first_line.find(k.name), std::string::npos);
  std::stringstream ptx_text;
  ptx_text << ptx.rdbuf();
  EXPECT_NE(ptx_text.str().find(".entry fj_fa2_prefill"), std::string::npos);
}

TEST_F(KernelStoreTest, CorruptEntryIsRebuilt) {
  {
    KernelStore store(config());
    CompiledKernel k;
    PlanChoice c;
    std::string origin;
    ASSERT_TRUE(store.compile(spec(), &k, &c, &origin).ok());
  }
  for (const auto &e : std::filesystem::directory_iterator(dir_ / "v1")) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  KernelStore store(config());
  CompiledKernel k;
  PlanChoice c;
  std::string origin;
  ASSERT_TRUE(store.compile(spec(), &k, &c, &origin).ok());
  EXPECT_EQ(origin, "jit") << "a corrupt entry must not be served";
  EXPECT_EQ(entries(), 1u);
}

// An entry whose checksums hold but whose metadata has a field of another type (written by another
// tool, or by hand) is unreadable: a miss that is rebuilt, not an exception out of compile.
TEST_F(KernelStoreTest, MetadataFieldOfTheWrongTypeIsRebuilt) {
  CompiledKernel k;
  PlanChoice c;
  std::string origin;
  std::string key;
  {
    KernelStore store(config());
    ASSERT_TRUE(store.compile(spec(), &k, &c, &origin).ok());
  }
  DiskCache disk(dir_);
  const std::string name = k.name;
  std::optional<CacheEntry> entry;
  for (const auto &e : std::filesystem::directory_iterator(dir_ / "v1")) { // NAME.KEY.fjc
    const std::string stem = e.path().stem().string();
    key = stem.substr(stem.rfind('.') + 1);
  }
  ASSERT_TRUE((entry = disk.load(key, name))) << "entry " << key << " " << name;
  entry->metadata.replace(entry->metadata.find("\"registers\":"), std::string("\"registers\":").size(),
                          "\"registers\":\"many\",\"unused\":");
  ASSERT_TRUE(disk.store(key, name, *entry));
  KernelStore store(config());
  CompiledKernel again;
  EXPECT_NO_THROW(ASSERT_TRUE(store.compile(spec(), &again, &c, &origin).ok()));
  EXPECT_EQ(origin, "jit") << "metadata of the wrong type must not be served";
  EXPECT_EQ(again.cubin, k.cubin);
}

TEST_F(KernelStoreTest, JitOffMissNamesTheKernel) {
  StoreConfig c = config();
  c.jit = false;
  KernelStore store(c);
  CompiledKernel k;
  PlanChoice choice;
  std::string origin;
  Status s = store.compile(spec(), &k, &choice, &origin);
  EXPECT_EQ(s.code, FLASHJIT_NOT_IN_BUNDLE);
  EXPECT_NE(s.message.find("prefill.fa2.sm80.d64v64.bf16.full"), std::string::npos) << s.message;
}

TEST_F(KernelStoreTest, StrictModeRefusesAFallback) {
  StoreConfig c = config();
  c.variant.reset();
  c.strict = true;
  KernelStore store(c);
  KernelSpec s = spec();
  s.arch = Arch{90, true};
  s.align_bytes = 2; // fa3 needs 16-byte aligned rows (TMA), so fa2 would run instead
  PlanChoice choice;
  Status status = store.choose(s, &choice);
  EXPECT_EQ(status.code, FLASHJIT_FALLBACK_FORBIDDEN);
  EXPECT_NE(status.message.find("fa3"), std::string::npos) << status.message;
  c.strict = false;
  KernelStore lenient(c);
  EXPECT_TRUE(lenient.choose(s, &choice).ok());
  EXPECT_EQ(choice.plan.variant, Variant::fa2);
  EXPECT_FALSE(choice.fallback_reason.empty());
}

TEST_F(KernelStoreTest, Fa3TuningOverrideFromTheEnvironment) {
  KernelSpec s = spec();
  s.arch = Arch{90, true};
  s.head_dim_qk = s.head_dim_v = 128;
  s.causal = true;
  setenv("FLASHJIT_FA3_TUNING", "consumer_warpgroups=2", 1);
  StoreConfig tuned = store_config_from(Options{});
  setenv("FLASHJIT_FA3_TUNING", "consumer_warpgroups=2,wgs=3", 1);
  StoreConfig broken = store_config_from(Options{});
  unsetenv("FLASHJIT_FA3_TUNING");
  ASSERT_TRUE(tuned.fa3_tuning.has_value()) << tuned.fa3_tuning_error;
  tuned.cache_dir = broken.cache_dir = dir_;
  PlanChoice choice;
  ASSERT_TRUE(KernelStore(tuned).choose(s, &choice).ok());
  EXPECT_EQ(choice.plan.consumer_warpgroups, 2);
  ASSERT_TRUE(KernelStore(store_config_from(Options{})).choose(s, &choice).ok());
  EXPECT_EQ(choice.plan.consumer_warpgroups, 3) << "unset: the planner's default";
  Status status = KernelStore(broken).choose(s, &choice);
  EXPECT_EQ(status.code, FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(status.message.find("FLASHJIT_FA3_TUNING"), std::string::npos) << status.message;
  EXPECT_NE(status.message.find("wgs=3"), std::string::npos) << status.message;
}

// One store used from several threads at once, as an engine's threads would (the store's CPU side:
// compile through the shared disk cache, served() queries, a bundle registered meanwhile). Every
// thread gets the same cubin for the same spec and the cache ends with one entry per spec. Run under
// ThreadSanitizer by scripts/sanitize.sh.
TEST_F(KernelStoreTest, ConcurrentCompilesQueriesAndRegistration) {
  constexpr int kThreads = 6;
  const std::vector<int> head_dims = {64, 80, 96};
  auto spec_of = [](int head_dim) {
    KernelSpec s = spec();
    s.head_dim_qk = s.head_dim_v = head_dim;
    return s;
  };
  const std::filesystem::path bundle_dir = dir_ / "bundle";
  {
    BundleContents contents; // a kernel the threads never ask for: registering it must not disturb them
    const PlanChoice choice = choose_plan(spec_of(128), Variant::fa2);
    ASSERT_TRUE(choice.ok) << choice.error;
    CompiledKernel stand_in;
    stand_in.backend = "nvrtc test";
    stand_in.cubin = {'c', 'u', 'b', 'i', 'n'};
    contents.add(bundle_kernel_from(choice, "00000000deadbeef", stand_in), stand_in.cubin);
    ASSERT_TRUE(write_bundle_directory(bundle_dir, contents).ok());
  }
  KernelStore store(config());
  std::vector<std::vector<std::vector<char>>> cubins(kThreads, std::vector<std::vector<char>>(head_dims.size()));
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < head_dims.size(); ++i) {
        const size_t which = (i + t) % head_dims.size(); // threads start on different specs
        CompiledKernel k;
        PlanChoice c;
        std::string origin;
        if (Status s = store.compile(spec_of(head_dims[which]), &k, &c, &origin); !s)
          failures[t] += s.message + "; ";
        cubins[t][which] = k.cubin;
        bool served = false;
        if (Status s = store.served(spec_of(head_dims[which]), &served, &origin); !s || !served)
          failures[t] += "not served after its compile; ";
        if (t == 0 && i == 0 && !store.register_bundle(bundle_dir).ok())
          failures[t] += "bundle refused; ";
        (void)store.bundles().size();
      }
    });
  for (std::thread &thread : threads)
    thread.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(failures[t].empty()) << "thread " << t << ": " << failures[t];
    for (size_t i = 0; i < head_dims.size(); ++i)
      EXPECT_EQ(cubins[t][i], cubins[0][i]) << "thread " << t << ", d" << head_dims[i];
  }
  EXPECT_EQ(entries(), head_dims.size());
  EXPECT_EQ(store.bundles().size(), 1u);
}

TEST(CacheKey, ChangesWithAnythingThatChangesCode) {
  KernelSpec s;
  s.arch = Arch{80, false};
  PlanChoice a = choose_plan(s, Variant::fa2);
  ASSERT_TRUE(a.ok);
  const std::string key = cache_key(a.spec, a.plan, FLASHJIT_BACKEND_NVRTC);
  EXPECT_EQ(key.size(), 16u);
  EXPECT_EQ(key, cache_key(a.spec, a.plan, FLASHJIT_BACKEND_NVRTC));
  KernelSpec other = a.spec;
  other.arch = Arch{86, false};
  EXPECT_NE(key, cache_key(other, a.plan, FLASHJIT_BACKEND_NVRTC));
  EXPECT_NE(key, cache_key(a.spec, a.plan, FLASHJIT_BACKEND_MLIR));
  Plan tweaked = a.plan;
  tweaked.stages += 1;
  EXPECT_NE(key, cache_key(a.spec, tweaked, FLASHJIT_BACKEND_NVRTC));
}

} // namespace
} // namespace flashjit
