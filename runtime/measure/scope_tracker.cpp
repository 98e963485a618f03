#include "runtime/measure/scope_tracker.h"

#include <algorithm>
#include <string>

#include "runtime/measure/scope_name.h"

namespace stash::measure {

namespace {
std::uint64_t innermost(const std::vector<std::uint64_t>& open) {
  return open.empty() ? 0 : open.back();
}
}  // namespace

scope_tracker::change scope_tracker::push(std::uint64_t thread, std::uint64_t domain,
                                          std::string_view name, std::uint64_t now_ns) {
  const bool is_stash_scope = parse_scope_name(name).has_value();
  std::lock_guard<std::mutex> lock(mutex_);
  thread_state& t = threads_[thread];
  change c;
  c.before = innermost(t.open);
  std::uint64_t id = 0;
  if (is_stash_scope) {
    scope_record r;
    r.id = scopes_.size() + 1;
    r.parent = c.before;
    r.name = std::string(name);
    r.thread_id = thread;
    r.begin_ns = now_ns;
    scopes_.push_back(std::move(r));
    id = scopes_.back().id;
    t.open.push_back(id);
  }
  t.stacks[domain].push_back(id);
  c.after = innermost(t.open);
  return c;
}

scope_tracker::change scope_tracker::pop(std::uint64_t thread, std::uint64_t domain,
                                         std::uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mutex_);
  change c;
  auto tit = threads_.find(thread);
  if (tit == threads_.end()) return c;
  thread_state& t = tit->second;
  c.before = c.after = innermost(t.open);
  auto sit = t.stacks.find(domain);
  if (sit == t.stacks.end() || sit->second.empty()) return c;
  const std::uint64_t id = sit->second.back();
  sit->second.pop_back();
  if (id != 0) {
    scopes_[id - 1].end_ns = now_ns;
    // Usually the innermost; with interleaved domains it may sit deeper.
    auto it = std::find(t.open.rbegin(), t.open.rend(), id);
    if (it != t.open.rend()) t.open.erase(std::next(it).base());
  }
  c.after = innermost(t.open);
  return c;
}

std::vector<scope_record> scope_tracker::scopes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return scopes_;
}

}  // namespace stash::measure
