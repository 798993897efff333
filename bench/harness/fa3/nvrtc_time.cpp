#include <nvrtc.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
int main(int argc, char **argv) {
  std::ifstream f(argv[1]); std::stringstream ss; ss << f.rdbuf(); std::string src = ss.str();
  auto t0 = std::chrono::steady_clock::now();
  nvrtcProgram prog; nvrtcCreateProgram(&prog, src.c_str(), "k.cu", 0, nullptr, nullptr);
  const char *opts[] = {"--gpu-architecture=sm_90a", "-I/work/main/templates", "-std=c++17", "--device-as-default-execution-space"};
  nvrtcResult r = nvrtcCompileProgram(prog, 4, opts);
  auto t1 = std::chrono::steady_clock::now();
  size_t n; nvrtcGetProgramLogSize(prog, &n); std::string log(n, 0); nvrtcGetProgramLog(prog, log.data());
  size_t cs = 0; nvrtcGetCUBINSize(prog, &cs);
  printf("%s: rc=%d %.3f s cubin=%zu\n%s\n", argv[1], (int)r, std::chrono::duration<double>(t1 - t0).count(), cs, log.substr(0, 2000).c_str());
}
