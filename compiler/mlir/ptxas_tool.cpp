#include "compiler/mlir/ptxas_tool.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#ifndef FLASHJIT_CUDA_LIB_DIR
#define FLASHJIT_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

extern char **environ;

namespace flashjit::ptxas {
namespace {

namespace fs = std::filesystem;

std::string find() {
  std::vector<fs::path> candidates;
  if (const char *explicit_path = std::getenv("FLASHJIT_PTXAS"); explicit_path && *explicit_path)
    candidates.emplace_back(explicit_path);
  for (const char *env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *root = std::getenv(env); root && *root)
      candidates.push_back(fs::path(root) / "bin" / "ptxas");
  candidates.push_back(fs::path(FLASHJIT_CUDA_LIB_DIR).parent_path() / "bin" / "ptxas");
  for (const fs::path &candidate : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(candidate, ec) && access(candidate.c_str(), X_OK) == 0)
      return candidate.string();
  }
  return {};
}

std::string read_text(const fs::path &file) {
  std::ifstream in(file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs `argv` with stdout and stderr into `output_file`; the exit status, or -1 if it did not run.
int run(const std::vector<std::string> &argv, const fs::path &output_file) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char *> args;
  for (const std::string &arg : argv)
    args.push_back(const_cast<char *>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR)
      return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A private directory for one assembly, removed with everything in it when this goes away.
struct ScratchDir {
  fs::path dir;
  ScratchDir() {
    std::string pattern = (fs::temp_directory_path() / "flashjit-ptxas-XXXXXX").string();
    if (mkdtemp(pattern.data()))
      dir = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!dir.empty())
      fs::remove_all(dir, ec);
  }
};

std::string query_version() {
  if (path().empty())
    return "ptxas unavailable";
  ScratchDir scratch;
  if (scratch.dir.empty() || run({path(), "--version"}, scratch.dir / "version.txt") != 0)
    return "ptxas unknown version";
  // "Cuda compilation tools, release 13.0, V13.0.88": the V-number is the assembler's version.
  std::istringstream lines(read_text(scratch.dir / "version.txt"));
  for (std::string line; std::getline(lines, line);)
    if (const size_t release = line.find(", V"); release != std::string::npos)
      return "ptxas " + line.substr(release + 3);
  return "ptxas unknown version";
}

} // namespace

const std::string &path() {
  static const std::string found = find();
  return found;
}

const std::string &version_string() {
  static const std::string version = query_version();
  return version;
}

Status assemble(const std::string &ptx, const std::string &arch, const std::string &name, std::vector<char> *cubin,
                std::string *log) {
  if (path().empty())
    return Status::error(FLASHJIT_COMPILE_ERROR, "ptxas not found (set FLASHJIT_PTXAS or CUDA_HOME)");
  ScratchDir scratch;
  if (scratch.dir.empty())
    return Status::error(FLASHJIT_COMPILE_ERROR, "ptxas: no temporary directory for " + name);
  const fs::path in = scratch.dir / "kernel.ptx", out = scratch.dir / "kernel.cubin", report = scratch.dir / "log.txt";
  if (!(std::ofstream(in, std::ios::binary) << ptx))
    return Status::error(FLASHJIT_COMPILE_ERROR, "ptxas: cannot write the PTX of " + name);
  const int status = run({path(), "-arch=" + arch, "-v", "-warn-spills", in.string(), "-o", out.string()}, report);
  *log = read_text(report);
  if (status != 0)
    return Status::error(FLASHJIT_COMPILE_ERROR, "ptxas rejected the PTX of " + name + " (exit status " +
                                                     std::to_string(status) + "):\n" + *log);
  const std::string bytes = read_text(out);
  if (bytes.empty())
    return Status::error(FLASHJIT_COMPILE_ERROR, "ptxas produced no cubin for " + name);
  cubin->assign(bytes.begin(), bytes.end());
  return Status::success();
}

} // namespace flashjit::ptxas
