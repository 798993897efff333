// PTX -> cubin through nvJitLink (libnvJitLink.so.13, opened with dlopen on first use), with
// ptxas's verbose report, the path the MLIR backend's PTX takes to the driver.
#pragma once

#include <flashjit/flashjit.hpp>

#include <string>
#include <vector>

namespace flashjit::nvjitlink {

// `arch` as nvJitLink spells it: "sm_90a". `info_log` receives ptxas -v (registers, spills).
Status ptx_to_cubin(const std::string &ptx, const std::string &arch, const std::string &name, std::vector<char> *cubin,
                    std::string *info_log);

// "nvjitlink 13.0", or "nvjitlink unavailable".
std::string version_string();

} // namespace flashjit::nvjitlink
