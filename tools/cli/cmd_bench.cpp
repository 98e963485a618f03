// `stash bench link`: the host<->device link benchmark (runtime/measure/link_bench.h).
// `stash bench copy`: the engine's copies next to plain cudaMemcpyAsync on one size mix
// (runtime/engine/copy_bench.h).
// Exit status: 0 measured, 2 bad options or a buffer refused, 3 no usable GPU or a CUDA
// error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "command.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/json_file.h"
#include "planner/model/profile.h"
#include "runtime/engine/copy_bench.h"
#include "runtime/measure/link_bench.h"
#include "cuda_prim.h"
#include "runtime/measure/profile_fill.h"

namespace stash::cli {
namespace {

struct bench_link_args {
  std::string bytes = "512MiB";
  int samples = 7;
  int warmups = 2;
  int sharers = 0;
  int device = 0;
  bool no_pageable = false;
  std::string json_out, profile;
};

// Replaces the link section of an existing profile in place, keeping every other key
// (including ones the planner does not read), and validates the result first.
void merge_into_profile(const std::string& path, const nlohmann::json& link) {
  nlohmann::json j = stash::read_json_file(path);
  if (!j.is_object()) throw stash::input_error(path + ": expected a stash.profile/1 object");
  j["link"] = link;
  (void)planner::profile_from_json(j);
  stash::write_json_file(path, j);
}

void run_bench_link(const bench_link_args& a) {
  measure::link_bench_options o;
  o.bytes = stash::parse_bytes(a.bytes);
  o.samples = a.samples;
  o.warmups = a.warmups;
  o.sharers = a.sharers;
  o.device = a.device;
  o.pageable = !a.no_pageable;
  const std::string problem = prim::device_problem();
  if (!problem.empty()) {
    std::fprintf(stderr, "stash bench link: no usable GPU: %s\n", problem.c_str());
    throw exit_status{3};
  }
  measure::link_bench_result r;
  try {
    r = measure::run_link_bench(o);
  } catch (const stash::input_error&) {
    throw;  // bad options: main() reports them (exit 2)
  } catch (const measure::measure_error& e) {
    std::fprintf(stderr, "stash bench link: %s\n", e.what());
    throw exit_status{3};
  }
  std::printf("%s", measure::format_link_table(r).c_str());
  const nlohmann::json j = measure::link_bench_to_json(r);
  if (!a.json_out.empty()) {
    stash::write_json_file(a.json_out, j);
    std::printf("wrote %s\n", a.json_out.c_str());
  }
  if (!a.profile.empty()) {
    merge_into_profile(a.profile, j["link"]);
    std::printf("merged the link section into %s\n", a.profile.c_str());
  }
}

struct bench_copy_args {
  std::vector<std::string> sizes;
  int samples = 5;
  int warmups = 1;
  std::string json_out;
};

void run_bench_copy(const bench_copy_args& a) {
  engine::copy_bench_options o;
  for (const std::string& s : a.sizes) o.sizes.push_back(stash::parse_bytes(s));
  o.samples = a.samples;
  o.warmups = a.warmups;
  const std::string problem = prim::device_problem();
  if (!problem.empty()) {
    std::fprintf(stderr, "stash bench copy: no usable GPU: %s\n", problem.c_str());
    throw exit_status{3};
  }
  engine::copy_bench_result r;
  try {
    r = engine::run_copy_bench(o);
  } catch (const stash::error& e) {
    std::fprintf(stderr, "stash bench copy: %s\n", e.what());
    throw exit_status{e.code() == status::invalid_argument ? 2 : 3};
  }
  std::printf("%s", engine::format_copy_table(r).c_str());
  if (!a.json_out.empty()) {
    stash::write_json_file(a.json_out, engine::copy_bench_to_json(r));
    std::printf("wrote %s\n", a.json_out.c_str());
  }
}

const subcommand_registrar reg(20, [](CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the machine");
  bench->require_subcommand(1);
  auto args = std::make_shared<bench_link_args>();
  CLI::App* link = bench->add_subcommand(
      "link", "Pinned/pageable host<->device copy bandwidth (H2D, D2H, both at once), GB/s");
  link->add_option("--bytes", args->bytes,
                   "buffer size (shrunk to fit free device memory; at least 64MiB)")
      ->capture_default_str();
  link->add_option("--samples", args->samples, "timed runs; the median is reported")
      ->capture_default_str();
  link->add_option("--warmups", args->warmups, "untimed runs first")->capture_default_str();
  link->add_option("--sharers", args->sharers,
                   "local ranks sharing the link (default: LOCAL_WORLD_SIZE, else 1)");
  link->add_option("--device", args->device, "GPU ordinal")->capture_default_str();
  link->add_flag("--no-pageable", args->no_pageable, "skip the pageable-memory contrast");
  link->add_option("--json", args->json_out, "write {link, link_bench} as JSON");
  link->add_option("--profile", args->profile,
                   "a stash.profile/1 file whose link section is replaced by the result");
  link->callback([args] { run_bench_link(*args); });

  auto cargs = std::make_shared<bench_copy_args>();
  CLI::App* copy = bench->add_subcommand(
      "copy", "The engine's offload/prefetch copies vs plain cudaMemcpyAsync, same size mix");
  copy->add_option("--sizes", cargs->sizes,
                   "the size mix, in order (bytes or units; default 1,4,16,64,256 MiB twice)")
      ->delimiter(',');
  copy->add_option("--samples", cargs->samples, "timed rounds; the median is reported")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  copy->add_option("--warmups", cargs->warmups, "untimed rounds first")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  copy->add_option("--json", cargs->json_out, "write every figure as JSON");
  copy->callback([cargs] { run_bench_copy(*cargs); });
});

}  // namespace
}  // namespace stash::cli
