// `flashjit bundle ls|verify|diff`: what a deployment bundle covers, whether it is intact, and how
// two bundles differ. Needs no GPU and no compiler.
#include "tools/commands.hpp"

#include "runtime/bundle.hpp"

#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

namespace flashjit::cli {
namespace {

constexpr int kNameColumn = 72;

struct BundleOptions {
  std::string path;
  std::string other;
  std::string arch;
  bool long_format = false;
};

int open_or_report(const std::string &path, const std::string &arch, std::shared_ptr<const Bundle> *bundle) {
  std::optional<Arch> required;
  if (!arch.empty()) {
    required = Arch::parse(arch);
    if (!required) {
      std::cerr << "flashjit bundle: --arch " << arch << ": expected sm80, sm86, sm89 or sm90a\n";
      return 2;
    }
  }
  if (Status s = Bundle::open(path, required, bundle); !s) {
    std::cerr << "flashjit bundle: " << s.message << "\n";
    return 1;
  }
  return 0;
}

void print_header(const Bundle &b) {
  const BundleManifest &m = b.manifest();
  uint64_t bytes = 0;
  for (const BundleKernel &k : m.kernels)
    bytes += k.size;
  std::string archs;
  for (const std::string &a : b.archs())
    archs += (archs.empty() ? "" : ",") + a;
  std::cout << b.path().string() << ": format " << m.format_version << ", flashjit " << m.flashjit_version << ", "
            << m.backend << ", templates " << m.templates_hash << "\n  " << m.kernels.size() << " kernels, " << bytes
            << " bytes of cubins, archs " << (archs.empty() ? "none" : archs) << "\n";
}

int list(const BundleOptions &o) {
  std::shared_ptr<const Bundle> bundle;
  if (int rc = open_or_report(o.path, o.arch, &bundle))
    return rc;
  print_header(*bundle);
  for (const BundleKernel &k : bundle->manifest().kernels) {
    std::cout << "  " << std::left << std::setw(kNameColumn) << k.name << " " << k.size << " B, "
              << k.resources.registers << " regs, " << k.resources.spill_store_bytes << " spill B, smem "
              << k.dynamic_smem_bytes << " B\n";
    if (o.long_format)
      std::cout << "      " << k.plan << "; entry " << k.entry << "; key " << k.key << "; xxh64 " << k.checksum << "\n";
  }
  return 0;
}

int verify(const BundleOptions &o) {
  std::shared_ptr<const Bundle> bundle;
  if (int rc = open_or_report(o.path, o.arch, &bundle))
    return rc;
  // Bundle::open has checked the format, the kernel sources and every cubin's size and checksum.
  std::cout << "ok: " << o.path << " (" << bundle->manifest().kernels.size() << " kernels, every checksum matches"
            << (o.arch.empty() ? "" : ", holds " + o.arch + " kernels") << ")\n";
  return 0;
}

int diff(const BundleOptions &o) {
  std::shared_ptr<const Bundle> a, b;
  if (int rc = open_or_report(o.path, "", &a))
    return rc;
  if (int rc = open_or_report(o.other, "", &b))
    return rc;
  std::map<std::string, std::pair<const BundleKernel *, const BundleKernel *>> all;
  for (const BundleKernel &k : a->manifest().kernels)
    all[k.name].first = &k;
  for (const BundleKernel &k : b->manifest().kernels)
    all[k.name].second = &k;
  size_t only_a = 0, only_b = 0, changed = 0, same = 0;
  for (const auto &[name, pair] : all) {
    const auto [ka, kb] = pair;
    if (ka && !kb) {
      ++only_a;
      std::cout << "- " << name << "\n";
    } else if (!ka && kb) {
      ++only_b;
      std::cout << "+ " << name << "\n";
    } else if (ka->checksum != kb->checksum || ka->plan_hash != kb->plan_hash) {
      ++changed;
      std::cout << "~ " << name << " (" << (ka->plan_hash != kb->plan_hash ? "plan" : "cubin")
                << " differs: " << ka->size << " -> " << kb->size << " B, " << ka->resources.registers << " -> "
                << kb->resources.registers << " regs)\n";
    } else {
      ++same;
    }
  }
  std::cout << only_a << " only in " << o.path << ", " << only_b << " only in " << o.other << ", " << changed
            << " differ, " << same << " identical\n";
  return only_a || only_b || changed ? 1 : 0;
}

} // namespace

Action add_bundle(CLI::App &app) {
  auto o = std::make_shared<BundleOptions>();
  app.require_subcommand(1);
  CLI::App *ls = app.add_subcommand("ls", "list the kernels a bundle covers");
  ls->add_option("bundle", o->path, "bundle directory or .fjb file")->required();
  ls->add_flag("-l,--long", o->long_format, "plans, entries, keys and checksums too");
  CLI::App *check = app.add_subcommand("verify", "verify format, kernel sources and every checksum (exit 1 if not)");
  check->add_option("bundle", o->path, "bundle directory or .fjb file")->required();
  check->add_option("--arch", o->arch, "also require kernels for this arch, e.g. sm90a");
  CLI::App *compare = app.add_subcommand("diff", "compare two bundles (exit 1 when they differ)");
  compare->add_option("a", o->path, "first bundle")->required();
  compare->add_option("b", o->other, "second bundle")->required();
  return [o, ls, check, compare]() -> int {
    if (ls->parsed())
      return list(*o);
    if (check->parsed())
      return verify(*o);
    if (compare->parsed())
      return diff(*o);
    return 2;
  };
}

} // namespace flashjit::cli
