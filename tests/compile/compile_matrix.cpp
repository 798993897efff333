#include "tests/compile/compile_matrix.hpp"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace flashjit::testing {

size_t count_of(const std::string &text, const std::string &what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++count;
  return count;
}

std::string find_cuobjdump() {
  std::vector<std::filesystem::path> candidates;
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *root = std::getenv(env))
      candidates.emplace_back(std::filesystem::path(root) / "bin/cuobjdump");
  candidates.emplace_back("/usr/local/cuda/bin/cuobjdump");
  // PyPI's nvidia-cuda-cuobjdump (scripts/setup.sh installs it when the toolkit lacks one).
  if (FILE *pipe = popen("python3 -c 'import nvidia.cu13; print(list(nvidia.cu13.__path__)[0])' 2>/dev/null", "r")) {
    std::array<char, 512> line{};
    if (fgets(line.data(), line.size(), pipe)) {
      std::string dir(line.data());
      while (!dir.empty() && (dir.back() == '\n' || dir.back() == '\r'))
        dir.pop_back();
      candidates.emplace_back(std::filesystem::path(dir) / "bin/cuobjdump");
    }
    pclose(pipe);
  }
  for (const auto &path : candidates)
    if (std::filesystem::exists(path))
      return path.string();
  return "";
}

std::string dump_sass(const std::vector<char> &cubin, std::string *error) {
  const std::string tool = find_cuobjdump();
  if (tool.empty()) {
    *error = "cuobjdump not found (CUDA toolkit bin/ or PyPI nvidia-cuda-cuobjdump)";
    return "";
  }
  std::filesystem::path file = std::filesystem::temp_directory_path() / ("flashjit-sass-" + std::to_string(getpid()) +
                                                                         "-" + std::to_string(std::rand()) + ".cubin");
  {
    std::ofstream out(file, std::ios::binary);
    out.write(cubin.data(), static_cast<std::streamsize>(cubin.size()));
  }
  std::string sass;
  if (FILE *pipe = popen((tool + " --dump-sass " + file.string() + " 2>&1").c_str(), "r")) {
    std::array<char, 4096> chunk{};
    size_t n;
    while ((n = fread(chunk.data(), 1, chunk.size(), pipe)) > 0)
      sass.append(chunk.data(), n);
    if (pclose(pipe) != 0)
      *error = "cuobjdump failed: " + sass.substr(0, 500);
  }
  std::filesystem::remove(file);
  return sass;
}

} // namespace flashjit::testing
