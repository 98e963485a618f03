#include "runtime/measure/measure_prim.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

namespace stash::measure::prim {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  char buf[768];
  std::snprintf(buf, sizeof buf, "%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(err),
                cudaGetErrorString(err));
  (void)cudaGetLastError();  // a failed call may leave a sticky error behind
  throw measure_error(buf);
}

void throw_cupti(CUptiResult r, const char* call, const char* file, int line) {
  char buf[768];
  std::snprintf(buf, sizeof buf, "%s:%d: %s: CUPTI error %d (%s)", file, line, call,
                static_cast<int>(r), cupti_result_text(r).c_str());
  throw measure_error(buf);
}

std::string device_problem() noexcept {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (n == 0) return "no CUDA-capable device is detected";
  return "";
}

int host_numa_node(int device) noexcept {
  int node = -1;
  if (cudaDeviceGetAttribute(&node, cudaDevAttrHostNumaId, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return node;
}

void free_device(void* p) noexcept {
  if (p) (void)cudaFree(p);
  (void)cudaGetLastError();
}
void destroy_stream(cudaStream_t s) noexcept {
  if (s) (void)cudaStreamDestroy(s);
  (void)cudaGetLastError();
}
void destroy_event(cudaEvent_t e) noexcept {
  if (e) (void)cudaEventDestroy(e);
  (void)cudaGetLastError();
}

namespace {

template <class F>
bool resolve(void* h, F& fn, const char* name, std::string* why) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  if (!fn && why->empty()) *why = std::string("libcupti lacks ") + name;
  return fn != nullptr;
}

cupti_api load(std::string* why) {
  cupti_api a;
  void* h = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
#ifdef STASH_CUPTI_DIR
  if (!h) h = dlopen(STASH_CUPTI_DIR "/libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
#endif
  if (!h) {
    const char* e = dlerror();
    *why = std::string("cannot load libcupti.so.13: ") + (e ? e : "not found");
    return a;
  }
  bool ok = true;
  ok &= resolve(h, a.get_result_string, "cuptiGetResultString", why);
  ok &= resolve(h, a.subscribe, "cuptiSubscribe", why);
  ok &= resolve(h, a.unsubscribe, "cuptiUnsubscribe", why);
  ok &= resolve(h, a.enable_domain, "cuptiEnableDomain", why);
  ok &= resolve(h, a.activity_enable, "cuptiActivityEnable", why);
  ok &= resolve(h, a.activity_disable, "cuptiActivityDisable", why);
  ok &= resolve(h, a.register_callbacks, "cuptiActivityRegisterCallbacks", why);
  ok &= resolve(h, a.flush_all, "cuptiActivityFlushAll", why);
  ok &= resolve(h, a.get_next_record, "cuptiActivityGetNextRecord", why);
  ok &= resolve(h, a.get_num_dropped, "cuptiActivityGetNumDroppedRecords", why);
  ok &= resolve(h, a.push_external, "cuptiActivityPushExternalCorrelationId", why);
  ok &= resolve(h, a.pop_external, "cuptiActivityPopExternalCorrelationId", why);
  ok &= resolve(h, a.get_timestamp, "cuptiGetTimestamp", why);
  ok &= resolve(h, a.set_thread_id_type, "cuptiSetThreadIdType", why);
  if (!ok) {
    a.get_result_string = nullptr;
    return a;
  }
  // The file actually loaded (NVTX_INJECTION64_PATH needs a path, not a soname).
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(a.subscribe), &info) && info.dli_fname) a.path = info.dli_fname;
  return a;
}

}  // namespace

const cupti_api* cupti(std::string* why) noexcept {
  static std::once_flag once;
  static cupti_api api;
  static std::string reason;
  std::call_once(once, [] {
    try {
      api = load(&reason);
    } catch (...) {
      reason = "cannot load libcupti.so.13";
    }
  });
  if (!api.get_result_string) {
    if (why) *why = reason;
    return nullptr;
  }
  return &api;
}

std::string cupti_result_text(CUptiResult r) noexcept {
  std::string why;
  const cupti_api* a = cupti(&why);
  const char* s = nullptr;
  if (a && a->get_result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI result " + std::to_string(static_cast<int>(r));
}

std::uint64_t system_thread_id() noexcept {
  return static_cast<std::uint64_t>(::syscall(SYS_gettid));
}

}  // namespace stash::measure::prim
