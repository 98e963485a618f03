// engine_status.h: the engine's result codes, under the engine's own names. They are rows
// of the one status table (Note [The status table] in core/error.h), in the 100..199
// range that bindings/include/stash.h gives the engine.
#pragma once

#include "core/error.h"

namespace stash::engine {

inline constexpr status no_plan = status::no_plan;                        // no plan loaded
inline constexpr status bad_plan = status::bad_plan;                      // malformed plan
inline constexpr status unknown_tensor = status::unknown_tensor;          // key not in the plan
inline constexpr status illegal_transition = status::illegal_transition;  // e.g. double release
inline constexpr status tensor_failed = status::tensor_failed;            // its copy failed

}  // namespace stash::engine
