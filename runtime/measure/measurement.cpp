#include "runtime/measure/measurement.h"

#include <nlohmann/json.hpp>

#include "planner/model/profile.h"

namespace stash::measure {

using nlohmann::json;

void measurement::merge(const measurement& o) {
  if (!o.available && available) {
    // One process that could not profile makes the whole run suspect; keep its reason.
    available = false;
    unavailable_reason = o.unavailable_reason;
  }
  for (const auto& [i, l] : o.layers) {
    layer_samples& mine = layers[i];
    mine.fwd_ms.insert(mine.fwd_ms.end(), l.fwd_ms.begin(), l.fwd_ms.end());
    mine.bwd_ms.insert(mine.bwd_ms.end(), l.bwd_ms.begin(), l.bwd_ms.end());
  }
  for (const auto& [k, v] : o.tensors) {
    std::vector<double>& mine = tensors[k];
    mine.insert(mine.end(), v.begin(), v.end());
  }
  step_outside_ms.insert(step_outside_ms.end(), o.step_outside_ms.begin(),
                         o.step_outside_ms.end());
  kernels += o.kernels;
  kernels_by_correlation += o.kernels_by_correlation;
  kernels_by_launch_thread += o.kernels_by_launch_thread;
  kernels_outside_scopes += o.kernels_outside_scopes;
  kernels_untimed += o.kernels_untimed;
  kernel_ms += o.kernel_ms;
  outside_ms += o.outside_ms;
  h2d_bytes += o.h2d_bytes;
  d2h_bytes += o.d2h_bytes;
  dropped_records += o.dropped_records;
  processes += o.processes;
  warnings.insert(warnings.end(), o.warnings.begin(), o.warnings.end());
}

json measurement_to_json(const measurement& m) {
  json layers = json::array();
  for (const auto& [i, l] : m.layers) {
    layers.push_back({{"index", i}, {"fwd_ms", l.fwd_ms}, {"bwd_ms", l.bwd_ms}});
  }
  json tensors = json::array();
  for (const auto& [k, v] : m.tensors) {
    tensors.push_back({{"layer", k.first}, {"name", k.second}, {"ms", v}});
  }
  return json{{"schema", kMeasurementSchema},
              {"available", m.available},
              {"unavailable_reason", m.unavailable_reason},
              {"layers", std::move(layers)},
              {"tensors", std::move(tensors)},
              {"step_outside_ms", m.step_outside_ms},
              {"kernels", m.kernels},
              {"kernels_by_correlation", m.kernels_by_correlation},
              {"kernels_by_launch_thread", m.kernels_by_launch_thread},
              {"kernels_outside_scopes", m.kernels_outside_scopes},
              {"kernels_untimed", m.kernels_untimed},
              {"kernel_ms", m.kernel_ms},
              {"outside_ms", m.outside_ms},
              {"h2d_bytes", m.h2d_bytes},
              {"d2h_bytes", m.d2h_bytes},
              {"dropped_records", m.dropped_records},
              {"processes", m.processes},
              {"warnings", m.warnings}};
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw stash::input_error(path + ": " + what);
}

const json& need(const json& j, const std::string& path, const char* key) {
  if (!j.is_object()) bad(path.empty() ? "<root>" : path, "expected an object");
  auto it = j.find(key);
  if (it == j.end()) bad(path.empty() ? key : path + "." + key, "missing required field");
  return *it;
}

std::uint64_t count(const json& j, const char* key) {
  const json& v = need(j, "", key);
  if (!v.is_number_unsigned()) bad(key, "expected a non-negative integer, got " + v.dump());
  return v.get<std::uint64_t>();
}

double number(const json& v, const std::string& path) {
  if (!v.is_number() || v.get<double>() < 0) bad(path, "expected a non-negative number");
  return v.get<double>();
}

std::vector<double> samples(const json& j, const std::string& path, const char* key) {
  const json& v = need(j, path, key);
  const std::string p = path.empty() ? std::string(key) : path + "." + key;
  if (!v.is_array()) bad(p, "expected an array of milliseconds");
  std::vector<double> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(number(v[i], p + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace

measurement measurement_from_json(const json& j) {
  const json& schema = need(j, "", "schema");
  if (schema != kMeasurementSchema) {
    bad("schema", "expected \"" + std::string(kMeasurementSchema) + "\", got " + schema.dump());
  }
  measurement m;
  m.available = need(j, "", "available").get<bool>();
  m.unavailable_reason = need(j, "", "unavailable_reason").get<std::string>();
  const json& layers = need(j, "", "layers");
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string p = "layers[" + std::to_string(i) + "]";
    const json& index = need(layers[i], p, "index");
    if (!index.is_number_integer() || index.get<int>() < 0) bad(p + ".index", "expected a layer index");
    layer_samples& l = m.layers[index.get<int>()];
    l.fwd_ms = samples(layers[i], p, "fwd_ms");
    l.bwd_ms = samples(layers[i], p, "bwd_ms");
  }
  const json& tensors = need(j, "", "tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string p = "tensors[" + std::to_string(i) + "]";
    const json& layer = need(tensors[i], p, "layer");
    if (!layer.is_number_integer()) bad(p + ".layer", "expected an integer");
    m.tensors[{layer.get<int>(), need(tensors[i], p, "name").get<std::string>()}] =
        samples(tensors[i], p, "ms");
  }
  // Optional: measurements written before it existed have no per-step outside samples.
  if (j.contains("step_outside_ms")) m.step_outside_ms = samples(j, "", "step_outside_ms");
  m.kernels = count(j, "kernels");
  m.kernels_by_correlation = count(j, "kernels_by_correlation");
  m.kernels_by_launch_thread = count(j, "kernels_by_launch_thread");
  m.kernels_outside_scopes = count(j, "kernels_outside_scopes");
  m.kernels_untimed = count(j, "kernels_untimed");
  m.kernel_ms = number(need(j, "", "kernel_ms"), "kernel_ms");
  m.outside_ms = number(need(j, "", "outside_ms"), "outside_ms");
  m.h2d_bytes = count(j, "h2d_bytes");
  m.d2h_bytes = count(j, "d2h_bytes");
  m.dropped_records = count(j, "dropped_records");
  m.processes = count(j, "processes");
  m.warnings = need(j, "", "warnings").get<std::vector<std::string>>();
  return m;
}

}  // namespace stash::measure
