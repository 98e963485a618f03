#include "host_memory.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace stash {

namespace {

constexpr size_t path_capacity = 512;
// memory.max values at or above this mean "no limit" (v1 reports ~2^63 rounded down).
constexpr uint64_t unlimited = uint64_t{1} << 60;

// Reads a whole small file into buf (NUL-terminated); false when unreadable.
bool read_file(const char* path, char* buf, size_t cap) noexcept {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  size_t used = 0;
  while (used + 1 < cap) {
    const ssize_t n = ::read(fd, buf + used, cap - 1 - used);
    if (n <= 0) break;
    used += static_cast<size_t>(n);
  }
  ::close(fd);
  buf[used] = '\0';
  return true;
}

// Parses a decimal number at s; false when there is none.
bool parse_u64(const char* s, uint64_t* out) noexcept {
  while (*s == ' ' || *s == '\t') ++s;
  if (*s < '0' || *s > '9') return false;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) {
    const uint64_t d = static_cast<uint64_t>(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

uint64_t read_mem_available(const char* root) noexcept {
  char path[path_capacity];
  char buf[8192];
  std::snprintf(path, sizeof path, "%s/proc/meminfo", root);
  if (!read_file(path, buf, sizeof buf)) return 0;
  const char* line = std::strstr(buf, "MemAvailable:");
  uint64_t kib = 0;
  if (!line || !parse_u64(line + std::strlen("MemAvailable:"), &kib)) return 0;
  return kib * 1024;
}

// Reads "<dir>/<limit_file>" and "<dir>/<usage_file>"; returns the headroom, or
// UINT64_MAX when there is no limit there.
uint64_t headroom_at(const char* dir, const char* limit_file, const char* usage_file) noexcept {
  char path[path_capacity];
  char buf[64];
  uint64_t limit = 0, usage = 0;
  std::snprintf(path, sizeof path, "%s/%s", dir, limit_file);
  if (!read_file(path, buf, sizeof buf) || !parse_u64(buf, &limit) || limit >= unlimited) {
    return UINT64_MAX;  // missing, "max", or a v1 "unlimited"
  }
  std::snprintf(path, sizeof path, "%s/%s", dir, usage_file);
  if (!read_file(path, buf, sizeof buf) || !parse_u64(buf, &usage)) usage = 0;
  return usage >= limit ? 0 : limit - usage;
}

bool is_dir_with(const char* dir, const char* file) noexcept {
  char path[path_capacity];
  std::snprintf(path, sizeof path, "%s/%s", dir, file);
  return ::access(path, F_OK) == 0;
}

// The smallest headroom over `cgpath` and each of its ancestors under `mount`. When the
// process's own cgroup directory is not visible (a container sees only its namespace's
// root), the mount root itself is used.
uint64_t hierarchy_headroom(const char* mount, const char* cgpath, const char* limit_file,
                            const char* usage_file) noexcept {
  char dir[path_capacity];
  std::snprintf(dir, sizeof dir, "%s%s", mount, cgpath);
  size_t len = std::strlen(dir);
  while (len > 1 && dir[len - 1] == '/') dir[--len] = '\0';
  if (!is_dir_with(dir, limit_file)) {
    std::snprintf(dir, sizeof dir, "%s", mount);
    len = std::strlen(dir);
  }
  const size_t mount_len = std::strlen(mount);
  uint64_t best = UINT64_MAX;
  for (;;) {
    const uint64_t h = headroom_at(dir, limit_file, usage_file);
    if (h < best) best = h;
    if (len <= mount_len) break;
    char* slash = std::strrchr(dir, '/');
    if (!slash || static_cast<size_t>(slash - dir) < mount_len) break;
    *slash = '\0';
    len = static_cast<size_t>(slash - dir);
  }
  return best;
}

// Finds this process's cgroup and its memory headroom. /proc/self/cgroup lines are
// "id:controllers:path"; v2 is "0::path", v1's memory controller is listed by name.
void read_cgroup(const char* root, host_memory* hm) noexcept {
  char path[path_capacity];
  char buf[4096];
  std::snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
  if (!read_file(path, buf, sizeof buf)) return;
  char v2_path[path_capacity] = "";
  char v1_path[path_capacity] = "";
  bool have_v2 = false, have_v1 = false;
  for (char* line = buf; line && *line;) {
    char* end = std::strchr(line, '\n');
    if (end) *end = '\0';
    char* c1 = std::strchr(line, ':');
    char* c2 = c1 ? std::strchr(c1 + 1, ':') : nullptr;
    if (c1 && c2) {
      *c2 = '\0';
      const char* controllers = c1 + 1;
      const char* cg = c2 + 1;
      if (std::strncmp(line, "0:", 2) == 0 && controllers[0] == '\0') {
        std::snprintf(v2_path, sizeof v2_path, "%s", cg);
        have_v2 = true;
      } else {
        // v1: the controller list is comma separated; look for "memory" as a whole word.
        for (const char* c = controllers; c && *c;) {
          const char* comma = std::strchr(c, ',');
          const size_t n = comma ? static_cast<size_t>(comma - c) : std::strlen(c);
          if (n == 6 && std::strncmp(c, "memory", 6) == 0) {
            std::snprintf(v1_path, sizeof v1_path, "%s", cg);
            have_v1 = true;
          }
          c = comma ? comma + 1 : nullptr;
        }
      }
    }
    line = end ? end + 1 : nullptr;
  }
  char mount[path_capacity];
  if (have_v1) {
    std::snprintf(mount, sizeof mount, "%s/sys/fs/cgroup/memory", root);
    const uint64_t h = hierarchy_headroom(mount, v1_path, "memory.limit_in_bytes",
                                          "memory.usage_in_bytes");
    if (h != UINT64_MAX || hm->cgroup_version == 0) hm->cgroup_version = 1;
    if (h < hm->cgroup_headroom) hm->cgroup_headroom = h;
  }
  if (have_v2) {
    std::snprintf(mount, sizeof mount, "%s/sys/fs/cgroup", root);
    const uint64_t h = hierarchy_headroom(mount, v2_path, "memory.max", "memory.current");
    if (h < hm->cgroup_headroom) {
      hm->cgroup_headroom = h;
      hm->cgroup_version = 2;
    } else if (hm->cgroup_version == 0) {
      hm->cgroup_version = 2;
    }
  }
}

}  // namespace

int parse_local_ranks(const char* value) noexcept {
  uint64_t n = 0;
  if (!value || !parse_u64(value, &n) || n == 0 || n > 4096) return 1;
  return static_cast<int>(n);
}

host_memory probe_host_memory(const char* root) noexcept {
  if (!root) root = "";
  host_memory hm;
  hm.mem_available = read_mem_available(root);
  read_cgroup(root, &hm);
  hm.really_available = hm.mem_available;
  if (hm.cgroup_headroom < hm.really_available || hm.really_available == 0) {
    hm.really_available = hm.cgroup_headroom == UINT64_MAX ? 0 : hm.cgroup_headroom;
  }
  hm.local_ranks = parse_local_ranks(std::getenv("LOCAL_WORLD_SIZE"));
  hm.default_cap = static_cast<uint64_t>(static_cast<double>(hm.really_available) * 0.8) /
                   static_cast<uint64_t>(hm.local_ranks);
  return hm;
}

}  // namespace stash
