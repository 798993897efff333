// What a backend produces for one specialization: the artifacts plus ptxas's resource report.
#pragma once

#include <string>
#include <vector>

namespace flashjit {

struct ResourceUsage {
  int registers = -1;
  int spill_store_bytes = -1;
  int spill_load_bytes = -1;
  int stack_frame_bytes = -1;
  int static_smem_bytes = -1;
  std::vector<std::string> warnings; // ptxas warnings (e.g. wgmma serialization)
};

struct CompiledKernel {
  std::string name;    // canonical kernel name
  std::string entry;   // symbol in the cubin
  std::string backend; // "nvrtc 13.0" / "mlir 22.1"
  std::string source;  // generated source (or IR) that was compiled
  std::string ptx;
  std::vector<char> cubin;
  std::string log; // compiler + ptxas log
  ResourceUsage resources;
  double compile_seconds = 0;
};

// Parses ptxas -v output (as NVRTC returns it in the program log). Registers and shared memory are
// those of `entry` ("" = the largest of any entry); spills and stack are the worst of any entry.
ResourceUsage parse_ptxas_report(const std::string &log, const std::string &entry = "");

} // namespace flashjit
