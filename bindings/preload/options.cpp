#include "options.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "byte_count.h"

namespace stash::preload {

namespace {

options g_options;
pthread_once_t g_once = PTHREAD_ONCE_INIT;

// stderr without stdio: stdio may allocate its buffer, and may not be set up yet.
void warn(const char* a, const char* b, const char* c) noexcept {
  for (const char* s : {"stash preload: ", a, b, c, "\n"}) {
    ssize_t ignored = write(2, s, std::strlen(s));
    (void)ignored;
  }
}

void parse_bytes_option(const char* name, uint64_t* out) noexcept {
  const char* text = std::getenv(name);
  if (!text || !*text) return;
  if (!parse_byte_count(text, out)) {
    warn(name, "=", text);
    warn(name, " is not a byte count (e.g. 8GiB, 512MiB, 1000000); ignored", "");
  }
}

void parse_all() noexcept {
  g_options.disabled = parse_flag(std::getenv("STASH_DISABLE"));
  parse_bytes_option("STASH_DEVICE_BUDGET", &g_options.device_budget);
  parse_bytes_option("STASH_PINNED_CAP", &g_options.pinned_cap);
  const char* report = std::getenv("STASH_REPORT");
  if (report && *report) {
    const size_t n = std::strlen(report);
    if (n >= sizeof g_options.report_path) {
      warn("STASH_REPORT is longer than ", "4095 characters", "; no report");
    } else {
      std::memcpy(g_options.report_path, report, n + 1);
    }
  }
}

// Before main, so that the environment is read before the program can change it.
__attribute__((constructor)) void parse_early() { opts(); }

}  // namespace

const options& opts() noexcept {
  pthread_once(&g_once, parse_all);
  return g_options;
}

}  // namespace stash::preload
