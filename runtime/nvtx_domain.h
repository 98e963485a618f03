// nvtx_domain.h: stash's NVTX domain, shared by the engine and the profiler.
//
// Every range stash emits lives in domain "stash", so an nsys user can filter it; layer
// scopes follow the naming the profiler attributes by ("stash:layer:<i>:fwd|bwd",
// "stash:tensor:<name>"). NVTX v3 is header-only: with no tool attached
// (NSYS / NVTX_INJECTION64_PATH unset) every call is a cheap no-op.
#pragma once

#include <nvtx3/nvToolsExt.h>

namespace stash::nvtx {

struct domain_tag {
  static constexpr const char* name{"stash"};
};

inline nvtxDomainHandle_t domain() {
  static const nvtxDomainHandle_t d = nvtxDomainCreateA(domain_tag::name);
  return d;
}

// RAII push/pop of a range in the stash domain on the calling thread.
class scoped_range {
 public:
  explicit scoped_range(const char* message) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    nvtxDomainRangePushEx(domain(), &a);
  }
  ~scoped_range() { nvtxDomainRangePop(domain()); }
  scoped_range(const scoped_range&) = delete;
  scoped_range& operator=(const scoped_range&) = delete;
};

}  // namespace stash::nvtx
