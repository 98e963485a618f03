// The C API's own contract: versions, status strings, NULL handles, versioned structs.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <thread>

#include "stash.h"

namespace {

TEST(CApi, VersionMatchesTheHeader) {
  EXPECT_EQ(stash_version(), static_cast<unsigned>(STASH_VERSION_NUMBER));
  EXPECT_STREQ(stash_version_string(), STASH_VERSION_STRING);
}

TEST(CApi, StatusNumbersAndStringsAreFixed) {
  EXPECT_EQ(STASH_OK, 0);
  EXPECT_EQ(STASH_ERROR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(STASH_ERROR_OUT_OF_MEMORY, 2);
  EXPECT_EQ(STASH_ERROR_CUDA, 3);
  EXPECT_EQ(STASH_ERROR_TIMEOUT, 4);
  EXPECT_EQ(STASH_ERROR_UNKNOWN_POINTER, 5);
  EXPECT_EQ(STASH_ERROR_VERSION_MISMATCH, 6);
  EXPECT_EQ(STASH_ERROR_INTERNAL, 7);
  EXPECT_STREQ(stash_status_string(STASH_ERROR_OUT_OF_MEMORY), "out of memory");
  EXPECT_STREQ(stash_status_string(static_cast<stash_status_t>(999)), "unknown status");
}

TEST(CApi, NullHandlesAreErrorsNotCrashes) {
  void* p = reinterpret_cast<void*>(1);
  EXPECT_EQ(stash_pinned_alloc(nullptr, 64, &p), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(stash_last_error()).find("pool is NULL"), std::string::npos);
  EXPECT_EQ(stash_pinned_free(nullptr, p, nullptr, 0), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_pinned_reserve(nullptr, 1), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_pinned_wait_reserved(nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_pinned_release_cached(nullptr, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_pinned_reset_peak(nullptr), STASH_ERROR_INVALID_ARGUMENT);
  stash_pool_stats_t s;
  stash_pool_stats_init(&s);
  EXPECT_EQ(stash_pinned_stats(nullptr, &s), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_alloc(nullptr, 64, nullptr, &p), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_free(nullptr, p, nullptr, 0), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_stats(nullptr, &s), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_reset_peak(nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_release_cached(nullptr, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_pinned_pool_create(nullptr, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stash_device_pool_create(nullptr, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  stash_pinned_pool_destroy(nullptr);
  stash_device_pool_destroy(nullptr);
  stash_pinned_pool_config_init(nullptr);
  stash_device_pool_config_init(nullptr);
  stash_pool_stats_init(nullptr);
}

TEST(CApi, ConfigsMustComeFromTheirInitFunction) {
  stash_pinned_pool_config_t cfg;
  std::memset(&cfg, 0, sizeof cfg);
  stash_pinned_pool_t* pool = reinterpret_cast<stash_pinned_pool_t*>(1);
  EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(pool, nullptr);
  EXPECT_NE(std::string(stash_last_error()).find("stash_pinned_pool_config_init"),
            std::string::npos);
  stash_pinned_pool_config_init(&cfg);
  EXPECT_EQ(cfg.struct_size, sizeof cfg);
  EXPECT_EQ(cfg.version, static_cast<unsigned>(STASH_PINNED_POOL_CONFIG_VERSION));
  EXPECT_EQ(cfg.alignment, 4096u);
  cfg.version = 99;
  EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_VERSION_MISMATCH);
  stash_device_pool_config_t dcfg;
  stash_device_pool_config_init(&dcfg);
  dcfg.struct_size -= 1;
  stash_device_pool_t* dpool = nullptr;
  EXPECT_EQ(stash_device_pool_create(&dcfg, &dpool), STASH_ERROR_VERSION_MISMATCH);
}

// The smallest struct_size that holds T::field (Note [Versioned structs]).
#define END_OF(T, field) (offsetof(T, field) + sizeof(T::field))

std::string range(size_t lo, size_t hi) {
  return lo == hi ? std::to_string(lo) : std::to_string(lo) + ".." + std::to_string(hi);
}

// All three configs are unchanged since 0.1.0, so their first size is where their last
// field ends; the pinned pool's is below its sizeof (tail padding).
constexpr size_t kPinnedFirst = END_OF(stash_pinned_pool_config_t, wait_timeout_ms);
constexpr size_t kDeviceFirst = END_OF(stash_device_pool_config_t, alignment);
constexpr size_t kEngineFirst = END_OF(stash_engine_config_t, max_micro_batches);

TEST(CApi, ConfigsFromTheFirstSizeUpAreAccepted) {
  stash_pinned_pool_config_t cfg;
  stash_pinned_pool_config_init(&cfg);
  cfg.cap_bytes = 1 << 20;
  cfg.struct_size = kPinnedFirst;
  stash_pinned_pool_t* pool = nullptr;
  ASSERT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_OK) << stash_last_error();
  stash_pool_stats_t s;
  stash_pool_stats_init(&s);
  ASSERT_EQ(stash_pinned_stats(pool, &s), STASH_OK);
  EXPECT_EQ(s.limit_bytes, 1u << 20);
  stash_pinned_pool_destroy(pool);

  stash_device_pool_config_t dcfg;
  stash_device_pool_config_init(&dcfg);
  dcfg.struct_size = kDeviceFirst;
  stash_device_pool_t* dpool = nullptr;
  ASSERT_EQ(stash_device_pool_create(&dcfg, &dpool), STASH_OK) << stash_last_error();
  stash_device_pool_destroy(dpool);
}

TEST(CApi, ConfigsBelowTheFirstSizeAreRefused) {
  stash_pinned_pool_config_t cfg;
  stash_pinned_pool_config_init(&cfg);
  cfg.struct_size = kPinnedFirst - 1;
  stash_pinned_pool_t* pool = reinterpret_cast<stash_pinned_pool_t*>(1);
  EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(pool, nullptr);
  const std::string e = stash_last_error();
  EXPECT_NE(e.find("stash_pinned_pool_create: config->struct_size is " +
                   std::to_string(kPinnedFirst - 1) + ", too small for any "
                   "stash_pinned_pool_config_t"),
            std::string::npos) << e;
  // The range, from the first size to this library's sizeof.
  EXPECT_NE(e.find("takes struct_size " + range(kPinnedFirst, sizeof cfg)), std::string::npos)
      << e;
  EXPECT_NE(e.find("stash_pinned_pool_config_init"), std::string::npos) << e;

  stash_device_pool_config_t dcfg;
  stash_device_pool_config_init(&dcfg);
  dcfg.struct_size = sizeof(size_t);
  stash_device_pool_t* dpool = reinterpret_cast<stash_device_pool_t*>(1);
  EXPECT_EQ(stash_device_pool_create(&dcfg, &dpool), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(dpool, nullptr);
  EXPECT_NE(std::string(stash_last_error()).find("stash_device_pool_config_t"), std::string::npos);

  // Refused before anything else is looked at: no pool or callbacks needed.
  stash_engine_config_t ecfg;
  stash_engine_config_init(&ecfg);
  ecfg.struct_size = kEngineFirst - 1;
  stash_engine_t* engine = reinterpret_cast<stash_engine_t*>(1);
  EXPECT_EQ(stash_engine_create(&ecfg, &engine), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(engine, nullptr);
  EXPECT_NE(std::string(stash_last_error()).find("stash_engine_config_t"), std::string::npos);
}

TEST(CApi, ConfigsLargerThanThisLibrarysAreRefused) {
  // A program built against a newer stash.h than the library: fields it sets would be
  // ignored, so nothing is guessed.
  struct {
    stash_pinned_pool_config_t cfg;
    unsigned char newer[16];
  } big{};
  stash_pinned_pool_config_init(&big.cfg);
  big.cfg.struct_size = sizeof big;
  stash_pinned_pool_t* pool = reinterpret_cast<stash_pinned_pool_t*>(1);
  EXPECT_EQ(stash_pinned_pool_create(&big.cfg, &pool), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(pool, nullptr);
  std::string e = stash_last_error();
  EXPECT_NE(e.find("config->struct_size is " + std::to_string(sizeof big) + ", larger than"),
            std::string::npos) << e;
  EXPECT_NE(e.find("stash_pinned_pool_config_t"), std::string::npos) << e;
  EXPECT_NE(e.find(range(kPinnedFirst, sizeof big.cfg)), std::string::npos) << e;

  stash_device_pool_config_t dcfg;
  stash_device_pool_config_init(&dcfg);
  dcfg.struct_size = sizeof dcfg + 1;
  stash_device_pool_t* dpool = nullptr;
  EXPECT_EQ(stash_device_pool_create(&dcfg, &dpool), STASH_ERROR_VERSION_MISMATCH);
  e = stash_last_error();
  EXPECT_NE(e.find("takes struct_size " + range(kDeviceFirst, sizeof dcfg)), std::string::npos)
      << e;

  stash_engine_config_t ecfg;
  stash_engine_config_init(&ecfg);
  ecfg.struct_size = sizeof ecfg + 8;
  stash_engine_t* engine = nullptr;
  EXPECT_EQ(stash_engine_create(&ecfg, &engine), STASH_ERROR_VERSION_MISMATCH);
  e = stash_last_error();
  EXPECT_NE(e.find("stash_engine_config_t"), std::string::npos) << e;
  EXPECT_NE(e.find("takes struct_size " + range(kEngineFirst, sizeof ecfg)), std::string::npos)
      << e;
}

TEST(CApi, UnknownConfigVersionsAreRefused) {
  for (unsigned v : {0u, unsigned{STASH_PINNED_POOL_CONFIG_VERSION} + 1}) {
    stash_pinned_pool_config_t cfg;
    stash_pinned_pool_config_init(&cfg);
    cfg.version = v;
    stash_pinned_pool_t* pool = reinterpret_cast<stash_pinned_pool_t*>(1);
    EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_VERSION_MISMATCH) << v;
    EXPECT_EQ(pool, nullptr);
    const std::string e = stash_last_error();
    EXPECT_NE(e.find("config->version is " + std::to_string(v)), std::string::npos) << e;
    EXPECT_NE(e.find("stash_pinned_pool_config_t version " +
                     range(1, STASH_PINNED_POOL_CONFIG_VERSION)),
              std::string::npos) << e;
  }
  stash_device_pool_config_t dcfg;
  stash_device_pool_config_init(&dcfg);
  dcfg.version = STASH_DEVICE_POOL_CONFIG_VERSION + 1;
  stash_device_pool_t* dpool = nullptr;
  EXPECT_EQ(stash_device_pool_create(&dcfg, &dpool), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_NE(std::string(stash_last_error()).find("stash_device_pool_config_t version"),
            std::string::npos);
  stash_engine_config_t ecfg;
  stash_engine_config_init(&ecfg);
  ecfg.version = STASH_ENGINE_CONFIG_VERSION + 1;
  stash_engine_t* engine = nullptr;
  EXPECT_EQ(stash_engine_create(&ecfg, &engine), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_NE(std::string(stash_last_error()).find("stash_engine_config_t version"),
            std::string::npos);
}

TEST(CApi, BadConfigValuesAreInvalidArguments) {
  stash_pinned_pool_config_t cfg;
  stash_pinned_pool_config_init(&cfg);
  cfg.cap_bytes = 1 << 20;
  cfg.alignment = 3000;
  stash_pinned_pool_t* pool = nullptr;
  EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stash_last_error()).find("alignment"), std::string::npos);
  EXPECT_EQ(pool, nullptr);
  stash_pinned_pool_config_init(&cfg);
  cfg.cap_bytes = 1 << 20;
  cfg.on_exhausted = static_cast<stash_exhaustion_t>(7);
  EXPECT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, StatsStructsAreVersionedBySize) {
  stash_pinned_pool_config_t cfg;
  stash_pinned_pool_config_init(&cfg);
  cfg.cap_bytes = 8 << 20;
  stash_pinned_pool_t* pool = nullptr;
  ASSERT_EQ(stash_pinned_pool_create(&cfg, &pool), STASH_OK) << stash_last_error();
  void* p = nullptr;
  ASSERT_EQ(stash_pinned_alloc(pool, 100, &p), STASH_OK);
  stash_pool_stats_t s;
  std::memset(&s, 0xff, sizeof s);
  s.struct_size = 0;
  EXPECT_EQ(stash_pinned_stats(pool, &s), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_EQ(stash_pinned_stats(pool, nullptr), STASH_ERROR_INVALID_ARGUMENT);
  s.struct_size = sizeof s + 8;  // a newer stash.h: more figures than this library has
  EXPECT_EQ(stash_pinned_stats(pool, &s), STASH_ERROR_VERSION_MISMATCH);
  EXPECT_NE(std::string(stash_last_error())
                .find("stats->struct_size is " + std::to_string(sizeof s + 8) +
                      ", larger than"),
            std::string::npos) << stash_last_error();
  // Statistics take any size that holds struct_size itself.
  EXPECT_NE(std::string(stash_last_error()).find(range(sizeof(size_t), sizeof s)),
            std::string::npos) << stash_last_error();
  // An older, shorter struct is filled as far as it goes.
  s.struct_size = offsetof(stash_pool_stats_t, peak_count);
  EXPECT_EQ(stash_pinned_stats(pool, &s), STASH_OK);
  EXPECT_EQ(s.current_count, 1u);
  EXPECT_EQ(s.peak_count, UINT64_MAX);  // untouched
  stash_pool_stats_init(&s);
  EXPECT_EQ(stash_pinned_stats(pool, &s), STASH_OK);
  EXPECT_EQ(s.requested_bytes, 100u);
  EXPECT_EQ(s.current_bytes, 4096u);
  EXPECT_EQ(stash_pinned_free(pool, p, nullptr, 0), STASH_OK);
  stash_pinned_pool_destroy(pool);
}

TEST(CApi, LastErrorIsPerThread) {
  void* p = nullptr;
  EXPECT_EQ(stash_pinned_alloc(nullptr, 1, &p), STASH_ERROR_INVALID_ARGUMENT);
  std::string other;
  std::thread t([&] { other = stash_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(stash_last_error()), "");
}

}  // namespace

#include "host_memory.h"

namespace {

// The profile's host.pinnable_bytes (stash.torch's record pass and fit) is the pinned
// pool's own default cap, cgroup limits and LOCAL_WORLD_SIZE included.
TEST(CApi, PinnedDefaultCapIsThePoolsDefault) {
  size_t bytes = 0;
  ASSERT_EQ(stash_pinned_default_cap(&bytes), STASH_OK) << stash_last_error();
  // Read twice, a moment apart: MemAvailable moves a little in between.
  const double want = static_cast<double>(stash::probe_host_memory().default_cap);
  EXPECT_NEAR(static_cast<double>(bytes), want, 0.02 * want);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(stash_pinned_default_cap(nullptr), STASH_ERROR_INVALID_ARGUMENT);
}

}  // namespace
