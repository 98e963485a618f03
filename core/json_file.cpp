// json_file.cpp: the JSON files stash exchanges (json_file.h).
#include "core/json_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include <unistd.h>

namespace stash {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(path + ": cannot open: " + std::strerror(errno));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() carries "at line L, column C"; the byte offset alone is useless to a user.
    throw input_error(path + ": not valid JSON: " + e.what());
  }
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  write_text_file(path, j.dump(2) + "\n");
}

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    if (!out) throw input_error(path + ": cannot write: " + std::strerror(errno));
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw input_error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw input_error(path + ": cannot replace: " + why);
  }
}

}  // namespace stash
