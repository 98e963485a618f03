// json_file.h: reading and writing the JSON files stash's tools exchange (profiles, plans,
// link sections, benchmark results): every failure is an input_error naming the path, and
// a write replaces the file whole or not at all. In core/ because the planner, the
// runtime's measurement and the CLI all read and write such files; it knows no schema.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace stash {

// Parses the file. Errors: "<path>: cannot open" and "<path>: not valid JSON: <what>", where
// <what> carries nlohmann's line and column.
nlohmann::json read_json_file(const std::string& path);

// Writes `text` to `path` through a temporary file in the same folder and a rename, so a
// failed or interrupted write never leaves a truncated file where a good one was. Every
// file stash writes goes through it (JSON through write_json_file; traces, SVG, CSV and
// the analytic profile's text directly); a std::ofstream onto a user's path is a bug.
// Errors: "<path>: cannot write: <reason>", "<path>: write failed", "<path>: cannot replace".
void write_text_file(const std::string& path, const std::string& text);

// write_text_file of j, indented, with a final newline.
void write_json_file(const std::string& path, const nlohmann::json& j);

}  // namespace stash
