// Profile parsing and validation, byte units and the digest.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "planner/model/profile.h"

using namespace stash::planner;
using stash::input_error;
using nlohmann::json;

namespace {

json example() {
  return json::parse(R"({ "schema": "stash.profile/1",
    "source": "analytic",
    "device": {"name": "NVIDIA H200", "memory_bytes": 150323855360},
    "link": {"h2d_gbps": 55.0, "d2h_gbps": 55.0, "bidir_gbps": 100.0, "local_ranks": 1},
    "host": {"pinnable_bytes": 400000000000},
    "fixed_bytes": 20000000000,
    "layers": [
      {"name": "layers.0", "signature": "llama_block", "fwd_ms": 1.9, "bwd_ms": 3.9,
       "bwd_temp_bytes": 268435456,
       "tensors": [ {"name": "attn_norm", "bytes": 33554432, "recompute_ms": 0.02,
                     "offloadable": true, "recomputable": true, "must_keep": false} ] } ] })");
}

// The input_error message for a profile, or "" when it parses.
std::string error_of(const json& j) {
  try {
    profile_from_json(j);
  } catch (const input_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Profile, ParsesTheIssueExample) {
  const step_profile p = profile_from_json(example());
  EXPECT_EQ(p.source, profile_source::analytic);
  EXPECT_EQ(p.device_name, "NVIDIA H200");
  EXPECT_EQ(p.device_memory_bytes, 150323855360ull);
  EXPECT_DOUBLE_EQ(p.link.h2d_gbps, 55.0);
  EXPECT_DOUBLE_EQ(p.d2h_bytes_per_ms(), 55e6);
  EXPECT_EQ(p.pinnable_bytes, 400000000000ull);
  EXPECT_EQ(p.fixed_bytes, 20000000000ull);
  ASSERT_EQ(p.layers.size(), 1u);
  EXPECT_EQ(p.layers[0].bwd_temp_bytes, 268435456ull);
  ASSERT_EQ(p.layers[0].tensors.size(), 1u);
  EXPECT_EQ(p.layers[0].tensors[0].bytes, 33554432ull);
  EXPECT_DOUBLE_EQ(p.layers[0].tensors[0].recompute_ms, 0.02);
  EXPECT_EQ(p.layers[0].saved_bytes(), 33554432ull);
}

TEST(Profile, RoundTripsAndDigestIsStable) {
  const step_profile p = profile_from_json(example());
  const step_profile q = profile_from_json(profile_to_json(p));
  EXPECT_EQ(profile_to_json(p), profile_to_json(q));
  const std::string d = profile_sha256(p);
  EXPECT_EQ(d.size(), 64u);
  EXPECT_EQ(d.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(d, profile_sha256(q));
  json changed = example();
  changed["layers"][0]["tensors"][0]["bytes"] = 33554433;
  EXPECT_NE(d, profile_sha256(profile_from_json(changed)));
}

TEST(Profile, DigestIsSha256OfTheCanonicalText) {
  // Cross-checked against coreutils' sha256sum, an implementation independent of libcrypto.
  const step_profile p = profile_from_json(example());
  const std::string path = ::testing::TempDir() + "stash_profile_digest.json";
  {
    std::ofstream f(path, std::ios::binary);
    f << profile_to_json(p).dump();
  }
  FILE* pipe = popen(("sha256sum " + path).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buf[128] = {};
  ASSERT_NE(fgets(buf, sizeof buf, pipe), nullptr);
  pclose(pipe);
  EXPECT_EQ(std::string(buf).substr(0, 64), profile_sha256(p));
}

TEST(Profile, RejectsUnknownSchema) {
  json j = example();
  j["schema"] = "stash.profile/2";
  const std::string e = error_of(j);
  EXPECT_NE(e.find("schema"), std::string::npos) << e;
  EXPECT_NE(e.find("stash.profile/1"), std::string::npos) << e;
  j.erase("schema");
  EXPECT_NE(error_of(j).find("schema: missing"), std::string::npos);
}

TEST(Profile, MissingFieldsAreNamedByPath) {
  const std::vector<std::pair<json::json_pointer, std::string>> cases = {
      {json::json_pointer("/source"), "source"},
      {json::json_pointer("/device/memory_bytes"), "device.memory_bytes"},
      {json::json_pointer("/link/d2h_gbps"), "link.d2h_gbps"},
      {json::json_pointer("/host/pinnable_bytes"), "host.pinnable_bytes"},
      {json::json_pointer("/fixed_bytes"), "fixed_bytes"},
      {json::json_pointer("/layers/0/fwd_ms"), "layers[0].fwd_ms"},
      {json::json_pointer("/layers/0/tensors/0/must_keep"), "layers[0].tensors[0].must_keep"},
      {json::json_pointer("/layers/0/tensors/0/bytes"), "layers[0].tensors[0].bytes"},
  };
  for (const auto& [ptr, path] : cases) {
    json j = example();
    j[ptr.parent_pointer()].erase(ptr.back());
    const std::string e = error_of(j);
    EXPECT_EQ(e, path + ": missing required field") << ptr.to_string();
  }
}

TEST(Profile, RejectsNegativeFractionalAndNonNumericSizes) {
  const auto at = [](const char* ptr, json v) {
    json j = example();
    j[json::json_pointer(ptr)] = v;
    return error_of(j);
  };
  // nlohmann would wrap -1 to 2^64-1 if asked for an unsigned; the parser must not.
  std::string e = at("/layers/0/tensors/0/bytes", -1);
  EXPECT_EQ(e.rfind("layers[0].tensors[0].bytes:", 0), 0u) << e;
  EXPECT_NE(e.find("non-negative integer"), std::string::npos) << e;
  e = at("/layers/0/tensors/0/bytes", 1.5);
  EXPECT_EQ(e.rfind("layers[0].tensors[0].bytes:", 0), 0u) << e;
  e = at("/layers/0/tensors/0/bytes", "12");
  EXPECT_EQ(e.rfind("layers[0].tensors[0].bytes:", 0), 0u) << e;
  e = at("/fixed_bytes", -20000000000LL);
  EXPECT_EQ(e.rfind("fixed_bytes:", 0), 0u) << e;
  e = at("/layers/0/bwd_temp_bytes", -5);
  EXPECT_EQ(e.rfind("layers[0].bwd_temp_bytes:", 0), 0u) << e;
  e = at("/host/pinnable_bytes", 3.25);
  EXPECT_EQ(e.rfind("host.pinnable_bytes:", 0), 0u) << e;
  // A whole number written as a float is still a byte count.
  EXPECT_EQ(at("/fixed_bytes", 2e10), "");
}

TEST(Profile, RejectsBadTimesFlagsAndLinks) {
  const auto at = [](const char* ptr, json v) {
    json j = example();
    j[json::json_pointer(ptr)] = v;
    return error_of(j);
  };
  EXPECT_EQ(at("/layers/0/fwd_ms", -1.0).rfind("layers[0].fwd_ms:", 0), 0u);
  EXPECT_EQ(at("/layers/0/tensors/0/recompute_ms", -0.1).rfind("layers[0].tensors[0].recompute_ms:", 0), 0u);
  EXPECT_EQ(at("/layers/0/bwd_ms", "fast").rfind("layers[0].bwd_ms:", 0), 0u);
  EXPECT_EQ(at("/layers/0/tensors/0/offloadable", 1).rfind("layers[0].tensors[0].offloadable:", 0), 0u);
  EXPECT_EQ(at("/link/h2d_gbps", 0).rfind("link.h2d_gbps:", 0), 0u);
  EXPECT_EQ(at("/link/local_ranks", 0).rfind("link.local_ranks:", 0), 0u);
  EXPECT_EQ(at("/source", "guessed").rfind("source:", 0), 0u);
  EXPECT_EQ(at("/layers", json::array()).rfind("layers:", 0), 0u);
  EXPECT_EQ(at("/layers/0/tensors", json::object()).rfind("layers[0].tensors:", 0), 0u);
  EXPECT_EQ(at("/device", 3).rfind("device:", 0), 0u);
  EXPECT_EQ(at("/layers/0/tensors/0/name", "").rfind("layers[0].tensors[0].name:", 0), 0u);
}

// The optional per-step time outside the layers (Note [Step overhead] in plan.h).
TEST(Profile, StepOverheadIsOptionalValidatedAndRoundTripped) {
  EXPECT_EQ(profile_from_json(example()).step_overhead_ms, 0.0);
  json j = example();
  j["step_overhead_ms"] = 0.25;
  const step_profile p = profile_from_json(j);
  EXPECT_EQ(p.step_overhead_ms, 0.25);
  EXPECT_EQ(profile_to_json(p).at("step_overhead_ms"), 0.25);
  EXPECT_EQ(profile_from_json(profile_to_json(p)).step_overhead_ms, 0.25);
  const auto bad = [](json v) {
    json k = example();
    k["step_overhead_ms"] = v;
    return error_of(k);
  };
  EXPECT_EQ(bad(-0.5).rfind("step_overhead_ms: must be non-negative", 0), 0u) << bad(-0.5);
  EXPECT_EQ(bad("slow").rfind("step_overhead_ms: must be a number", 0), 0u);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(bad(inf).rfind("step_overhead_ms: must be finite", 0), 0u);
  EXPECT_EQ(bad(nullptr).rfind("step_overhead_ms:", 0), 0u);
}

// The optional optimizer position (Note [The optimizer's position] in plan.h): absent is
// 0 and not written, so existing profiles keep their digest; present, a size.
TEST(Profile, OptimizerBytesIsOptionalValidatedAndRoundTripped) {
  EXPECT_EQ(profile_from_json(example()).optimizer_bytes, 0u);
  EXPECT_FALSE(profile_to_json(profile_from_json(example())).contains("optimizer_bytes"));
  json j = example();
  j["optimizer_bytes"] = 123456;
  const step_profile p = profile_from_json(j);
  EXPECT_EQ(p.optimizer_bytes, 123456u);
  EXPECT_EQ(profile_from_json(profile_to_json(p)).optimizer_bytes, 123456u);
  EXPECT_NE(profile_sha256(p), profile_sha256(profile_from_json(example())));
  const auto bad = [](json v) {
    json k = example();
    k["optimizer_bytes"] = v;
    return error_of(k);
  };
  EXPECT_EQ(bad(-1).rfind("optimizer_bytes:", 0), 0u) << bad(-1);
  EXPECT_EQ(bad(1.5).rfind("optimizer_bytes:", 0), 0u) << bad(1.5);
  EXPECT_EQ(bad("big").rfind("optimizer_bytes:", 0), 0u) << bad("big");
}

// Profiles without an overhead keep the digest they had before the field existed (the
// value below is what stash computed for example() then); an explicit 0 is the same model
// and the same digest, and a non-zero overhead is a different one.
TEST(Profile, StepOverheadLeavesExistingDigestsAlone) {
  const std::string before = "b94b82f404557e953e299a35fc94656dedf08777cbd96cf7e60d1fe7619ff415";
  EXPECT_EQ(profile_sha256(profile_from_json(example())), before);
  json zero = example();
  zero["step_overhead_ms"] = 0;
  EXPECT_EQ(profile_sha256(profile_from_json(zero)), before);
  EXPECT_FALSE(profile_to_json(profile_from_json(zero)).contains("step_overhead_ms"));
  json some = example();
  some["step_overhead_ms"] = 0.05;
  EXPECT_NE(profile_sha256(profile_from_json(some)), before);
}

// A layer's optional recompute temporaries in backward (Note [Backward temporaries of a
// recompute] in plan.h): absent is 0 and not written, as the other optional fields, so
// existing profiles keep their serialization and digest; present, a size, kept by the
// round trip.
TEST(Profile, RecomputeTemporariesAreOptionalValidatedAndRoundTripped) {
  const step_profile plain = profile_from_json(example());
  EXPECT_EQ(plain.layers[0].bwd_recompute_temp_bytes, 0u);
  EXPECT_FALSE(profile_to_json(plain).at("layers")[0].contains("bwd_recompute_temp_bytes"));
  json zero = example();
  zero["layers"][0]["bwd_recompute_temp_bytes"] = 0;
  EXPECT_EQ(profile_to_json(profile_from_json(zero)), profile_to_json(plain));
  EXPECT_EQ(profile_sha256(profile_from_json(zero)), profile_sha256(plain));

  json j = example();
  j["layers"][0]["bwd_recompute_temp_bytes"] = 9122611;
  const step_profile p = profile_from_json(j);
  EXPECT_EQ(p.layers[0].bwd_recompute_temp_bytes, 9122611u);
  const json out = profile_to_json(p);
  EXPECT_EQ(out.at("layers")[0].at("bwd_recompute_temp_bytes"), 9122611u);
  EXPECT_EQ(profile_from_json(out).layers[0].bwd_recompute_temp_bytes, 9122611u);
  EXPECT_EQ(profile_to_json(profile_from_json(out)), out);
  EXPECT_NE(profile_sha256(p), profile_sha256(plain));

  const auto bad = [](json v) {
    json k = example();
    k["layers"][0]["bwd_recompute_temp_bytes"] = v;
    return error_of(k);
  };
  for (const json& v : {json(-1), json(1.5), json("big"), json(nullptr)}) {
    const std::string e = bad(v);
    EXPECT_EQ(e.rfind("layers[0].bwd_recompute_temp_bytes: must be a non-negative integer", 0),
              0u)
        << e;
  }
  // It counts toward the model's byte total, which must stay exact in a double.
  EXPECT_EQ(bad(std::uint64_t{1} << 54).rfind("layers[0]: total bytes of the model", 0), 0u);
}

TEST(Profile, RejectsDuplicateTensorNames) {
  json j = example();
  j["layers"][0]["tensors"].push_back(j["layers"][0]["tensors"][0]);
  EXPECT_EQ(error_of(j).rfind("layers[0].tensors[1].name: duplicate", 0), 0u) << error_of(j);
}

TEST(Profile, LoadReportsBadJsonWithPosition) {
  const std::string path = ::testing::TempDir() + "stash_bad_profile.json";
  {
    std::ofstream f(path);
    f << "{ \"schema\": \"stash.profile/1\",\n  \"layers\": [ }";
  }
  try {
    load_profile(path);
    FAIL() << "bad JSON accepted";
  } catch (const input_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("not valid JSON"), std::string::npos) << m;
    EXPECT_NE(m.find("line 2"), std::string::npos) << m;
  }
  EXPECT_THROW(load_profile(path + ".missing"), input_error);
}
