// command.h: how `stash` subcommands plug into the CLI.
//
// Each tools/cli/cmd_*.cpp (and tools/demo/cli/cmd_demo.cpp, in the demo's room) defines
// one subcommand and registers it with a static subcommand_registrar; main.cpp builds the
// CLI11 app from the registry. Files are compiled straight into the executable, or linked
// into it from an object library (tools/demo/CMakeLists.txt), never from a static
// library, so the registrars are never dropped by the linker.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace stash::cli {

// Thrown by a command to end the program with a given exit status after it has printed
// its own message (e.g. `stash check` on an invalid plan exits 1).
struct exit_status {
  int code;
};

struct subcommand {
  int order;  // position in --help
  std::function<void(CLI::App& app)> add;  // adds the subcommand and its callback
};

std::vector<subcommand>& command_registry();

struct subcommand_registrar {
  subcommand_registrar(int order, std::function<void(CLI::App&)> add) {
    command_registry().push_back({order, std::move(add)});
  }
};

}  // namespace stash::cli
