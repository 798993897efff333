#include "runtime/bundle.hpp"

#include "compiler/embedded_templates.hpp"
#include "runtime/json_fields.hpp"

#include <nlohmann/json.hpp>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#ifndef FLASHJIT_VERSION_STRING
#define FLASHJIT_VERSION_STRING "0.0.0"
#endif

namespace flashjit {
namespace fs = std::filesystem;
using nlohmann::json;
namespace {

// .fjb header: magic, format version (u32), reserved (u32, 0), manifest length (u64), xxh64 of the
// manifest (u64); little-endian. The manifest carries each cubin's checksum, so the header's one
// checksum covers the whole file's metadata and the manifest covers the payload.
constexpr std::array<char, 8> kMagic = {'F', 'J', 'B', 'U', 'N', 'D', 'L', 'E'};
constexpr size_t kVersionOffset = sizeof(kMagic);
constexpr size_t kReservedOffset = kVersionOffset + sizeof(uint32_t);
constexpr size_t kManifestLengthOffset = kReservedOffset + sizeof(uint32_t);
constexpr size_t kManifestChecksumOffset = kManifestLengthOffset + sizeof(uint64_t);
constexpr size_t kHeaderBytes = kManifestChecksumOffset + sizeof(uint64_t);
constexpr uint64_t kChecksumSeed = 0;
// Far above any real bundle; a larger file is not read into memory.
constexpr uint64_t kMaxBundleBytes = uint64_t{4} << 30;
constexpr int kJsonIndent = 1;
constexpr mode_t kFileMode = 0644;

void put_le(std::vector<char> &out, size_t offset, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i)
    out[offset + i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint64_t get_le(const std::vector<char> &in, size_t offset, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i)
    value |= static_cast<uint64_t>(static_cast<unsigned char>(in[offset + i])) << (8 * i);
  return value;
}

bool read_whole(const fs::path &path, std::vector<char> *out, std::string *error) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) {
    *error = "cannot read " + path.string() + " (" + ec.message() + ")";
    return false;
  }
  if (size > kMaxBundleBytes) {
    *error = path.string() + " is " + std::to_string(size) + " bytes, larger than any bundle";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  out->resize(static_cast<size_t>(size));
  if (!in.read(out->data(), static_cast<std::streamsize>(size))) {
    *error = "cannot read " + path.string();
    return false;
  }
  return true;
}

json spec_json(const KernelSpec &s) {
  return {{"op", op_name(s.op)},
          {"arch", s.arch.name()},
          {"dtype", dtype_name(s.dtype)},
          {"head_dim_qk", s.head_dim_qk},
          {"head_dim_v", s.head_dim_v},
          {"causal", s.causal},
          {"local", s.local},
          {"softcap", s.softcap},
          {"varlen", s.varlen},
          {"page_size", s.page_size},
          {"gqa_group", s.gqa_group},
          {"q_len", s.q_len},
          {"align_bytes", s.align_bytes},
          {"key_block", s.key_block}};
}

bool spec_from_json(const json &j, KernelSpec *s, JsonFields &fields) {
  if (!j.is_object())
    return false;
  const std::string op = fields.get(j, "op", "");
  if (op == "prefill")
    s->op = Op::prefill;
  else if (op == "decode")
    s->op = Op::decode;
  else if (op == "combine")
    s->op = Op::combine;
  else
    return false;
  std::optional<Arch> arch = Arch::parse(fields.get(j, "arch", ""));
  if (!arch)
    return false;
  s->arch = *arch;
  s->dtype = fields.get(j, "dtype", "") == "fp16" ? FLASHJIT_FP16 : FLASHJIT_BF16;
  s->head_dim_qk = fields.get(j, "head_dim_qk", 0);
  s->head_dim_v = fields.get(j, "head_dim_v", 0);
  s->causal = fields.get(j, "causal", false);
  s->local = fields.get(j, "local", false);
  s->softcap = fields.get(j, "softcap", false);
  s->varlen = fields.get(j, "varlen", false);
  s->page_size = fields.get(j, "page_size", 0);
  s->gqa_group = fields.get(j, "gqa_group", 0);
  s->q_len = fields.get(j, "q_len", 0);
  s->align_bytes = fields.get(j, "align_bytes", 0);
  s->key_block = fields.get(j, "key_block", 0);
  return fields.ok();
}

json kernel_json(const BundleKernel &k, bool directory_form) {
  json j = {{"name", k.name},
            {"key", k.key},
            {"plan_hash", k.plan_hash},
            {"plan", k.plan},
            {"arch", k.arch},
            {"variant", k.variant},
            {"entry", k.entry},
            {"backend", k.backend},
            {"checksum_xxh64", k.checksum},
            {"size", k.size},
            {"dynamic_smem_bytes", k.dynamic_smem_bytes},
            {"registers", k.resources.registers},
            {"static_smem_bytes", k.resources.static_smem_bytes},
            {"spill_store_bytes", k.resources.spill_store_bytes},
            {"spill_load_bytes", k.resources.spill_load_bytes},
            {"spec", spec_json(k.spec)}};
  if (directory_form)
    j["file"] = k.file;
  else
    j["offset"] = k.offset;
  return j;
}

// Reads a manifest; the first problem found is the error.
bool parse_manifest(const std::string &text, BundleManifest *m, std::string *error) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *error = "the manifest is not a JSON object";
    return false;
  }
  JsonFields fields;
  auto field_error = [&](const std::string &where) {
    *error = "the manifest's " + where + fields.error();
    return false;
  };
  const std::string format = fields.get(j, "format", "");
  if (!fields.ok())
    return field_error("");
  if (format != kBundleFormatName) {
    *error = "not a flashjit bundle manifest (format '" + format + "', expected '" + kBundleFormatName + "')";
    return false;
  }
  m->format_version = fields.get(j, "format_version", -1);
  if (!fields.ok())
    return field_error("");
  if (m->format_version != kBundleFormatVersion) {
    *error = "unknown format version " + std::to_string(m->format_version) + " (this flashjit " +
             FLASHJIT_VERSION_STRING + " reads version " + std::to_string(kBundleFormatVersion) + ")";
    return false;
  }
  m->flashjit_version = fields.get(j, "flashjit_version", "");
  m->backend = fields.get(j, "backend", "");
  m->templates_hash = fields.get(j, "templates_hash", "");
  if (!fields.ok())
    return field_error("");
  const json kernels = j.contains("kernels") ? j.at("kernels") : json::array();
  if (!kernels.is_array()) {
    *error = "the manifest's 'kernels' is not an array";
    return false;
  }
  for (const json &e : kernels) {
    BundleKernel k;
    if (!e.is_object()) {
      *error = "a manifest kernel entry is not an object";
      return false;
    }
    k.name = fields.get(e, "name", "");
    k.key = fields.get(e, "key", "");
    k.plan_hash = fields.get(e, "plan_hash", "");
    k.plan = fields.get(e, "plan", "");
    k.arch = fields.get(e, "arch", "");
    k.variant = fields.get(e, "variant", "");
    k.entry = fields.get(e, "entry", "");
    k.backend = fields.get(e, "backend", "");
    k.checksum = fields.get(e, "checksum_xxh64", "");
    k.file = fields.get(e, "file", "");
    k.offset = fields.get(e, "offset", uint64_t{0});
    k.size = fields.get(e, "size", uint64_t{0});
    k.dynamic_smem_bytes = fields.get(e, "dynamic_smem_bytes", 0);
    k.resources.registers = fields.get(e, "registers", -1);
    k.resources.static_smem_bytes = fields.get(e, "static_smem_bytes", -1);
    k.resources.spill_store_bytes = fields.get(e, "spill_store_bytes", -1);
    k.resources.spill_load_bytes = fields.get(e, "spill_load_bytes", -1);
    const json spec = e.contains("spec") ? e.at("spec") : json();
    const bool spec_read = spec_from_json(spec, &k.spec, fields);
    if (!fields.ok())
      return field_error("kernel entry '" + k.name + "': ");
    if (k.name.empty() || k.entry.empty() || k.checksum.empty() || !spec_read) {
      *error = "kernel entry '" + k.name + "' lacks its name, entry, checksum or 'spec' (an object with op and arch)";
      return false;
    }
    if (k.spec.arch.name() != k.arch) {
      *error = "kernel " + k.name + ": arch " + k.arch + " contradicts its spec (" + k.spec.arch.name() + ")";
      return false;
    }
    m->kernels.push_back(std::move(k));
  }
  return true;
}

std::string errno_text() {
  return std::strerror(errno);
}

} // namespace

std::string hex64(uint64_t value) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(value));
  return hex;
}

std::string hex_xxh64(std::span<const char> bytes) {
  return hex64(XXH64(bytes.data(), bytes.size(), kChecksumSeed));
}

std::string plan_summary(const Plan &plan) {
  std::ostringstream s;
  s << "block " << plan.block_m << "x" << plan.block_n << ", stages " << plan.stages << ", threads " << plan.threads
    << ", smem " << plan.smem_bytes << " B";
  if (plan.consumer_warpgroups)
    s << ", consumer warpgroups " << plan.consumer_warpgroups << (plan.pingpong ? " (pingpong)" : "");
  if (plan.persistent)
    s << ", persistent grid";
  if (plan.cluster_m > 1)
    s << ", CTA clusters of " << plan.cluster_m << " (K/V multicast)";
  return s.str();
}

BundleKernel bundle_kernel_from(const PlanChoice &choice, const std::string &key, const CompiledKernel &kernel) {
  BundleKernel k;
  k.name = kernel_name(choice.spec, choice.plan);
  k.key = key;
  k.plan_hash = hex64(kernel_hash(choice.spec, choice.plan));
  k.plan = plan_summary(choice.plan);
  k.arch = choice.spec.arch.name();
  k.variant = variant_name(choice.plan.variant);
  k.entry = choice.plan.entry;
  k.backend = kernel.backend;
  k.checksum = hex_xxh64(kernel.cubin);
  k.size = kernel.cubin.size();
  k.dynamic_smem_bytes = choice.plan.smem_bytes;
  k.resources = kernel.resources;
  k.resources.warnings.clear();
  k.spec = choice.spec;
  return k;
}

std::string manifest_text(const BundleManifest &m, bool directory_form) {
  json kernels = json::array();
  for (const BundleKernel &k : m.kernels)
    kernels.push_back(kernel_json(k, directory_form));
  json j = {
      {"format", kBundleFormatName}, {"format_version", m.format_version}, {"flashjit_version", m.flashjit_version},
      {"backend", m.backend},        {"templates_hash", m.templates_hash}, {"kernels", std::move(kernels)}};
  return j.dump(kJsonIndent) + "\n";
}

bool write_file_atomic(const fs::path &path, std::span<const char> bytes, std::string *error) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::string temp_pattern = (dir / ("." + path.filename().string() + ".tmp.XXXXXX")).string();
  const int fd = ::mkstemp(temp_pattern.data());
  if (fd < 0) {
    *error = "cannot create a temp file in " + dir.string() + " (" + errno_text() + ")";
    return false;
  }
  const fs::path temp = temp_pattern;
  bool ok = true;
  const char *data = bytes.data();
  size_t left = bytes.size();
  while (ok && left > 0) {
    const ssize_t written = ::write(fd, data, left);
    if (written < 0 && errno == EINTR)
      continue;
    ok = written > 0;
    if (ok) {
      data += written;
      left -= static_cast<size_t>(written);
    }
  }
  // mkstemp makes 0600 files; a bundle is meant to be read by the serving user too.
  ok = ok && ::fchmod(fd, kFileMode) == 0 && ::fsync(fd) == 0;
  const std::string why = ok ? "" : errno_text();
  ::close(fd);
  if (!ok || ::rename(temp.c_str(), path.c_str()) != 0) {
    *error = "cannot write " + path.string() + " (" + (ok ? errno_text() : why) + ")";
    ::unlink(temp.c_str());
    return false;
  }
  return true;
}

void BundleContents::add(BundleKernel kernel, std::vector<char> cubin) {
  manifest.kernels.push_back(std::move(kernel));
  cubins.push_back(std::move(cubin));
}

void BundleContents::sort() {
  std::vector<size_t> order(manifest.kernels.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return manifest.kernels[a].name < manifest.kernels[b].name; });
  BundleContents sorted;
  sorted.manifest = manifest;
  sorted.manifest.kernels.clear();
  for (size_t i : order) {
    if (!sorted.manifest.kernels.empty() && sorted.manifest.kernels.back().name == manifest.kernels[i].name)
      continue;
    sorted.add(std::move(manifest.kernels[i]), std::move(cubins[i]));
  }
  if (sorted.manifest.flashjit_version.empty())
    sorted.manifest.flashjit_version = FLASHJIT_VERSION_STRING;
  if (sorted.manifest.templates_hash.empty())
    sorted.manifest.templates_hash = hex64(templates_hash());
  if (sorted.manifest.backend.empty() && !sorted.manifest.kernels.empty())
    sorted.manifest.backend = sorted.manifest.kernels.front().backend;
  *this = std::move(sorted);
}

Status write_bundle_directory(const fs::path &dir, BundleContents contents) {
  contents.sort();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "cannot create " + dir.string() + " (" + ec.message() + ")");
  std::string error;
  for (size_t i = 0; i < contents.cubins.size(); ++i) {
    BundleKernel &k = contents.manifest.kernels[i];
    k.file = k.name + ".cubin";
    if (!write_file_atomic(dir / k.file, contents.cubins[i], &error))
      return Status::error(FLASHJIT_INTERNAL, error);
  }
  const std::string text = manifest_text(contents.manifest, /*directory_form=*/true);
  if (!write_file_atomic(dir / kBundleManifestFile, text, &error))
    return Status::error(FLASHJIT_INTERNAL, error);
  return Status::success();
}

Status write_bundle_file(const fs::path &file, BundleContents contents) {
  contents.sort();
  uint64_t offset = 0;
  for (size_t i = 0; i < contents.cubins.size(); ++i) {
    contents.manifest.kernels[i].offset = offset;
    offset += contents.cubins[i].size();
  }
  const std::string text = manifest_text(contents.manifest, /*directory_form=*/false);
  std::vector<char> bytes(kHeaderBytes);
  std::memcpy(bytes.data(), kMagic.data(), kMagic.size());
  put_le(bytes, kVersionOffset, kBundleFormatVersion, sizeof(uint32_t));
  put_le(bytes, kReservedOffset, 0, sizeof(uint32_t));
  put_le(bytes, kManifestLengthOffset, text.size(), sizeof(uint64_t));
  put_le(bytes, kManifestChecksumOffset, XXH64(text.data(), text.size(), kChecksumSeed), sizeof(uint64_t));
  bytes.insert(bytes.end(), text.begin(), text.end());
  for (const std::vector<char> &cubin : contents.cubins)
    bytes.insert(bytes.end(), cubin.begin(), cubin.end());
  std::string error;
  if (!write_file_atomic(file, bytes, &error))
    return Status::error(FLASHJIT_INTERNAL, error);
  return Status::success();
}

Status Bundle::open(const fs::path &path, std::optional<Arch> require_arch, std::shared_ptr<const Bundle> *out) {
  auto refuse = [&](const std::string &why) {
    return Status::error(FLASHJIT_INVALID_ARGUMENT, "bundle " + path.string() + " refused: " + why);
  };
  auto bundle = std::make_shared<Bundle>();
  bundle->path_ = path;
  std::string error;
  const bool directory = fs::is_directory(path);
  std::vector<char> file_bytes; // the .fjb, whole
  size_t payload_begin = 0;
  if (directory) {
    std::vector<char> text;
    if (!read_whole(path / kBundleManifestFile, &text, &error))
      return refuse(error);
    if (!parse_manifest(std::string(text.begin(), text.end()), &bundle->manifest_, &error))
      return refuse(error);
  } else {
    if (!read_whole(path, &file_bytes, &error))
      return refuse(error);
    if (file_bytes.size() < kHeaderBytes || std::memcmp(file_bytes.data(), kMagic.data(), kMagic.size()) != 0)
      return refuse("not a .fjb bundle (bad magic) nor a bundle directory");
    if (const uint64_t version = get_le(file_bytes, kVersionOffset, sizeof(uint32_t)); version != kBundleFormatVersion)
      return refuse("unknown format version " + std::to_string(version) + " (this flashjit " + FLASHJIT_VERSION_STRING +
                    " reads version " + std::to_string(kBundleFormatVersion) + ")");
    const uint64_t manifest_length = get_le(file_bytes, kManifestLengthOffset, sizeof(uint64_t));
    if (manifest_length > file_bytes.size() - kHeaderBytes)
      return refuse("truncated (the manifest runs past the end of the file)");
    const char *manifest = file_bytes.data() + kHeaderBytes;
    if (XXH64(manifest, manifest_length, kChecksumSeed) !=
        get_le(file_bytes, kManifestChecksumOffset, sizeof(uint64_t)))
      return refuse("manifest checksum mismatch (the file is corrupt)");
    if (!parse_manifest(std::string(manifest, manifest_length), &bundle->manifest_, &error))
      return refuse(error);
    payload_begin = kHeaderBytes + manifest_length;
  }
  BundleManifest &m = bundle->manifest_;
  if (const std::string ours = hex64(templates_hash()); m.templates_hash != ours)
    return refuse("built from other kernel sources (templates hash " + m.templates_hash + ", flashjit " +
                  m.flashjit_version + "; this library has " + ours + ", flashjit " + FLASHJIT_VERSION_STRING +
                  "): regenerate it with this version's `flashjit aot`");
  std::set<std::string> names;
  for (const BundleKernel &k : m.kernels) {
    if (!names.insert(k.name).second)
      return refuse("kernel " + k.name + " appears twice");
    std::vector<char> cubin;
    if (directory) {
      if (k.file.empty() || k.file.find('/') != std::string::npos)
        return refuse("kernel " + k.name + ": bad file name '" + k.file + "'");
      if (!read_whole(path / k.file, &cubin, &error))
        return refuse("kernel " + k.name + ": " + error);
    } else {
      const uint64_t available = file_bytes.size() - payload_begin;
      if (k.offset > available || k.size > available - k.offset)
        return refuse("kernel " + k.name + ": cubin runs past the end of the file (truncated?)");
      const char *begin = file_bytes.data() + payload_begin + k.offset;
      cubin.assign(begin, begin + k.size);
    }
    if (cubin.size() != k.size)
      return refuse("kernel " + k.name + ": cubin is " + std::to_string(cubin.size()) + " bytes, the manifest says " +
                    std::to_string(k.size));
    if (const std::string sum = hex_xxh64(cubin); sum != k.checksum)
      return refuse("kernel " + k.name + ": checksum mismatch (xxh64 " + sum + ", manifest " + k.checksum +
                    "): the cubin is corrupt");
    bundle->cubins_.push_back(std::move(cubin));
  }
  if (require_arch) {
    const std::vector<std::string> archs = bundle->archs();
    if (std::find(archs.begin(), archs.end(), require_arch->name()) == archs.end()) {
      std::string held;
      for (const std::string &a : archs)
        held += (held.empty() ? "" : ", ") + a;
      return refuse("built for " + (held.empty() ? std::string("no arch (it is empty)") : held) + ", not " +
                    require_arch->name() + " (the arch asked for)");
    }
  }
  *out = std::move(bundle);
  return Status::success();
}

const BundleKernel *Bundle::find(const std::string &name) const {
  auto it = std::lower_bound(manifest_.kernels.begin(), manifest_.kernels.end(), name,
                             [](const BundleKernel &k, const std::string &n) { return k.name < n; });
  if (it != manifest_.kernels.end() && it->name == name)
    return &*it;
  // Hand-edited manifests may be unsorted: fall back to a scan.
  for (const BundleKernel &k : manifest_.kernels)
    if (k.name == name)
      return &k;
  return nullptr;
}

std::span<const char> Bundle::cubin(const BundleKernel &kernel) const {
  const size_t index = static_cast<size_t>(&kernel - manifest_.kernels.data());
  return cubins_.at(index);
}

std::vector<std::string> Bundle::archs() const {
  std::set<std::string> archs;
  for (const BundleKernel &k : manifest_.kernels)
    archs.insert(k.arch);
  return {archs.begin(), archs.end()};
}

} // namespace flashjit
