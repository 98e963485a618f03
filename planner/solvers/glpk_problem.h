// glpk_problem.h: the only door to GLPK. Everything else in the planner is GLPK-free.
//
// GLPK reports misuse (a duplicate column in a row, an out-of-range index, a bad bound
// type) by printing and calling abort(). This wrapper validates every argument before it
// reaches GLPK and throws std::logic_error instead, so a planner bug is a C++ exception.
// Terminal output is switched off: the planner never prints from inside a solve.
//
// Thread safety: one glpk_problem per thread; GLPK keeps per-thread environment state.
#pragma once

#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace stash::planner {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

enum class solve_status { optimal, feasible, infeasible, unbounded, failed };
const char* to_string(solve_status s);

struct mip_outcome {
  solve_status status = solve_status::failed;
  bool proved_optimal = false;  // branch and bound finished (within the requested gap)
  double objective = 0;
  double best_bound = 0;        // best known lower bound on the objective
  double gap = 0;               // (objective - best_bound) / |objective|, 0 when proved
  double lp_relaxation = 0;     // objective of the root LP relaxation
};

// A minimisation problem with named rows and columns, owned RAII-style.
class glpk_problem {
 public:
  explicit glpk_problem(const std::string& name);
  ~glpk_problem();
  glpk_problem(const glpk_problem&) = delete;
  glpk_problem& operator=(const glpk_problem&) = delete;

  // Column with bounds [lo, hi] (either may be +-kInf) and objective coefficient.
  // Returns a 0-based index.
  int add_col(const std::string& name, double lo, double hi, double cost, bool integer = false);
  // Row lo <= sum coef * col <= hi. Duplicate columns are merged and zeros dropped.
  int add_row(const std::string& name, double lo, double hi,
              std::vector<std::pair<int, double>> coefs);
  void set_col_bounds(int col, double lo, double hi);
  void set_row_bounds(int row, double lo, double hi);
  void set_cost(int col, double cost);

  int num_cols() const;
  int num_rows() const;

  // Primal simplex with presolve. On success values and duals are available.
  solve_status solve_lp();
  // Branch and bound. Solves the LP relaxation first (without presolve, so that a
  // heuristic start can be given in the original column space), then glp_intopt.
  // `start`, if non-empty, is a full integer-feasible column vector offered to the
  // search as its first incumbent. `node_limit` > 0 ends the search after that many
  // subproblems, whatever the clock says (Note [A search that ends the same way] in
  // planner.cpp).
  mip_outcome solve_mip(double time_limit_s, double mip_gap, const std::vector<double>& start,
                        long node_limit = 0);

  double objective() const;
  double col_value(int col) const;  // LP or MIP value, whichever was solved last
  double row_activity(int col) const;
  double row_dual(int row) const;   // LP only
  const std::string& row_name(int row) const { return row_names_.at(row); }
  const std::string& col_name(int col) const { return col_names_.at(col); }
  // Rows whose dual is non-zero: the constraints that hold the LP optimum where it is.
  std::vector<std::string> binding_rows(double tol = 1e-9) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::vector<std::string> row_names_, col_names_;
  bool last_was_mip_ = false;
};

}  // namespace stash::planner
