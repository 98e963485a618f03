// profile.cpp: parsing and validation of stash.profile/1, byte units, and the digest.
//
// Every rejection is an input_error whose text starts with the JSON path of the offending
// value ("layers[3].tensors[0].bytes: ..."), so a user can find it in a 2,000-tensor file.
#include "planner/model/profile.h"
#include "core/json_file.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <nettle/sha2.h>

namespace stash::planner {

using nlohmann::json;

std::uint64_t layer_profile::saved_bytes() const {
  std::uint64_t a = 0;
  for (const auto& t : tensors) a += t.bytes;
  return a;
}

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw input_error(path + ": " + what);
}

std::string type_name(const json& v) { return v.type_name(); }

const json& field(const json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(path.empty() ? key : path + "." + key, "missing required field");
  return *it;
}

std::string join(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

void require_object(const json& v, const std::string& path) {
  if (!v.is_object()) fail(path.empty() ? "<root>" : path, "expected an object, got " + type_name(v));
}

// Sizes: JSON integers >= 0 only. nlohmann stores a negative literal as number_integer and
// a non-negative one as number_unsigned; a fractional one as number_float. Asking a
// negative number_integer for uint64_t would wrap silently, so the type is checked first.
std::uint64_t get_size(const json& obj, const std::string& path, const char* key) {
  const json& v = field(obj, path, key);
  const std::string p = join(path, key);
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  // Built in memory (not parsed), a non-negative int is number_integer, not unsigned.
  if (v.is_number_integer()) {
    if (v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(p, "must be a non-negative integer, got " + v.dump());
  }
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 1e9 written as a float is still a whole number of bytes, but 1.5 is not.
    if (std::isfinite(d) && d >= 0 && d == std::floor(d) && d < 1.8e19) {
      return static_cast<std::uint64_t>(d);
    }
    fail(p, "must be a non-negative integer, got " + v.dump());
  }
  fail(p, "must be a non-negative integer, got " + type_name(v));
}

double get_number(const json& obj, const std::string& path, const char* key, bool positive) {
  const json& v = field(obj, path, key);
  const std::string p = join(path, key);
  if (!v.is_number()) fail(p, "must be a number, got " + type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(p, "must be finite");
  if (positive ? !(d > 0) : d < 0) {
    fail(p, std::string(positive ? "must be positive" : "must be non-negative") + ", got " +
                v.dump());
  }
  return d;
}

std::string get_string(const json& obj, const std::string& path, const char* key) {
  const json& v = field(obj, path, key);
  if (!v.is_string()) fail(join(path, key), "must be a string, got " + type_name(v));
  return v.get<std::string>();
}

bool get_bool(const json& obj, const std::string& path, const char* key) {
  const json& v = field(obj, path, key);
  if (!v.is_boolean()) fail(join(path, key), "must be true or false, got " + type_name(v));
  return v.get<bool>();
}

tensor_profile parse_tensor(const json& t, const std::string& path) {
  require_object(t, path);
  tensor_profile tp;
  tp.name = get_string(t, path, "name");
  if (tp.name.empty()) fail(join(path, "name"), "must not be empty");
  tp.bytes = get_size(t, path, "bytes");
  tp.recompute_ms = get_number(t, path, "recompute_ms", false);
  tp.offloadable = get_bool(t, path, "offloadable");
  tp.recomputable = get_bool(t, path, "recomputable");
  tp.must_keep = get_bool(t, path, "must_keep");
  return tp;
}

layer_profile parse_layer(const json& l, const std::string& path) {
  require_object(l, path);
  layer_profile lp;
  lp.name = get_string(l, path, "name");
  lp.signature = get_string(l, path, "signature");
  lp.fwd_ms = get_number(l, path, "fwd_ms", false);
  lp.bwd_ms = get_number(l, path, "bwd_ms", false);
  lp.bwd_temp_bytes = get_size(l, path, "bwd_temp_bytes");
  // Optional (added after the first profiles shipped): absent means a recompute makes no
  // temporaries of its own in backward.
  if (l.contains("bwd_recompute_temp_bytes"))
    lp.bwd_recompute_temp_bytes = get_size(l, path, "bwd_recompute_temp_bytes");
  const json& ts = field(l, path, "tensors");
  if (!ts.is_array()) fail(join(path, "tensors"), "must be an array, got " + type_name(ts));
  std::set<std::string> names;
  std::uint64_t total = 0;
  for (std::size_t j = 0; j < ts.size(); ++j) {
    const std::string tp = path + ".tensors[" + std::to_string(j) + "]";
    lp.tensors.push_back(parse_tensor(ts[j], tp));
    if (!names.insert(lp.tensors.back().name).second) {
      fail(tp + ".name", "duplicate tensor name \"" + lp.tensors.back().name + "\" in layer");
    }
    // Sums of sizes must stay exact in 64 bits (and in the double the LP sees).
    total += lp.tensors.back().bytes;
    if (total > (std::uint64_t{1} << 53)) fail(tp + ".bytes", "layer total exceeds 2^53 bytes");
  }
  return lp;
}

}  // namespace

step_profile profile_from_json(const json& j) {
  require_object(j, "");
  const json& schema = field(j, "", "schema");
  if (!schema.is_string() || schema.get<std::string>() != kProfileSchema) {
    fail("schema", std::string("unsupported profile schema ") + schema.dump() + ", expected \"" +
                       kProfileSchema + "\"");
  }
  step_profile p;
  const std::string src = get_string(j, "", "source");
  if (src == "analytic") {
    p.source = profile_source::analytic;
  } else if (src == "measured") {
    p.source = profile_source::measured;
  } else {
    fail("source", "must be \"analytic\" or \"measured\", got \"" + src + "\"");
  }
  const json& dev = field(j, "", "device");
  require_object(dev, "device");
  p.device_name = get_string(dev, "device", "name");
  p.device_memory_bytes = get_size(dev, "device", "memory_bytes");

  const json& link = field(j, "", "link");
  require_object(link, "link");
  // Bandwidths divide copy sizes in the cost model, so zero is rejected too.
  p.link.h2d_gbps = get_number(link, "link", "h2d_gbps", true);
  p.link.d2h_gbps = get_number(link, "link", "d2h_gbps", true);
  p.link.bidir_gbps = get_number(link, "link", "bidir_gbps", true);
  const std::uint64_t ranks = get_size(link, "link", "local_ranks");
  if (ranks < 1 || ranks > 1024) fail("link.local_ranks", "must be between 1 and 1024");
  p.link.local_ranks = static_cast<int>(ranks);

  const json& host = field(j, "", "host");
  require_object(host, "host");
  p.pinnable_bytes = get_size(host, "host", "pinnable_bytes");
  p.fixed_bytes = get_size(j, "", "fixed_bytes");
  if (p.fixed_bytes > (std::uint64_t{1} << 53)) fail("fixed_bytes", "exceeds 2^53 bytes");
  // Optional (added after the first profiles shipped): absent means no time outside layers.
  if (j.contains("step_overhead_ms"))
    p.step_overhead_ms = get_number(j, "", "step_overhead_ms", false);
  if (j.contains("optimizer_bytes")) {
    p.optimizer_bytes = get_size(j, "", "optimizer_bytes");
    if (p.optimizer_bytes > (std::uint64_t{1} << 53))
      fail("optimizer_bytes", "exceeds 2^53 bytes");
  }
  if (j.contains("loss_bytes")) {
    p.loss_bytes = get_size(j, "", "loss_bytes");
    if (p.loss_bytes > (std::uint64_t{1} << 53)) fail("loss_bytes", "exceeds 2^53 bytes");
  }
  if (j.contains("recompute_cost")) {
    const std::string rc = get_string(j, "", "recompute_cost");
    if (rc == "prefix") {
      p.recompute = recompute_cost::prefix;
    } else if (rc != "per_tensor") {
      fail("recompute_cost", "must be \"per_tensor\" or \"prefix\", got \"" + rc + "\"");
    }
  }

  const json& layers = field(j, "", "layers");
  if (!layers.is_array()) fail("layers", "must be an array, got " + type_name(layers));
  if (layers.empty()) fail("layers", "must list at least one layer");
  std::uint64_t total = p.fixed_bytes;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const std::string lp = "layers[" + std::to_string(i) + "]";
    p.layers.push_back(parse_layer(layers[i], lp));
    total += p.layers.back().saved_bytes() + p.layers.back().bwd_temp_bytes +
             p.layers.back().bwd_recompute_temp_bytes;
    if (total > (std::uint64_t{1} << 53)) fail(lp, "total bytes of the model exceed 2^53");
  }
  return p;
}

json profile_to_json(const step_profile& p) {
  json layers = json::array();
  for (const auto& l : p.layers) {
    json ts = json::array();
    for (const auto& t : l.tensors) {
      ts.push_back({{"name", t.name},
                    {"bytes", t.bytes},
                    {"recompute_ms", t.recompute_ms},
                    {"offloadable", t.offloadable},
                    {"recomputable", t.recomputable},
                    {"must_keep", t.must_keep}});
    }
    json layer = {{"name", l.name},
                  {"signature", l.signature},
                  {"fwd_ms", l.fwd_ms},
                  {"bwd_ms", l.bwd_ms},
                  {"bwd_temp_bytes", l.bwd_temp_bytes},
                  {"tensors", std::move(ts)}};
    // Written only when it is not 0, as the optional fields below.
    if (l.bwd_recompute_temp_bytes != 0)
      layer["bwd_recompute_temp_bytes"] = l.bwd_recompute_temp_bytes;
    layers.push_back(std::move(layer));
  }
  json j = {{"schema", kProfileSchema},
            {"source", p.source == profile_source::analytic ? "analytic" : "measured"},
            {"device", {{"name", p.device_name}, {"memory_bytes", p.device_memory_bytes}}},
            {"link",
             {{"h2d_gbps", p.link.h2d_gbps},
              {"d2h_gbps", p.link.d2h_gbps},
              {"bidir_gbps", p.link.bidir_gbps},
              {"local_ranks", p.link.local_ranks}}},
            {"host", {{"pinnable_bytes", p.pinnable_bytes}}},
            {"fixed_bytes", p.fixed_bytes},
            {"layers", std::move(layers)}};
  // Written only when it is not 0: the model is the same either way, and existing profiles
  // keep their serialization and profile_sha256.
  if (p.step_overhead_ms != 0) j["step_overhead_ms"] = p.step_overhead_ms;
  if (p.optimizer_bytes != 0) j["optimizer_bytes"] = p.optimizer_bytes;
  if (p.loss_bytes != 0) j["loss_bytes"] = p.loss_bytes;
  if (p.recompute == recompute_cost::prefix) j["recompute_cost"] = "prefix";
  return j;
}

step_profile load_profile(const std::string& path) {
  const json j = read_json_file(path);
  try {
    return profile_from_json(j);
  } catch (const input_error& e) {
    throw input_error(path + ": " + e.what());
  }
}

std::string profile_sha256(const step_profile& p) {
  const std::string text = profile_to_json(p).dump();
  // Nettle rather than OpenSSL: Nettle's hash is a pure function over a context on the
  // stack, with no library state. OpenSSL 3 keeps its default context in pthread-key
  // thread-local storage, which breaks when libstash runs in a linker namespace of its own
  // (Note [A linker namespace for stash's libcudart] in bindings/python/stash/_lib.py):
  // each namespace's libc numbers its keys from 0 in the one thread descriptor they share.
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, text.size(), reinterpret_cast<const std::uint8_t*>(text.data()));
  std::uint8_t md[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, SHA256_DIGEST_SIZE, md);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < SHA256_DIGEST_SIZE; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

}  // namespace stash::planner
