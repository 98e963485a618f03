"""Engine side of stash.torch.offload: the allocator callbacks the engine calls, handing
a storage to the engine and fetching it back, and the compute stream of each path (CUDA,
or on the CPU test double a stream of the hooks' own): EngineStreams, a part
_offload.OffloadHandle owns.

Note [Stream order with torch's allocator]
CUDA: the engine's compute stream is torch's current stream on the device when offload()
is called; run the blocks on it.
- Offload: the producer is the current stream at pack time; the engine records an event
  there and its D2H stream waits on it, so the copy reads finished data. torch's
  allocator believes only the compute stream uses the block; that is safe because our
  reference keeps it allocated until the engine releases it: right after it enqueued the
  compute stream's wait for the copy (engine 0.2, Note [Handing offloaded blocks back] in
  prefetch_engine.h; the block is the compute stream's, so torch reuses it only for work
  ordered after that wait), or, for a block produced on another stream, once the copy
  was observed complete. Release runs from an engine call on the Python thread, never
  from a CUDA callback thread, where taking the GIL could deadlock.
- Prefetch: the buffer is allocated with the compute stream current, so torch's
  allocator treats it as that stream's memory from the allocation on. The engine records
  an event on the compute stream after the allocation and the H2D stream waits on it, so
  the copy cannot write memory the compute stream is still reading from an earlier owner.
- Unpack: acquire makes the consumer (the stream autograd runs that node on) wait for
  this tensor's H2D event only. When the consumer is not the compute stream the buffer
  gets record_stream(consumer), so torch does not reuse it before that stream is done.
- A prefetch never acquired is released by the engine after it makes the compute stream
  wait for its H2D, so dropping the buffer cannot let the compute stream reuse memory
  the H2D still writes.
- Host-visible memory: torch's allocator decides reuse on the host, at allocation time.
  A storage produced on the compute stream returns to it when the engine enqueues the
  compute stream's wait for its copy (forward_begin two blocks on: Note [The step's
  schedule] in planner/model/schedule.h), with no host wait; one produced elsewhere only when
  the host has seen its copy complete (the engine polls at each call), so a host far
  ahead of the GPU holds more of those than the planner's one layer in flight.
  max_in_flight_bytes (about one block's offloaded bytes) bounds copies in transit: an
  offload past the cap makes the host wait for older copies.
Under a CUDA graph capture (Note [Steps under CUDA graphs] in _offload_steps.py) the
engine's compute stream is the capturing stream (torch.cuda.graph's own side stream): the
prefetch buffers are allocated with that stream current, so torch puts them in the
graph's private pool, as it does the blocks' activations; nothing waits on the host.
CPU (torch's CPU build on the test double, STASHDBL_FOREIGN_IS_DEVICE=1): torch ops are
synchronous on the host and have no streams. The engine gets a stream of its own as the
compute stream (created through the libcudart that libstash loaded); unpack acquires on
it and synchronizes it from the host before handing the tensor to autograd. Offload
needs no wait: the tensor is complete when the pack hook sees it. The engine hands blocks
back as free for work enqueued on a stream from then on (offloaded sources right after
the compute stream's wait for their copy; prefetches never acquired, e.g. by a backward
stopped by an error, after its wait for their copy), while torch frees host memory at
once: the release callback synchronizes that stream from the host first.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Dict, List, Optional, Tuple

import torch

from .. import _lib
from .._engine import Engine
from .._lib import StashError
from ._offload_policy import StepPolicy
from ._step import _Fetched, _Step


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 tensor over t's whole storage (it keeps the storage alive)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class _CudaRt:
    """The few runtime calls the CPU path needs, from the libcudart libstash runs on. CPU
    blocks need a runtime that takes host memory as device memory: stash's test double,
    loaded through STASH_CUDART (Note [A linker namespace for stash's libcudart] in
    _lib.py); a real runtime cannot copy from a CPU tensor as device memory."""

    def __init__(self) -> None:
        if _lib.runs_on_cuda_runtime_of_torch():
            raise StashError(
                "stash.torch: the blocks are on the CPU. stash manages CUDA memory; CPU "
                "blocks run only on a CPU runtime named by STASH_CUDART (stash's test "
                "double, tests/cudart_double, with STASHDBL_FOREIGN_IS_DEVICE=1). Move the "
                "model to a CUDA device.")
        lib = _lib.cudart()
        if (hasattr(lib, "stashdbl_set_foreign_is_device")
                and os.environ.get("STASHDBL_FOREIGN_IS_DEVICE") != "1"):
            # The test double read the variable when it loaded: without it torch's CPU
            # tensors are pageable host memory to it, and the first copy would fail with a
            # CUDA error that names nothing.
            raise StashError(
                "stash.torch: the blocks are on the CPU and STASH_CUDART names stash's test "
                "double, but STASHDBL_FOREIGN_IS_DEVICE=1 is not set: set it in the "
                "environment before the process starts, so that the double takes torch's "
                "CPU tensors as device memory")
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        self._is_capturing = lib.cudaStreamIsCapturing
        self._status = ctypes.c_int()
        self._status_ref = ctypes.byref(self._status)
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        self.lib = lib

    def check(self, err: int, what: str) -> None:
        if err != 0:
            text = self.lib.cudaGetErrorString(err).decode()
            raise StashError(f"{what}: {text} (cudaError {err})")

    def stream_create(self) -> Optional[int]:
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1),  # non-blocking
                   "cudaStreamCreateWithFlags")
        return s.value

    def stream_synchronize(self, s: Optional[int]) -> None:
        self.check(self.lib.cudaStreamSynchronize(s), "cudaStreamSynchronize")

    def stream_is_capturing(self, s: Optional[int]) -> bool:
        """Whether `s` is in a capture (active or invalidated)."""
        # Asked at every step's start: the status and its reference are made once.
        err = self._is_capturing(s, self._status_ref)
        if err != 0:
            self.check(err, "cudaStreamIsCapturing")
        return self._status.value != 0  # cudaStreamCaptureStatusNone


class EngineStreams:
    """The engine's side of an OffloadHandle, a part the handle owns: the compute stream
    (torch's current stream on CUDA, a stream of its own on the CPU double), the allocator
    callbacks the engine calls, handing a storage to the engine and fetching it back, and
    joining a CUDA graph capture (Note [Stream order with torch's allocator]). The handle
    makes the Engine with `alloc`, `release` and `stream`, then sets `engine`; close()
    after the engine's."""

    def __init__(self, device: torch.device, policy: StepPolicy) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self._policy = policy  # Note [The step policy] in _offload_policy.py
        # Set by the handle once made, the one reference to it (OffloadHandle.engine reads
        # it); None once closed.
        self.engine: Optional[Engine] = None
        self._lock = threading.Lock()
        # data pointer -> uint8 views held for the D2H, and -> uint8 tensor of a prefetch
        self._sources: Dict[int, List[torch.Tensor]] = {}
        self._buffers: Dict[int, torch.Tensor] = {}
        # Note [Steps under CUDA graphs] in _offload_steps.py: the capturing stream the
        # engine joined (its cudaStream_t, and on CUDA the torch stream), None outside one.
        self._capture: Optional[int] = None
        self._capture_stream: Optional[torch.cuda.Stream] = None
        self._compute: Optional[torch.cuda.Stream] = None  # CUDA only
        self._cudart: Optional[_CudaRt] = None  # CPU only
        self._cpu_stream: Optional[int] = None  # CPU only; None once closed
        self._cpu_stream_known = False  # CPU only: the stream property handed it out
        if self.cuda:
            self._compute = torch.cuda.current_stream(device)
        else:
            self._cudart = _CudaRt()
            self._cpu_stream = self._cudart.stream_create()

    @property
    def stream(self) -> Optional[int]:
        """The engine's compute stream (a cudaStream_t). On the CPU it is the hooks' own,
        and only a caller that has it can capture it (through the test double): from here
        on capturing_stream asks the double at every step (Note [Lean blocks] in
        _offload_hooks.py: that query cost 33 us a step on the CPU peers' tiny Llama)."""
        if self._compute is None:
            self._cpu_stream_known = True
        return self.engine_stream()

    def engine_stream(self) -> Optional[int]:
        """The compute stream, for the engine stash makes (which captures nothing)."""
        if self._compute is not None:
            return int(self._compute.cuda_stream)
        return self._cpu_stream

    @property
    def buffers(self) -> List[torch.Tensor]:
        """The prefetch buffers the engine holds now."""
        with self._lock:
            return list(self._buffers.values())

    def host_wait(self) -> None:
        """On the CPU double, waits for the compute stream from the host (Note [Stream
        order with torch's allocator]); nothing on CUDA."""
        if self._cudart is not None and self._cpu_stream is not None:
            self._cudart.stream_synchronize(self._cpu_stream)

    def close(self) -> None:
        """After the engine's close (which hands every block back through release)."""
        self.engine = None
        with self._lock:
            self._sources.clear()
            self._buffers.clear()
        if self._cpu_stream is not None:
            stream, self._cpu_stream = self._cpu_stream, None
            assert self._cudart is not None  # the CPU stream was made through it
            self._cudart.lib.cudaStreamDestroy(stream)

    # --- engine callbacks (inside engine calls, on this thread) -------------------------

    def alloc(self, nbytes: int, _stream: Optional[int]) -> int:
        if self.cuda:
            stream = self._capture_stream if self._capture is not None else self._compute
            with torch.cuda.stream(stream):
                buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            self._buffers[buf.data_ptr()] = buf
        self._policy.on_buffer_allocated(buf, nbytes)
        return buf.data_ptr()

    def release(self, ptr: int, _nbytes: int, stream: Optional[int]) -> None:
        if not self.cuda and self._capture is None:
            # The engine hands a block back as free for work enqueued on `stream` from now
            # on (the compute stream, right after its wait for the block's copy), not
            # after the host saw the copy end. torch's CPU allocator frees at once, so the
            # host waits here (Note [Stream order with torch's allocator]). Under a capture
            # nothing of the copies ran, and a wait would invalidate it.
            assert self._cudart is not None  # set on the CPU path
            self._cudart.stream_synchronize(stream if stream else self._cpu_stream)
        # The lock guards the two maps against a backward on autograd's device thread and
        # a forward on the main thread; nothing under it calls the engine (whose mutex a
        # caller of this callback holds), so it cannot deadlock.
        with self._lock:
            held = self._sources.get(ptr)
            if held:
                held.pop()
                if not held:
                    del self._sources[ptr]
            else:
                self._buffers.pop(ptr, None)

    # --- one storage to the engine and back ----------------------------------------------

    def hand_over(self, step: _Step, key: Tuple[int, int, int], ptr: int, nbytes: int,
                  source: Optional[torch.Tensor]) -> None:
        """stash_engine_offload of one tensor; `source` (offload tensors) is held until the
        engine releases its pointer. Held before the call: another thread's engine call may
        retire the copy and release the pointer as soon as the engine has it."""
        if source is not None:
            with self._lock:
                self._sources.setdefault(ptr, []).append(_flat_bytes(source))
        step.live.add(key)
        engine = self.engine
        assert engine is not None  # the hooks offer tensors only while the handle is open
        try:
            engine.offload(key, ptr, nbytes, self._producer())
        except StashError:
            # A failed copy stays the engine's (it frees the block at release, through our
            # callback); a rejected call never took the tensor.
            try:
                state, _ = engine.tensor_state(key)
            except StashError:  # a key outside the plan
                state = "not_offered"
            if state == "not_offered":
                step.live.discard(key)
                if source is not None:
                    self.release(ptr, nbytes, None)
            raise

    def _producer(self) -> Optional[int]:
        if self.cuda:
            return torch.cuda.current_stream(self.device).cuda_stream
        return self._cpu_stream

    def fetch(self, f: _Fetched) -> torch.Tensor:
        """The uint8 tensor over an offloaded storage, fetched from the engine the first
        time one of its views (or a recompute's input) needs it."""
        if f.flat is None:
            step = f.step
            mb, layer, _ = f.key
            name = f"(micro-batch {mb}, layer {layer}, index {f.index})"
            if step.abandoned:
                raise StashError(
                    f"stash.torch.offload: tensor {name} belongs to a forward of micro-batch "
                    f"{step.mb} that a later forward of the same micro-batch replaced; use "
                    "handle.micro_batch(i) for forwards that wait for their backward")
            if f.key not in step.live:
                raise StashError(f"stash.torch.offload: tensor {name} was given back when an "
                                 "earlier backward pass through this graph ended without "
                                 "using it")
            if self.engine is None:
                raise StashError("stash.torch.offload: backward after the handle was closed; "
                                 "the offloaded tensors of its forward are gone")
            consumer = self._producer()
            ptr = self.engine.acquire(f.key, consumer)
            if not self.cuda and self._capture is None:
                # Note [Stream order with torch's allocator]: the host waits on CPU (not
                # under a capture: nothing ran, and the wait would invalidate it).
                assert self._cudart is not None  # set on the CPU path
                self._cudart.stream_synchronize(self._cpu_stream)
            with self._lock:
                flat = self._buffers.get(ptr) if ptr is not None else None
                if flat is None:  # kept on the device (pinned pool exhausted): the source
                    held = self._sources.get(ptr) if ptr is not None else None
                    flat = held[-1] if held else None
            if flat is None:
                raise StashError(f"stash.torch.offload: acquire of {name} returned {ptr:#x}, "
                                 "which is neither a prefetch buffer nor an offloaded storage")
            compute = (self._capture if self._capture is not None else
                       self._compute.cuda_stream if self._compute is not None else None)
            if self.cuda and compute is not None and consumer != compute:
                flat.record_stream(torch.cuda.current_stream(self.device))
            f.flat = flat
            step.live.discard(f.key)
            self.engine.release(f.key)
        return f.flat

    # --- Note [Steps under CUDA graphs] in _offload_steps.py -------------------------------

    def capturing_stream(self) -> Optional[int]:
        """The stream the step's work is being captured on, or None: torch's current stream
        when it captures (CUDA), the hooks' own stream when the test double captures it
        (CPU)."""
        if self.cuda:
            if not torch.cuda.is_current_stream_capturing():
                return None
            return int(torch.cuda.current_stream(self.device).cuda_stream)
        if self._cudart is None or self._cpu_stream is None or not self._cpu_stream_known:
            return None
        return self._cpu_stream if self._cudart.stream_is_capturing(self._cpu_stream) else None

    def join_capture(self, stream: int) -> None:
        """The engine runs the step inside the caller's capture of `stream`."""
        engine = self.engine
        assert engine is not None  # the hooks run only while the handle is open
        engine.capture_join(stream)
        self._capture = stream
        self._capture_stream = torch.cuda.current_stream(self.device) if self.cuda else None

    def settle_capture(self) -> None:
        """After the caller ended the capture the engine joined: the engine leaves capture
        mode (while the stream still captures, nothing changes). A bad verdict was raised
        during the capture already, by the call the engine refused."""
        engine = self.engine
        if self._capture is None or engine is None:
            return
        try:
            engine.capture_settle()
        except StashError:
            if engine.graph_state()["capturing"]:
                return  # the capture still runs
        self._capture = None
        self._capture_stream = None

    def release_graphs(self) -> int:
        """The CUDA graphs captured through this handle's steps will not be replayed again
        (they were destroyed, or their replays are finished or enqueued on the compute
        stream): gives back the pinned blocks they copy through, held since their capture
        (Note [Steps under CUDA graphs] in _offload_steps.py). Returns their bytes."""
        self.settle_capture()
        if self.engine is None:
            return 0
        return self.engine.capture_release()
