// engine_status.h: the engine's result codes. They extend stash::status (allocator/status.h)
// into the 100..199 range reserved for the engine in bindings/include/stash.h, whose
// stash_status_t carries the same numbers (bindings/engine_api.cpp static_asserts them).
#pragma once

#include "status.h"

namespace stash::engine {

inline constexpr status no_plan = static_cast<status>(100);             // no plan loaded
inline constexpr status bad_plan = static_cast<status>(101);            // malformed plan
inline constexpr status unknown_tensor = static_cast<status>(102);      // key not in the plan
inline constexpr status illegal_transition = static_cast<status>(103);  // e.g. double release
inline constexpr status tensor_failed = static_cast<status>(104);       // its copy failed

// "no plan", ..., or status_name() for the allocator's codes.
const char* status_text(status s) noexcept;

}  // namespace stash::engine
