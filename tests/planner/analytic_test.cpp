// Analytic profiles (planner/model/analytic.h): schema-valid, plausible against hand
// computations, and the shipped tools/demo/profiles/ files are what the model generates today.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "planner/model/analytic.h"
#include "planner/model/plan.h"

namespace stash::planner {
namespace {

constexpr double MiB = 1048576;

step_profile model(const std::string& arch, const std::string& device, int batch, int seq) {
  analytic_options o;
  o.arch = arch;
  o.device = device;
  o.batch = batch;
  o.seq = seq;
  return analytic_profile(o);
}

const tensor_profile& tensor(const layer_profile& l, const std::string& name) {
  for (const tensor_profile& t : l.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name + " in " + l.name);
}

TEST(Analytic, EveryArchAndDeviceValidatesThroughTheSchema) {
  for (const arch_spec& a : analytic_archs())
    for (const device_spec& d : analytic_devices()) {
      SCOPED_TRACE(a.key + " on " + d.key);
      const step_profile p = model(a.key, d.key, 2, 2048);
      EXPECT_EQ(p.source, profile_source::analytic);
      EXPECT_EQ(p.device_name, d.name);
      ASSERT_EQ(static_cast<int>(p.layers.size()), a.layers);
      // Both serializations parse back to the same profile.
      const step_profile q = profile_from_json(nlohmann::json::parse(profile_json_text(p)));
      EXPECT_EQ(profile_to_json(q), profile_to_json(p));
      EXPECT_EQ(profile_to_json(profile_from_json(profile_to_json(p))), profile_to_json(p));
      for (const layer_profile& l : p.layers) {
        ASSERT_FALSE(l.tensors.empty());
        // The layer input comes first and is where recompute starts.
        EXPECT_EQ(l.tensors[0].name, "input");
        EXPECT_FALSE(l.tensors[0].recomputable);
        EXPECT_GT(l.fwd_ms, 0);
        EXPECT_GT(l.bwd_ms, 1.5 * l.fwd_ms);
        EXPECT_LT(l.bwd_ms, 3.0 * l.fwd_ms);
        EXPECT_GT(l.bwd_temp_bytes, 0u);
        for (const tensor_profile& t : l.tensors) {
          EXPECT_GT(t.bytes, 0u) << t.name;
          if (t.recomputable) {
            EXPECT_GT(t.recompute_ms, 0) << t.name;
          }
          EXPECT_LT(t.recompute_ms, l.fwd_ms) << t.name;
        }
      }
      // Keep-all is feasible on a big enough device only; recompute-all must fit these.
      EXPECT_LT(p.fixed_bytes, p.device_memory_bytes / 2);
      EXPECT_GT(p.pinnable_bytes, 0u);
      EXPECT_GT(p.link.bidir_gbps, p.link.d2h_gbps);
    }
}

// llama3-8b, batch 4 x 4096 tokens on an H200, checked against a hand computation.
TEST(Analytic, Llama8bMatchesHandComputation) {
  const step_profile p = model("llama3-8b", "h200", 4, 4096);
  const double T = 4.0 * 4096, h = 4096, f = 14336, kvd = 1024;
  const layer_profile& l = p.layers[5];
  EXPECT_EQ(l.signature, "llama_block");
  // Bytes, as autograd saves them in bf16.
  EXPECT_EQ(tensor(l, "input").bytes, static_cast<std::uint64_t>(T * h * 2));
  EXPECT_EQ(tensor(l, "attn.k").bytes, static_cast<std::uint64_t>(T * kvd * 2));
  EXPECT_EQ(tensor(l, "mlp.gate").bytes, static_cast<std::uint64_t>(T * f * 2));
  EXPECT_EQ(tensor(l, "attn.lse").bytes, static_cast<std::uint64_t>(4.0 * 32 * 4096 * 4));
  EXPECT_LT(tensor(l, "attn_norm.rstd").bytes, kMinOffloadBytes);  // never offloads
  EXPECT_EQ(l.saved_bytes(), static_cast<std::uint64_t>(T * 2 * (6 * h + 2 * kvd + 4 * f) + 2 * T * 4 + 4.0 * 32 * 4096 * 4));
  // Forward: 2 FLOPs per parameter per token plus causal attention 2*b*s^2*h, at 50% of
  // the H200's 989 TFLOP/s; the model must be within a factor of 2.
  const double params = 2 * h * h + 2 * h * kvd + 3 * h * f;
  const double flops = 2 * params * T + 2 * 4.0 * 4096 * 4096 * h;
  const double hand_ms = flops / (989.4e12 * 0.5) * 1e3;
  EXPECT_GT(l.fwd_ms, hand_ms / 2);
  EXPECT_LT(l.fwd_ms, hand_ms * 2);
  // A tensor's recompute is its producer: the gate projection is one T x f x h GEMM.
  EXPECT_NEAR(tensor(l, "mlp.gate").recompute_ms, 2 * T * f * h / (989.4e12 * kGemmEfficiency) * 1e3,
              1e-5);
  // Fixed: 16 bytes per parameter sharded 4 ways (auto on a 140 GiB part) + the rest.
  analytic_options o{"llama3-8b", "h200", 4, 4096, 0};
  EXPECT_EQ(analytic_shard(o), 4);
  EXPECT_NEAR(trainable_params(find_arch("llama3-8b")) / 1e9, 8.03, 0.01);
  EXPECT_GT(p.fixed_bytes, 16 * 8.03e9 / 4);
  EXPECT_LT(p.fixed_bytes, 16 * 8.03e9 / 4 + 12e9);
  // The whole step is in the range such a job sees on an H200: 16k tokens in ~1-2 s.
  double step = 0;
  for (const layer_profile& x : p.layers) step += x.fwd_ms + x.bwd_ms;
  EXPECT_GT(step, 800);
  EXPECT_LT(step, 2500);
}

TEST(Analytic, SeventyBIsShardedWiderAndCostsMorePerLayer) {
  EXPECT_NEAR(trainable_params(find_arch("llama3-70b")) / 1e9, 70.55, 0.05);
  analytic_options o{"llama3-70b", "h200", 1, 8192, 0};
  EXPECT_EQ(analytic_shard(o), 32);
  o.shard = 64;
  const step_profile wide = analytic_profile(o);
  o.shard = 0;
  const step_profile p = analytic_profile(o);
  EXPECT_LT(wide.fixed_bytes, p.fixed_bytes);
  const step_profile small = model("llama3-8b", "h200", 1, 8192);
  EXPECT_GT(p.layers[0].fwd_ms, 3 * small.layers[0].fwd_ms);
  EXPECT_GT(p.layers[0].saved_bytes(), 1.5 * small.layers[0].saved_bytes());
}

TEST(Analytic, VisionModelHasTwoSignaturesWhereLlamaPutsThem) {
  const step_profile p = model("llama3.2-11b-vision", "h100", 2, 4096);
  std::set<std::string> signatures;
  std::vector<std::size_t> cross;
  for (std::size_t i = 0; i < p.layers.size(); ++i) {
    signatures.insert(p.layers[i].signature);
    if (p.layers[i].signature == "cross_attn_block") cross.push_back(i);
  }
  EXPECT_EQ(signatures, (std::set<std::string>{"llama_block", "cross_attn_block"}));
  EXPECT_EQ(cross, (std::vector<std::size_t>{3, 8, 13, 18, 23, 28, 33, 38}));
  const layer_profile &self = p.layers[2], &x = p.layers[3];
  // Cross-attention k/v come from the 6404 vision tokens, not the 4096 text tokens.
  EXPECT_EQ(tensor(x, "attn.k").bytes, static_cast<std::uint64_t>(2.0 * 6404 * 1024 * 2));
  EXPECT_EQ(tensor(self, "attn.k").bytes, static_cast<std::uint64_t>(2.0 * 4096 * 1024 * 2));
  EXPECT_NE(x.fwd_ms, self.fwd_ms);
  EXPECT_EQ(tensor(x, "mlp.gate").bytes, tensor(self, "mlp.gate").bytes);
}

TEST(Analytic, DevicesCarryTheirLinksAndSpeeds) {
  const step_profile h100 = model("llama3-8b", "h100", 1, 4096);
  const step_profile gb200 = model("llama3-8b", "gb200", 1, 4096);
  EXPECT_DOUBLE_EQ(h100.link.h2d_gbps, 55);
  EXPECT_GE(gb200.link.h2d_gbps, 300);
  EXPECT_LE(gb200.link.h2d_gbps, 450);
  EXPECT_LT(gb200.layers[0].fwd_ms, h100.layers[0].fwd_ms / 2);
  EXPECT_GT(gb200.device_memory_bytes, h100.device_memory_bytes);
}

TEST(Analytic, UnknownNamesAndBadNumbersAreInputErrors) {
  try {
    model("gpt-5", "h100", 1, 1);
    FAIL();
  } catch (const input_error& e) {
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos);  // lists the known
  }
  EXPECT_THROW(model("llama3-8b", "tpu", 1, 1), input_error);
  EXPECT_THROW(model("llama3-8b", "h100", 0, 1), input_error);
  EXPECT_THROW(model("llama3-8b", "h100", 1, -4), input_error);
}

// tools/demo/profiles/<arch>_<device>_b<B>_s<S>.json must be exactly what the model writes now:
// regenerate them with `stash profile-model` when the model changes.
TEST(Analytic, ShippedProfilesAreCurrent) {
  const std::string dir = std::string(STASH_SOURCE_DIR) + "/tools/demo/profiles";
  const std::regex name(R"((.+)_(h100|h200|gb200)_b(\d+)_s(\d+)\.json)");
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  std::set<std::string> archs;
  std::set<std::string> signatures_seen;
  while (dirent* e = readdir(d)) {
    std::smatch m;
    const std::string file = e->d_name;
    if (!std::regex_match(file, m, name)) continue;
    bool known = false;
    for (const arch_spec& a : analytic_archs()) known |= a.key == m[1].str();
    if (!known) continue;  // a measured profile someone shipped beside ours
    SCOPED_TRACE(file);
    std::ifstream in(dir + "/" + file);
    std::stringstream text;
    text << in.rdbuf();
    const step_profile shipped = load_profile(dir + "/" + file);
    const step_profile fresh = model(m[1], m[2], std::stoi(m[3]), std::stoi(m[4]));
    EXPECT_EQ(text.str(), profile_json_text(fresh)) << "regenerate " << file;
    EXPECT_LT(text.str().size(), 256u * 1024);
    archs.insert(m[1]);
    for (const layer_profile& l : shipped.layers) signatures_seen.insert(l.signature);
  }
  closedir(d);
  EXPECT_TRUE(archs.count("llama3-8b") && archs.count("llama3-70b") &&
              archs.count("llama3.2-11b-vision"));
  EXPECT_GE(signatures_seen.size(), 2u);
}

}  // namespace
}  // namespace stash::planner
