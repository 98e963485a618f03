#include "report.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "options.h"
#include "pools.h"

namespace stash::preload {

namespace {

std::atomic<bool> g_armed{false};
std::atomic<bool> g_written{false};

// A bounded appender over a caller's buffer; output past the end is dropped and flagged.
struct text {
  char* buf;
  size_t cap;
  size_t len = 0;
  bool overflow = false;

  void add(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    if (overflow) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = std::vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (n < 0 || static_cast<size_t>(n) >= cap - len) {
      overflow = true;
      return;
    }
    len += static_cast<size_t>(n);
  }
};

unsigned long long v(const std::atomic<uint64_t>& a) {
  return static_cast<unsigned long long>(a.load(std::memory_order_relaxed));
}
unsigned long long v(uint64_t x) { return static_cast<unsigned long long>(x); }

void add_pool(text& t, const pool_stats& s) {
  t.add("\"current_bytes\": %llu, \"peak_bytes\": %llu, \"current_count\": %llu, "
        "\"peak_count\": %llu, \"reserved_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
        "\"slab_count\": %llu, \"limit_bytes\": %llu",
        v(s.current_bytes), v(s.peak_bytes), v(s.current_count), v(s.peak_count),
        v(s.reserved_bytes), v(s.peak_reserved_bytes), v(s.slab_count), v(s.limit_bytes));
}

// `read_pools`: false from the library destructor, when the runtime may be gone.
void format(text& t, bool read_pools) {
  const options& o = opts();
  const counters& c = tally();
  t.add("{\n  \"schema\": \"stash.preload_report/1\",\n  \"enabled\": %s,\n",
        o.disabled ? "false" : "true");
  t.add("  \"device_budget_bytes\": %llu,\n", v(o.device_budget));
  // Peaks summed over devices are an upper bound of a simultaneous peak; per-device
  // figures are exact.
  pool_stats sum;
  t.add("  \"devices\": [");
  bool first = true;
  for (int d = 0; read_pools && d < kMaxDevices; ++d) {
    device_pool* pool = device_pool_if_built(d);
    if (!pool) continue;
    const pool_stats s = pool->stats();
    sum.peak_bytes += s.peak_bytes;
    sum.peak_reserved_bytes += s.peak_reserved_bytes;
    sum.current_bytes += s.current_bytes;
    t.add("%s\n    {\"device\": %d, ", first ? "" : ",", d);
    add_pool(t, s);
    t.add("}");
    first = false;
  }
  t.add("%s],\n", first ? "" : "\n  ");
  t.add("  \"device\": {\"alloc_count\": %llu, \"free_count\": %llu, "
        "\"largest_alloc_bytes\": %llu, \"peak_bytes\": %llu, \"peak_reserved_bytes\": %llu, "
        "\"current_bytes\": %llu, \"budget_refusals\": %llu, \"failed_count\": %llu, "
        "\"passthrough_alloc_count\": %llu, \"foreign_free_count\": %llu},\n",
        v(c.device_alloc), v(c.device_free), v(c.device_largest), v(sum.peak_bytes),
        v(sum.peak_reserved_bytes), v(sum.current_bytes), v(c.device_refused),
        v(c.device_failed), v(c.device_passthrough_alloc), v(c.device_foreign_free));
  t.add("  \"pinned\": {\"alloc_count\": %llu, \"free_count\": %llu, "
        "\"largest_alloc_bytes\": %llu, \"passthrough_alloc_count\": %llu, "
        "\"foreign_free_count\": %llu",
        v(c.pinned_alloc), v(c.pinned_free), v(c.pinned_largest), v(c.pinned_passthrough_alloc),
        v(c.pinned_foreign_free));
  pinned_pool* pinned = read_pools ? pinned_pool_if_built() : nullptr;
  if (pinned) {
    t.add(", ");
    add_pool(t, pinned->stats());
  }
  t.add("}\n}\n");
}

int write_locked(const char* path, bool read_pools) noexcept {
  static char buf[16384];  // one writer at a time (write_to)
  text t{buf, sizeof buf};
  format(t, read_pools);
  if (t.overflow) {
    errno = ENOBUFS;
    return -1;
  }
  // Whole or not at all, as write_text_file (core/json_file.h) writes every other file:
  // a temporary beside the report, then rename(2). That writer allocates, which this one,
  // running in any program's exit path, must not, so the steps are written out here.
  static char tmp[4096 + 64];
  const int len = std::snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, static_cast<long>(getpid()));
  if (len < 0 || static_cast<size_t>(len) >= sizeof tmp) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  auto give_up = [&](bool close_fd) {
    const int saved = errno;
    if (close_fd) ::close(fd);
    ::unlink(tmp);
    errno = saved;
    return -1;
  };
  size_t off = 0;
  while (off < t.len) {
    const ssize_t n = ::write(fd, buf + off, t.len - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return give_up(true);
    }
    off += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) return give_up(false);
  if (::rename(tmp, path) != 0) return give_up(false);
  return 0;
}

int write_to(const char* path, bool read_pools) noexcept {
  static std::atomic<bool> busy{false};
  if (busy.exchange(true, std::memory_order_acquire)) {
    errno = EBUSY;
    return -1;
  }
  const int rc = write_locked(path, read_pools);
  busy.store(false, std::memory_order_release);
  return rc;
}

// STASH_REPORT with "%p" replaced by the process id: child processes inherit LD_PRELOAD
// and the variable, and would otherwise overwrite one another's report.
const char* report_path() noexcept {
  static char path[4096 + 32];
  const char* in = opts().report_path;
  size_t o = 0;
  for (const char* c = in; *c && o + 24 < sizeof path; ++c) {
    if (c[0] == '%' && c[1] == 'p') {
      o += static_cast<size_t>(std::snprintf(path + o, sizeof path - o, "%ld",
                                             static_cast<long>(getpid())));
      ++c;
    } else {
      path[o++] = *c;
    }
  }
  path[o] = '\0';
  return path;
}

void report_at_exit() {
  if (g_written.exchange(true)) return;
  write_to(report_path(), true);
}

__attribute__((destructor)) void report_from_destructor() {
  if (!opts().report_path[0] || g_written.exchange(true)) return;
  write_to(report_path(), false);
}

}  // namespace

void arm_report_at_exit() noexcept {
  if (g_armed.load(std::memory_order_relaxed) || !opts().report_path[0]) return;
  if (!g_armed.exchange(true)) std::atexit(report_at_exit);
}

int write_report(const char* path) noexcept {
  if (!path) {
    errno = EINVAL;
    return -1;
  }
  return write_to(path, true);
}

}  // namespace stash::preload
