// Deployment bundles: round trip (directory and .fjb, byte-identical rewrites), refusal of corrupt,
// unknown-version and wrong-arch bundles, the lookup order (bundle before disk cache), the first of
// two overlapping bundles winning (and the log saying so), a JIT-off miss naming the kernel and its
// closest neighbours, and a child process without NVRTC served from a bundle. No GPU, no compiler:
// the cubins are stand-in bytes (a bundle is checked by checksum; only a GPU load reads the ELF).
#include "compiler/build.hpp"
#include "runtime/bundle.hpp"
#include "runtime/kernel_store.hpp"

#include <flashjit/flashjit.h>
#include <flashjit/flashjit.hpp>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using namespace flashjit;

namespace {

constexpr const char *kChildEnv = "FLASHJIT_BUNDLE_TEST_CHILD";

class TempDir {
public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "flashjit-bundle-test-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path &path() const { return path_; }

private:
  fs::path path_;
};

KernelSpec prefill(int head_dim, bool causal, flashjit_dtype dtype = FLASHJIT_BF16, const char *arch = "sm90a") {
  KernelSpec spec;
  spec.arch = *Arch::parse(arch);
  spec.dtype = dtype;
  spec.head_dim_qk = spec.head_dim_v = head_dim;
  spec.causal = causal;
  return spec;
}

std::string name_of(const KernelSpec &spec) {
  const PlanChoice choice = choose_plan(spec);
  return kernel_name(choice.spec, choice.plan);
}

// A bundle of stand-in cubins whose bytes say which bundle (`tag`) and kernel they belong to.
BundleContents fake_bundle(const std::vector<KernelSpec> &specs, const std::string &tag) {
  BundleContents contents;
  for (const KernelSpec &spec : specs) {
    const PlanChoice choice = choose_plan(spec);
    EXPECT_TRUE(choice.ok) << choice.error;
    CompiledKernel kernel;
    kernel.backend = "nvrtc test";
    const std::string bytes = "cubin " + tag + " " + kernel_name(choice.spec, choice.plan);
    kernel.cubin.assign(bytes.begin(), bytes.end());
    kernel.resources.registers = 168;
    contents.add(bundle_kernel_from(choice, "00000000deadbeef", kernel), kernel.cubin);
  }
  return contents;
}

std::string text_of(std::span<const char> bytes) {
  return {bytes.begin(), bytes.end()};
}

std::string read_text(const fs::path &path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_text(const fs::path &path, const std::string &text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

StoreConfig no_jit_config() {
  StoreConfig config;
  config.disk_cache = false;
  config.jit = false;
  return config;
}

const std::vector<KernelSpec> kModelSpecs = {prefill(64, true), prefill(64, false), prefill(128, true),
                                             prefill(128, false)};

// Runs this test binary again with `filter` and extra environment, returns its exit code and output.
int run_child(const std::string &filter, const std::string &env, std::string *output) {
  const std::string command = "env " + env + " " + std::string(kChildEnv) + "=1 /proc/" + std::to_string(getpid()) +
                              "/exe --gtest_filter=" + filter + " 2>&1";
  FILE *pipe = popen(command.c_str(), "r");
  if (!pipe)
    return -1;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe))
    output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool nvrtc_is_loaded() {
  return read_text("/proc/self/maps").find("libnvrtc") != std::string::npos;
}

} // namespace

TEST(Bundle, RoundTripDirectoryAndFile) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_directory(dir.path() / "b", fake_bundle(kModelSpecs, "a")).ok());
  ASSERT_TRUE(write_bundle_file(dir.path() / "b.fjb", fake_bundle(kModelSpecs, "a")).ok());
  for (const fs::path &path : {dir.path() / "b", dir.path() / "b.fjb"}) {
    std::shared_ptr<const Bundle> bundle;
    Status s = Bundle::open(path, Arch{90, true}, &bundle);
    ASSERT_TRUE(s.ok()) << s.message;
    ASSERT_EQ(bundle->manifest().kernels.size(), kModelSpecs.size());
    EXPECT_EQ(bundle->manifest().format_version, kBundleFormatVersion);
    EXPECT_EQ(bundle->archs(), std::vector<std::string>{"sm90a"});
    for (const KernelSpec &spec : kModelSpecs) {
      const BundleKernel *k = bundle->find(name_of(spec));
      ASSERT_NE(k, nullptr) << name_of(spec);
      EXPECT_EQ(text_of(bundle->cubin(*k)), "cubin a " + name_of(spec));
      EXPECT_EQ(k->spec, choose_plan(spec).spec);
      EXPECT_EQ(k->resources.registers, 168);
      EXPECT_FALSE(k->entry.empty());
    }
  }
  // Deterministic: the same contents, in another order, give the same bytes.
  std::vector<KernelSpec> reversed(kModelSpecs.rbegin(), kModelSpecs.rend());
  ASSERT_TRUE(write_bundle_file(dir.path() / "again.fjb", fake_bundle(reversed, "a")).ok());
  EXPECT_EQ(read_text(dir.path() / "b.fjb"), read_text(dir.path() / "again.fjb"));
  EXPECT_EQ(read_text(dir.path() / "b" / "manifest.json").find("seconds"), std::string::npos);
}

TEST(Bundle, CorruptCubinIsRefusedAndNamed) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_directory(dir.path() / "b", fake_bundle(kModelSpecs, "a")).ok());
  ASSERT_TRUE(write_bundle_file(dir.path() / "b.fjb", fake_bundle(kModelSpecs, "a")).ok());
  const std::string victim = name_of(kModelSpecs[2]);
  // One flipped byte in a cubin file...
  const fs::path cubin = dir.path() / "b" / (victim + ".cubin");
  std::string bytes = read_text(cubin);
  bytes[bytes.size() / 2] ^= 0x20;
  write_text(cubin, bytes);
  std::shared_ptr<const Bundle> bundle;
  Status s = Bundle::open(dir.path() / "b", std::nullopt, &bundle);
  EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(s.message.find("checksum mismatch"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find(victim), std::string::npos) << s.message;
  // ...and in the last byte of a .fjb (the last cubin's payload).
  std::string file = read_text(dir.path() / "b.fjb");
  file.back() ^= 0x01;
  write_text(dir.path() / "b.fjb", file);
  s = Bundle::open(dir.path() / "b.fjb", std::nullopt, &bundle);
  EXPECT_NE(s.message.find("checksum mismatch"), std::string::npos) << s.message;
  // A registered bundle is refused as a whole: the store holds nothing from it.
  KernelStore store(no_jit_config());
  EXPECT_FALSE(store.register_bundle(dir.path() / "b").ok());
  EXPECT_TRUE(store.bundles().empty());
}

TEST(Bundle, UnknownFormatVersionIsRefused) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_directory(dir.path() / "b", fake_bundle(kModelSpecs, "a")).ok());
  const fs::path manifest = dir.path() / "b" / kBundleManifestFile;
  nlohmann::json j = nlohmann::json::parse(read_text(manifest));
  j["format_version"] = kBundleFormatVersion + 1;
  write_text(manifest, j.dump());
  std::shared_ptr<const Bundle> bundle;
  Status s = Bundle::open(dir.path() / "b", std::nullopt, &bundle);
  EXPECT_NE(s.message.find("unknown format version " + std::to_string(kBundleFormatVersion + 1)), std::string::npos)
      << s.message;
  // Other kernel sources (a bundle from another flashjit build) are refused too.
  j["format_version"] = kBundleFormatVersion;
  j["templates_hash"] = "0000000000000000";
  write_text(manifest, j.dump());
  s = Bundle::open(dir.path() / "b", std::nullopt, &bundle);
  EXPECT_NE(s.message.find("other kernel sources"), std::string::npos) << s.message;
}

// A manifest whose fields have the wrong JSON type (hand-edited, or another tool's) is refused with
// a message naming the field, as bad input: not an internal error, not an exception out of open.
TEST(Bundle, ManifestFieldOfTheWrongTypeIsRefusedAndNamed) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_directory(dir.path() / "b", fake_bundle(kModelSpecs, "a")).ok());
  const fs::path manifest = dir.path() / "b" / kBundleManifestFile;
  const nlohmann::json good = nlohmann::json::parse(read_text(manifest));
  struct Edit {
    const char *field;
    std::function<void(nlohmann::json &)> apply;
  };
  const std::vector<Edit> edits = {
      {"format", [](nlohmann::json &j) { j["format"] = 1; }},
      {"format_version", [](nlohmann::json &j) { j["format_version"] = "1"; }},
      {"kernels", [](nlohmann::json &j) { j["kernels"] = "none"; }},
      {"size", [](nlohmann::json &j) { j["kernels"][0]["size"] = "12"; }},
      {"size", [](nlohmann::json &j) { j["kernels"][0]["size"] = -5; }},
      {"name", [](nlohmann::json &j) { j["kernels"][1]["name"] = nlohmann::json::array(); }},
      {"head_dim_qk", [](nlohmann::json &j) { j["kernels"][0]["spec"]["head_dim_qk"] = "64"; }},
      {"causal", [](nlohmann::json &j) { j["kernels"][0]["spec"]["causal"] = nullptr; }},
      {"spec", [](nlohmann::json &j) { j["kernels"][0]["spec"] = 3; }},
  };
  for (const Edit &edit : edits) {
    nlohmann::json j = good;
    edit.apply(j);
    write_text(manifest, j.dump());
    std::shared_ptr<const Bundle> bundle;
    Status s;
    EXPECT_NO_THROW(s = Bundle::open(dir.path() / "b", std::nullopt, &bundle)) << edit.field;
    EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT) << edit.field << ": " << s.message;
    EXPECT_NE(s.message.find(edit.field), std::string::npos) << s.message;
    EXPECT_EQ(bundle, nullptr) << edit.field;
  }
}

// Every truncation of a .fjb is refused (header, manifest or a cubin cut short), never read past.
TEST(Bundle, EveryTruncationOfAFileIsRefused) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_file(dir.path() / "b.fjb", fake_bundle(kModelSpecs, "a")).ok());
  const std::string whole = read_text(dir.path() / "b.fjb");
  std::shared_ptr<const Bundle> bundle;
  ASSERT_TRUE(Bundle::open(dir.path() / "b.fjb", std::nullopt, &bundle).ok());
  for (size_t length = 0; length < whole.size(); ++length) {
    write_text(dir.path() / "cut.fjb", whole.substr(0, length));
    std::shared_ptr<const Bundle> cut;
    const Status s = Bundle::open(dir.path() / "cut.fjb", std::nullopt, &cut);
    ASSERT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT) << "cut at " << length << " of " << whole.size();
    ASSERT_EQ(cut, nullptr);
  }
}

TEST(Bundle, WrongArchIsRefused) {
  TempDir dir;
  const std::vector<KernelSpec> sm80 = {prefill(64, true, FLASHJIT_BF16, "sm80"),
                                        prefill(128, true, FLASHJIT_BF16, "sm80")};
  ASSERT_TRUE(write_bundle_file(dir.path() / "ampere.fjb", fake_bundle(sm80, "a")).ok());
  std::shared_ptr<const Bundle> bundle;
  Status s = Bundle::open(dir.path() / "ampere.fjb", Arch{90, true}, &bundle);
  EXPECT_EQ(s.code, FLASHJIT_INVALID_ARGUMENT);
  EXPECT_NE(s.message.find("built for sm80, not sm90a"), std::string::npos) << s.message;
  // Registered anyway (no arch asked), it serves sm80 and not sm90a.
  KernelStore store(no_jit_config());
  ASSERT_TRUE(store.register_bundle(dir.path() / "ampere.fjb").ok());
  bool served = false;
  std::string origin;
  ASSERT_TRUE(store.served(sm80[0], &served, &origin).ok());
  EXPECT_TRUE(served) << origin;
  ASSERT_TRUE(store.served(prefill(64, true), &served, &origin).ok());
  EXPECT_FALSE(served);
}

TEST(Bundle, JitOffMissNamesKernelAndClosest) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_file(dir.path() / "model.fjb", fake_bundle(kModelSpecs, "a")).ok());
  KernelStore store(no_jit_config());
  ASSERT_TRUE(store.register_bundle(dir.path() / "model.fjb").ok());
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
  Status s = store.compile(prefill(80, true), &kernel, &choice, &origin);
  ASSERT_EQ(s.code, FLASHJIT_NOT_IN_BUNDLE);
  EXPECT_NE(s.message.find("JIT is off"), std::string::npos) << s.message;
  EXPECT_NE(s.message.find(name_of(prefill(80, true))), std::string::npos) << s.message;
  // The nearest head dim with the same op, arch, dtype and mask comes first.
  const size_t closest = s.message.find("closest bundled kernels: ");
  ASSERT_NE(closest, std::string::npos) << s.message;
  EXPECT_EQ(s.message.find(name_of(prefill(64, true)), closest), closest + std::strlen("closest bundled kernels: "))
      << s.message;
  // A hit needs no JIT.
  ASSERT_TRUE(store.compile(prefill(128, false), &kernel, &choice, &origin).ok());
  EXPECT_EQ(origin, "bundle:" + (dir.path() / "model.fjb").string());
  EXPECT_EQ(text_of(kernel.cubin), "cubin a " + name_of(prefill(128, false)));
}

TEST(Bundle, BundleWinsOverDiskCache) {
  TempDir dir;
  const KernelSpec spec = prefill(128, true);
  StoreConfig config = no_jit_config();
  config.disk_cache = true;
  config.cache_dir = dir.path() / "cache";
  {
    // A different but valid disk entry under the spec's real cache key.
    KernelStore seed(config);
    const PlanChoice choice = choose_plan(spec);
    const std::string key = cache_key(choice.spec, choice.plan, resolve_backend(config.backend, choice.plan.variant));
    const std::string meta = nlohmann::json{{"name", name_of(spec)}, {"entry", choice.plan.entry}}.dump();
    ASSERT_TRUE(seed.disk()->store(key, name_of(spec), CacheEntry{{'d', 'i', 's', 'k'}, meta}));
  }
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
  {
    KernelStore store(config);
    ASSERT_TRUE(store.compile(spec, &kernel, &choice, &origin).ok());
    EXPECT_EQ(origin, "disk");
  }
  ASSERT_TRUE(write_bundle_directory(dir.path() / "b", fake_bundle({spec}, "a")).ok());
  KernelStore store(config);
  ASSERT_TRUE(store.register_bundle(dir.path() / "b").ok());
  ASSERT_TRUE(store.compile(spec, &kernel, &choice, &origin).ok());
  EXPECT_EQ(origin, "bundle:" + (dir.path() / "b").string());
  EXPECT_EQ(text_of(kernel.cubin), "cubin a " + name_of(spec));
}

// Two bundles hold one kernel: the first registered serves it, and the info log says so. Runs in
// a child so that FLASHJIT_LOG=info (read once per process) applies.
TEST(Bundle, FirstOfOverlappingBundlesWins) {
  TempDir dir;
  ASSERT_TRUE(
      write_bundle_file(dir.path() / "first.fjb", fake_bundle({prefill(64, true), prefill(128, true)}, "first")).ok());
  ASSERT_TRUE(
      write_bundle_file(dir.path() / "second.fjb", fake_bundle({prefill(128, true), prefill(256, true)}, "second"))
          .ok());
  std::string output;
  const int rc = run_child("BundleChild.Overlap",
                           "FLASHJIT_LOG=info FLASHJIT_CACHE=off FLASHJIT_JIT=off FLASHJIT_BUNDLE_PATH=" +
                               (dir.path() / "first.fjb").string() + ":" + (dir.path() / "second.fjb").string(),
                           &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("[flashjit] info: bundle: " + name_of(prefill(128, true)) + " is in both " +
                        (dir.path() / "first.fjb").string() + " and " + (dir.path() / "second.fjb").string() +
                        "; using " + (dir.path() / "first.fjb").string() + " (registered first)"),
            std::string::npos)
      << output;
}

TEST(BundleChild, Overlap) {
  if (!std::getenv(kChildEnv))
    GTEST_SKIP() << "runs as a child of Bundle.FirstOfOverlappingBundlesWins";
  KernelStore store(store_config_from(Options()));
  ASSERT_EQ(store.bundles().size(), 2u);
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
  ASSERT_TRUE(store.compile(prefill(128, true), &kernel, &choice, &origin).ok());
  EXPECT_EQ(text_of(kernel.cubin), "cubin first " + name_of(prefill(128, true)));
  ASSERT_TRUE(store.compile(prefill(256, true), &kernel, &choice, &origin).ok());
  EXPECT_EQ(text_of(kernel.cubin), "cubin second " + name_of(prefill(256, true)));
}

// No compiler at run time: a child with NVRTC made unavailable (FLASHJIT_NVRTC_PATH, no library
// path, no CUDA_HOME), JIT off and the bundle on FLASHJIT_BUNDLE_PATH is served through the C API,
// never loads NVRTC, and reports an unbundled shape clearly.
TEST(Bundle, ServedWithoutCompiler) {
  TempDir dir;
  ASSERT_TRUE(write_bundle_file(dir.path() / "model.fjb", fake_bundle(kModelSpecs, "a")).ok());
  std::string output;
  const int rc = run_child("BundleChild.NoCompiler",
                           "-u CUDA_HOME -u CUDA_PATH LD_LIBRARY_PATH=/nonexistent FLASHJIT_NVRTC_PATH=/nonexistent "
                           "FLASHJIT_JIT=off FLASHJIT_CACHE=off FLASHJIT_BUNDLE_PATH=" +
                               (dir.path() / "model.fjb").string(),
                           &output);
  EXPECT_EQ(rc, 0) << output;
  EXPECT_NE(output.find("served: 1"), std::string::npos) << output;
  EXPECT_NE(output.find("not served: JIT is off"), std::string::npos) << output;
  EXPECT_NE(output.find(name_of(prefill(96, true))), std::string::npos) << output;
  EXPECT_NE(output.find("closest bundled kernels"), std::string::npos) << output;
}

TEST(BundleChild, NoCompiler) {
  if (!std::getenv(kChildEnv))
    GTEST_SKIP() << "runs as a child of Bundle.ServedWithoutCompiler";
  flashjit_runtime runtime = nullptr;
  ASSERT_EQ(flashjit_runtime_create(nullptr, &runtime), FLASHJIT_OK);
  flashjit_problem p;
  flashjit_problem_init(&p);
  p.dtype = FLASHJIT_BF16;
  p.batch = 2;
  p.seqlen_q = p.seqlen_k = 2048; // past the short causal tile's lengths: the bundled default spec
  p.heads_q = p.heads_kv = 8;
  p.head_dim_qk = 128;
  p.causal = 1;
  int served = -1;
  ASSERT_EQ(flashjit_is_served(runtime, &p, "sm90a", &served), FLASHJIT_OK) << flashjit_last_error();
  std::printf("served: %d\n", served);
  EXPECT_EQ(served, 1);
  EXPECT_FALSE(nvrtc_is_loaded()) << "a bundle hit loaded NVRTC";
  // The cubin bytes themselves, as prepare() would load them, through the same store.
  KernelStore store(store_config_from(Options()));
  CompiledKernel kernel;
  PlanChoice choice;
  std::string origin;
  ASSERT_TRUE(store.compile(prefill(128, true), &kernel, &choice, &origin).ok());
  EXPECT_EQ(origin.rfind("bundle:", 0), 0u) << origin;
  EXPECT_FALSE(nvrtc_is_loaded());
  // An unbundled head dim: not served, and the reason names it and what the bundle has instead.
  Runtime cpp;
  AttentionProblem q;
  static_cast<flashjit_problem &>(q) = p;
  q.head_dim_qk = 96;
  bool found = true;
  std::string why;
  ASSERT_TRUE(cpp.is_served(q, "sm90a", &found, &why).ok());
  EXPECT_FALSE(found);
  std::printf("not served: %s\n", why.c_str());
  Status s = store.compile(prefill(96, true), &kernel, &choice, &origin);
  EXPECT_EQ(s.code, FLASHJIT_NOT_IN_BUNDLE);
  flashjit_runtime_destroy(runtime);
}
