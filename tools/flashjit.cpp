// flashjit: run-time generated FlashAttention kernels, from the command line.
#include "tools/commands.hpp"

#include <flashjit/flashjit.h>

#include <iostream>
#include <map>

int main(int argc, char **argv) {
  CLI::App app{"flashjit: generates FlashAttention kernels specialized to each problem (NVRTC -> cubin), "
               "caches and launches them.\nEnvironment: FLASHJIT_CACHE_DIR, FLASHJIT_CACHE=off, FLASHJIT_JIT=off, "
               "FLASHJIT_STRICT=1, FLASHJIT_BACKEND=nvrtc|mlir, FLASHJIT_LOG=off|error|warn|info|debug, "
               "FLASHJIT_BUNDLE_PATH=a.fjb:dir, FLASHJIT_VARIANT=fa2|fa3|decode_splitk, FLASHJIT_DUMP_DIR=DIR"};
  app.set_version_flag("--version", std::string("flashjit ") + flashjit_version());
  app.require_subcommand(1);
  std::map<CLI::App *, flashjit::cli::Action> actions;
  auto add = [&](const char *name, const char *help, auto registrar) {
    CLI::App *sub = app.add_subcommand(name, help);
    actions[sub] = registrar(*sub);
  };
  add("info", "GPU, driver, NVRTC and LLVM versions, cache directory and its contents", flashjit::cli::add_info);
  add("aot", "pre-generate kernels (no GPU needed) into a bundle: DIR/manifest.json + cubins, or --bundle FILE.fjb",
      flashjit::cli::add_aot);
  add("bundle", "inspect deployment bundles: ls, verify, diff (no GPU needed)", flashjit::cli::add_bundle);
  add("check", "run one problem on the GPU and compare with the float64 CPU reference", flashjit::cli::add_check);
  add("bench", "measure TFLOP/s of one problem on the GPU", flashjit::cli::add_bench);
  add("explain", "which kernel a problem maps to, and why", flashjit::cli::add_explain);
  CLI11_PARSE(app, argc, argv);
  for (auto &[sub, action] : actions)
    if (sub->parsed())
      return action();
  return 1;
}
