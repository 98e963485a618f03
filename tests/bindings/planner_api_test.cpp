// The planner through the C API (stash.h, "Planner"): the same plan `stash plan` makes,
// the same messages, statuses for every failure, and versioned structs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/solvers/planner.h"
#include "planner/model/profile.h"
#include "stash.h"
#include "test_paths.h"

namespace {

namespace pl = stash::planner;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::string& llama_profile() {
  static const std::string text =
      read_text(STASH_TEST_PATH(STASH_PROFILES_DIR) + "/llama3-8b_h200_b4_s4096.json");
  return text;
}

// Two identical layers of three tensors, small enough for every solver.
std::string tiny_profile() {
  const nlohmann::json layer = {
      {"name", "block"}, {"signature", "b"}, {"fwd_ms", 2.0}, {"bwd_ms", 4.0},
      {"bwd_temp_bytes", 0},
      {"tensors",
       {{{"name", "input"}, {"bytes", 8 << 20}, {"recompute_ms", 0.0}, {"offloadable", true},
         {"recomputable", false}, {"must_keep", false}},
        {{"name", "a"}, {"bytes", 16 << 20}, {"recompute_ms", 0.5}, {"offloadable", true},
         {"recomputable", true}, {"must_keep", false}},
        {{"name", "b"}, {"bytes", 16 << 20}, {"recompute_ms", 1.5}, {"offloadable", true},
         {"recomputable", true}, {"must_keep", false}}}}};
  nlohmann::json l0 = layer, l1 = layer, l2 = layer;
  l0["name"] = "block.0";
  l1["name"] = "block.1";
  l2["name"] = "block.2";
  const nlohmann::json p = {{"schema", "stash.profile/1"}, {"source", "measured"},
                            {"device", {{"name", "test"}, {"memory_bytes", 0}}},
                            {"link", {{"h2d_gbps", 10.0}, {"d2h_gbps", 10.0},
                                      {"bidir_gbps", 16.0}, {"local_ranks", 1}}},
                            {"host", {{"pinnable_bytes", 1ull << 32}}},
                            {"fixed_bytes", 64 << 20},
                            {"layers", {l0, l1, l2}}};
  return p.dump();
}

// solve_ms differs between two solves of the same problem; nothing else may.
nlohmann::json without_time(nlohmann::json j) {
  j.erase("solve_ms");
  return j;
}

struct PlanText {
  char* text = nullptr;
  ~PlanText() { stash_free(text); }
};

TEST(PlannerApi, SamePlanAsThePlannerAndTheCli) {
  const std::string& text = llama_profile();
  ASSERT_FALSE(text.empty());
  PlanText out;
  stash_plan_result_t r;
  stash_plan_result_init(&r);
  ASSERT_EQ(stash_plan_make(text.c_str(), "70%", nullptr, &out.text, &r), STASH_OK)
      << stash_last_error();
  ASSERT_NE(out.text, nullptr);
  const nlohmann::json got = nlohmann::json::parse(out.text);
  EXPECT_EQ(got.at("schema"), "stash.plan/1");

  const pl::step_profile p = pl::profile_from_json(nlohmann::json::parse(text));
  const std::uint64_t budget = pl::parse_budget("70%", p);
  const pl::step_plan want = pl::make_plan(p, budget);
  EXPECT_EQ(without_time(got), without_time(pl::plan_to_json(want)));
  EXPECT_EQ(r.budget_bytes, budget);
  EXPECT_EQ(r.keep_all_peak_bytes, want.keep_all.peak_bytes);
  EXPECT_EQ(r.predicted_peak_bytes, want.predicted.peak_bytes);
  EXPECT_LE(r.predicted_peak_bytes, budget);
  EXPECT_DOUBLE_EQ(r.predicted_step_ms, want.predicted.step_ms);
  EXPECT_EQ(r.min_feasible_bytes, 0u);
}

TEST(PlannerApi, EverySolverAndTheOptionsTheyTake) {
  const std::string text = tiny_profile();
  for (stash_solver_t s : {STASH_SOLVER_GREEDY, STASH_SOLVER_ILP, STASH_SOLVER_EXACT}) {
    stash_plan_options_t o;
    stash_plan_options_init(&o);
    EXPECT_EQ(o.solver, STASH_SOLVER_GREEDY);
    EXPECT_EQ(o.time_limit_s, 60);
    EXPECT_EQ(o.polish, 1);
    o.solver = s;
    o.time_limit_s = 10;
    PlanText out;
    ASSERT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out.text, nullptr), STASH_OK)
        << stash_last_error();
    const nlohmann::json j = nlohmann::json::parse(out.text);
    EXPECT_EQ(j.at("solver"), s == STASH_SOLVER_GREEDY ? "greedy" : s == STASH_SOLVER_ILP ? "ilp"
                                                                                           : "exact");
  }
  stash_plan_options_t o;
  stash_plan_options_init(&o);
  o.solver = static_cast<stash_solver_t>(7);
  char* out = reinterpret_cast<char*>(1);
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);
  EXPECT_NE(std::string(stash_last_error()).find("unknown solver 7"), std::string::npos);
  stash_plan_options_init(&o);
  o.time_limit_s = 0;
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("time_limit_s"), std::string::npos);
}

// Note [One check of the plan options] in planner/solvers/planner.h: the C API reports the
// planner's check in its words, as the CLI does.
TEST(PlannerApi, BadOptionsAreThePlannersOneCheck) {
  const std::string text = tiny_profile();
  auto planner_says = [](const pl::plan_options& opt) -> std::string {
    try {
      pl::check_plan_options(opt);
    } catch (const stash::input_error& e) {
      return e.what();
    }
    return "";
  };
  for (int k = 0; k < 4; ++k) {
    stash_plan_options_t o;
    stash_plan_options_init(&o);
    pl::plan_options opt;
    if (k == 0) o.solver = static_cast<stash_solver_t>(7), opt.solver = pl::solver_kind(7);
    if (k == 1) o.time_limit_s = opt.time_limit_s = -2;
    if (k == 2) o.mip_gap = opt.mip_gap = -0.25;
    if (k == 3) o.time_limit_s = opt.time_limit_s = std::nan("");
    const std::string want = planner_says(opt);
    ASSERT_FALSE(want.empty()) << k;
    char* out = reinterpret_cast<char*>(1);
    EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
              STASH_ERROR_INVALID_ARGUMENT);
    EXPECT_EQ(out, nullptr);
    EXPECT_EQ(std::string(stash_last_error()), "stash_plan_make: options: " + want);
  }
}

TEST(PlannerApi, InfeasibleBudgetGivesTheSmallestFeasibleOne) {
  const std::string text = tiny_profile();
  const pl::step_profile p = pl::profile_from_json(nlohmann::json::parse(text));
  const std::uint64_t min = pl::min_feasible_budget(p);
  ASSERT_GT(min, p.fixed_bytes);
  for (const std::string& budget : {std::to_string(min - 1), std::to_string(p.fixed_bytes - 1)}) {
    PlanText out;
    stash_plan_result_t r;
    stash_plan_result_init(&r);
    EXPECT_EQ(stash_plan_make(text.c_str(), budget.c_str(), nullptr, &out.text, &r),
              STASH_ERROR_INFEASIBLE_BUDGET)
        << budget;
    EXPECT_EQ(out.text, nullptr);
    EXPECT_EQ(r.min_feasible_bytes, min) << budget;
    EXPECT_EQ(r.min_feasible_proved, 1);
    EXPECT_EQ(r.budget_bytes, std::stoull(budget));
    const std::string msg = stash_last_error();
    EXPECT_NE(msg.find("stash_plan_make: "), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::to_string(min) + " bytes"), std::string::npos) << msg;
    EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  }
  // The smallest feasible budget is feasible.
  PlanText out;
  EXPECT_EQ(stash_plan_make(text.c_str(), std::to_string(min).c_str(), nullptr, &out.text,
                            nullptr),
            STASH_OK)
      << stash_last_error();
  EXPECT_STREQ(stash_status_string(STASH_ERROR_INFEASIBLE_BUDGET), "infeasible budget");
  EXPECT_EQ(STASH_ERROR_INFEASIBLE_BUDGET, 106);
}

// Note [A budget too small is an answer] in planner/solvers/planner.cpp: below the fixed bytes the C
// API reports make_plan's own refusal, word for word, with its smallest feasible budget.
TEST(PlannerApi, BelowTheFixedBytesIsThePlannersOwnRefusal) {
  const std::string text = tiny_profile();
  const pl::step_profile p = pl::profile_from_json(nlohmann::json::parse(text));
  const std::uint64_t budget = p.fixed_bytes - 1;
  std::string planner_says;
  try {
    pl::make_plan(p, budget);
  } catch (const pl::infeasible_budget& e) {
    planner_says = e.what();
  }
  ASSERT_NE(planner_says.find("below the profile's fixed_bytes"), std::string::npos)
      << planner_says;
  PlanText out;
  stash_plan_result_t r;
  stash_plan_result_init(&r);
  ASSERT_EQ(stash_plan_make(text.c_str(), std::to_string(budget).c_str(), nullptr, &out.text, &r),
            STASH_ERROR_INFEASIBLE_BUDGET);
  EXPECT_EQ(std::string(stash_last_error()), "stash_plan_make: " + planner_says);
  EXPECT_EQ(r.budget_bytes, budget);
  EXPECT_EQ(r.min_feasible_bytes, pl::min_feasible_budget(p));
  EXPECT_EQ(r.min_feasible_proved, 1);
  EXPECT_EQ(r.keep_all_peak_bytes, pl::evaluate(p, pl::keep_all(p), UINT64_MAX).peak_bytes);
  EXPECT_EQ(r.predicted_peak_bytes, 0u);
}

// stash_plan_min_feasible is the figure a refusal names, without asking for a plan (what
// a caller that only wants the smallest budget used to get from planning at "1").
TEST(PlannerApi, MinFeasibleIsTheFigureARefusalNames) {
  const std::string text = tiny_profile();
  const pl::step_profile p = pl::profile_from_json(nlohmann::json::parse(text));
  std::uint64_t min = 0;
  int proved = -1;
  ASSERT_EQ(stash_plan_min_feasible(text.c_str(), &min, &proved), STASH_OK) << stash_last_error();
  EXPECT_EQ(min, pl::min_feasible_budget(p));
  EXPECT_GT(min, p.fixed_bytes);
  EXPECT_EQ(proved, 1);
  PlanText out;
  stash_plan_result_t r;
  stash_plan_result_init(&r);
  EXPECT_EQ(stash_plan_make(text.c_str(), "1", nullptr, &out.text, &r),
            STASH_ERROR_INFEASIBLE_BUDGET);
  EXPECT_EQ(r.min_feasible_bytes, min);
  PlanText at_min;
  EXPECT_EQ(stash_plan_make(text.c_str(), std::to_string(min).c_str(), nullptr, &at_min.text,
                            nullptr),
            STASH_OK)
      << stash_last_error();
  std::uint64_t again = 0;
  EXPECT_EQ(stash_plan_min_feasible(text.c_str(), &again, nullptr), STASH_OK);
  EXPECT_EQ(again, min);

  EXPECT_EQ(stash_plan_min_feasible("{\"schema\": \"stash.profile/9\"}", &again, nullptr),
            STASH_ERROR_BAD_PROFILE);
  EXPECT_NE(std::string(stash_last_error()).find("stash_plan_min_feasible: "), std::string::npos)
      << stash_last_error();
  EXPECT_NE(std::string(stash_last_error()).find("schema"), std::string::npos);
  EXPECT_EQ(stash_plan_min_feasible("{not json", &again, nullptr), STASH_ERROR_BAD_PROFILE);
  EXPECT_NE(std::string(stash_last_error()).find("not JSON"), std::string::npos);
  EXPECT_EQ(stash_plan_min_feasible(nullptr, &again, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("profile_json is NULL"), std::string::npos);
  EXPECT_EQ(stash_plan_min_feasible(text.c_str(), nullptr, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("min_feasible_bytes is NULL"), std::string::npos);
}

TEST(PlannerApi, BadInputNamesTheProblem) {
  char* out = nullptr;
  EXPECT_EQ(stash_plan_make("{\"schema\": \"stash.profile/9\"}", "1GiB", nullptr, &out, nullptr),
            STASH_ERROR_BAD_PROFILE);
  EXPECT_NE(std::string(stash_last_error()).find("schema"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_plan_make("{not json", "1GiB", nullptr, &out, nullptr), STASH_ERROR_BAD_PROFILE);
  EXPECT_NE(std::string(stash_last_error()).find("not JSON"), std::string::npos);
  const std::string text = tiny_profile();
  EXPECT_EQ(stash_plan_make(text.c_str(), "70 parsecs", nullptr, &out, nullptr),
            STASH_ERROR_BAD_PROFILE);
  EXPECT_NE(std::string(stash_last_error()).find("70 parsecs"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(stash_plan_make(nullptr, "1GiB", nullptr, &out, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("profile_json is NULL"), std::string::npos);
  EXPECT_EQ(stash_plan_make(text.c_str(), nullptr, nullptr, &out, nullptr),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_plan_make(text.c_str(), "1GiB", nullptr, nullptr, nullptr),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(stash_status_string(STASH_ERROR_BAD_PROFILE), "bad profile");
  stash_free(nullptr);
  stash_plan_options_init(nullptr);
  stash_plan_result_init(nullptr);
}

TEST(PlannerApi, ValidateAcceptsWhatThePlannerReads) {
  EXPECT_EQ(stash_profile_validate(llama_profile().c_str()), STASH_OK) << stash_last_error();
  EXPECT_EQ(stash_profile_validate(tiny_profile().c_str()), STASH_OK) << stash_last_error();
}

TEST(PlannerApi, ValidateNamesTheFirstBadField) {
  const auto expect_bad = [](const nlohmann::json& doc, const std::string& message) {
    const std::string text = doc.dump();
    EXPECT_EQ(stash_profile_validate(text.c_str()), STASH_ERROR_BAD_PROFILE) << message;
    EXPECT_EQ(std::string(stash_last_error()), "stash_profile_validate: " + message);
    // The planner refuses the same text with the same words.
    char* out = nullptr;
    EXPECT_EQ(stash_plan_make(text.c_str(), "1GiB", nullptr, &out, nullptr),
              STASH_ERROR_BAD_PROFILE);
    EXPECT_NE(std::string(stash_last_error()).find(message), std::string::npos)
        << stash_last_error();
  };
  const nlohmann::json good = nlohmann::json::parse(tiny_profile());
  nlohmann::json bad = good;
  bad["layers"][0]["tensors"][1]["name"] = "input";
  expect_bad(bad, "layers[0].tensors[1].name: duplicate tensor name \"input\" in layer");
  bad = good;
  bad["link"].erase("h2d_gbps");
  expect_bad(bad, "link.h2d_gbps: missing required field");
  bad = good;
  bad["layers"][2]["tensors"][0]["bytes"] = -1;
  expect_bad(bad, "layers[2].tensors[0].bytes: must be a non-negative integer, got -1");
  bad = good;
  bad["layers"] = nlohmann::json::array();
  expect_bad(bad, "layers: must list at least one layer");
  expect_bad(nlohmann::json::array(), "<root>: expected an object, got array");
}

TEST(PlannerApi, ValidateRefusesTextThatIsNotJsonAndNull) {
  EXPECT_EQ(stash_profile_validate("{not json"), STASH_ERROR_BAD_PROFILE);
  EXPECT_EQ(std::string(stash_last_error()).rfind("stash_profile_validate: the profile is not "
                                                  "JSON: ", 0), 0u) << stash_last_error();
  EXPECT_EQ(stash_profile_validate(nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_STREQ(stash_last_error(), "stash_profile_validate: profile_json is NULL");
}

TEST(PlannerApi, OptionsOfAnUnknownSizeOrVersionAreRefused) {
  const std::string text = tiny_profile();
  stash_plan_options_t o;
  stash_plan_options_init(&o);
  char* out = nullptr;
  o.struct_size = sizeof o + 8;  // a newer header than this library
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
            STASH_ERROR_VERSION_MISMATCH);
  EXPECT_NE(std::string(stash_last_error()).find("struct_size"), std::string::npos);
  o.struct_size = sizeof(size_t);  // shorter than the first version
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
            STASH_ERROR_VERSION_MISMATCH);
  stash_plan_options_init(&o);
  o.version = 2;
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", &o, &out, nullptr),
            STASH_ERROR_VERSION_MISMATCH);

}

TEST(PlannerApi, ResultOfAnOldSizeIsRefusedBelowTheFirstVersion) {
  const std::string text = tiny_profile();
  stash_plan_result_t r;
  stash_plan_result_init(&r);
  r.struct_size = offsetof(stash_plan_result_t, keep_all_peak_bytes);
  char* out = nullptr;
  EXPECT_EQ(stash_plan_make(text.c_str(), "160MiB", nullptr, &out, &r),
            STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(out, nullptr);
}

TEST(PlannerApi, EvaluatePricesAPlanAndNamesViolations) {
  const std::string text = tiny_profile();
  PlanText out;
  stash_plan_result_t made;
  stash_plan_result_init(&made);
  ASSERT_EQ(stash_plan_make(text.c_str(), "160MiB", nullptr, &out.text, &made), STASH_OK);
  stash_plan_result_t r;
  stash_plan_result_init(&r);
  ASSERT_EQ(stash_plan_evaluate(text.c_str(), out.text, 0, &r), STASH_OK) << stash_last_error();
  EXPECT_EQ(r.predicted_peak_bytes, made.predicted_peak_bytes);
  EXPECT_DOUBLE_EQ(r.predicted_step_ms, made.predicted_step_ms);
  EXPECT_EQ(r.budget_bytes, 160u << 20);

  // Under a smaller budget the same plan violates a peak row, named.
  stash_plan_result_init(&r);
  EXPECT_EQ(stash_plan_evaluate(text.c_str(), out.text, made.predicted_peak_bytes - 1, &r),
            STASH_ERROR_INFEASIBLE_BUDGET);
  EXPECT_NE(std::string(stash_last_error()).find("peak:"), std::string::npos)
      << stash_last_error();
  EXPECT_EQ(r.predicted_peak_bytes, made.predicted_peak_bytes);

  // The last layer offloads nothing: a rule, named.
  nlohmann::json j = nlohmann::json::parse(out.text);
  j["layers"][2]["tensors"][1]["action"] = "offload";
  EXPECT_EQ(stash_plan_evaluate(text.c_str(), j.dump().c_str(), 0, nullptr),
            STASH_ERROR_INFEASIBLE_BUDGET);
  EXPECT_NE(std::string(stash_last_error()).find("last_layer"), std::string::npos)
      << stash_last_error();

  // A plan for another model: bad plan, the field named.
  j = nlohmann::json::parse(out.text);
  j["layers"].erase(2);
  EXPECT_EQ(stash_plan_evaluate(text.c_str(), j.dump().c_str(), 0, nullptr), STASH_ERROR_BAD_PLAN);
  EXPECT_NE(std::string(stash_last_error()).find("layers"), std::string::npos)
      << stash_last_error();
}

}  // namespace

namespace {

// Note [One plan reader]: stash_plan_read_actions reads what stash_engine_load_plan reads,
// into stash_engine_set_plan's arrays.
TEST(PlannerApi, ReadActionsGivesTheEngineArrays) {
  char* text = nullptr;
  ASSERT_EQ(stash_plan_make(tiny_profile().c_str(), "70%", nullptr, &text, nullptr), STASH_OK)
      << stash_last_error();
  const std::string plan_text = text;
  stash_free(text);
  const nlohmann::json j = nlohmann::json::parse(plan_text);

  size_t n_layers = 0, n_actions = 0;
  ASSERT_EQ(stash_plan_read_actions(plan_text.c_str(), &n_layers, nullptr, 0, &n_actions,
                                    nullptr, 0),
            STASH_OK)
      << stash_last_error();
  EXPECT_EQ(n_layers, 3u);
  EXPECT_EQ(n_actions, 9u);
  std::vector<size_t> counts(n_layers);
  std::vector<stash_action_t> actions(n_actions);
  ASSERT_EQ(stash_plan_read_actions(plan_text.c_str(), nullptr, counts.data(), counts.size(),
                                    nullptr, actions.data(), actions.size()),
            STASH_OK);
  size_t at = 0;
  for (size_t i = 0; i < n_layers; ++i) {
    ASSERT_EQ(counts[i], j["layers"][i]["tensors"].size());
    for (const auto& t : j["layers"][i]["tensors"]) {
      EXPECT_EQ(stash_action_name(actions[at++]), t["action"].get<std::string>());
    }
  }
  // A short buffer takes what fits; the totals are still the plan's.
  stash_action_t first = STASH_ACTION_FORCE_INT_;
  ASSERT_EQ(stash_plan_read_actions(plan_text.c_str(), &n_layers, nullptr, 0, &n_actions,
                                    &first, 1),
            STASH_OK);
  EXPECT_EQ(first, actions[0]);
  EXPECT_EQ(n_actions, 9u);

  // The engine's plan needs no profile, names or header.
  const char* bare = R"({"schema": "stash.plan/1", "layers": [
      {"tensors": [{"action": "offload"}, {"action": "keep"}]}, {"tensors": []}]})";
  ASSERT_EQ(stash_plan_read_actions(bare, &n_layers, counts.data(), counts.size(), &n_actions,
                                    actions.data(), actions.size()),
            STASH_OK)
      << stash_last_error();
  EXPECT_EQ(n_layers, 2u);
  EXPECT_EQ(n_actions, 2u);
  EXPECT_EQ(counts[0], 2u);
  EXPECT_EQ(counts[1], 0u);
  EXPECT_EQ(actions[0], STASH_ACTION_OFFLOAD);
  EXPECT_EQ(actions[1], STASH_ACTION_KEEP);
}

TEST(PlannerApi, ReadActionsNamesTheJsonPath) {
  size_t n = 0;
  const auto bad = [&](const char* text, const char* what) {
    n = 7;
    EXPECT_EQ(stash_plan_read_actions(text, &n, nullptr, 0, nullptr, nullptr, 0),
              STASH_ERROR_BAD_PLAN)
        << text;
    EXPECT_NE(std::string(stash_last_error()).find(what), std::string::npos)
        << stash_last_error();
    EXPECT_EQ(n, 7u);  // nothing written on failure
  };
  bad(R"({"schema": "stash.plan/1", "layers": [{"tensors": [{"action": "keep"},
        {"action": "drop"}]}]})",
      "stash_plan_read_actions: plan: layers[0].tensors[1].action: unknown action \"drop\"");
  bad(R"({"schema": "stash.plan/9", "layers": [{"tensors": []}]})", "plan: schema:");
  bad(R"({"schema": "stash.plan/1", "layers": []})", "plan: layers: must be a non-empty array");
  bad(R"({"schema": "stash.plan/1", "layers": [{"tensors": [{}]}]})",
      "layers[0].tensors[0].action: missing required field");
  bad(R"({"schema": "stash.plan/1", "layers": [{"index": 1, "tensors": []}]})",
      "layers[0].index: expected 0");
  bad("{not json", "stash_plan_read_actions: the plan is not JSON");
  EXPECT_EQ(stash_plan_read_actions(nullptr, &n, nullptr, 0, nullptr, nullptr, 0),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_plan_read_actions(R"({"schema": "stash.plan/1", "layers": [{"tensors": []}]})",
                                    &n, nullptr, 1, nullptr, nullptr, 0),
            STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("tensors_per_layer is NULL"), std::string::npos)
      << stash_last_error();
}

TEST(PlannerApi, ActionNamesAreThePlanSpelling) {
  EXPECT_STREQ(stash_action_name(STASH_ACTION_KEEP), "keep");
  EXPECT_STREQ(stash_action_name(STASH_ACTION_RECOMPUTE), "recompute");
  EXPECT_STREQ(stash_action_name(STASH_ACTION_OFFLOAD), "offload");
  EXPECT_EQ(stash_action_name(static_cast<stash_action_t>(3)), nullptr);
  EXPECT_EQ(stash_action_name(STASH_ACTION_FORCE_INT_), nullptr);  // not an action
}

}  // namespace
