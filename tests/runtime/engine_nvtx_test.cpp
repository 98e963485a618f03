// NVTX as Nsight Systems would see it: the engine runs under a recording NVTX tool
// (nvtx_tool.cpp, loaded through NVTX_INJECTION64_PATH), and the test checks the domain,
// the range names and the stream names that stash emitted.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>

#include "engine_fixture.h"
#include "engine_nvtx.h"

namespace stash::test {
namespace {

std::vector<std::string> recorded(int list) {
  const char* path = std::getenv("NVTX_INJECTION64_PATH");
  void* h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
  if (!h) return {};
  auto count = reinterpret_cast<size_t (*)(int)>(dlsym(h, "nvtxtool_count"));
  auto get = reinterpret_cast<size_t (*)(int, size_t, char*, size_t)>(dlsym(h, "nvtxtool_get"));
  std::vector<std::string> out;
  for (size_t i = 0; count && get && i < count(list); ++i) {
    std::string s(get(list, i, nullptr, 0) + 1, '\0');
    get(list, i, s.data(), s.size());
    s.resize(s.size() - 1);
    out.push_back(s);
  }
  dlclose(h);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

class EngineNvtx : public EngineTest {};

TEST_F(EngineNvtx, DomainRangesAndStreamNames) {
  if (!std::getenv("NVTX_INJECTION64_PATH")) GTEST_SKIP() << "needs NVTX_INJECTION64_PATH";
  make(config(), plan_of({"o", "o", "o", "k"}));
  for (uint32_t l = 0; l < 3; ++l) {
    ASSERT_EQ(engine_->forward_begin(0, l), status::ok);
    void* p = dev_alloc(4096);
    ASSERT_EQ(engine_->offload({0, l, 0}, p, 4096, compute_), status::ok);
    ASSERT_EQ(engine_->forward_end(0, l), status::ok);
  }
  for (uint32_t l = 4; l-- > 0;) {
    ASSERT_EQ(engine_->backward_begin(0, l), status::ok);
    if (l < 3) {
      void* q = nullptr;
      ASSERT_EQ(engine_->acquire({0, l, 0}, compute_, &q), status::ok);
      ASSERT_EQ(engine_->release({0, l, 0}), status::ok);
    }
    ASSERT_EQ(engine_->backward_end(0, l), status::ok);
  }
  const auto domains = recorded(0), ranges = recorded(1), streams = recorded(2);
  ASSERT_FALSE(domains.empty()) << "the NVTX tool was not loaded";
  EXPECT_TRUE(has(domains, "stash"));
  for (const char* r : {engine::nvtx::kOffload, engine::nvtx::kPrefetch,
                        engine::nvtx::kWaitAcquire, engine::nvtx::kWaitInFlight,
                        engine::nvtx::kWaitTurn})
    EXPECT_TRUE(has(ranges, std::string("stash|") + r)) << r;
  for (const std::string& r : ranges) EXPECT_EQ(r.rfind("stash|stash:", 0), 0u) << r;
  EXPECT_TRUE(has(streams, "stash d2h"));
  EXPECT_TRUE(has(streams, "stash h2d"));
}

}  // namespace
}  // namespace stash::test
