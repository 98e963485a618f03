"""The c10 CPU allocator's peak over a window, for the CPU meter (Note [The CPU
allocator's meter] in _meter.py).

c10 keeps no statistics of its CPU allocator, and torch.profiler's memory events cost
about +60% of a step. This installs, once per process, a counting allocator in front of
c10's CPU allocator (c10::SetCPUAllocator, above the default's priority). It counts by
window, as the profiler's memory events do: begin_window() starts one, and from then on
the blocks allocated in it count while they live; a block allocated before it counts
neither when it was allocated nor when it is freed (garbage of an earlier step that the
collector frees now lowers nothing), so peak() is the most bytes held above the level at
the window's start. A table under a mutex keeps each block's own DataPtr, so that the
DataPtrs handed out are simple ones (raw_allocate asks for that). The counting allocator is
a few lines of C++ built on first use with torch.utils.cpp_extension against the torch
that runs (cached by torch in TORCH_EXTENSIONS_DIR), so it always matches that torch's
ABI; only CPU tensors pass through it.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

_SOURCE = r"""
#include <mutex>
#include <unordered_map>
#include <c10/core/CPUAllocator.h>
#include <torch/extension.h>

namespace {

// Each block's own DataPtr (the inner allocator's deleter and context), size and window,
// by its address: the DataPtrs handed out are simple (context == data), as raw_allocate
// asks. Everything below is guarded by one mutex.
struct Block {
  c10::DataPtr inner;
  int64_t bytes;
  uint64_t window;
};
struct State {
  std::mutex mutex;
  std::unordered_map<void*, Block> blocks;
  uint64_t window = 0;
  int64_t current = 0;  // bytes of the blocks allocated in this window and alive
  int64_t peak = 0;     // the most of current since the window or the last reset_peak
};
State& state() {
  static State* s = new State();  // never destroyed: blocks may be freed at exit
  return *s;
}

void release(void* data) {
  c10::DataPtr inner;
  {
    State& s = state();
    std::lock_guard<std::mutex> guard(s.mutex);
    auto it = s.blocks.find(data);
    if (it == s.blocks.end()) return;
    if (it->second.window == s.window) s.current -= it->second.bytes;
    inner = std::move(it->second.inner);
    s.blocks.erase(it);
  }
  // inner frees the block through the inner allocator's deleter here, outside the lock.
}

struct CountingAllocator final : c10::Allocator {
  c10::Allocator* inner;
  explicit CountingAllocator(c10::Allocator* a) : inner(a) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr dp = inner->allocate(n);
    void* data = dp.get();
    if (data == nullptr) return dp;
    const c10::Device device = dp.device();
    {
      State& s = state();
      std::lock_guard<std::mutex> guard(s.mutex);
      s.blocks[data] = Block{std::move(dp), static_cast<int64_t>(n), s.window};
      s.current += static_cast<int64_t>(n);
      if (s.current > s.peak) s.peak = s.current;
    }
    return c10::DataPtr(data, data, &release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

bool g_installed = false;

void install() {
  if (g_installed) return;
  static CountingAllocator counting(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  g_installed = true;
}

// A new window: from here on only blocks allocated in it count, allocated or freed.
void begin_window() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.mutex);
  ++s.window;
  s.current = 0;
  s.peak = 0;
}
int64_t peak() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.mutex);
  return s.peak;
}
void reset_peak() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.mutex);
  s.peak = s.current;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("begin_window", &begin_window);
  m.def("peak", &peak);
  m.def("reset_peak", &reset_peak);
}
"""

_lock = threading.Lock()
_module: Optional[Any] = None
_failure: Optional[str] = None


def counting_allocator() -> Optional[Any]:
    """The installed counting allocator's module (begin_window(), peak(), reset_peak()),
    or None when it cannot be built here (reason: failure())."""
    global _module, _failure
    with _lock:
        if _module is None and _failure is None:
            try:
                from torch.utils.cpp_extension import load_inline

                # The module binds its own functions (PYBIND11_MODULE above).
                mod = load_inline("stash_cpu_meter", cpp_sources=_SOURCE, functions=None,
                                  extra_cflags=["-O2"], with_cuda=False, verbose=False)
                mod.install()
                _module = mod
            except Exception as e:  # noqa: BLE001 -- no compiler, no ninja, no headers
                _failure = f"{type(e).__name__}: {e}"
        return _module


def failure() -> Optional[str]:
    return _failure

