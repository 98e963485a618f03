// The `stash` command-line tool. Exit status: 0 success, 1 a negative verdict (invalid
// plan, infeasible budget), 2 bad input or usage, 3 an internal or CUDA error.
#include <algorithm>
#include <cstdio>
#include <exception>

#include "command.h"
#include "planner/model/profile.h"

namespace stash::cli {
std::vector<subcommand>& command_registry() {
  static std::vector<subcommand> r;
  return r;
}
}  // namespace stash::cli

int main(int argc, char** argv) {
  using namespace stash;
  CLI::App app{"stash: plan and execute GPU activation offload/recompute under a memory budget"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("stash ") + STASH_VERSION_STRING);
  auto& reg = cli::command_registry();
  std::sort(reg.begin(), reg.end(),
            [](const cli::subcommand& a, const cli::subcommand& b) { return a.order < b.order; });
  for (auto& c : reg) c.add(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const cli::exit_status& s) {
    return s.code;
  } catch (const stash::input_error& e) {
    std::fprintf(stderr, "stash: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "stash: internal error: %s\n", e.what());
    return 3;
  }
  return 0;
}
