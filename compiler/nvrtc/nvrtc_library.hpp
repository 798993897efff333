// NVRTC, loaded with dlopen on first use, so programs that only run bundled or cached kernels
// need no NVRTC on their machine.
#pragma once

#include <nvrtc.h>

#include <string>

namespace flashjit::nvrtc {

struct Api {
  decltype(&::nvrtcVersion) version;
  decltype(&::nvrtcGetErrorString) error_string;
  decltype(&::nvrtcCreateProgram) create_program;
  decltype(&::nvrtcDestroyProgram) destroy_program;
  decltype(&::nvrtcCompileProgram) compile_program;
  decltype(&::nvrtcGetProgramLogSize) get_log_size;
  decltype(&::nvrtcGetProgramLog) get_log;
  decltype(&::nvrtcGetPTXSize) get_ptx_size;
  decltype(&::nvrtcGetPTX) get_ptx;
  decltype(&::nvrtcGetCUBINSize) get_cubin_size;
  decltype(&::nvrtcGetCUBIN) get_cubin;
  int major = 0;
  int minor = 0;
};

// The loaded library, or nullptr with *error saying what was tried.
const Api *api(std::string *error = nullptr);
// "nvrtc 13.0", or "nvrtc unavailable".
std::string version_string();

} // namespace flashjit::nvrtc
