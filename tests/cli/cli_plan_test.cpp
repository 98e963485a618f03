// `stash plan` and `stash check`, run as the built binary: exit codes and messages.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/planner/plan_fixtures.h"
#include "planner/solvers/planner.h"

using namespace stash::planner;
using nlohmann::json;

namespace {

struct run_result {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

run_result run_stash(const std::string& args) {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "stash_cli.out", err = dir + "stash_cli.err";
  const std::string cmd = std::string(STASH_CLI_PATH) + " " + args + " >" + out + " 2>" + err;
  const int st = std::system(cmd.c_str());
  run_result r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

class CliPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir();
    profile_ = stash::planner::testing::llama_like(6, 17);
    profile_path_ = dir_ + "stash_cli_profile.json";
    std::ofstream(profile_path_) << profile_to_json(profile_).dump(1);
    min_ = min_feasible_budget(profile_);
    keep_ = evaluate(profile_, keep_all(profile_), UINT64_MAX).peak_bytes;
  }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + name) << text;
    return dir_ + name;
  }
  std::string dir_, profile_path_;
  step_profile profile_;
  std::uint64_t min_ = 0, keep_ = 0;
};

}  // namespace

TEST_F(CliPlan, PlanWritesAValidPlanThatCheckAccepts) {
  const std::string plan = dir_ + "stash_cli_plan.json";
  const std::uint64_t budget = (min_ + keep_) / 2;
  for (const char* solver : {"greedy", "ilp", "exact"}) {
    const run_result r = run_stash("plan --profile " + profile_path_ + " --budget " +
                               std::to_string(budget) + " --solver " + solver + " --time-limit 3 -o " + plan);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("peak"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("keep-all"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("recompute-all"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("offloaded"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("binding"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("lower_bound"), std::string::npos) << r.out;
    const json j = json::parse(slurp(plan));
    EXPECT_EQ(j["solver"], solver);
    EXPECT_EQ(j["budget_bytes"], budget);
    const run_result c = run_stash("check --profile " + profile_path_ + " --plan " + plan);
    EXPECT_EQ(c.code, 0) << c.out << c.err;
    EXPECT_NE(c.out.find("valid"), std::string::npos);
  }
}

TEST_F(CliPlan, BudgetAcceptsUnits) {
  // The keep-all peak rounded up to whole MiB always fits.
  const std::uint64_t mib = (keep_ + 1048575) / 1048576;
  const run_result r = run_stash("plan --profile " + profile_path_ + " --budget " +
                             std::to_string(mib) + "MiB");
  EXPECT_EQ(r.code, 0) << r.err;
  const run_result bad = run_stash("plan --profile " + profile_path_ + " --budget 80XiB");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("unknown unit"), std::string::npos) << bad.err;
}

TEST_F(CliPlan, InfeasibleBudgetExitsOneWithTheSmallestBudget) {
  const run_result r = run_stash("plan --profile " + profile_path_ + " --budget " +
                             std::to_string(min_ - 1));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("smallest feasible budget is " + std::to_string(min_) + " bytes"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("GiB)"), std::string::npos) << r.err;
}

// Note [A budget too small is an answer] in planner/solvers/planner.cpp: exit 1, the smallest named.
TEST_F(CliPlan, BudgetBelowFixedBytesIsInfeasibleWithTheSmallestBudget) {
  const run_result r = run_stash("plan --profile " + profile_path_ + " --budget 1GiB");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("smallest feasible budget is " + std::to_string(min_) + " bytes"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("below the profile's fixed_bytes"), std::string::npos) << r.err;
}

TEST_F(CliPlan, MalformedProfilesExitTwoNamingTheProblem) {
  const std::string bad_json = write("stash_cli_bad.json", "{\"schema\": ");
  run_result r = run_stash("plan --profile " + bad_json + " --budget 80GiB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos) << r.err;

  json j = profile_to_json(profile_);
  j["schema"] = "stash.profile/9";
  r = run_stash("plan --profile " + write("stash_cli_schema.json", j.dump()) + " --budget 80GiB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unsupported profile schema"), std::string::npos) << r.err;

  j = profile_to_json(profile_);
  j["layers"][2]["tensors"][3]["bytes"] = -4096;
  r = run_stash("plan --profile " + write("stash_cli_neg.json", j.dump()) + " --budget 80GiB");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("layers[2].tensors[3].bytes"), std::string::npos) << r.err;

  j = profile_to_json(profile_);
  j["layers"][1].erase("bwd_ms");
  r = run_stash("check --profile " + write("stash_cli_missing.json", j.dump()) + " --plan x.json");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("layers[1].bwd_ms: missing"), std::string::npos) << r.err;

  r = run_stash("plan --profile " + profile_path_ + ".nonexistent --budget 80GiB");
  EXPECT_EQ(r.code, 2);
}

TEST_F(CliPlan, CheckNamesTheViolatedConstraints) {
  // Keep-all under a budget that only the planner's plan fits.
  step_plan plan = make_plan(profile_, min_);
  for (auto& l : plan.layers) std::fill(l.actions.begin(), l.actions.end(), tensor_action::keep);
  const std::string path = write("stash_cli_keepall.json", plan_to_json(plan).dump());
  run_result r = run_stash("check --profile " + profile_path_ + " --plan " + path);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("INVALID"), std::string::npos);
  EXPECT_NE(r.err.find("violated: peak:backward[5]"), std::string::npos) << r.err;

  // A rule broken: the last layer offloads.
  plan.layers.back().actions[0] = tensor_action::offload;
  r = run_stash("check --profile " + profile_path_ + " --plan " +
            write("stash_cli_rule.json", plan_to_json(plan).dump()) + " --budget " +
            std::to_string(keep_ * 2));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("violated: rule:layers[5].tensors[0]:last_layer"), std::string::npos)
      << r.err;

  // A plan for another model is bad input, not a verdict.
  json j = plan_to_json(plan);
  j["layers"].erase(0);
  r = run_stash("check --profile " + profile_path_ + " --plan " +
            write("stash_cli_short.json", j.dump()));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("plan has 5 layers, profile has 6"), std::string::npos) << r.err;
}

// Note [One check of the plan options] in planner/solvers/planner.h: plan and pareto print the
// planner's one wording, exit 2.
TEST_F(CliPlan, PlanAndParetoReportBadOptionsInThePlannersWords) {
  auto says = [](const plan_options& o) -> std::string {
    try {
      check_plan_options(o);
    } catch (const stash::input_error& e) {
      return e.what();
    }
    return "";
  };
  plan_options zero_time;
  zero_time.time_limit_s = 0;
  plan_options negative_gap;
  negative_gap.mip_gap = -1;
  const std::string budget = " --budget " + std::to_string(keep_);
  for (const char* cmd : {"plan", "pareto"}) {
    const std::string head = std::string(cmd) + " --profile " + profile_path_;
    run_result r = run_stash(head + (cmd[1] == 'l' ? budget : "") + " --time-limit 0");
    EXPECT_EQ(r.code, 2) << cmd << r.err;
    EXPECT_EQ(r.err, "stash: error: " + says(zero_time) + "\n") << cmd;
    r = run_stash(head + (cmd[1] == 'l' ? budget : "") + " --solver magic");
    EXPECT_EQ(r.code, 2) << cmd << r.err;
    EXPECT_EQ(r.err, "stash: error: unknown solver \"magic\" (expected greedy, ilp or exact)\n")
        << cmd;
  }
  const run_result r = run_stash("plan --profile " + profile_path_ + budget + " --mip-gap -1");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_EQ(r.err, "stash: error: " + says(negative_gap) + "\n");
}
