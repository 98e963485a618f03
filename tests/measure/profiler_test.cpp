// The CUPTI profiler, the C API's profiler calls and `stash profile` where profiling may
// be unavailable. Runs everywhere with its own main (no device-skip): on a machine without
// a driver the real runtime's .gpu variant must say "profiling unavailable: <the runtime's
// reason>" and go on; on the double (.cpu) CUPTI has no driver behind it and must fail
// cleanly; on a GPU the profiler must start and stop.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "runtime/measure/cupti_profiler.h"
#include "cuda_prim.h"
#include "stash.h"
#include "test_paths.h"

namespace stash::measure {
namespace {

TEST(Profiler, StartsOrSaysWhyNotAndTheProgramGoesOn) {
  const std::string problem = prim::device_problem();
  cupti_profiler& p = cupti_profiler::process();
  const std::string why = p.start(profiler_options{});
  if (!problem.empty()) {
    // No driver / no device: the runtime's words, not CUPTI's 999.
    EXPECT_EQ(why, problem);
    EXPECT_FALSE(p.active());
  } else if (!why.empty()) {
    EXPECT_FALSE(p.active()) << why;  // e.g. the double: no driver behind CUPTI
    std::printf("profiling unavailable: %s\n", why.c_str());
  } else {
    EXPECT_TRUE(p.active());
    p.scope_push("stash:layer:0:fwd");
    p.scope_pop();
    const activity_log log = p.stop();
    ASSERT_EQ(log.scopes.size(), 1u);
    EXPECT_EQ(log.scopes[0].name, "stash:layer:0:fwd");
    EXPECT_FALSE(p.active());
  }
  // Scopes while inactive are harmless no-ops, and stop is idempotent.
  p.scope_push("stash:layer:1:fwd");
  p.scope_pop();
  EXPECT_TRUE(p.stop().scopes.empty());
}

TEST(ProfilerCApi, StartReportsUnavailabilityAsAStatus) {
  const std::string problem = prim::device_problem();
  const stash_status_t s = stash_profiler_start();
  if (s == STASH_OK) {
    EXPECT_TRUE(problem.empty());
    EXPECT_EQ(stash_profiler_active(), 1);
    EXPECT_EQ(stash_profiler_start(), STASH_ERROR_PROFILER_STATE);
    const std::string out = ::testing::TempDir() + "/capi_profile.json";
    EXPECT_EQ(stash_profiler_stop(nullptr, out.c_str()), STASH_OK) << stash_last_error();
    std::remove(out.c_str());
    return;
  }
  EXPECT_EQ(s, STASH_ERROR_PROFILING_UNAVAILABLE);
  const std::string msg = stash_last_error();
  EXPECT_EQ(msg.rfind("profiling unavailable: ", 0), 0u) << msg;
  if (!problem.empty()) {
    EXPECT_EQ(msg, "profiling unavailable: " + problem);
  }
  EXPECT_EQ(stash_profiler_active(), 0);
  EXPECT_EQ(stash_profiler_stop(nullptr, "unused.json"), STASH_ERROR_PROFILER_STATE);
}

TEST(ProfilerCApi, ScopesWorkWithOrWithoutAProfiler) {
  EXPECT_EQ(stash_profile_scope_begin(STASH_SCOPE_FORWARD, 3, nullptr), STASH_OK);
  EXPECT_EQ(stash_profile_scope_begin(STASH_SCOPE_TENSOR, 3, "attn_out"), STASH_OK);
  EXPECT_EQ(stash_profile_scope_end(), STASH_OK);
  EXPECT_EQ(stash_profile_scope_end(), STASH_OK);
  EXPECT_EQ(stash_profile_scope_end(), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("no profiler scope is open"), std::string::npos);
  EXPECT_EQ(stash_profile_scope_begin(STASH_SCOPE_BACKWARD, -1, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_profile_scope_begin(STASH_SCOPE_TENSOR, 0, ""), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_profile_scope_begin(static_cast<stash_scope_kind_t>(3) /* not a kind */, 0, "x"),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_profile_scope_end(), STASH_ERROR_INVALID_ARGUMENT);  // nothing opened
}

// `stash profile` runs the command whatever happens to profiling, and exits with its status.
struct run_result {
  int status;
  std::string output;
};
run_result run(const std::string& cmd) {
  run_result r{-1, ""};
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!f) return r;
  char buf[512];
  while (std::fgets(buf, sizeof buf, f)) r.output += buf;
  const int st = ::pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

TEST(StashProfile, RunsTheCommandAndExitsWithItsStatusWhenNothingCanBeProfiled) {
  const std::string out = ::testing::TempDir() + "/stash_profile_out.json";
  std::remove(out.c_str());
  const run_result r =
      run(STASH_TEST_PATH(STASH_CLI) + " profile -o " + out +
          " -- sh -c 'echo ran-the-command; exit 3'");
  EXPECT_EQ(r.status, 3) << r.output;
  EXPECT_NE(r.output.find("ran-the-command"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("profiling unavailable: "), std::string::npos) << r.output;
  const std::string problem = prim::device_problem();
  if (!problem.empty()) {
    EXPECT_NE(r.output.find(problem), std::string::npos) << r.output;
  }
  EXPECT_FALSE(std::ifstream(out).good()) << "no profile is written when nothing was measured";

  EXPECT_EQ(run(STASH_TEST_PATH(STASH_CLI) + " profile -o " + out + " -- true").status, 0);
  EXPECT_EQ(run(STASH_TEST_PATH(STASH_CLI) + " profile -o " + out + " -- /nonexistent/cmd").status,
            127);
  // Bad inputs fail before the command runs.
  const run_result bad = run(STASH_TEST_PATH(STASH_CLI) + " profile -o " + out +
                             " --skeleton /nonexistent.json -- sh -c 'echo should-not-run'");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_EQ(bad.output.find("should-not-run"), std::string::npos) << bad.output;
}

// The injection library's own start-up and exit paths, driven by a probe that loads it
// as the driver would: it must report what happened through the result folder, and
// `stash profile` must pass the command's status through.
TEST(StashProfile, ReadsWhatTheInjectionLibraryReports) {
  const std::string out = ::testing::TempDir() + "/stash_profile_probe.json";
  std::remove(out.c_str());
  const run_result r = run(STASH_TEST_PATH(STASH_CLI) + " profile -o " + out + " -- " +
                           STASH_TEST_PATH(STASH_INJECT_PROBE));
  EXPECT_EQ(r.status, 5) << r.output;
  if (r.output.find("profiling unavailable: ") != std::string::npos) {
    // No driver behind CUPTI: the library said so, and so did stash profile.
    EXPECT_NE(r.output.find("stash: profiling unavailable: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("stash profile: profiling unavailable: "), std::string::npos) << r.output;
    EXPECT_FALSE(std::ifstream(out).good());
  } else {
    // A GPU: CUPTI started; no scope ran, so the profile has no layers and says so.
    EXPECT_NE(r.output.find("no stash:layer:<i>:fwd|bwd scope was seen"), std::string::npos) << r.output;
    EXPECT_TRUE(std::ifstream(out).good()) << r.output;
    std::remove(out.c_str());
  }
}

}  // namespace
}  // namespace stash::measure
