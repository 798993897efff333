#include "compiler/compiled_kernel.hpp"

#include <regex>
#include <sstream>

namespace flashjit {

namespace {

int match_int(const std::string &line, const std::regex &pattern) {
  std::smatch m;
  if (std::regex_search(line, m, pattern))
    return std::stoi(m[1].str());
  return -1;
}

} // namespace

ResourceUsage parse_ptxas_report(const std::string &log) {
  static const std::regex registers(R"(Used (\d+) registers)");
  static const std::regex spill_stores(R"((\d+) bytes spill stores)");
  static const std::regex spill_loads(R"((\d+) bytes spill loads)");
  static const std::regex stack(R"((\d+) bytes stack frame)");
  static const std::regex smem(R"((\d+) bytes smem)");
  ResourceUsage usage;
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    auto take = [&](const std::regex &pattern, int *field) {
      int value = match_int(line, pattern);
      if (value >= 0)
        *field = value;
    };
    take(registers, &usage.registers);
    take(spill_stores, &usage.spill_store_bytes);
    take(spill_loads, &usage.spill_load_bytes);
    take(stack, &usage.stack_frame_bytes);
    take(smem, &usage.static_smem_bytes);
    if (line.find("warning") != std::string::npos)
      usage.warnings.push_back(line);
  }
  return usage;
}

} // namespace flashjit
