// plan.h: the planner's output, schema "stash.plan/1", and the canonical cost model that
// decides whether a plan is valid (documented in README.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/model/profile.h"

namespace stash::planner {

inline constexpr const char* kPlanSchema = "stash.plan/1";

enum class tensor_action { keep, recompute, offload };
const char* to_string(tensor_action a);
tensor_action action_from_string(const std::string& s);  // throws input_error

// decisions[i][j]: the action for tensor j of layer i.
using decision_table = std::vector<std::vector<tensor_action>>;

struct byte_fractions {  // byte fractions of a layer's saved bytes; k + r + o = 1
  double keep = 1, recompute = 0, offload = 0;
};

// The canonical model's verdict on a set of decisions.
struct evaluation {
  double step_ms = 0;          // layer_ms + step_overhead_ms
  double layer_ms = 0;         // compute + recompute + exposed: what the solvers compare
  double step_overhead_ms = 0; // the profile's, outside the layers (Note [Step overhead])
  double compute_ms = 0;       // sum of fwd + bwd
  double recompute_ms = 0;     // sum of R_i
  double exposed_copy_ms = 0;  // sum of the max(0, ...) copy terms
  std::uint64_t peak_bytes = 0;
  std::string peak_at;         // "forward[3]" | "backward[3]"
  std::uint64_t offloaded_bytes = 0;
  std::uint64_t recomputed_bytes = 0;
  bool valid = false;          // peak <= budget, host fits, and every rule respected
  // Each violated constraint, by name: "peak:forward[3]", "peak:backward[3]", "host",
  // "rule:layers[2].tensors[5]:must_keep", "rule:...:min_offload_bytes", "rule:...:last_layer",
  // "rule:...:not_offloadable", "rule:...:not_recomputable".
  std::vector<std::string> violations;
};

// Canonical cost model (issue "Planner"):
//   step = sum_i (fwd_i + bwd_i + R_i)
//        + sum_{i<L-1} [max(0, O_i/d2h - fwd_{i+1}) + max(0, O_i/h2d - bwd_{i+1})]
//        + step_overhead
// Note [Step overhead]
// ~~~~~~~~~~~~~~~~~~~~
// step_overhead_ms is the step's time outside every layer: the loss, the optimizer, input
// uploads. It is the same for every set of decisions, so it never enters a solver: they
// compare layer_ms (the first two lines, computed exactly as step_ms was before the field
// existed), and plans, polish moves and Pareto samples are bit-for-bit those of a profile
// without it. It is no copy window either: crediting the loss as time to hide the last
// forward offloads would make it a decision variable. Reported step times, baselines, the
// lower bound and the simulator's timeline all include it (the simulator runs it as one
// compute span at the loss turn, after the turn barrier, simulator.h).
//   forward_i  = fixed + sum_{l<i} K_l + O_{i-1} + A_i
//   backward_i = fixed + sum_{l<i} K_l + A_i + O_{i-1} + bwd_temp_i + rtemp_i
//   rtemp_i    = ceil(bwd_recompute_temp_i * Rb_i / S_i)   (0 when S_i = 0)
//                S_i: bytes of layer i's tensors allowed to recompute (recomputable_bytes),
//                Rb_i: bytes of those the plan recomputes
//   loss       = fixed + sum_{l<L} K_l + O_{L-1} + loss_bytes
//   peak = max(max_i max(forward_i, backward_i), loss, optimizer);
//   host: sum O_i <= pinnable_bytes.
// Note [Backward temporaries of a recompute]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A recomputed layer's backward holds, besides bwd_temp_i, the replay's own intermediates
// until its backward consumes them. A profile measured with every layer recomputed (fit's
// measuring step) sees them in every layer's backward temporaries; a constant bwd_temp_i
// then over-prices a layer the plan keeps and under-prices one it recomputes in part
// (issue 21: 8.7 MB and 2.2 MB under torch.compile). So the profile may split them off as
// bwd_recompute_temp_i, measured with the whole layer recomputed, and a plan pays the
// share of the layer's recomputable bytes it recomputes, Rb_i / S_i. Linear in the
// decisions: the LP and the MIPs put the coefficient bwd_recompute_temp_i / S_i on layer
// i's own recompute columns in the row peak:backward[i], and nowhere else (the forward
// makes none of it, and it is freed with the layer's backward). evaluate() rounds the
// exact rational up; since every other term and the budget are whole bytes,
// x + ceil(t) <= budget exactly when x + t <= budget, so evaluate and the rows admit the
// same plans. The inner solvers round the LP's recompute up as before, and repair may
// recompute less of a layer whose own backward ends over the budget (inner_solver.h).
// With bwd_recompute_temp_i 0 the term is 0 and no row gains a coefficient: every figure
// is the model's without it. It does break one old shortcut: recompute is no longer
// always the least-peak action (it raises its own layer's backward), so the least peak of
// such a profile is searched for (Note [The least peak with recompute temporaries] in
// planner.cpp). In a prefix profile a plan that recomputes a deep link alone pays a
// smaller share than the prefix through it, but the replay makes the whole prefix anyway;
// the solvers still search prefix plans only (Note [Recompute by prefix]).
// Note [The loss's position]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~
// loss is the position between the last layer's forward and its backward: the head, the
// loss and their backward run with every layer's kept tensors alive and none of the last
// layer's recomputed ones (its replay starts with its backward). Its loss_bytes (0 when
// absent) are what they hold above that. Counting them as the last layer's bwd_temp_bytes
// instead would put them beside the last layer's replayed activations, which they never
// meet: a model whose head is large next to a layer (logits over a big vocabulary) would
// be refused budgets that full checkpointing trains in. As position L it has the shape of
// every other (the layers' kept bytes before it, the previous layer's offload still in
// flight), so the solvers take it as one more peak row (peak:loss). With loss_bytes 0 it
// never binds: backward[L-1] holds at least as much. peak_at names it "loss".
// Note [The optimizer's position]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// optimizer is the profile's optimizer_bytes (0 when absent): what the step holds after
// its last backward, with no activation alive. fixed_bytes is what every position holds;
// a profile may count gradients made in backward (a loop that zeroes them to None) in
// backward_i's bwd_temp_i, as they are made, and all of them only here. No
// decision moves it, so no solver sees it: a budget below it is infeasible, with it as the
// smallest feasible budget when nothing else binds; above it, plans are those of a profile
// without it. peak_at names it "optimizer" when it is the peak.
// The decision table must have one entry per tensor (input_error otherwise).
evaluation evaluate(const step_profile& p, const decision_table& d, std::uint64_t budget_bytes);

// The actions a tensor may take under the rules (must_keep, offloadable, recomputable,
// 1 MiB floor, last layer).
bool allowed(const step_profile& p, std::size_t layer, std::size_t tensor, tensor_action a);

decision_table keep_all(const step_profile& p);

// Note [Backward temporaries of a recompute]: S_i, the bytes of layer i's tensors the
// rules allow to recompute (what recompute_all recomputes).
std::uint64_t recomputable_bytes(const step_profile& p, std::size_t layer);
// rtemp_i for R_i = recomputed_bytes (at most S_i): ceil(bwd_recompute_temp_i * R_i / S_i),
// exact in 128 bits; 0 when S_i or bwd_recompute_temp_i is 0.
std::uint64_t recompute_temp_bytes(const layer_profile& l, std::uint64_t recomputed_bytes,
                                   std::uint64_t recomputable);
// The same for one layer's actions (tensors recomputed that may not be count for nothing).
std::uint64_t recompute_temp_bytes(const step_profile& p, std::size_t layer,
                                   const std::vector<tensor_action>& actions);

// Note [Recompute by prefix]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~
// A profile's recompute_cost says how a layer's recompute is paid. per_tensor (the
// default, the analytic model's): R_i is the sum of the recomputed tensors' recompute_ms,
// each tensor's producer run from kept inputs. prefix (stash.torch.fit's eager blocks,
// Note [Recompute cost as the replay pays it] in _fit_measure.py): a layer is recomputed by
// re-running its forward from its input up to the last tensor it needs, so R_i is the sum
// of recompute_ms over every tensor of the layer up to its last recomputed one, whatever
// their actions. The replay makes every tensor before that one again anyway, so a plan
// that keeps or offloads one of them pays time for nothing and holds its bytes twice:
// the plans worth having recompute a prefix of the layer's chain (the tensors allowed
// to recompute that have bytes, in save order), and the solvers search only those (a
// monotone row per chain link in the LP and the MIPs, the prefix length enumerated by the
// inner solver, repair and polish moving only the prefix's end). They work on
// chain_priced(p), where each chain tensor's recompute_ms is the cost of extending the
// replay to it from the chain tensor before, so that the additive sum over a prefix is
// exactly what the replay pays and every term they add up is the model's. Solving
// per_tensor and closing each layer's prefix afterwards (what fit did before) prices a
// deep, cheap-looking tensor at its own cost and then pays the whole replay to it: the
// closure cannot lower the time it raised, and the plans came out near full
// checkpointing with the budget unused (issue 20).
double layer_recompute_ms(const step_profile& p, std::size_t layer,
                          const std::vector<tensor_action>& actions);
// The layer's chain (empty for a per_tensor profile).
std::vector<std::size_t> recompute_chain(const step_profile& p, std::size_t layer);
// The profile with each chain tensor's recompute_ms the cost of extending the replay to
// it, and every other tensor's 0 (p itself for a per_tensor profile).
step_profile chain_priced(const step_profile& p);
// Recomputes every tensor allowed to that comes before its layer's last recomputed one
// (prefix profiles only; it lowers no time and can only lower the peak, but for the
// recompute temporaries of the layer's own backward, Note [Backward temporaries of a
// recompute]). Returns the number of tensors changed.
std::size_t close_prefixes(const step_profile& p, decision_table& d);
// Recomputes every recomputable tensor that is not must_keep; keeps the rest.
decision_table recompute_all(const step_profile& p);

struct baseline {
  double step_ms = 0;
  std::uint64_t peak_bytes = 0;
};

struct prediction {
  double step_ms = 0;
  std::uint64_t peak_bytes = 0;
  std::string peak_at;
  double exposed_copy_ms = 0;
  double recompute_ms = 0;
  std::uint64_t offloaded_bytes = 0;
  double lower_bound_ms = 0;  // step time of the whole model's LP relaxation
  double gap = 0;             // step_ms / lower_bound_ms - 1
};

struct layer_plan {
  std::size_t index = 0;
  std::string name;
  byte_fractions fractions;
  std::vector<std::string> tensor_names;
  std::vector<tensor_action> actions;
};

struct step_plan {
  std::uint64_t budget_bytes = 0;
  std::string solver;  // greedy | ilp | exact
  double solve_ms = 0;
  std::string profile_sha256;
  std::vector<layer_plan> layers;
  prediction predicted;
  baseline keep_all, recompute_all;
  std::vector<std::string> binding_constraints;  // names of LP rows at their bound
  bool proved_optimal = false;                   // exact only
  double mip_gap = 0;                            // exact only: remaining relative gap

  decision_table decisions() const;
};

nlohmann::json plan_to_json(const step_plan& plan);

// Note [One plan reader]
// ~~~~~~~~~~~~~~~~~~~~~~
// Every stash.plan/1 document is read by one parser (plan.cpp), with or without a profile:
// `stash check` and `stash simulate` (load_plan), the C API's planner (stash_plan_evaluate),
// the engine (stash_engine_load_plan: engine_plan::from_file) and Python (plan_actions,
// through stash_plan_actions). Errors are input_error "<json path>: <problem>", e.g.
// "layers[3].tensors[2].action: unknown action \"evict\" (...)"; the file readers prefix
// the path ("plan.json: layers[3]..."). Checks run in document order, so the first
// problem reported is the first in the document.
//  * Both readers: a JSON object; "schema" is "stash.plan/1"; "budget_bytes" a
//    non-negative integer and "solver" a string when present; "layers" a non-empty array
//    of objects, each with "index" (when present) its position, "name" (when present) a
//    string, "tensors" an array of objects with "name" (when present) a string and
//    "action" one of keep, recompute, offload. Other fields are read leniently or ignored.
//  * Without a profile (read_plan): that is all. A missing name reads as "" (the engine
//    calls such a tensor "t<index>"); budget_bytes and solver may be absent.
//  * With a profile (plan_from_json): budget_bytes, solver and every name are required,
//    and the layers and their tensors must be the profile's, in order and by name.
// Validity under a budget and the rules is evaluate()'s job, never the reader's.
step_plan read_plan(const nlohmann::json& j);
step_plan read_plan_file(const std::string& path);  // read_json_file, then read_plan
step_plan plan_from_json(const nlohmann::json& j, const step_profile& p);
step_plan load_plan(const std::string& path, const step_profile& p);  // read, then plan_from_json

}  // namespace stash::planner
