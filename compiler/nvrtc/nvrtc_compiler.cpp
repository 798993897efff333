#include "compiler/nvrtc/nvrtc_compiler.hpp"

#include "compiler/codegen.hpp"
#include "compiler/embedded_templates.hpp"
#include "compiler/nvrtc/nvrtc_library.hpp"

#include <chrono>
#include <memory>

namespace flashjit {

std::vector<std::string> nvrtc_options(const Arch &arch, const Plan &plan) {
  // -minimal: NVRTC leaves out the texture, surface and device-runtime declarations the templates never
  // use; the PTX and cubin are byte for byte the same, and the front end parses ~10% less (session 45).
  std::vector<std::string> options = {"--gpu-architecture=" + arch.nvrtc_target(), "-std=c++17",
                                      "--device-as-default-execution-space", "-minimal", "--ptxas-options=-v"};
  if (const int64_t level = plan.constant("kPtxasOptLevel", 0); level > 0)
    options.push_back("--ptxas-options=-O" + std::to_string(level));
  // The fa3 timeline's module global exists in its diagnostic build only (templates/kernels/fa3/timeline.cuh).
  if (plan.constant("kTimeline", 0) != 0)
    options.push_back("-DFJ_FA3_TIMELINE");
  return options;
}

namespace {

struct ProgramDeleter {
  const nvrtc::Api *api;
  void operator()(nvrtcProgram program) const { api->destroy_program(&program); }
};
using Program = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string program_log(const nvrtc::Api &api, nvrtcProgram program) {
  size_t size = 0;
  if (api.get_log_size(program, &size) != NVRTC_SUCCESS || size <= 1)
    return {};
  std::string log(size, '\0');
  api.get_log(program, log.data());
  log.resize(size - 1);
  return log;
}

} // namespace

Status compile_with_nvrtc(const KernelSpec &spec, const Plan &plan, CompiledKernel *out) {
  std::string error;
  const nvrtc::Api *api = nvrtc::api(&error);
  if (!api)
    return Status::error(FLASHJIT_COMPILE_ERROR, error);

  const auto start = std::chrono::steady_clock::now();
  CompiledKernel kernel;
  kernel.name = kernel_name(spec, plan);
  kernel.entry = plan.entry;
  kernel.backend = nvrtc::version_string();
  kernel.source = render_source(spec, plan);

  std::vector<const char *> header_texts;
  std::vector<const char *> header_names;
  std::vector<std::string> storage; // string_views in the embedded table are not NUL-terminated
  const auto &templates = embedded_templates();
  storage.reserve(templates.size() * 2);
  for (const EmbeddedTemplate &file : templates) {
    storage.emplace_back(file.text);
    storage.emplace_back(file.path);
  }
  for (size_t i = 0; i < templates.size(); ++i) {
    header_texts.push_back(storage[2 * i].c_str());
    header_names.push_back(storage[2 * i + 1].c_str());
  }

  nvrtcProgram raw = nullptr;
  std::string file_name = kernel.name + ".cu";
  nvrtcResult result =
      api->create_program(&raw, kernel.source.c_str(), file_name.c_str(), static_cast<int>(header_texts.size()),
                          header_texts.data(), header_names.data());
  if (result != NVRTC_SUCCESS)
    return Status::error(FLASHJIT_COMPILE_ERROR,
                         "NVRTC could not create a program for " + kernel.name + ": " + api->error_string(result));
  Program program(raw, ProgramDeleter{api});

  std::vector<std::string> options = nvrtc_options(spec.arch, plan);
  std::vector<const char *> option_ptrs;
  for (const auto &option : options)
    option_ptrs.push_back(option.c_str());
  result = api->compile_program(program.get(), static_cast<int>(option_ptrs.size()), option_ptrs.data());
  kernel.log = program_log(*api, program.get());
  if (result != NVRTC_SUCCESS)
    return Status::error(FLASHJIT_COMPILE_ERROR, "NVRTC failed to compile " + kernel.name + " (" +
                                                     api->error_string(result) + "):\n" + kernel.log);

  size_t size = 0;
  if (api->get_ptx_size(program.get(), &size) == NVRTC_SUCCESS && size > 1) {
    kernel.ptx.resize(size);
    api->get_ptx(program.get(), kernel.ptx.data());
    kernel.ptx.resize(size - 1);
  }
  if (api->get_cubin_size(program.get(), &size) != NVRTC_SUCCESS || size == 0)
    return Status::error(FLASHJIT_COMPILE_ERROR, "NVRTC produced no cubin for " + kernel.name);
  kernel.cubin.resize(size);
  api->get_cubin(program.get(), kernel.cubin.data());

  kernel.resources = parse_ptxas_report(kernel.log, kernel.entry);
  kernel.compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  *out = std::move(kernel);
  return Status::success();
}

} // namespace flashjit
