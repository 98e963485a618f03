// `stash simulate`: replays a plan on compute / D2H / H2D streams (planner/simulator/simulator.h),
// prints step time, peak, exposed copy and recompute next to the canonical model's figures
// and the overlap report, and writes the timeline as a Chrome/Perfetto trace.
// Exit status: 0, or 2 for bad input.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "command.h"
#include "core/bytes.h"
#include "core/json_file.h"
#include "planner/plots/memory_svg.h"
#include "planner/simulator/simulator.h"

namespace stash::cli {
namespace {

struct simulate_args {
  std::string profile, plan, trace, pinned, memory_svg, measured;
  int lookahead = 1;
  bool no_link_sharing = false, no_turn_barrier = false, prefetch_at_recompute = false;
};

void run_simulate(const simulate_args& a) {
  using namespace stash::planner;
  if (!a.measured.empty() && a.memory_svg.empty())
    throw input_error("--measured is plotted with --memory-svg PATH; give both");
  const step_profile p = load_profile(a.profile);
  const step_plan plan = load_plan(a.plan, p);
  // Read before anything is printed, so that a bad trace fails the command cleanly.
  std::optional<trace_writer> measured;
  if (!a.measured.empty()) {
    const nlohmann::json j = read_json_file(a.measured);  // its errors name the file
    try {
      measured = trace_from_json(j);
    } catch (const std::exception& e) {
      throw input_error(a.measured + ": " + e.what());
    }
  }
  sim_options opt;
  opt.lookahead = a.lookahead;
  // The runtime's pinned pool is capped at the profile's pinnable bytes unless told.
  opt.pinned_bytes = a.pinned.empty() ? p.pinnable_bytes : parse_bytes(a.pinned);
  opt.share_link = !a.no_link_sharing;
  opt.turn_barrier = !a.no_turn_barrier;
  opt.prefetch_after_recompute = !a.prefetch_at_recompute;
  opt.record_trace = true;
  const decision_table d = plan.decisions();
  const sim_result r = simulate(p, d, opt);
  const evaluation ev = evaluate(p, d, plan.budget_bytes);

  std::printf("simulate: %zu layers, lookahead %d, pinned cap %s, link %.1f/%.1f GB/s "
              "(both %.1f%s)\n",
              p.layers.size(), opt.lookahead, format_bytes(opt.pinned_bytes).c_str(),
              p.link.d2h_gbps, p.link.h2d_gbps, p.link.bidir_gbps,
              opt.share_link ? "" : ", sharing off");
  double rel = ev.step_ms > 0 ? (r.step_ms / ev.step_ms - 1) * 100 : 0.0;
  if (std::abs(rel) < 5e-5) rel = 0;  // float rounding, not a difference worth a sign
  std::printf("  step        %.3f ms  (canonical model %.3f ms, %+.4f%%)\n", r.step_ms,
              ev.step_ms, rel);
  std::printf("  peak        %s (%llu bytes) at %s, t = %.3f ms  (canonical %s at %s; budget %s)\n",
              format_bytes(r.peak_bytes).c_str(), static_cast<unsigned long long>(r.peak_bytes),
              r.peak_at.c_str(), r.peak_time_ms, format_bytes(ev.peak_bytes).c_str(),
              ev.peak_at.c_str(), format_bytes(plan.budget_bytes).c_str());
  std::printf("  compute     %.3f ms fwd+bwd, recompute %.3f ms", r.compute_ms, r.recompute_ms);
  // Only profiles that have one print it, so the output for the others is unchanged.
  if (p.step_overhead_ms > 0)
    std::printf(", step overhead %.3f ms (outside the layers, at the turn)", r.step_overhead_ms);
  std::printf("\n");
  std::printf("  exposed     %.3f ms copy wait (d2h %.3f, h2d %.3f)  (canonical %.3f ms)\n",
              r.exposed_copy_ms, r.d2h_wait_ms, r.h2d_wait_ms, ev.exposed_copy_ms);
  std::printf("  offloaded   %s, pinned peak %s, link shared %.3f ms\n",
              format_bytes(r.offloaded_bytes).c_str(), format_bytes(r.pinned_peak_bytes).c_str(),
              r.link_shared_ms);
  if (r.pinned_fallback_tensors)
    std::printf("  pinned full %zu offloads (%s) stayed on the device\n",
                r.pinned_fallback_tensors, format_bytes(r.pinned_fallback_bytes).c_str());
  if (r.peak_bytes > plan.budget_bytes)
    std::printf("  warning     the replay's peak exceeds the plan's budget\n");
  std::printf("overlap report:\n%s",
              format_overlap_report(compute_overlap(r.trace.spans())).c_str());
  if (!a.trace.empty()) {
    r.trace.write(a.trace);
    std::printf("wrote %s (open in ui.perfetto.dev or chrome://tracing)\n", a.trace.c_str());
  }
  if (!a.memory_svg.empty()) {
    std::vector<memory_series> series = {{"predicted (stash simulate)", "#1f5fbf", step_memory(r)}};
    if (measured) {
      series.push_back({"measured (" + a.measured + ", last pass)", "#e07000",
                        last_pass(*measured, kDeviceBytesCounter)});
      if (series.back().samples.empty())
        std::fprintf(stderr, "stash simulate: %s has no \"device bytes\" samples in a pass "
                             "(an engine trace on stash's device pool has them)\n",
                     a.measured.c_str());
    }
    const std::string title = "device memory: " + a.plan;
    write_text_file(a.memory_svg, memory_svg(series, plan.budget_bytes, title, p.device_name));
    std::printf("wrote %s\n", a.memory_svg.c_str());
  }
}

const subcommand_registrar reg(60, [](CLI::App& app) {
  auto args = std::make_shared<simulate_args>();
  CLI::App* cmd = app.add_subcommand(
      "simulate", "Replay a plan on compute/D2H/H2D streams; print the timeline's figures");
  cmd->add_option("--profile", args->profile, "profile.json")->required();
  cmd->add_option("--plan", args->plan, "plan.json (from stash plan)")->required();
  cmd->add_option("--trace", args->trace, "write a Chrome/Perfetto trace here");
  cmd->add_option("--memory-svg", args->memory_svg,
                  "plot device memory over the step (SVG), with the plan's budget");
  cmd->add_option("--measured", args->measured,
                  "with --memory-svg: also plot this engine trace's measured device bytes "
                  "(its last pass)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--lookahead", args->lookahead,
                  "prefetch layer i at the backward of layer i+N (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pinned-bytes", args->pinned,
                  "pinned pool capacity, bytes or units (default: the profile's pinnable bytes)");
  cmd->add_flag("--no-link-sharing", args->no_link_sharing,
                "ignore bidir_gbps: directions never slow each other");
  cmd->add_flag("--no-turn-barrier", args->no_turn_barrier,
                "let backward start before the last forward offloads finish");
  cmd->add_flag("--prefetch-at-recompute", args->prefetch_at_recompute,
                "issue prefetches when a layer's recompute starts, not its backward compute");
  cmd->callback([args] { run_simulate(*args); });
});

}  // namespace
}  // namespace stash::cli
