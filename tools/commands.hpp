// The flashjit CLI's subcommands. Each registers its options on the app and returns the action to
// run when it is selected.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace flashjit::cli {

using Action = std::function<int()>;

Action add_info(CLI::App &app);
Action add_aot(CLI::App &app);
Action add_check(CLI::App &app);
Action add_bench(CLI::App &app);
Action add_explain(CLI::App &app);
Action add_bundle(CLI::App &app);

} // namespace flashjit::cli
