// engine_nvtx.h: the engine's NVTX ranges, in domain "stash" (runtime/nvtx_domain.h).
//
// Every offload, prefetch and wait is a range on the calling thread. Messages are static
// ASCII strings (no formatting on the hot path); the tensor key travels in the 64-bit
// payload: micro_batch << 40 | layer << 20 | index. With no tool attached each call is a
// load and a branch inside nvtx3.
#pragma once

#include <cstdint>

#include "runtime/nvtx_domain.h"

namespace stash::engine::nvtx {

inline constexpr const char* kOffload = "stash:offload";
inline constexpr const char* kPrefetch = "stash:prefetch";
inline constexpr const char* kWaitAcquire = "stash:wait:acquire";
inline constexpr const char* kWaitInFlight = "stash:wait:in_flight_layer";
inline constexpr const char* kWaitTurn = "stash:wait:turn";
inline constexpr const char* kWaitCap = "stash:wait:in_flight_cap";
inline constexpr const char* kWaitPinned = "stash:wait:pinned";

class range {
 public:
  range(const char* message, std::uint64_t payload) noexcept {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = message;
    a.payloadType = NVTX_PAYLOAD_TYPE_UNSIGNED_INT64;
    a.payload.ullValue = payload;
    nvtxDomainRangePushEx(::stash::nvtx::domain(), &a);
  }
  ~range() { nvtxDomainRangePop(::stash::nvtx::domain()); }
  range(const range&) = delete;
  range& operator=(const range&) = delete;
};

inline std::uint64_t payload(std::uint32_t mb, std::uint32_t layer, std::uint32_t index) {
  return (std::uint64_t{mb} << 40) | (std::uint64_t{layer & 0xFFFFF} << 20) | (index & 0xFFFFF);
}

}  // namespace stash::engine::nvtx
