// `stash profile -o profile.json [--skeleton S] [--link L] -- CMD ARGS...`: runs any CUDA
// program under stash's CUPTI injection library and turns its layer scopes into a
// measured stash.profile/1 (runtime/measure/profile_fill.h).
//
// Exit status: the command's own (128 + signal when a signal ended it), also when
// profiling was unavailable: the command always runs, profiled or not. 2 for bad options
// or an unusable skeleton/link file.
//
// Note [Finding the injection library]
// CUDA_INJECTION64_PATH needs an absolute path to libstash_inject.so. In order:
//   1. $STASH_INJECT_LIBRARY, when set (a relocated install);
//   2. next to the stash executable (/proc/self/exe): the build tree puts it there;
//   3. <exe dir>/STASH_BIN_TO_LIB/libstash_inject.so: an installed prefix (bin/ and lib/;
//      cmake/StashInstall.cmake defines the relative path, ../lib unless GNUInstallDirs
//      names another lib folder).
// NVTX_INJECTION64_PATH gets the libcupti that stash itself loads (cupti_api.h), so
// NVTX hands every range to the same CUPTI the injection library subscribes to.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/json_file.h"
#include "cuda_prim.h"
#include "planner/model/profile.h"
#include "runtime/measure/cupti_api.h"
#include "runtime/measure/measurement.h"
#include "runtime/measure/profile_fill.h"

namespace stash::cli {
namespace {

struct profile_args {
  std::string out, skeleton, link;
  std::vector<std::string> command;
};

bool is_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

#ifndef STASH_BIN_TO_LIB
#define STASH_BIN_TO_LIB "../lib"
#endif

std::string find_inject_library() {
  if (const char* env = std::getenv("STASH_INJECT_LIBRARY"); env && *env) {
    return is_file(env) ? env : "";
  }
  char exe[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  std::string dir(exe);
  dir.erase(dir.find_last_of('/'));
  for (const std::string& c :
       {dir + "/libstash_inject.so", dir + "/" STASH_BIN_TO_LIB "/libstash_inject.so"}) {
    if (is_file(c)) return c;
  }
  return "";
}

// Runs the command with the extra environment; returns its exit status.
int run_command(const std::vector<std::string>& command,
                const std::vector<std::pair<std::string, std::string>>& env) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& s : command) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "stash profile: cannot run %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(127);
  }
  // Ctrl-C reaches the command (same process group); stash stays to collect what it wrote.
  struct sigaction ignore {}, old_int {}, old_quit {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGINT, &ignore, &old_int);
  ::sigaction(SIGQUIT, &ignore, &old_quit);
  int status = 0;
  int rc;
  while ((rc = ::waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGQUIT, &old_quit, nullptr);
  if (rc < 0) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Every measure.<pid>.json the profiled processes wrote; removes the folder. A process
// killed while writing leaves only its writer's temporary file (write_text_file in
// core/json_file.h), which is removed unread.
std::vector<measure::measurement> collect_results(const std::string& dir) {
  std::vector<measure::measurement> out;
  std::vector<std::string> files;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("measure.", 0) == 0) files.push_back(dir + "/" + name);
    }
    ::closedir(d);
  }
  for (const std::string& f : files) {
    if (f.size() < 5 || f.compare(f.size() - 5, 5, ".json") != 0) {
      std::remove(f.c_str());
      continue;
    }
    try {
      std::ifstream in(f);
      nlohmann::json j;
      in >> j;
      out.push_back(measure::measurement_from_json(j));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "stash profile: ignoring %s: %s\n", f.c_str(), e.what());
    }
    std::remove(f.c_str());
  }
  ::rmdir(dir.c_str());
  return out;
}

void print_summary(const measure::measurement& m) {
  std::printf("profiled %llu kernels in %llu process%s: %llu by layer scope, %llu by launching "
              "thread, %llu outside every scope (%.3f ms)\n",
              static_cast<unsigned long long>(m.kernels),
              static_cast<unsigned long long>(m.processes), m.processes == 1 ? "" : "es",
              static_cast<unsigned long long>(m.kernels_by_correlation),
              static_cast<unsigned long long>(m.kernels_by_launch_thread),
              static_cast<unsigned long long>(m.kernels_outside_scopes), m.outside_ms);
  if (m.layers.empty()) {
    std::printf("no stash:layer:<i>:fwd|bwd scope was seen\n");
    return;
  }
  std::printf("  %6s %8s %10s %8s %10s\n", "layer", "fwd n", "fwd ms", "bwd n", "bwd ms");
  for (const auto& [i, l] : m.layers) {
    std::printf("  %6d %8zu %10.3f %8zu %10.3f\n", i, l.fwd_ms.size(), measure::median(l.fwd_ms),
                l.bwd_ms.size(), measure::median(l.bwd_ms));
  }
}

int run_profile(const profile_args& a) {
  // Inputs first: a bad skeleton should fail before a long run, not after it.
  std::unique_ptr<planner::step_profile> skeleton;
  if (!a.skeleton.empty())
    skeleton = std::make_unique<planner::step_profile>(planner::load_profile(a.skeleton));
  std::optional<planner::link_profile> link;
  if (!a.link.empty()) link = measure::load_link_section(a.link);

  std::string unavailable;
  std::vector<std::pair<std::string, std::string>> env;
  std::string result_dir;
  const std::string inject = find_inject_library();
  std::string why;
  const measure::cupti_api* cupti = measure::cupti(&why);
  if (inject.empty()) {
    unavailable = "libstash_inject.so not found (Note [Finding the injection library]; set "
                  "STASH_INJECT_LIBRARY)";
  } else if (!cupti) {
    unavailable = why;
  } else {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/stash-profile.XXXXXX";
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
    result_dir = templ;
    env = {{"CUDA_INJECTION64_PATH", inject},
           {"NVTX_INJECTION64_PATH", cupti->path},
           {"STASH_PROFILE_RESULT_DIR", result_dir}};
  }

  const int status = run_command(a.command, env);

  measure::measurement m;
  bool have = false;
  if (!result_dir.empty()) {
    for (const measure::measurement& r : collect_results(result_dir)) {
      if (!have) {
        m = r;
        have = true;
      } else {
        m.merge(r);
      }
    }
  }
  if (unavailable.empty() && !have) {
    // The driver loads the injection library in cuInit; without a driver it never runs.
    unavailable = prim::device_problem();
    if (unavailable.empty()) {
      unavailable = "the command initialized no CUDA context, so the injection library was "
                    "never loaded";
    }
  }
  if (unavailable.empty() && !m.available) {
    // The injection library runs inside cuInit and cannot ask the runtime; we can.
    unavailable = m.unavailable_reason;
    const std::string problem = prim::device_problem();
    if (!problem.empty()) unavailable += " (CUDA runtime: " + problem + ")";
  }
  if (!unavailable.empty()) {
    std::fprintf(stderr, "stash profile: profiling unavailable: %s\n", unavailable.c_str());
    std::fprintf(stderr, "stash profile: %s not written; the command exited with status %d\n",
                 a.out.c_str(), status);
    return status;
  }

  print_summary(m);
  const measure::filled_profile f = measure::fill_profile(m, skeleton.get(), link);
  stash::write_json_file(a.out, f.json);
  for (const std::string& n : f.notes) std::fprintf(stderr, "stash profile: %s\n", n.c_str());
  std::printf("wrote %s (%s)\n", a.out.c_str(),
              f.plannable ? "ready for stash plan" : "per-layer times only, not plannable yet");
  if (status != 0) std::fprintf(stderr, "stash profile: the command exited with status %d\n", status);
  return status;
}

const subcommand_registrar reg(10, [](CLI::App& app) {
  auto args = std::make_shared<profile_args>();
  CLI::App* cmd = app.add_subcommand(
      "profile", "Profile a CUDA program's layer scopes with CUPTI into profile.json");
  cmd->add_option("-o,--output", args->out, "profile.json to write")->required();
  cmd->add_option("--skeleton", args->skeleton,
                  "a stash.profile/1 listing each layer's tensors (bytes, flags) to fill");
  cmd->add_option("--link", args->link,
                  "link section to merge: `stash bench link --json` output or a profile");
  cmd->add_option("command", args->command, "-- CMD ARGS...: the program to profile")
      ->required()
      ->expected(-1);
  cmd->callback([args] {
    const int status = run_profile(*args);
    if (status != 0) throw exit_status{status};
  });
});

}  // namespace
}  // namespace stash::cli
