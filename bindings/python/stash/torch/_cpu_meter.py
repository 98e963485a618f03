"""The c10 CPU allocator's peak over a window, for the CPU meter (Note [The CPU
allocator's meter] in _meter.py).

c10 keeps no statistics of its CPU allocator, and torch.profiler's memory events cost
about +60% of a step. This installs, once per process, a counting allocator in front of
c10's CPU allocator (c10::SetCPUAllocator, above the default's priority). It counts by
window, as the profiler's memory events do: a Window, once open, counts the blocks
allocated after it opened while they live; a block allocated before counts neither when it
was allocated nor when it is freed (garbage of an earlier step that the collector frees
now lowers nothing), so its peak is the most bytes held above the level it opened at.
Several windows may be open at once (the benchmark's around a step, fit's inside it). A table under a mutex keeps each block's own DataPtr, so that the
DataPtrs handed out are simple ones (raw_allocate asks for that). The counting allocator is
a few lines of C++ built on first use with torch.utils.cpp_extension against the torch
that runs (cached by torch in TORCH_EXTENSIONS_DIR), so it always matches that torch's
ABI; only CPU tensors pass through it.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

_SOURCE = r"""
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <vector>
#include <c10/core/CPUAllocator.h>
#include <torch/extension.h>

namespace {

// Each block's own DataPtr (the inner allocator's deleter and context), size and the
// number of windows opened before it, by its address: the DataPtrs handed out are simple
// (context == data), as raw_allocate asks. A window counts the blocks allocated after it
// opened. Several windows may be open at once (a benchmark's around a step, fit's from
// block 0): each has its own current and peak. Everything is guarded by one mutex.
struct Block {
  c10::DataPtr inner;
  int64_t bytes;
  uint64_t opened_before;
};
struct Window {
  bool open = false;
  uint64_t opened = 0;  // windows opened before this one, itself included
  int64_t current = 0;  // bytes of the blocks allocated since it opened, alive
  int64_t peak = 0;     // the most of current since it opened or its last reset_peak
};
struct State {
  std::mutex mutex;
  std::unordered_map<void*, Block> blocks;
  uint64_t opened = 0;
  std::vector<Window> windows;  // slots of closed windows are reused
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
    for (Window& w : s.windows) {
      if (w.open && it->second.opened_before >= w.opened) w.current -= it->second.bytes;
    }
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
    const auto bytes = static_cast<int64_t>(n);
    {
      State& s = state();
      std::lock_guard<std::mutex> guard(s.mutex);
      s.blocks[data] = Block{std::move(dp), bytes, s.opened};
      for (Window& w : s.windows) {
        if (!w.open) continue;
        w.current += bytes;
        if (w.current > w.peak) w.peak = w.current;
      }
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

Window& window(int64_t id) {
  State& s = state();
  if (id < 0 || id >= static_cast<int64_t>(s.windows.size()) || !s.windows[id].open) {
    throw std::invalid_argument("stash: no such counting window");
  }
  return s.windows[id];
}

int64_t open_window() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.mutex);
  const Window fresh{true, ++s.opened, 0, 0};
  for (size_t id = 0; id < s.windows.size(); ++id) {
    if (!s.windows[id].open) {
      s.windows[id] = fresh;
      return static_cast<int64_t>(id);
    }
  }
  s.windows.push_back(fresh);
  return static_cast<int64_t>(s.windows.size()) - 1;
}
void close_window(int64_t id) {
  std::lock_guard<std::mutex> guard(state().mutex);
  window(id).open = false;
}
int64_t peak(int64_t id) {
  std::lock_guard<std::mutex> guard(state().mutex);
  return window(id).peak;
}
void reset_peak(int64_t id) {
  std::lock_guard<std::mutex> guard(state().mutex);
  Window& w = window(id);
  w.peak = w.current;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", &install);
  m.def("open_window", &open_window);
  m.def("close_window", &close_window);
  m.def("peak", &peak);
  m.def("reset_peak", &reset_peak);
}
"""

_lock = threading.Lock()
_module: Optional[Any] = None
_failure: Optional[str] = None


def counting_allocator() -> Optional[Any]:
    """The installed counting allocator's module, or None when it cannot be built here
    (reason: failure()). Use it through Window."""
    global _module, _failure
    with _lock:
        if _module is None and _failure is None:
            try:
                from torch.utils.cpp_extension import load_inline

                # The module binds its own functions (PYBIND11_MODULE above).
                mod = load_inline(  # type: ignore[no-untyped-call]
                    "stash_cpu_meter", cpp_sources=_SOURCE, functions=None,
                    extra_cflags=["-O2"], with_cuda=False, verbose=False)
                mod.install()
                _module = mod
            except Exception as e:  # noqa: BLE001 -- no compiler, no ninja, no headers
                _failure = f"{type(e).__name__}: {e}"
        return _module


def failure() -> Optional[str]:
    return _failure



class Window:
    """One counting window (see above): peak() and reset_peak() while open; reopen()
    starts a new one in its place; close() ends it."""

    def __init__(self, module: Any) -> None:
        self._m = module
        self._id: Optional[int] = None

    def reopen(self) -> None:
        self.close()
        self._id = self._m.open_window()

    @property
    def is_open(self) -> bool:
        return self._id is not None

    def peak(self) -> int:
        return int(self._m.peak(self._id)) if self._id is not None else 0

    def reset_peak(self) -> None:
        if self._id is not None:
            self._m.reset_peak(self._id)

    def close(self) -> None:
        if self._id is not None:
            self._m.close_window(self._id)
            self._id = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter shutdown
            pass


def window() -> Optional[Window]:
    """A counting window over the installed counting allocator (not open yet), or None
    where it cannot be built."""
    module = counting_allocator()
    return Window(module) if module is not None else None
