// The model's commands end to end, through the built `stash` binary: `stash profile-model`
// (planner/model/analytic.h), `stash pareto` (planner/solvers/pareto.h) and `stash plan` then
// `stash simulate` (planner/simulator/simulator.h). The functions they call are tested in
// tests/planner; here, what the commands write, print and exit with.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "planner/model/analytic.h"
#include "planner/model/plan.h"
#include "planner/model/profile.h"
#include "planner/model/trace.h"
#include "tests/planner/plan_fixtures.h"
#include "tests/planner/xml_check.h"

namespace stash::planner {
namespace {

using test::well_formed_xml;
using testing::add_tensor;
using testing::hand_profile;

constexpr std::uint64_t MiB = testing::kMiB;

// `stash <args>`'s exit status, its output discarded.
int run(const std::string& args) {
  const int rc = std::system((std::string(STASH_CLI_PATH) + " " + args + " >/dev/null 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (std::size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1)) ++n;
  return n;
}

using testing::small_llama;

TEST(ProfileModelCli, WritesALoadableProfileAndRejectsUnknownNames) {
  const std::string out = ::testing::TempDir() + "stash_profile_model_cli.json";
  ASSERT_EQ(run("profile-model --arch llama3-70b --device gb200 --batch 1 --seq 4096 -o " + out), 0);
  const step_profile p = load_profile(out);
  EXPECT_EQ(p.layers.size(), 80u);
  EXPECT_EQ(p.device_name, "NVIDIA GB200");
  std::remove(out.c_str());
  EXPECT_EQ(run("profile-model --arch llama4 --device h100 --batch 1 --seq 4096"), 2);
  EXPECT_EQ(run("profile-model --arch llama3-8b --device h100"), 2);  // batch, seq missing
  EXPECT_EQ(run("profile-model --list"), 0);
}

TEST(ParetoCli, WritesCsvAndSvgAndRejectsBadRanges) {
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "stash_pareto_cli_profile.json";
  std::ofstream(profile) << profile_json_text(small_llama());
  const std::string csv = dir + "stash_pareto_cli.csv", svg = dir + "stash_pareto_cli.svg";
  ASSERT_EQ(run("pareto --profile " + profile + " --points 12 -o " + csv + " --svg " + svg), 0);
  std::ifstream c(csv), s(svg);
  std::stringstream cs, ss;
  cs << c.rdbuf();
  ss << s.rdbuf();
  EXPECT_EQ(count(cs.str(), "\n"), 13);  // header + 12 points
  std::string why;
  EXPECT_TRUE(well_formed_xml(ss.str(), &why)) << why;
  EXPECT_EQ(run("pareto --profile " + profile + " --from 90GiB --to 80GiB"), 2);
  // Below the fixed bytes: infeasible (exit 1), as `stash plan` says it.
  EXPECT_EQ(run("pareto --profile " + profile + " --from 1GiB"), 1);
  EXPECT_NE(run("pareto --profile " + profile + " --solver magic"), 0);
  for (const auto& f : {profile, csv, svg}) std::remove(f.c_str());
}

// `stash plan` then `stash simulate --trace`: the figures printed match the canonical model
// (depth 1) and the trace parses back.
TEST(SimulateCli, PrintsFiguresAndWritesTheTrace) {
  const std::string dir = ::testing::TempDir();
  const std::string profile = dir + "stash_sim_cli_profile.json", plan = dir + "stash_sim_cli_plan.json",
                    trace = dir + "stash_sim_cli_trace.json", out = dir + "stash_sim_cli.out";
  step_profile p = hand_profile({2, 2, 2, 2}, {4, 4, 4, 4});
  for (int i = 0; i < 4; ++i) {
    add_tensor(p, i, "input", 64 * MiB, 0);
    p.layers[i].tensors[0].recomputable = false;
    add_tensor(p, i, "h", 96 * MiB, 0.5);
  }
  p.device_memory_bytes = 1ull << 34;
  std::ofstream(profile) << nlohmann::json(profile_to_json(p)).dump();
  const std::string cli = STASH_CLI_PATH;
  auto run = [&](const std::string& args) {
    const int rc = std::system((cli + " " + args + " >" + out + " 2>&1").c_str());
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  ASSERT_EQ(run("plan --profile " + profile + " --budget 400MiB -o " + plan), 0);
  ASSERT_EQ(run("simulate --profile " + profile + " --plan " + plan + " --trace " + trace), 0);
  std::ifstream o(out);
  std::stringstream text;
  text << o.rdbuf();
  EXPECT_NE(text.str().find("overlap report"), std::string::npos) << text.str();
  const std::size_t at = text.str().find("  step ");
  ASSERT_NE(at, std::string::npos) << text.str();
  double sim_ms = 0, canonical_ms = 0;
  ASSERT_EQ(std::sscanf(text.str().c_str() + at, " step %lf ms (canonical model %lf ms", &sim_ms,
                        &canonical_ms), 2) << text.str();
  EXPECT_GT(sim_ms, 24);  // at least the compute
  EXPECT_NEAR(sim_ms, canonical_ms, 1e-3);
  std::ifstream t(trace);
  const trace_writer tw = trace_from_json(nlohmann::json::parse(t));
  EXPECT_FALSE(tw.spans().empty());
  EXPECT_EQ(text.str().find("step overhead"), std::string::npos) << "no overhead, no mention";
  // With a step overhead: the same plan, both figures up by it, and the compute line says so.
  p.step_overhead_ms = 1.25;
  std::ofstream(profile) << nlohmann::json(profile_to_json(p)).dump();
  ASSERT_EQ(run("simulate --profile " + profile + " --plan " + plan), 0);
  std::ifstream o2(out);
  std::stringstream text2;
  text2 << o2.rdbuf();
  const std::size_t at2 = text2.str().find("  step ");
  ASSERT_NE(at2, std::string::npos) << text2.str();
  double sim2 = 0, canonical2 = 0;
  ASSERT_EQ(std::sscanf(text2.str().c_str() + at2, " step %lf ms (canonical model %lf ms", &sim2,
                        &canonical2), 2) << text2.str();
  EXPECT_NEAR(sim2, sim_ms + 1.25, 2e-3);
  EXPECT_NEAR(sim2, canonical2, 1e-3);
  EXPECT_NE(text2.str().find("step overhead 1.250 ms"), std::string::npos) << text2.str();
  EXPECT_NE(run("simulate --profile " + profile + " --plan " + plan + " --lookahead 0"), 0);
  EXPECT_EQ(run("simulate --profile " + profile + " --plan /nonexistent.json"), 2);
  // --memory-svg: the predicted device memory with the plan's budget, and with --measured a
  // trace's last pass beside it (here the simulator's own trace, so both peak alike).
  const std::string svg = dir + "stash_sim_cli_memory.svg";
  ASSERT_EQ(run("simulate --profile " + profile + " --plan " + plan + " --trace " + trace +
                " --memory-svg " + svg + " --measured " + trace), 0);
  std::ifstream sv(svg);
  std::stringstream plot;
  plot << sv.rdbuf();
  const std::size_t pred = plot.str().find("predicted (stash simulate): peak ");
  const std::size_t meas = plot.str().find(", last pass): peak ");
  ASSERT_NE(pred, std::string::npos) << plot.str();
  ASSERT_NE(meas, std::string::npos) << plot.str();
  const std::string pred_peak = plot.str().substr(pred + 33, 12);
  EXPECT_EQ(plot.str().substr(meas + 19, 12), pred_peak);
  EXPECT_NE(plot.str().find("budget 400.00 MiB"), std::string::npos) << plot.str();
  EXPECT_EQ(run("simulate --profile " + profile + " --plan " + plan + " --measured " + trace), 2)
      << "--measured without --memory-svg";
  // A file that is not a trace fails before anything is printed, naming the file.
  EXPECT_EQ(run("simulate --profile " + profile + " --plan " + plan + " --memory-svg " + svg +
                " --measured " + plan), 2);
  std::ifstream bad(out);
  std::stringstream bad_text;
  bad_text << bad.rdbuf();
  EXPECT_EQ(bad_text.str().find("overlap report"), std::string::npos) << bad_text.str();
  EXPECT_NE(bad_text.str().find(plan + ": trace: expected"), std::string::npos) << bad_text.str();
  for (const auto& f : {profile, plan, trace, out, svg}) std::remove(f.c_str());
}

}  // namespace
}  // namespace stash::planner
