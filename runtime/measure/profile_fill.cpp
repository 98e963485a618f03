#include "runtime/measure/profile_fill.h"

#include "core/json_file.h"

#include <fstream>
#include <sstream>

namespace stash::measure {

using nlohmann::json;

namespace {

json summary(const measurement& m) {
  return json{{"kernels", m.kernels},
              {"kernels_by_correlation", m.kernels_by_correlation},
              {"kernels_by_launch_thread", m.kernels_by_launch_thread},
              {"kernels_outside_scopes", m.kernels_outside_scopes},
              {"kernel_ms", m.kernel_ms},
              {"outside_ms", m.outside_ms},
              {"steps", m.step_outside_ms.size()},
              {"dropped_records", m.dropped_records},
              {"processes", m.processes},
              {"warnings", m.warnings}};
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

json link_to_json(const planner::link_profile& l) {
  return json{{"h2d_gbps", l.h2d_gbps},
              {"d2h_gbps", l.d2h_gbps},
              {"bidir_gbps", l.bidir_gbps},
              {"local_ranks", static_cast<std::uint64_t>(l.local_ranks)}};
}

filled_profile fill_profile(const measurement& m, const planner::step_profile* skeleton,
                            const std::optional<planner::link_profile>& link) {
  filled_profile out;
  for (const std::string& w : m.warnings) out.notes.push_back("warning: " + w);
  if (!skeleton) {
    json layers = json::array();
    for (const auto& [i, l] : m.layers) {
      layers.push_back({{"index", i},
                        {"name", "layers." + std::to_string(i)},
                        {"fwd_ms", median(l.fwd_ms)},
                        {"bwd_ms", median(l.bwd_ms)}});
    }
    out.json = json{{"schema", planner::kProfileSchema},
                    {"source", "measured"},
                    {"plannable", false},
                    {"layers", std::move(layers)},
                    {"measurement", summary(m)}};
    if (!m.step_outside_ms.empty()) out.json["step_overhead_ms"] = median(m.step_outside_ms);
    if (link) out.json["link"] = link_to_json(*link);
    out.notes.push_back(
        "no skeleton given: per-layer times only; this profile cannot be planned yet "
        "(rerun with --skeleton S, a stash.profile/1 listing each layer's tensors)");
    out.json["measurement"]["notes"] = out.notes;
    return out;
  }

  planner::step_profile p = *skeleton;
  p.source = planner::profile_source::measured;
  if (link) p.link = *link;
  std::vector<int> missing_fwd, missing_bwd, extra;
  int tensors_filled = 0, tensors_missing = 0;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    planner::layer_profile& layer = p.layers[i];
    auto it = m.layers.find(static_cast<int>(i));
    if (it == m.layers.end() || it->second.fwd_ms.empty()) {
      missing_fwd.push_back(static_cast<int>(i));
    } else {
      layer.fwd_ms = median(it->second.fwd_ms);
    }
    if (it == m.layers.end() || it->second.bwd_ms.empty()) {
      missing_bwd.push_back(static_cast<int>(i));
    } else {
      layer.bwd_ms = median(it->second.bwd_ms);
    }
    for (planner::tensor_profile& t : layer.tensors) {
      auto tt = m.tensors.find({static_cast<int>(i), t.name});
      if (tt == m.tensors.end() || tt->second.empty()) {
        if (t.recomputable) ++tensors_missing;  // the others need no recompute_ms
      } else {
        t.recompute_ms = median(tt->second);
        ++tensors_filled;
      }
    }
  }
  for (const auto& [i, l] : m.layers) {
    if (i >= static_cast<int>(p.layers.size())) extra.push_back(i);
  }
  // Note [Time outside the layers] (attribution.h): one sample per step.
  if (m.step_outside_ms.empty()) {
    out.notes.push_back("no step measured (no forward scope of layer 0): step_overhead_ms stays "
                        "the skeleton's");
  } else {
    p.step_overhead_ms = median(m.step_outside_ms);
  }
  if (!missing_fwd.empty()) {
    out.notes.push_back("no forward scope measured for layers " + list(missing_fwd) +
                        "; their fwd_ms stay the skeleton's");
  }
  if (!missing_bwd.empty()) {
    out.notes.push_back("no backward scope measured for layers " + list(missing_bwd) +
                        "; their bwd_ms stay the skeleton's");
  }
  if (!extra.empty()) {
    out.notes.push_back("measured layers " + list(extra) + " are not in the skeleton (it has " +
                        std::to_string(p.layers.size()) + "); ignored");
  }
  if (tensors_missing > 0) {
    out.notes.push_back(std::to_string(tensors_missing) + " of " +
                        std::to_string(tensors_missing + tensors_filled) +
                        " recomputable tensors had no stash:tensor scope; their recompute_ms "
                        "stay the skeleton's");
  }
  out.json = planner::profile_to_json(p);
  // profile_to_json writes local_ranks as a signed JSON integer, which profile_from_json
  // (sizes must be unsigned) then rejects; write it the way the validator reads it.
  out.json["link"]["local_ranks"] = static_cast<std::uint64_t>(p.link.local_ranks);
  // Round trip through the validator: what we write must be what `stash plan` accepts.
  (void)planner::profile_from_json(out.json);
  out.json["measurement"] = summary(m);
  out.json["measurement"]["notes"] = out.notes;
  out.plannable = true;
  return out;
}

planner::link_profile load_link_section(const std::string& path) {
  const json j = stash::read_json_file(path);
  if (!j.is_object() || !j.contains("link") || !j["link"].is_object()) {
    throw stash::input_error(path + ": link: missing required field (expected a profile or "
                               "the output of `stash bench link --json`)");
  }
  const json& l = j["link"];
  planner::link_profile link;
  auto gbps = [&](const char* key) {
    if (!l.contains(key) || !l[key].is_number() || !(l[key].get<double>() > 0)) {
      throw stash::input_error(path + ": link." + key + ": expected a positive number (GB/s)");
    }
    return l[key].get<double>();
  };
  link.h2d_gbps = gbps("h2d_gbps");
  link.d2h_gbps = gbps("d2h_gbps");
  link.bidir_gbps = gbps("bidir_gbps");
  if (l.contains("local_ranks")) {
    if (!l["local_ranks"].is_number_unsigned() || l["local_ranks"].get<int>() < 1) {
      throw stash::input_error(path + ": link.local_ranks: expected a positive integer");
    }
    link.local_ranks = l["local_ranks"].get<int>();
  }
  return link;
}

}  // namespace stash::measure
