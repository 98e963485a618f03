// preload_probe: a CUDA program run by ctest with LD_PRELOAD=libstash_preload.so on the
// CPU test double of libcudart.so.13. `preload_probe <scenario>`; each scenario checks
// one behaviour of the interposer and exits non-zero on the first failed check.
//
// Every scenario first requires that it runs on the double and under the preload library
// (stash_preload_counters found with dlsym), so a misconfigured run fails instead of
// passing vacuously.
#include <dlfcn.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include "stash_preload.h"

extern "C" cudaError_t cudaMallocAsync_ptsz(void**, size_t, cudaStream_t);
extern "C" cudaError_t cudaFreeAsync_ptsz(void*, cudaStream_t);
extern char** environ;

namespace {

constexpr size_t MiB = size_t{1} << 20;

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::exit(1);                                                              \
    }                                                                            \
  } while (0)

#define CHECK_CUDA(call)                                                          \
  do {                                                                            \
    const cudaError_t e_ = (call);                                                \
    if (e_ != cudaSuccess) {                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorName(e_)); \
      std::exit(1);                                                               \
    }                                                                             \
  } while (0)

template <class F>
F lookup(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

stash_preload_counters_t counters() {
  auto fn = lookup<decltype(&stash_preload_counters)>("stash_preload_counters");
  CHECK(fn != nullptr);  // the preload library is loaded
  stash_preload_counters_t c;
  std::memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  CHECK(fn(&c) == STASH_OK);
  return c;
}

// Returns false when device 0 has no pool yet.
bool device_stats(stash_pool_stats_t* s) {
  auto fn = lookup<decltype(&stash_preload_device_stats)>("stash_preload_device_stats");
  CHECK(fn != nullptr);
  std::memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return fn(0, s) == STASH_OK;
}

bool pinned_stats(stash_pool_stats_t* s) {
  auto fn = lookup<decltype(&stash_preload_pinned_stats)>("stash_preload_pinned_stats");
  CHECK(fn != nullptr);
  std::memset(s, 0, sizeof *s);
  s->struct_size = sizeof *s;
  return fn(s) == STASH_OK;
}

void require_setup() {
  CHECK(lookup<void*>("stashdbl_probe") != nullptr);  // on the CPU test double
  counters();                                          // under the preload library
}

// The runtime's own functions, bypassing the hooks: a handle lookup in libcudart.so.13
// (RTLD_NEXT from here would find the preload library first).
template <class F>
F real(const char* name) {
  void* lib = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
  CHECK(lib != nullptr);
  auto f = reinterpret_cast<F>(dlvsym(lib, name, "libcudart.so.13"));
  CHECK(f != nullptr);
  return f;
}

void interpose() {
  require_setup();
  CHECK(counters().enabled == 1);
  CHECK_CUDA(cudaFree(nullptr));  // context init idiom: passes through
  void *a = nullptr, *b = nullptr, *c = nullptr;
  CHECK_CUDA(cudaMalloc(&a, MiB));
  CHECK_CUDA(cudaMalloc(&b, MiB));
  stash_pool_stats_t s;
  CHECK(device_stats(&s));
  CHECK(s.current_count == 2 && s.current_bytes == 2 * MiB);
  CHECK(s.slab_count == 1 && s.reserved_bytes == 32 * MiB);  // both from one slab
  CHECK(static_cast<char*>(b) == static_cast<char*>(a) + MiB);  // best fit, address order
  // The memory is real to the runtime: a copy through it round-trips.
  std::vector<char> in(MiB, 'x'), out(MiB, 0);
  CHECK_CUDA(cudaMemcpy(b, in.data(), MiB, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(out.data(), b, MiB, cudaMemcpyDeviceToHost));
  CHECK(out == in);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaMalloc(&c, MiB));
  CHECK(c == a);  // the freed block is reused, not a fresh cudaMalloc
  CHECK_CUDA(cudaFree(b));
  CHECK_CUDA(cudaFree(c));

  cudaStream_t st;
  CHECK_CUDA(cudaStreamCreate(&st));
  void* d = nullptr;
  CHECK_CUDA(cudaMallocAsync(&d, 4 * MiB, st));
  void* e = nullptr;
  CHECK_CUDA(cudaMallocAsync_ptsz(&e, 2 * MiB, nullptr));
  CHECK(device_stats(&s) && s.current_count == 2 && s.current_bytes == 6 * MiB);
  CHECK_CUDA(cudaFreeAsync(d, st));
  CHECK_CUDA(cudaFreeAsync_ptsz(e, nullptr));
  CHECK_CUDA(cudaStreamSynchronize(st));
  CHECK_CUDA(cudaStreamDestroy(st));
  CHECK(device_stats(&s) && s.current_count == 0);

  void *h1 = nullptr, *h2 = nullptr, *h3 = nullptr;
  CHECK_CUDA(cudaMallocHost(&h1, 64 * 1024));
  CHECK_CUDA(cudaHostAlloc(&h2, MiB, cudaHostAllocPortable));
  CHECK_CUDA(cudaHostAlloc(&h3, MiB, cudaHostAllocMapped));  // not the pool's kind
  CHECK(pinned_stats(&s) && s.current_count == 2);
  CHECK_CUDA(cudaFreeHost(h1));
  CHECK_CUDA(cudaFreeHost(h2));
  CHECK_CUDA(cudaFreeHost(h3));
  CHECK(pinned_stats(&s) && s.current_count == 0);

  const stash_preload_counters_t k = counters();
  CHECK(k.device_alloc_count == 5 && k.device_free_count == 5);
  CHECK(k.device_largest_alloc_bytes == 4 * MiB);
  CHECK(k.pinned_alloc_count == 2 && k.pinned_free_count == 2);
  CHECK(k.pinned_passthrough_alloc_count == 1 && k.pinned_foreign_free_count == 1);
  CHECK(k.device_budget_refusals == 0 && k.device_foreign_free_count == 0);
}

void threads() {
  require_setup();
  constexpr int kThreads = 4, kRounds = 300;
  std::atomic<int> failures{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, &failures] {
      std::vector<void*> live;
      for (int i = 0; i < kRounds; ++i) {
        void* p = nullptr;
        const size_t bytes = size_t(1 + (i * 7 + t) % 13) * 4096;
        if (cudaMalloc(&p, bytes) != cudaSuccess) ++failures;
        live.push_back(p);
        if (i % 3 == 2) {
          if (cudaFree(live.front()) != cudaSuccess) ++failures;
          live.erase(live.begin());
        }
      }
      for (void* p : live)
        if (cudaFree(p) != cudaSuccess) ++failures;
    });
  }
  for (auto& th : pool) th.join();
  CHECK(failures == 0);
  stash_pool_stats_t s;
  CHECK(device_stats(&s) && s.current_count == 0 && s.total_count == kThreads * kRounds);
  const stash_preload_counters_t k = counters();
  CHECK(k.device_alloc_count == kThreads * kRounds && k.device_free_count == kThreads * kRounds);
}

// Run with STASH_DEVICE_BUDGET=64MiB.
void budget() {
  require_setup();
  CHECK(counters().device_budget_bytes == 64 * MiB);
  void *a = nullptr, *b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 40 * MiB));
  CHECK(cudaMalloc(&b, 40 * MiB) == cudaErrorMemoryAllocation);
  CHECK(b == nullptr);
  CHECK(cudaMallocAsync(&b, 40 * MiB, nullptr) == cudaErrorMemoryAllocation);
  stash_pool_stats_t s;
  CHECK(device_stats(&s) && s.limit_bytes == 64 * MiB && s.reserved_bytes <= 64 * MiB);
  CHECK(counters().device_budget_refusals == 2);
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaMalloc(&b, 40 * MiB));  // fits again once the first is freed
  CHECK_CUDA(cudaFree(b));
}

void foreign() {
  require_setup();
  auto real_malloc = real<cudaError_t (*)(void**, size_t)>("cudaMalloc");
  auto real_host_alloc = real<cudaError_t (*)(void**, size_t, unsigned)>("cudaHostAlloc");
  auto real_malloc_async = real<cudaError_t (*)(void**, size_t, cudaStream_t)>("cudaMallocAsync");
  CHECK(reinterpret_cast<void*>(real_malloc) != reinterpret_cast<void*>(&cudaMalloc));
  void* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&pooled, MiB));  // builds the pool, so ownership is really checked
  void *d = nullptr, *h = nullptr, *x = nullptr;
  CHECK_CUDA(real_malloc(&d, MiB));
  CHECK_CUDA(real_host_alloc(&h, MiB, cudaHostAllocDefault));
  CHECK_CUDA(real_malloc_async(&x, MiB, nullptr));
  CHECK_CUDA(cudaFree(d));        // through the hook, on to the runtime
  CHECK_CUDA(cudaFreeHost(h));
  CHECK_CUDA(cudaFreeAsync(x, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  const stash_preload_counters_t k = counters();
  CHECK(k.device_foreign_free_count == 2 && k.pinned_foreign_free_count == 1);
  CHECK(k.device_alloc_count == 1 && k.device_free_count == 0);
  // A pointer inside a pooled block is not a block: an error, and nothing changes.
  CHECK(cudaFree(static_cast<char*>(pooled) + 512) != cudaSuccess);
  cudaGetLastError();
  stash_pool_stats_t s;
  CHECK(device_stats(&s) && s.current_count == 1);
  CHECK_CUDA(cudaFree(pooled));
}

// Run with STASH_DISABLE=1 and STASH_DEVICE_BUDGET=1MiB.
void disabled() {
  require_setup();
  CHECK(counters().enabled == 0);
  void *a = nullptr, *h = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 8 * MiB));  // the budget does not apply
  CHECK_CUDA(cudaMallocHost(&h, MiB));
  stash_pool_stats_t s;
  CHECK(!device_stats(&s) && !pinned_stats(&s));  // no pool was ever built
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFreeHost(h));
  const stash_preload_counters_t k = counters();
  CHECK(k.device_alloc_count == 0 && k.pinned_alloc_count == 0 && k.device_foreign_free_count == 0);
}

// The child of `report`: allocates, leaves one block live, and exits (the report is
// written at exit).
void report_child() {
  void *a = nullptr, *b = nullptr, *c = nullptr, *h = nullptr;
  CHECK_CUDA(cudaMalloc(&a, 3 * MiB));
  CHECK_CUDA(cudaMalloc(&b, 5 * MiB));
  if (counters().enabled) {
    CHECK(cudaMalloc(&c, 32 * MiB) == cudaErrorMemoryAllocation);  // budget 16 MiB
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaMallocHost(&h, MiB));
  std::exit(0);
}

// Spawns report-child with STASH_REPORT=report (no "%p": the caller names the file) and
// the extra variables; its pid. The child exits 0 or the probe fails.
pid_t spawn_report_child(const std::string& report, const std::vector<std::string>& env_extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    if (std::strncmp(*e, "STASH_", 6) != 0) env.emplace_back(*e);
  }
  env.push_back("STASH_REPORT=" + report);
  for (const auto& e : env_extra) env.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char arg0[] = "preload_probe", arg1[] = "report-child";
  char* argv[] = {arg0, arg1, nullptr};
  pid_t pid = 0;
  CHECK(posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv, envp.data()) == 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return pid;
}

nlohmann::json run_child(const std::string& path, const std::vector<std::string>& env_extra) {
  // "%p" is the child's pid: the file the parent reads is found by the child's pid.
  const pid_t pid = spawn_report_child(path + ".%p", env_extra);
  const std::string written = path + "." + std::to_string(pid);
  std::ifstream in(written);
  CHECK(in.good());
  nlohmann::json doc = nlohmann::json::parse(in);  // throws (fails the test) if malformed
  std::remove(written.c_str());
  return doc;
}

void report() {
  require_setup();
  const std::string path = "preload_report_" + std::to_string(getpid()) + ".json";
  const nlohmann::json r = run_child(path, {"STASH_DEVICE_BUDGET=16MiB"});
  std::printf("%s\n", r.dump(2).c_str());
  CHECK(r.at("schema") == "stash.preload_report/1");
  CHECK(r.at("enabled") == true);
  CHECK(r.at("device_budget_bytes") == 16 * MiB);
  const auto& d = r.at("device");
  CHECK(d.at("alloc_count") == 2 && d.at("free_count") == 1);
  CHECK(d.at("largest_alloc_bytes") == 5 * MiB);
  CHECK(d.at("budget_refusals") == 1);
  CHECK(d.at("peak_bytes") == 8 * MiB && d.at("current_bytes") == 5 * MiB);
  CHECK(r.at("devices").size() == 1 && r.at("devices")[0].at("device") == 0);
  CHECK(r.at("devices")[0].at("limit_bytes") == 16 * MiB);
  const auto& p = r.at("pinned");
  CHECK(p.at("alloc_count") == 1 && p.at("largest_alloc_bytes") == MiB);
  CHECK(p.at("current_count") == 1);

  // Disabled: the report still comes (from the destructor) and says so.
  const nlohmann::json off = run_child(path, {"STASH_DEVICE_BUDGET=64MiB", "STASH_DISABLE=1"});
  CHECK(off.at("enabled") == false);
  CHECK(off.at("device").at("alloc_count") == 0 && off.at("devices").empty());

  // A report that cannot be written whole (a 512-byte file-size limit, SIGXFSZ ignored:
  // both inherited by the child) leaves the file that was there as it was, and no
  // temporary beside it (write_locked in bindings/preload/report.cpp).
  const std::string kept = path + ".kept";
  const std::string old = "{\"the previous\": \"report\"}\n";
  std::ofstream(kept) << old;
  struct rlimit saved {};
  CHECK(getrlimit(RLIMIT_FSIZE, &saved) == 0);
  struct rlimit small = saved;
  small.rlim_cur = 512;
  struct sigaction ignore {}, before {};
  ignore.sa_handler = SIG_IGN;
  CHECK(sigaction(SIGXFSZ, &ignore, &before) == 0);
  CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
  const pid_t pid = spawn_report_child(kept, {"STASH_DEVICE_BUDGET=16MiB"});
  CHECK(setrlimit(RLIMIT_FSIZE, &saved) == 0);
  CHECK(sigaction(SIGXFSZ, &before, nullptr) == 0);
  std::ifstream in(kept);
  const std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(now == old);
  CHECK(access((kept + ".tmp." + std::to_string(pid)).c_str(), F_OK) != 0);
  std::remove(kept.c_str());
  // Without the limit the same report replaces it.
  std::ofstream(kept) << old;
  spawn_report_child(kept, {"STASH_DEVICE_BUDGET=16MiB"});
  std::ifstream again(kept);
  CHECK(nlohmann::json::parse(again).at("schema") == "stash.preload_report/1");
  std::remove(kept.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "interpose") interpose();
  else if (scenario == "threads") threads();
  else if (scenario == "budget") budget();
  else if (scenario == "foreign") foreign();
  else if (scenario == "disabled") disabled();
  else if (scenario == "report") report();
  else if (scenario == "report-child") report_child();
  else {
    std::fprintf(stderr, "usage: preload_probe interpose|threads|budget|foreign|disabled|report\n");
    return 2;
  }
  std::printf("preload_probe %s: ok\n", scenario.c_str());
  return 0;
}
