// glpk_problem.cpp: every GLPK call in stash lives in this file (see glpk_problem.h).
#include "planner/solvers/glpk_problem.h"

#include <glpk.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>

namespace stash::planner {

const char* to_string(solve_status s) {
  switch (s) {
    case solve_status::optimal: return "optimal";
    case solve_status::feasible: return "feasible";
    case solve_status::infeasible: return "infeasible";
    case solve_status::unbounded: return "unbounded";
    case solve_status::failed: return "failed";
  }
  return "failed";
}

struct glpk_problem::impl {
  glp_prob* lp = nullptr;
};

namespace {

// GLPK truncation would abort on names of 256+ characters.
std::string glpk_name(const std::string& s) { return s.substr(0, 255); }

void bounds(double lo, double hi, int& type, double& l, double& h) {
  if (std::isnan(lo) || std::isnan(hi) || lo == kInf || hi == -kInf || lo > hi) {
    throw std::logic_error("glpk_problem: invalid bounds [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "]");
  }
  l = std::isinf(lo) ? 0 : lo;
  h = std::isinf(hi) ? 0 : hi;
  if (std::isinf(lo) && std::isinf(hi)) {
    type = GLP_FR;
  } else if (std::isinf(hi)) {
    type = GLP_LO;
  } else if (std::isinf(lo)) {
    type = GLP_UP;
  } else if (lo == hi) {
    type = GLP_FX;
  } else {
    type = GLP_DB;
  }
}

struct mip_callback_state {
  const std::vector<double>* start = nullptr;
  bool offered = false;
  double best_bound = -DBL_MAX;
  long node_limit = 0;  // 0: none
};

// Offers the caller's start once, keeps the best node bound for the gap report, and
// stops the search after node_limit subproblems (Note [A search that ends the same way] in
// planner.cpp).
void mip_callback(glp_tree* tree, void* info) {
  auto* st = static_cast<mip_callback_state*>(info);
  if (st->node_limit > 0) {
    int active = 0, current = 0, total = 0;
    glp_ios_tree_size(tree, &active, &current, &total);
    if (total > st->node_limit) {
      glp_ios_terminate(tree);
      return;
    }
  }
  switch (glp_ios_reason(tree)) {
    case GLP_IHEUR:
      if (st->start != nullptr && !st->offered) {
        st->offered = true;
        // GLPK indexes columns from 1; slot 0 is ignored.
        std::vector<double> x(st->start->size() + 1, 0.0);
        std::copy(st->start->begin(), st->start->end(), x.begin() + 1);
        glp_ios_heur_sol(tree, x.data());
      }
      break;
    case GLP_ISELECT:
    case GLP_IBINGO: {
      const int node = glp_ios_best_node(tree);
      if (node != 0) st->best_bound = glp_ios_node_bound(tree, node);
      break;
    }
    default: break;
  }
}

}  // namespace

glpk_problem::glpk_problem(const std::string& name) : impl_(std::make_unique<impl>()) {
  glp_term_out(GLP_OFF);
  impl_->lp = glp_create_prob();
  glp_set_prob_name(impl_->lp, glpk_name(name).c_str());
  glp_set_obj_dir(impl_->lp, GLP_MIN);
}

glpk_problem::~glpk_problem() {
  if (impl_ && impl_->lp) glp_delete_prob(impl_->lp);
}

int glpk_problem::num_cols() const { return static_cast<int>(col_names_.size()); }
int glpk_problem::num_rows() const { return static_cast<int>(row_names_.size()); }

int glpk_problem::add_col(const std::string& name, double lo, double hi, double cost,
                          bool integer) {
  int type;
  double l, h;
  bounds(lo, hi, type, l, h);
  if (!std::isfinite(cost)) throw std::logic_error("glpk_problem: non-finite cost for " + name);
  const int j = glp_add_cols(impl_->lp, 1);
  glp_set_col_name(impl_->lp, j, glpk_name(name).c_str());
  glp_set_col_bnds(impl_->lp, j, type, l, h);
  glp_set_obj_coef(impl_->lp, j, cost);
  if (integer) glp_set_col_kind(impl_->lp, j, GLP_IV);
  col_names_.push_back(name);
  return j - 1;
}

int glpk_problem::add_row(const std::string& name, double lo, double hi,
                          std::vector<std::pair<int, double>> coefs) {
  int type;
  double l, h;
  bounds(lo, hi, type, l, h);
  std::sort(coefs.begin(), coefs.end());
  std::vector<int> ind(1, 0);
  std::vector<double> val(1, 0.0);
  for (std::size_t k = 0; k < coefs.size(); ++k) {
    const auto [c, v] = coefs[k];
    if (c < 0 || c >= num_cols() || !std::isfinite(v)) {
      throw std::logic_error("glpk_problem: bad coefficient in row " + name);
    }
    if (ind.size() > 1 && ind.back() == c + 1) {
      val.back() += v;  // GLPK aborts on a repeated column; merge instead
    } else {
      ind.push_back(c + 1);
      val.push_back(v);
    }
  }
  // Drop zeros after merging (GLPK would store them as explicit zeros).
  std::size_t w = 1;
  for (std::size_t k = 1; k < ind.size(); ++k) {
    if (val[k] != 0.0) {
      ind[w] = ind[k];
      val[w] = val[k];
      ++w;
    }
  }
  const int i = glp_add_rows(impl_->lp, 1);
  glp_set_row_name(impl_->lp, i, glpk_name(name).c_str());
  glp_set_row_bnds(impl_->lp, i, type, l, h);
  glp_set_mat_row(impl_->lp, i, static_cast<int>(w - 1), ind.data(), val.data());
  row_names_.push_back(name);
  return i - 1;
}

void glpk_problem::set_col_bounds(int col, double lo, double hi) {
  if (col < 0 || col >= num_cols()) throw std::logic_error("glpk_problem: bad column");
  int type;
  double l, h;
  bounds(lo, hi, type, l, h);
  glp_set_col_bnds(impl_->lp, col + 1, type, l, h);
}

void glpk_problem::set_row_bounds(int row, double lo, double hi) {
  if (row < 0 || row >= num_rows()) throw std::logic_error("glpk_problem: bad row");
  int type;
  double l, h;
  bounds(lo, hi, type, l, h);
  glp_set_row_bnds(impl_->lp, row + 1, type, l, h);
}

void glpk_problem::set_cost(int col, double cost) {
  if (col < 0 || col >= num_cols() || !std::isfinite(cost)) {
    throw std::logic_error("glpk_problem: bad cost");
  }
  glp_set_obj_coef(impl_->lp, col + 1, cost);
}

solve_status glpk_problem::solve_lp() {
  last_was_mip_ = false;
  if (num_cols() == 0) return solve_status::optimal;  // nothing to decide
  if (num_rows() == 0) add_row("empty", -kInf, kInf, {});  // GLPK wants m >= 1
  glp_scale_prob(impl_->lp, GLP_SF_AUTO);
  glp_smcp parm;
  glp_init_smcp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_OFF;  // keep the basis: duals name the binding rows; warm starts
  parm.meth = GLP_DUALP;    // cost >= 0 at the slack basis and after added rows: dual feasible
  // Long-step ratio test: one dual iteration may flip many bounded columns (a tensor from
  // "kept" to "recomputed"), which is exactly the shape of a peak row.
  parm.r_test = GLP_RT_FLIP;
  int ret = glp_simplex(impl_->lp, &parm);
  if (ret != 0) {
    // A singular or ill-conditioned start basis: rebuild an advanced basis and retry once.
    glp_adv_basis(impl_->lp, 0);
    ret = glp_simplex(impl_->lp, &parm);
  }
  if (ret == GLP_ENOPFS) return solve_status::infeasible;
  if (ret == GLP_ENODFS) return solve_status::unbounded;
  if (ret != 0) return solve_status::failed;
  switch (glp_get_status(impl_->lp)) {
    case GLP_OPT: return solve_status::optimal;
    case GLP_NOFEAS: return solve_status::infeasible;
    case GLP_UNBND: return solve_status::unbounded;
    default: return solve_status::failed;
  }
}

mip_outcome glpk_problem::solve_mip(double time_limit_s, double mip_gap,
                                    const std::vector<double>& start, long node_limit) {
  mip_outcome out;
  const solve_status lp = solve_lp();
  last_was_mip_ = true;
  if (num_cols() == 0) {
    out.status = solve_status::optimal;
    out.proved_optimal = true;
    return out;
  }
  if (lp != solve_status::optimal) {
    out.status = lp;
    last_was_mip_ = false;
    return out;
  }
  out.lp_relaxation = glp_get_obj_val(impl_->lp);
  if (!start.empty() && start.size() != static_cast<std::size_t>(num_cols())) {
    throw std::logic_error("glpk_problem: start vector has the wrong size");
  }
  mip_callback_state st;
  st.start = start.empty() ? nullptr : &start;
  st.node_limit = node_limit;
  glp_iocp parm;
  glp_init_iocp(&parm);
  parm.msg_lev = GLP_MSG_OFF;
  parm.presolve = GLP_OFF;  // the root basis is given; a start is in original columns
  parm.tm_lim = static_cast<int>(std::clamp(time_limit_s, 0.001, 2.0e6) * 1000.0);
  parm.mip_gap = std::max(0.0, mip_gap);
  parm.br_tech = GLP_BR_DTH;
  parm.bt_tech = GLP_BT_BLB;
  parm.mir_cuts = GLP_ON;
  parm.cov_cuts = GLP_ON;
  parm.cb_func = mip_callback;
  parm.cb_info = &st;
  const int ret = glp_intopt(impl_->lp, &parm);
  const int status = glp_mip_status(impl_->lp);
  const bool have = status == GLP_OPT || status == GLP_FEAS;
  if (!have) {
    out.status = status == GLP_NOFEAS ? solve_status::infeasible : solve_status::failed;
    return out;
  }
  out.objective = glp_mip_obj_val(impl_->lp);
  out.proved_optimal = (ret == 0 && status == GLP_OPT) || ret == GLP_EMIPGAP;
  out.status = out.proved_optimal ? solve_status::optimal : solve_status::feasible;
  double bound = std::max(st.best_bound, out.lp_relaxation);
  if (out.proved_optimal && parm.mip_gap == 0) bound = out.objective;
  out.best_bound = std::min(bound, out.objective);
  const double denom = std::max(std::fabs(out.objective), 1e-12);
  out.gap = std::max(0.0, (out.objective - out.best_bound) / denom);
  return out;
}

double glpk_problem::objective() const {
  return last_was_mip_ ? glp_mip_obj_val(impl_->lp) : glp_get_obj_val(impl_->lp);
}

double glpk_problem::col_value(int col) const {
  if (col < 0 || col >= num_cols()) throw std::logic_error("glpk_problem: bad column");
  return last_was_mip_ ? glp_mip_col_val(impl_->lp, col + 1)
                       : glp_get_col_prim(impl_->lp, col + 1);
}

double glpk_problem::row_activity(int row) const {
  if (row < 0 || row >= num_rows()) throw std::logic_error("glpk_problem: bad row");
  return last_was_mip_ ? glp_mip_row_val(impl_->lp, row + 1)
                       : glp_get_row_prim(impl_->lp, row + 1);
}

double glpk_problem::row_dual(int row) const {
  if (row < 0 || row >= num_rows()) throw std::logic_error("glpk_problem: bad row");
  return glp_get_row_dual(impl_->lp, row + 1);
}

std::vector<std::string> glpk_problem::binding_rows(double tol) const {
  std::vector<std::string> out;
  for (int i = 0; i < num_rows(); ++i) {
    if (std::fabs(glp_get_row_dual(impl_->lp, i + 1)) > tol) out.push_back(row_names_[i]);
  }
  return out;
}

}  // namespace stash::planner
