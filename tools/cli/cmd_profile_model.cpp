// `stash profile-model`: an analytic profile (source "analytic") from the FLOP/byte model of
// a named architecture on a named device (planner/model/analytic.h). Exit status: 0, or 2 for
// unknown names and bad numbers.
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "core/bytes.h"
#include "core/json_file.h"
#include "planner/model/analytic.h"

namespace stash::cli {
namespace {

struct profile_model_args {
  std::string arch, device, out;
  int batch = 0, seq = 0, shard = 0;
  bool list = false;
};

void list_models() {
  using namespace stash::planner;
  std::printf("architectures:\n");
  for (const arch_spec& a : analytic_archs())
    std::printf("  %-20s %d layers, hidden %d, ffn %d, %.2fB trainable parameters: %s\n",
                a.key.c_str(), a.layers, a.hidden, a.ffn, trainable_params(a) / 1e9,
                a.note.c_str());
  std::printf("devices:\n");
  for (const device_spec& d : analytic_devices())
    std::printf("  %-6s %s: %.0f TFLOP/s bf16, %.0f GB/s HBM, %s, link %.0f/%.0f GB/s "
                "(both %.0f; %s)\n",
                d.key.c_str(), d.name.c_str(), d.bf16_tflops, d.hbm_gbps,
                format_bytes(d.memory_bytes).c_str(), d.h2d_gbps, d.d2h_gbps, d.bidir_gbps,
                d.link_note.c_str());
}

void run_profile_model(const profile_model_args& a) {
  using namespace stash::planner;
  if (a.list) {
    list_models();
    return;
  }
  if (a.arch.empty() || a.device.empty() || a.batch == 0 || a.seq == 0)
    throw input_error("profile-model needs --arch, --device, --batch and --seq (--list shows the names)");
  analytic_options o;
  o.arch = a.arch;
  o.device = a.device;
  o.batch = a.batch;
  o.seq = a.seq;
  o.shard = a.shard;
  const step_profile p = analytic_profile(o);
  const std::string text = profile_json_text(p);
  std::uint64_t saved = 0;
  double fwd = 0, bwd = 0;
  for (const layer_profile& l : p.layers)
    saved += l.saved_bytes(), fwd += l.fwd_ms, bwd += l.bwd_ms;
  std::fprintf(stderr,
               "profile-model: %s on %s, batch %d, seq %d, FSDP shard %d: %zu layers, "
               "fwd %.1f ms, bwd %.1f ms, saved activations %s, fixed %s\n",
               a.arch.c_str(), p.device_name.c_str(), a.batch, a.seq, analytic_shard(o),
               p.layers.size(), fwd, bwd, format_bytes(saved).c_str(),
               format_bytes(p.fixed_bytes).c_str());
  if (a.out.empty() || a.out == "-") {
    std::fputs(text.c_str(), stdout);
    return;
  }
  write_text_file(a.out, text);
  std::fprintf(stderr, "wrote %s\n", a.out.c_str());
}

const subcommand_registrar reg(30, [](CLI::App& app) {
  auto args = std::make_shared<profile_model_args>();
  CLI::App* cmd = app.add_subcommand(
      "profile-model", "Write an analytic profile from a FLOP/byte model of an architecture");
  cmd->add_option("--arch", args->arch, "llama3-8b | llama3-70b | llama3.2-11b-vision");
  cmd->add_option("--device", args->device, "h100 | h200 | gb200");
  cmd->add_option("--batch", args->batch, "micro-batch size per GPU")->check(CLI::PositiveNumber);
  cmd->add_option("--seq", args->seq, "sequence length (tokens)")->check(CLI::PositiveNumber);
  cmd->add_option("--shard", args->shard,
                  "FSDP shard count for parameters and optimizer state (default: auto)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("-o,--output", args->out, "write profile.json here (default: stdout)");
  cmd->add_flag("--list", args->list, "list the known architectures and devices");
  cmd->callback([args] { run_profile_model(*args); });
});

}  // namespace
}  // namespace stash::cli
