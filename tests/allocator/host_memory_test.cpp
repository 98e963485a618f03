// The pinned pool's default cap: MemAvailable, cgroup v1/v2 headroom, LOCAL_WORLD_SIZE,
// read from a fake /proc and /sys/fs/cgroup tree.
#include "host_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace stash {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t GiB = uint64_t{1} << 30;

class HostMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("stash_host_memory_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "proc/self");
    unsetenv("LOCAL_WORLD_SIZE");
  }
  void TearDown() override {
    fs::remove_all(root_);
    unsetenv("LOCAL_WORLD_SIZE");
  }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  void meminfo(uint64_t available_kib) {
    write("proc/meminfo", "MemTotal:       263856120 kB\nMemFree:         1000 kB\n"
                          "MemAvailable:   " + std::to_string(available_kib) + " kB\n");
  }
  host_memory probe() { return probe_host_memory(root_.c_str()); }
  fs::path root_;
};

TEST_F(HostMemory, MemAvailableWithoutCgroup) {
  meminfo(100 * 1024 * 1024);  // 100 GiB
  const host_memory hm = probe();
  EXPECT_EQ(hm.mem_available, 100 * GiB);
  EXPECT_EQ(hm.cgroup_headroom, UINT64_MAX);
  EXPECT_EQ(hm.really_available, 100 * GiB);
  EXPECT_EQ(hm.default_cap, 80 * GiB);
}

TEST_F(HostMemory, CgroupV2LimitWins) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/job.slice/rank0\n");
  write("sys/fs/cgroup/job.slice/rank0/memory.max", std::to_string(30 * GiB) + "\n");
  write("sys/fs/cgroup/job.slice/rank0/memory.current", std::to_string(10 * GiB) + "\n");
  write("sys/fs/cgroup/job.slice/memory.max", "max\n");
  const host_memory hm = probe();
  EXPECT_EQ(hm.cgroup_version, 2);
  EXPECT_EQ(hm.cgroup_headroom, 20 * GiB);
  EXPECT_EQ(hm.really_available, 20 * GiB);
  EXPECT_EQ(hm.default_cap, 16 * GiB);
}

TEST_F(HostMemory, CgroupV2AncestorLimitCounts) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/job.slice/rank0\n");
  write("sys/fs/cgroup/job.slice/rank0/memory.max", "max\n");
  write("sys/fs/cgroup/job.slice/memory.max", std::to_string(12 * GiB) + "\n");
  write("sys/fs/cgroup/job.slice/memory.current", std::to_string(2 * GiB) + "\n");
  EXPECT_EQ(probe().really_available, 10 * GiB);
}

TEST_F(HostMemory, CgroupV2NamespaceRootWhenOwnPathIsInvisible) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "0::/kubepods/pod123/ctr\n");
  write("sys/fs/cgroup/memory.max", std::to_string(8 * GiB) + "\n");
  write("sys/fs/cgroup/memory.current", std::to_string(4 * GiB) + "\n");
  EXPECT_EQ(probe().really_available, 4 * GiB);
}

TEST_F(HostMemory, CgroupV1Limit) {
  meminfo(100 * 1024 * 1024);
  write("proc/self/cgroup", "12:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n");
  write("sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", std::to_string(6 * GiB));
  write("sys/fs/cgroup/memory/docker/abc/memory.usage_in_bytes", std::to_string(1 * GiB));
  const host_memory hm = probe();
  EXPECT_EQ(hm.cgroup_version, 1);
  EXPECT_EQ(hm.really_available, 5 * GiB);
}

TEST_F(HostMemory, CgroupV1UnlimitedIsIgnored) {
  meminfo(10 * 1024 * 1024);
  write("proc/self/cgroup", "4:memory:/\n");
  write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write("sys/fs/cgroup/memory/memory.usage_in_bytes", "12345\n");
  EXPECT_EQ(probe().really_available, 10 * GiB);
}

TEST_F(HostMemory, UsageAboveLimitLeavesNothing) {
  meminfo(10 * 1024 * 1024);
  write("proc/self/cgroup", "0::/\n");
  write("sys/fs/cgroup/memory.max", std::to_string(1 * GiB));
  write("sys/fs/cgroup/memory.current", std::to_string(2 * GiB));
  EXPECT_EQ(probe().really_available, 0u);
  EXPECT_EQ(probe().default_cap, 0u);
}

TEST_F(HostMemory, LocalRanksShareTheCap) {
  meminfo(100 * 1024 * 1024);
  setenv("LOCAL_WORLD_SIZE", "8", 1);
  const host_memory hm = probe();
  EXPECT_EQ(hm.local_ranks, 8);
  EXPECT_EQ(hm.default_cap, 10 * GiB);
}

TEST(LocalRanks, ParsesOrDefaultsToOne) {
  EXPECT_EQ(parse_local_ranks(nullptr), 1);
  EXPECT_EQ(parse_local_ranks(""), 1);
  EXPECT_EQ(parse_local_ranks("abc"), 1);
  EXPECT_EQ(parse_local_ranks("0"), 1);
  EXPECT_EQ(parse_local_ranks("4"), 4);
}

TEST(HostMemoryReal, ThisMachineHasSomeMemory) {
  const host_memory hm = probe_host_memory("");
  EXPECT_GT(hm.mem_available, 0u);
  EXPECT_GT(hm.default_cap, 0u);
  EXPECT_LE(hm.really_available, hm.mem_available);
}

}  // namespace
}  // namespace stash
