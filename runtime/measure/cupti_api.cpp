// cupti_api.cpp: one dlopen of libcupti (cupti_api.h).
#include "runtime/measure/cupti_api.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace stash::measure {

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

}  // namespace stash::measure
