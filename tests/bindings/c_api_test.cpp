// The C API's own contract: versions, status strings, NULL handles, versioned structs.
#include <gtest/gtest.h>

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
