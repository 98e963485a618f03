"""stash.torch.offload: apply a plan to a model's blocks through the prefetch engine.

Note [Offload hooks]
Each block's forward runs under torch.autograd.graph.saved_tensors_hooks. The pack hook
numbers what the block saves exactly as stash.torch.record does (_saved.SaveOrder:
parameters and buffers pass through unnumbered, views of one storage share one index, the
block's input comes first), so tensor (layer i, index j) of a plan made from a recorded
profile is the tensor the hook sees. Keys are (micro-batch, block, index).
- Every numbered tensor is handed to the engine (stash_engine_offload), as the C API asks.
  Keep tensors pass through: the hook returns the tensor itself. Recompute tensors get a
  placeholder (Note [Selective recompute]); their storage is freed when the forward ends.
- An offload tensor's storage goes to the engine: its data pointer and the storage's bytes.
  The hook keeps a reference to the storage until the engine's release callback hands it
  back (Note [Stream order with torch's allocator]); dropping it then lets torch's
  allocator reuse the memory. The hook returns only a small record (key, dtype, shape, strides, offset).
- The storages a block saves are held until that block's forward ends, even when their
  copy finished earlier, because saved tensors are numbered by storage address: a freed
  address handed to a later tensor of the same block would look like a view of the first.
  The planner's peak counts a block's own tensors as resident during its forward anyway.
- Backward: an identity autograd.Function at each block's output (_boundary.py) fires
  when the gradient reaches it, i.e. when backward of that block begins: it ends the
  backward of the block above (backward_end) and calls backward_begin, which prefetches
  the block below (lookahead 1) into buffers the engine allocates through our allocator
  callback (torch.empty(bytes, dtype=uint8) on the compute stream, held by pointer). The
  unpack hook acquires the tensor, releases it in the engine at once (our release callback
  drops our reference; the saved tensor rebuilt over the buffer keeps it alive for as long
  as autograd needs it), and returns a view with the saved dtype, shape, strides and
  storage offset: no copy. Several views of one storage share one fetched buffer.
- When the whole backward pass ends, everything of the micro-batch still held by the
  engine (keep tensors, offloads never unpacked) is released and the micro-batch's step
  ends; its next forward starts a new one.

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
  A storage produced on the compute stream returns to it when forward_begin(i+2)
  enqueues the wait for its copy, with no host wait; one produced elsewhere only when
  the host has seen its copy complete (the engine polls at each call), so a host far
  ahead of the GPU holds more of those than the planner's one layer in flight.
  max_in_flight_bytes (about one block's offloaded bytes) bounds copies in transit: an
  offload past the cap makes the host wait for older copies.
CPU (torch's CPU build on the test double, STASHDBL_FOREIGN_IS_DEVICE=1): torch ops are
synchronous on the host and have no streams. The engine gets a stream of its own as the
compute stream (created through the libcudart that libstash loaded); unpack acquires on
it and synchronizes it from the host before handing the tensor to autograd. Offload
needs no wait: the tensor is complete when the pack hook sees it. The engine hands blocks
back as free for work enqueued on a stream from then on (offloaded sources right after
the compute stream's wait for their copy; prefetches never acquired, e.g. by a backward
stopped by an error, after its wait for their copy), while torch frees host memory at
once: the release callback synchronizes that stream from the host first.

Note [Selective recompute]
stash recomputes exactly the tensors the plan marks recompute, in the manner of torch's
non-reentrant checkpoint (2.x, with early stop), on torch 1.13 and 2.x alike.
- Forward: the pack hook returns a Placeholder (frame, save position) for each save of a
  recompute storage, so autograd holds no reference and the storage is freed when the
  block's forward ends (held until then, as every saved storage: numbering is by
  address). A Frame per block forward and micro-batch records what the recompute needs:
  the block's own forward, its inputs as slots (a storage the plan offloads is rebuilt
  over the fetched buffer, with the input's dtype, shape, strides and offset, so a view
  comes back a view; anything else, kept inputs and inputs the block does not save, is
  held detached), the CPU and CUDA RNG states and the autocast modes at the start of the
  forward, and every save in order (index, first, dtype, shape, device; None for the
  parameters'). The input and whatever existed before the block are not recomputable:
  a plan that recomputes one keeps it, counted, with one warning. A saved view of an
  offloaded storage has that storage's index: it is offloaded with it, never recomputed.
- Backward: the first unpack of a placeholder whose tensor is not captured replays the
  block: inputs restored (offloaded ones acquired from the engine; the engine has them
  prefetched, since the block's backward began), detached so that the replay's graph
  does not reach the outer one, with the forward's requires_grad (which decides what
  autograd saves); RNG and autocast as in the forward; grad enabled; under a nested
  saved_tensors_hooks that numbers saves with SaveOrder as the forward did. Each save is
  checked against the forward's (a block that saves something else the second time,
  e.g. control flow on a call counter, raises a StashError naming both); the saves whose
  placeholders autograd still holds are captured (detached); after the last of them the
  hook raises StopRecompute, which ends the replay, so it costs the forward's prefix up
  to the last recompute tensor, not the whole block. Its own graph keeps nothing (its
  pack hook returns None) and dies with the replay. Later unpacks take their tensor
  from the capture, which drops it: a recomputed tensor lives until its node ran.
- A replay holds every storage it sees until it ends (numbering again), so its peak is
  the block's forward peak up to the stop; the planner counts one block rebuilt at a
  time in backward.
- retain_graph: a placeholder unpacked twice (a second backward through the graph)
  finds nothing captured and replays again; offloaded inputs stay fetched (their
  buffers live with the frame). Several micro-batches have their own frames. A forward
  under no_grad or inference mode saves nothing and makes no frame. Captures left over
  (a save a partial backward did not reach) go with the frame, which dies with the last
  placeholder, i.e. with the graph.
- Whole blocks (every tensor but the input recomputed) take the same path. The reentrant
  torch.utils.checkpoint used before ran the forward without grad (nothing saved, not
  even for the forward's duration) but needs an input that requires grad (else the
  parameters' gradients are cut), cannot take keyword or non-tensor arguments, refuses
  torch.autograd.grad, runs a nested backward (which DDP's hooks see at odd times) and
  recomputes past the last save; torch itself recommends the non-reentrant form. The
  planner already counts a block's own tensors as resident during its forward.
- A replay runs the block's code again, as torch's checkpoint does: a module that
  updates state in forward (BatchNorm's running statistics, a call counter) updates it
  again; one whose saves depend on that state fails the check above.
- CUDA: the replay runs on the stream autograd runs the unpacking node on, as the rest
  of the block's backward; fetched inputs are acquired for that stream (_fetch). A held
  input modified in place since the forward (its version counter moved) is refused:
  the replay would not see the values the forward saw.
- Why not torch's selective activation checkpointing (2.4+): it caches the tensors its
  policy keeps outside saved-tensor hooks, so they could not be offloaded, and its policy
  decides per op call whether to keep that op's outputs, while a plan decides per saved
  storage in save order; the two do not map one to one (one storage is saved by several
  ops, an op's outputs may be saved by none). It does not exist on 1.13 either.
"""

import contextlib
import ctypes
import os
import threading
import warnings

import torch

from .._engine import KEEP, OFFLOAD, RECOMPUTE, Engine, plan_actions
from .._engine import _lib as engine_lib
from .._lib import StashError, parse_bytes
from ._boundary import at_backward_end, mark_backward
from ._recompute import (FetchedInput, ForwardState, Frame, HeldInput, Placeholder, Replay,
                         map_tensors)
from ._saved import SaveOrder, resident_storages, storage_of, tensors_in

__all__ = ["offload", "OffloadHandle"]


def _flat_bytes(t):
    """A 1-D uint8 tensor over t's whole storage (it keeps the storage alive)."""
    if hasattr(t, "untyped_storage"):
        s = t.untyped_storage()
    else:
        s = t.storage()
        s = s._untyped() if hasattr(s, "_untyped") else s.untyped()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(s)


class _Fetched:
    """One offloaded storage of one micro-batch: the views saved of it share this, and the
    first unpack fetches it. Freed with the last saved view (autograd drops saved tensors
    as their nodes run), which frees the prefetched buffer."""

    __slots__ = ("step", "key", "flat")

    def __init__(self, step, key):
        self.step, self.key, self.flat = step, key, None


_INPUT_SLOTS = (HeldInput, FetchedInput)
_RECOMPUTE = object()  # fetched[j] of a storage the plan recomputes: saves get placeholders


class _Packed:
    """What the pack hook returns for an offload tensor: how to rebuild the view."""

    __slots__ = ("fetched", "dtype", "size", "stride", "offset")

    def __init__(self, fetched, t):
        self.fetched = fetched
        self.dtype, self.size, self.stride = t.dtype, t.size(), t.stride()
        self.offset = t.storage_offset()


class _Step:
    """One micro-batch's forward and backward: the keys the engine holds for it."""

    def __init__(self, mb, resident):
        self.mb = mb
        self.resident = resident
        self.next_block = 0
        self.live = set()          # keys offered and not released
        self.backward_open = None  # the block whose backward began and has not ended
        self.backward_started = False
        self.abandoned = False


class _CudaRt:
    """The few runtime calls the CPU path needs, from the libcudart libstash loaded: by
    soname, which dlopen resolves to the library already loaded. Only the test double
    (with STASHDBL_FOREIGN_IS_DEVICE=1) can take host memory as device memory."""

    def __init__(self):
        engine_lib()  # libstash first: its libcudart.so.13 is the one to talk to
        lib = ctypes.CDLL("libcudart.so.13")
        if not hasattr(lib, "stashdbl_set_foreign_is_device"):
            raise StashError(
                "stash.torch.offload: the blocks are on the CPU. Offloading applies to CUDA "
                "models; CPU blocks run only on stash's CPU test double of libcudart "
                "(tests/cudart_double, with STASHDBL_FOREIGN_IS_DEVICE=1).")
        if os.environ.get("STASHDBL_FOREIGN_IS_DEVICE") != "1":
            raise StashError(
                "stash.torch.offload: CPU blocks on the test double need "
                "STASHDBL_FOREIGN_IS_DEVICE=1 in the environment (torch's CPU tensors are "
                "the engine's device memory)")
        lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        self.lib = lib

    def check(self, err, what):
        if err != 0:
            text = self.lib.cudaGetErrorString(err).decode()
            raise StashError(f"{what}: {text} (cudaError {err})")

    def stream_create(self):
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1),  # non-blocking
                   "cudaStreamCreateWithFlags")
        return s.value

    def stream_synchronize(self, s):
        self.check(self.lib.cudaStreamSynchronize(s), "cudaStreamSynchronize")


def _block_device(blocks, device):
    if device is not None:
        return torch.device(device)
    for block in blocks:
        for p in block.parameters():
            return p.device
    return torch.device("cpu")


class OffloadHandle:
    """Returned by :func:`offload`; see there. A context manager: leaving it closes."""

    def __init__(self, blocks, plan, *, device=None, lookahead=1, pinned_cap=None,
                 max_in_flight_bytes=None, timing=True, max_micro_batches=8):
        self.blocks = list(blocks)
        if not self.blocks:
            raise ValueError("stash.torch.offload: no blocks")
        self.actions = plan_actions(plan)
        if len(self.actions) != len(self.blocks):
            raise StashError(f"stash.torch.offload: the plan has {len(self.actions)} layers, but "
                             f"{len(self.blocks)} blocks were given")
        self.device = _block_device(self.blocks, device)
        self._cuda = self.device.type == "cuda"
        self._cudart = None
        self._cpu_stream = None
        self._sources = {}  # data pointer -> [uint8 views] held until the D2H is complete
        self._buffers = {}  # data pointer -> uint8 tensor allocated for a prefetch
        self._steps = {}    # micro-batch -> _Step
        self._micro_batch = 0
        self._warned = set()
        self._hook_error = None
        self._lock = threading.Lock()
        self._hooks = {"recompute_count": 0, "recompute_bytes": 0, "recompute_forwards": 0,
                       "recompute_stopped_early": 0, "recompute_replayed_saves": 0,
                       "recompute_captured": 0, "recompute_kept_count": 0,
                       "recompute_kept_bytes": 0, "not_on_device_count": 0,
                       "abandoned_micro_batches": 0}
        if self._cuda:
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self._compute = torch.cuda.current_stream(self.device)
            stream = self._compute.cuda_stream
        else:
            self._compute = None
            self._cudart = _CudaRt()
        self.engine = None
        try:
            if not self._cuda:
                self._cpu_stream = self._cudart.stream_create()
                stream = self._cpu_stream
            self.engine = Engine(
                self._alloc, self._release, stream, lookahead=lookahead,
                pinned_cap_bytes=parse_bytes(pinned_cap) if pinned_cap is not None else 0,
                max_in_flight_bytes=(parse_bytes(max_in_flight_bytes)
                                     if max_in_flight_bytes is not None else 0),
                timing=timing, max_micro_batches=max_micro_batches)
            self.engine.set_plan(self.actions)
        except BaseException:
            self._teardown()
            raise
        self._originals = []
        for i, block in enumerate(self.blocks):
            if "forward" in vars(block):
                self._teardown()
                raise StashError(f"stash.torch.offload: block {i} ({type(block).__name__}) "
                                 "already has its forward replaced (offload applied twice?)")
        for i, block in enumerate(self.blocks):
            self._originals.append(block.forward)
            block.forward = self._wrap(i, block.forward)

    # --- engine callbacks (inside engine calls, on this thread) -------------------------

    def _alloc(self, nbytes, _stream):
        if self._cuda:
            with torch.cuda.stream(self._compute):
                buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        else:
            buf = torch.empty(nbytes, dtype=torch.uint8)
        with self._lock:
            self._buffers[buf.data_ptr()] = buf
        return buf.data_ptr()

    def _release(self, ptr, _nbytes, stream):
        if not self._cuda:
            # The engine hands a block back as free for work enqueued on `stream` from now
            # on (the compute stream, right after its wait for the block's copy), not
            # after the host saw the copy end. torch's CPU allocator frees at once, so the
            # host waits here (Note [Stream order with torch's allocator]).
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

    # --- forward -------------------------------------------------------------------------

    def _warn_once(self, what, message):
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"stash.torch.offload: {message}", stacklevel=4)

    def _begin_step(self, i):
        mb = self._micro_batch
        step = self._steps.get(mb)
        if i == 0:
            if step is not None:
                self._warn_once(("abandon", mb), (
                    f"micro-batch {mb} ran forward again before its backward; the earlier "
                    "graph's offloaded tensors are dropped. Use handle.micro_batch(i) to run "
                    "several forwards before their backwards."))
                self._abandon(step)
            step = self._steps[mb] = _Step(mb, resident_storages(self.blocks))
        elif step is None or step.next_block != i:
            expected = "block 0" if step is None else f"block {step.next_block}"
            raise StashError(f"stash.torch.offload: block {i} ran in micro-batch {mb} where "
                             f"{expected} was expected; the blocks must run in order, once "
                             "each per micro-batch")
        return step

    def _wrap(self, i, forward):
        def wrapped(*args, **kwargs):
            if not torch.is_grad_enabled() or self.engine is None:
                return forward(*args, **kwargs)
            return self._forward(i, forward, args, kwargs)
        wrapped.__wrapped__ = forward
        return wrapped

    def _cuda_rng_devices(self, args, kwargs):
        """Devices whose RNG state a recompute must restore: the blocks' and the inputs'
        (torch's checkpoint takes the inputs' too). None before CUDA is initialized."""
        if not torch.cuda.is_initialized():
            return []
        devices = {t.get_device() for t in tensors_in((args, kwargs)) if t.is_cuda}
        if self._cuda:
            devices.add(self.device.index)
        return sorted(devices)

    def _forward(self, i, forward, args, kwargs):
        step = self._begin_step(i)
        mb, engine = step.mb, self.engine
        engine.forward_begin(mb, i)
        inputs = {storage_of(t)[0] for t in tensors_in((args, kwargs))}
        order = SaveOrder(step.resident, inputs, inputs)
        held = []  # every storage the block saves, until its forward ends (Note [Offload hooks])
        fetched = {}  # index -> _Fetched (offload), _RECOMPUTE, or None (the tensor itself)
        actions = self.actions[i]
        n_plan = len(actions)
        # Note [Selective recompute]: taken before the block runs (its dropout draws next).
        frame = (Frame(i, step, forward, ForwardState(self._cuda_rng_devices(args, kwargs)))
                 if RECOMPUTE in actions else None)

        def pack(t):
            try:
                return pack_one(t)
            except StashError as e:
                # torch reports an exception of a pack hook as a RuntimeError; _forward
                # raises this one instead.
                self._hook_error = e
                raise

        def pack_one(t):
            seen = order.see(t)
            if seen is None:
                if frame is not None:
                    frame.place(None)
                return t
            j, first = seen
            if j >= n_plan:
                raise StashError(f"stash.torch.offload: block {i} saves more than the "
                                 f"{n_plan} tensors the plan lists for layer {i}")
            pos = None if frame is None else frame.place(
                (j, first, t.dtype, tuple(t.shape), t.device))
            if first:
                held.append(t)
                action = actions[j]
                ptr, nbytes = storage_of(t)
                if action == RECOMPUTE and not order.entries[j]["recomputable"]:
                    self._recompute_kept(i, j, nbytes)
                    action = KEEP
                if action == OFFLOAD and (t.device != self.device or t.layout != torch.strided):
                    # A host scalar in a CUDA model, a sparse tensor: nothing to copy.
                    self._hooks["not_on_device_count"] += 1
                    fetched[j] = None
                    return t
                self._hand_over(step, (mb, i, j), ptr, nbytes, t if action == OFFLOAD else None)
                if action == OFFLOAD:
                    fetched[j] = _Fetched(step, (mb, i, j))
                elif action == RECOMPUTE:
                    self._hooks["recompute_count"] += 1
                    self._hooks["recompute_bytes"] += nbytes
                    fetched[j] = _RECOMPUTE
                else:
                    fetched[j] = None
            f = fetched[j]
            if f is None:
                return t
            if f is _RECOMPUTE:
                return frame.placeholder(pos)
            return _Packed(f, t)

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                out = forward(*args, **kwargs)
            if len(order) != n_plan:
                raise StashError(f"stash.torch.offload: block {i} saved {len(order)} tensors, "
                                 f"but the plan lists {n_plan} for layer {i}; make the plan "
                                 "from this model's record pass (stash.torch.record)")
            if frame is not None and frame.wanted:
                frame.args, frame.kwargs = self._input_slots(args, kwargs, order, fetched)
            engine.forward_end(mb, i)
        except RuntimeError as e:
            error, self._hook_error = self._hook_error, None
            if error is not None:
                raise error from e
            raise
        finally:
            held.clear()
        step.next_block = i + 1
        return mark_backward(out, lambda: self._backward_boundary(step, i))

    def _recompute_kept(self, i, j, nbytes):
        self._hooks["recompute_kept_count"] += 1
        self._hooks["recompute_kept_bytes"] += nbytes
        self._warn_once(("input", i, j), (
            f"the plan recomputes tensor {j} of block {i}, which existed before the block "
            "ran (its input): nothing in the block can produce it again, so it is kept on "
            "the device (counted in stats()['hooks']['recompute_kept_count']). Make the "
            "plan from this model's record pass, which marks it not recomputable."))

    @staticmethod
    def _input_slots(args, kwargs, order, fetched):
        """Note [Selective recompute]: the block's inputs as its recompute takes them back,
        by the action of the storage each one is in."""
        def slot(t):
            j = order.index.get(storage_of(t)[0])
            f = fetched.get(j) if j is not None else None
            return FetchedInput(f, t) if isinstance(f, _Fetched) else HeldInput(t)
        return map_tensors(args, slot), map_tensors(kwargs, slot)

    def _hand_over(self, step, key, ptr, nbytes, source):
        """stash_engine_offload of one tensor; `source` (offload tensors) is held until the
        engine releases its pointer. Held before the call: another thread's engine call may
        retire the copy and release the pointer as soon as the engine has it."""
        if source is not None:
            with self._lock:
                self._sources.setdefault(ptr, []).append(_flat_bytes(source))
        step.live.add(key)
        try:
            self.engine.offload(key, ptr, nbytes, self._producer())
        except StashError:
            # A failed copy stays the engine's (it frees the block at release, through our
            # callback); a rejected call never took the tensor.
            try:
                state, _ = self.engine.tensor_state(key)
            except StashError:  # a key outside the plan
                state = "not_offered"
            if state == "not_offered":
                step.live.discard(key)
                if source is not None:
                    self._release(ptr, nbytes, None)
            raise

    def _producer(self):
        if self._cuda:
            return torch.cuda.current_stream(self.device).cuda_stream
        return self._cpu_stream

    # --- backward ------------------------------------------------------------------------

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        if isinstance(packed, Placeholder):
            return self._unpack_recomputed(packed)
        flat = self._fetch(packed.fetched)
        return flat.view(packed.dtype).as_strided(packed.size, packed.stride, packed.offset)

    def _fetch(self, f):
        """The uint8 tensor over an offloaded storage, fetched from the engine the first
        time one of its views (or a recompute's input) needs it."""
        if f.flat is None:
            step = f.step
            if step.abandoned:
                raise StashError(
                    f"stash.torch.offload: tensor {f.key} belongs to a forward of micro-batch "
                    f"{step.mb} that a later forward of the same micro-batch replaced; use "
                    "handle.micro_batch(i) for forwards that wait for their backward")
            if f.key not in step.live:
                raise StashError(f"stash.torch.offload: tensor {f.key} was given back when an "
                                 "earlier backward pass through this graph ended without "
                                 "using it")
            if self.engine is None:
                raise StashError("stash.torch.offload: backward after the handle was closed; "
                                 "the offloaded tensors of its forward are gone")
            consumer = self._producer()
            ptr = self.engine.acquire(f.key, consumer)
            if not self._cuda:
                # Note [Stream order with torch's allocator]: the host waits on CPU.
                self._cudart.stream_synchronize(self._cpu_stream)
            with self._lock:
                flat = self._buffers.get(ptr)
                if flat is None:  # kept on the device (pinned pool exhausted): the source
                    held = self._sources.get(ptr)
                    flat = held[-1] if held else None
            if flat is None:
                raise StashError(f"stash.torch.offload: acquire of {f.key} returned {ptr:#x}, "
                                 "which is neither a prefetch buffer nor an offloaded storage")
            if self._cuda and consumer != self._compute.cuda_stream:
                flat.record_stream(torch.cuda.current_stream(self.device))
            f.flat = flat
            step.live.discard(f.key)
            self.engine.release(f.key)
        return f.flat

    def _unpack_recomputed(self, ph):
        """Note [Selective recompute]: the captured tensor of a placeholder, after a replay
        of its block when this backward has not run one (the first unpack of the block's
        placeholders, or the first of a later backward through a retained graph)."""
        frame = ph.frame
        t = frame.captured.pop(ph.pos, None)
        if t is None:
            self._replay(frame)
            t = frame.captured.pop(ph.pos, None)
            if t is None:  # Replay captures every live placeholder or raises
                raise StashError(f"stash.torch.offload: recompute of block {frame.layer} did "
                                 f"not capture save {ph.pos}")
        return t

    def _replay(self, frame):
        step = frame.step
        if step.abandoned:
            raise StashError(
                f"stash.torch.offload: this backward belongs to a forward of micro-batch "
                f"{step.mb} that a later forward of the same micro-batch replaced; use "
                "handle.micro_batch(i) for forwards that wait for their backward")
        if frame.args is None:
            raise StashError(
                f"stash.torch.offload: a recompute tensor of block {frame.layer} was needed "
                "before the block's forward returned (a gradient taken inside its forward); "
                "keep or offload what that gradient uses")
        # Stale captures of an earlier backward (saves it did not reach) are replaced.
        frame.captured.clear()
        args = map_tensors(frame.args, lambda s: self._restore(frame, s), _INPUT_SLOTS)
        kwargs = map_tensors(frame.kwargs, lambda s: self._restore(frame, s), _INPUT_SLOTS)
        replay = Replay(frame, step.resident,
                        {storage_of(t)[0] for t in tensors_in((args, kwargs))})
        self._hooks["recompute_forwards"] += 1
        try:
            replay.run(args, kwargs)
        finally:
            self._hooks["recompute_replayed_saves"] += replay.pos
            self._hooks["recompute_captured"] += replay.captured
        if replay.pos < len(frame.saves):  # saves the forward made after the stop point
            self._hooks["recompute_stopped_early"] += 1

    def _restore(self, frame, slot):
        """A block input for its replay: detached (the replay's graph must not reach the
        graph that produced it) with the forward's requires_grad (which decides what
        autograd saves, e.g. both operands of a product or only one)."""
        if isinstance(slot, FetchedInput):
            flat = self._fetch(slot.fetched)
            t = flat.view(slot.dtype).as_strided(slot.size, slot.stride, slot.offset)
        elif isinstance(slot, HeldInput):
            if slot.t._version != slot.version:
                raise StashError(
                    f"stash.torch.offload: an input of block {frame.layer} (micro-batch "
                    f"{frame.step.mb}) was modified in place after the block's forward; its "
                    "recompute would not see the values the forward saw")
            t = slot.t
        return t.detach().requires_grad_(slot.requires_grad)

    def _backward_boundary(self, step, i):
        # Raised here rather than in the unpack hook: torch passes an exception of an
        # autograd.Function's backward through as it is, one of a hook as a RuntimeError.
        if step.abandoned:
            raise StashError(
                f"stash.torch.offload: this backward belongs to a forward of micro-batch "
                f"{step.mb} that a later forward of the same micro-batch replaced (its "
                "offloaded tensors are gone); use handle.micro_batch(i) for forwards that "
                "wait for their backward")
        if self.engine is None:
            raise StashError("stash.torch.offload: backward after the handle was closed; the "
                             "offloaded tensors of its forward are gone")
        if not step.backward_started:
            step.backward_started = True
            at_backward_end(lambda: self._finish_backward(step))
        if step.backward_open is not None:
            self.engine.backward_end(step.mb, step.backward_open)
        self.engine.backward_begin(step.mb, i)
        step.backward_open = i

    def _finish_backward(self, step):
        if step.abandoned or self.engine is None:
            return
        if step.backward_open is not None and step.backward_open != 0:
            self.engine.backward_end(step.mb, step.backward_open)
        self._end_step(step)

    def _end_step(self, step):
        """Gives back what the engine still holds for the step and ends it."""
        for key in sorted(step.live):
            self.engine.release(key)
        step.live.clear()
        self.engine.backward_end(step.mb, 0)
        if self._steps.get(step.mb) is step:
            del self._steps[step.mb]

    def _abandon(self, step):
        step.abandoned = True
        self._hooks["abandoned_micro_batches"] += 1
        self._end_step(step)

    # --- public ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def micro_batch(self, index):
        """Runs the blocks' forwards inside as micro-batch `index` (0 outside any): several
        micro-batches may run their forwards before their backwards (gradient accumulation,
        pipeline schedules), up to max_micro_batches at once."""
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"micro-batch index must be a non-negative int, got {index!r}")
        previous, self._micro_batch = self._micro_batch, index
        try:
            yield self
        finally:
            self._micro_batch = previous

    def stats(self):
        """The engine's statistics (stash_engine_stats_t as a dict, the pinned pool under
        "pinned") and the hooks' own under "hooks" (Note [Selective recompute]):
        recompute_count/bytes: storages replaced by placeholders in forward;
        recompute_forwards: replays run in backward, recompute_stopped_early: those that
        stopped before the forward's last save, recompute_replayed_saves: saves they went
        through (of the forward's, including parameters'), recompute_captured: saved tensors they captured (a storage saved
        twice counts twice); recompute_kept_count/bytes: tensors the plan recomputes that
        cannot be (an input), kept instead; offload tensors not on the device;
        micro-batches whose forward was dropped without a backward."""
        d = self._live().stats()
        d["hooks"] = dict(self._hooks)
        return d

    def overlap(self):
        """Copy, hidden and exposed milliseconds, in total and per layer."""
        return self._live().overlap()

    def write_trace(self, path):
        """Writes the engine's Chrome/Perfetto trace (needs timing=True)."""
        self._live().write_trace(path)

    def synchronize(self):
        """Waits for the engine's copies and gives back the storages they read."""
        self._live().synchronize()

    def _live(self):
        if self.engine is None:
            raise StashError("stash.torch.offload: the handle was closed")
        return self.engine

    def close(self):
        """Restores the blocks' forwards, drops live micro-batches (their graphs can no
        longer run backward through offloaded tensors) and destroys the engine."""
        if getattr(self, "_originals", None):
            for block in self.blocks:
                vars(block).pop("forward", None)
            self._originals = []
        if self.engine is not None:
            try:
                for step in list(self._steps.values()):
                    step.abandoned = True
                    self._end_step(step)
            finally:
                self._teardown()

    def _teardown(self):
        if self.engine is not None:
            engine, self.engine = self.engine, None
            engine.close()  # hands every block back through _release
        self._steps.clear()
        self._sources.clear()
        self._buffers.clear()
        if self._cpu_stream is not None:
            stream, self._cpu_stream = self._cpu_stream, None
            self._cudart.lib.cudaStreamDestroy(stream)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def offload(blocks, plan, *, device=None, lookahead=1, pinned_cap=None,
            max_in_flight_bytes=None, timing=True, max_micro_batches=8):
    """Applies `plan` to `blocks` (nn.Modules run in order, block i's output feeding block
    i+1) through stash's prefetch engine, and returns an :class:`OffloadHandle`.

    plan: a stash.plan/1 file or dict (from ``stash plan`` over a profile made from
    :func:`stash.torch.record`), or one list of actions per block ("keep", "recompute",
    "offload"), indexed like the record pass lists each block's saved tensors.

    While the handle is open, each block's forward under grad hands its saved tensors to
    the engine: offload tensors are copied to pinned host memory in forward and prefetched
    one block ahead in backward; keep tensors stay; recompute tensors are freed after the
    forward and recomputed in backward by a replay of the block's forward that stops after
    the last of them (Note [Selective recompute]). Run the
    blocks on the current CUDA stream at the time of this call (Note [Stream order with
    torch's allocator]). Use ``handle.micro_batch(i)`` when several forwards run before
    their backwards. Raises StashError when the plan does not match the blocks (layer
    count here; tensor counts at the first forward; during backward, a block whose replay
    saves other tensors than its forward did: torch 1.13 reports it as a RuntimeError
    carrying the StashError's text) or the engine fails.

    device: where the blocks' activations live (default: the blocks' parameters'). pinned_cap
    (bytes or "8GiB"): the engine's pinned pool cap. max_in_flight_bytes (bytes or "1GiB";
    default none): bound on device-to-host copies in transit; on CUDA set it to about one
    block's offloaded bytes, so that a host running ahead of the GPU cannot hold more
    offloaded storages than the plan assumes (Note [Stream order with torch's allocator]).
    lookahead: prefetch block i when backward of block i+lookahead begins. timing: time
    operations for write_trace/overlap. max_micro_batches: live at once."""
    return OffloadHandle(blocks, plan, device=device, lookahead=lookahead,
                         pinned_cap=pinned_cap, max_in_flight_bytes=max_in_flight_bytes,
                         timing=timing, max_micro_batches=max_micro_batches)
