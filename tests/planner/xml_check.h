// xml_check.h: a minimal XML well-formedness check for the planner's SVG plots' tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace stash::planner::test {

// A minimal XML well-formedness check: balanced, properly nested tags, quoted attributes.
inline bool well_formed_xml(const std::string& s, std::string* why) {
  std::vector<std::string> stack;
  std::size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    const std::size_t end = s.find('>', i);
    if (end == std::string::npos) return *why = "unterminated tag", false;
    std::string tag = s.substr(i + 1, end - i - 1);
    i = end + 1;
    if (tag.empty()) return *why = "empty tag", false;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (std::count(tag.begin(), tag.end(), '"') % 2) return *why = "unbalanced quotes: " + tag, false;
    if (tag[0] == '/') {
      if (stack.empty() || stack.back() != tag.substr(1)) return *why = "mismatched </" + tag + ">", false;
      stack.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    const std::string name = tag.substr(0, tag.find_first_of(" /"));
    if (!self_closing) stack.push_back(name);
  }
  if (!stack.empty()) return *why = "unclosed <" + stack.back() + ">", false;
  // Text must not carry raw '&' other than entities.
  for (std::size_t a = s.find('&'); a != std::string::npos; a = s.find('&', a + 1))
    if (s.compare(a, 5, "&amp;") && s.compare(a, 4, "&lt;") && s.compare(a, 4, "&gt;") &&
        s.compare(a, 6, "&quot;"))
      return *why = "raw &", false;
  return true;
}

}  // namespace stash::planner::test
