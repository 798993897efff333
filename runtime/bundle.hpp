// Deployment bundles: pre-generated cubins plus a manifest, read at run time without a compiler.
//
// Two forms with one manifest schema:
//   - a directory: DIR/manifest.json and one DIR/<name>.cubin per kernel (what `flashjit aot --out` writes);
//   - a single file, FILE.fjb: a fixed header (magic, format version, manifest length, xxh64 of the
//     manifest), the manifest JSON, then the cubins back to back at the offsets the manifest gives.
// The manifest is deterministic for the same inputs (kernels sorted by name, keys sorted, no
// timestamps or compile times), so two builds of one spec list produce byte-identical bundles.
//
// Opening a bundle verifies everything up front (format version, the kernel templates it was built
// from, every cubin's size and xxh64, the arch when one is required), so a registered bundle never
// fails later; a bundle that fails a check is refused with a message naming the bundle, the kernel
// and the reason.
#pragma once

#include "compiler/compiled_kernel.hpp"
#include "compiler/planner.hpp"

#include <flashjit/flashjit.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace flashjit {

inline constexpr int kBundleFormatVersion = 1;
inline constexpr const char *kBundleFormatName = "flashjit-bundle";
inline constexpr const char *kBundleManifestFile = "manifest.json";
inline constexpr const char *kBundleFileSuffix = ".fjb";

// One kernel of a bundle, as its manifest describes it.
struct BundleKernel {
  std::string name;      // canonical spec name (kernel_name)
  std::string key;       // the cache key it was built under (identity at build time)
  std::string plan_hash; // kernel_hash(spec, plan), hex: a changed planner makes the entry stale
  std::string plan;      // summary for people: tiles, stages, threads, smem
  std::string arch;      // "sm90a"
  std::string variant;   // fa2 | fa3 | decode_splitk | combine
  std::string entry;     // symbol in the cubin
  std::string backend;   // "nvrtc 13.0"
  std::string checksum;  // xxh64 of the cubin, hex
  std::string file;      // directory form: the cubin's file name; empty in a .fjb
  uint64_t offset = 0;   // .fjb form: where the cubin starts after the manifest
  uint64_t size = 0;     // cubin bytes
  int dynamic_smem_bytes = 0;
  ResourceUsage resources;
  KernelSpec spec; // the spec the plan realizes (for "closest kernel" answers)
};

struct BundleManifest {
  int format_version = kBundleFormatVersion;
  std::string flashjit_version;
  std::string backend;               // of the kernels (one backend per bundle), e.g. "nvrtc 13.0"
  std::string templates_hash;        // hex; the kernels' sources: a bundle from other sources is refused
  std::vector<BundleKernel> kernels; // sorted by name
};

// xxh64 of `bytes` as 16 hex digits.
std::string hex_xxh64(std::span<const char> bytes);
std::string hex64(uint64_t value);

// The manifest entry for a compiled kernel (everything but file/offset, which the writer sets).
BundleKernel bundle_kernel_from(const PlanChoice &choice, const std::string &key, const CompiledKernel &kernel);

// A short plan description: "block 128x128, stages 2, threads 384, smem 163840 B, wg 2 pingpong".
std::string plan_summary(const Plan &plan);

class Bundle {
public:
  // Reads and verifies the bundle at `path` (a directory or a .fjb file). With `require_arch`, a
  // bundle holding no kernel for that arch is refused too.
  static Status open(const std::filesystem::path &path, std::optional<Arch> require_arch,
                     std::shared_ptr<const Bundle> *out);

  const std::filesystem::path &path() const { return path_; }
  const BundleManifest &manifest() const { return manifest_; }
  const BundleKernel *find(const std::string &name) const;
  std::span<const char> cubin(const BundleKernel &kernel) const;
  // The archs it holds kernels for, sorted ("sm80", "sm90a").
  std::vector<std::string> archs() const;

private:
  std::filesystem::path path_;
  BundleManifest manifest_;
  std::vector<std::vector<char>> cubins_; // parallel to manifest_.kernels
};

// Writes a bundle from (kernel, cubin) pairs; kernels are sorted by name and duplicates (same
// name) dropped. Both writers are atomic: every file is written to a temp name, fsynced and renamed
// into place; in a directory the manifest goes last, so it only ever names complete cubins.
struct BundleContents {
  BundleManifest manifest;
  std::vector<std::vector<char>> cubins; // parallel to manifest.kernels
  void add(BundleKernel kernel, std::vector<char> cubin);
  void sort(); // by name, dropping repeated names
};

Status write_bundle_directory(const std::filesystem::path &dir, BundleContents contents);
Status write_bundle_file(const std::filesystem::path &file, BundleContents contents);

// The manifest as JSON text, exactly as written (for the directory form, `files` = true).
std::string manifest_text(const BundleManifest &manifest, bool directory_form);

// Writes `bytes` to `path` atomically (temp file in the same folder, fsync, rename).
bool write_file_atomic(const std::filesystem::path &path, std::span<const char> bytes, std::string *error);

} // namespace flashjit
