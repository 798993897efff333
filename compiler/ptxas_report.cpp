#include "compiler/compiled_kernel.hpp"

#include <algorithm>
#include <regex>
#include <sstream>

namespace flashjit {

namespace {

constexpr const char *kInjectedWarpgroupArrive = "(C7519)";

int match_int(const std::string &line, const std::regex &pattern) {
  std::smatch m;
  if (std::regex_search(line, m, pattern))
    return std::stoi(m[1].str());
  return -1;
}

} // namespace

ResourceUsage parse_ptxas_report(const std::string &log, const std::string &entry) {
  static const std::regex function(R"((?:Compiling entry function|Function properties for) '?([A-Za-z_0-9$.]+)'?)");
  static const std::regex registers(R"(Used (\d+) registers)");
  static const std::regex spill_stores(R"((\d+) bytes spill stores)");
  static const std::regex spill_loads(R"((\d+) bytes spill loads)");
  static const std::regex stack(R"((\d+) bytes stack frame)");
  static const std::regex smem(R"((\d+) bytes smem)");
  // A module can hold several entries (decode: pieces, merge, standalone combine). Registers and
  // shared memory are those of `entry` (or the largest, when no entry is named); spills and stack are
  // the worst of any entry, so a spill anywhere in the module is never hidden.
  ResourceUsage usage;
  ResourceUsage current;
  std::string current_name;
  auto flush = [&] {
    const bool chosen = entry.empty() || current_name == entry;
    if (chosen) {
      usage.registers = std::max(usage.registers, current.registers);
      usage.static_smem_bytes = std::max(usage.static_smem_bytes, current.static_smem_bytes);
    }
    usage.spill_store_bytes = std::max(usage.spill_store_bytes, current.spill_store_bytes);
    usage.spill_load_bytes = std::max(usage.spill_load_bytes, current.spill_load_bytes);
    usage.stack_frame_bytes = std::max(usage.stack_frame_bytes, current.stack_frame_bytes);
    current = ResourceUsage{};
  };
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch m;
    if (std::regex_search(line, m, function) && m[1].str() != current_name) {
      flush();
      current_name = m[1].str();
    }
    auto take = [&](const std::regex &pattern, int *field) {
      int value = match_int(line, pattern);
      if (value >= 0)
        *field = value;
    };
    take(registers, &current.registers);
    take(spill_stores, &current.spill_store_bytes);
    take(spill_loads, &current.spill_load_bytes);
    take(stack, &current.stack_frame_bytes);
    take(smem, &current.static_smem_bytes);
    // C7519 is printed as info, but an injected warpgroup.arrive stalls the wgmma pipeline where it
    // sits (a kernel with one after a branch between two wgmma shapes ran 25-30% slower on the H200:
    // docs/perf-notes.md, "half-width tail block"): reported as a warning.
    if (line.find("warning") != std::string::npos || line.find(kInjectedWarpgroupArrive) != std::string::npos)
      usage.warnings.push_back(line);
  }
  flush();
  return usage;
}

} // namespace flashjit
