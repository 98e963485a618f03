"""stash.torch.offload: apply a plan to a model's blocks through the prefetch engine.

Note [Offload hooks]
Each block's forward runs under torch.autograd.graph.saved_tensors_hooks. The pack hook
numbers what the block saves exactly as stash.torch.record does (_saved.SaveOrder:
parameters and buffers pass through unnumbered, views of one storage share one index, the
block's input comes first), so tensor (layer i, index j) of a plan made from a recorded
profile is the tensor the hook sees. Keys are (micro-batch, block, index).
- Every numbered tensor is handed to the engine (stash_engine_offload), as the C API asks.
  Keep and recompute tensors pass through: the hook returns the tensor itself.
- An offload tensor's storage goes to the engine: its data pointer and the storage's bytes.
  The hook keeps a reference to the storage until the engine's release callback says the
  device-to-host copy is complete; dropping it then lets torch's allocator reuse the
  memory. The hook returns only a small record (key, dtype, shape, strides, offset).
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
  reference keeps it allocated until the copy has been observed complete (the engine
  calls release only then, from an engine call on the Python thread, never from a CUDA
  callback thread, where taking the GIL could deadlock).
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
- Host-visible memory: torch's allocator decides reuse on the host, at allocation time,
  and an offloaded storage returns to it only when the host has seen its copy complete
  (the engine polls at each call). A host that runs far ahead of the GPU therefore holds
  more offloaded storages than the planner's one layer in flight. max_in_flight_bytes
  (about one block's offloaded bytes) bounds that: an offload past the cap makes the
  host wait for older copies, which are then given back.
CPU (torch's CPU build on the test double, STASHDBL_FOREIGN_IS_DEVICE=1): torch ops are
synchronous on the host and have no streams. The engine gets a stream of its own as the
compute stream (created through the libcudart that libstash loaded); unpack acquires on
it and synchronizes it from the host before handing the tensor to autograd. Offload
needs no wait: the tensor is complete when the pack hook sees it.

Note [Recompute on torch without selective checkpointing]
A block whose plan recomputes all of its recomputable tensors runs its forward under the
reentrant torch.utils.checkpoint: it saves only its inputs (which the plan keeps or
offloads; they are the block's non-recomputable tensors, matched to the plan's
non-recompute indices in argument order) and recomputes the rest in backward, with the
RNG state restored. Actions alone do not say which tensors are recomputable, so the
first recompute of each such block numbers what the block saves (as record does) and
checks it: the same count as the plan, and the non-recompute indices are exactly the
tensors that come from the inputs. If the plan keeps or offloads a recomputable tensor
the block is recomputed whole no more: from the next step it runs normally, its
recompute tensors are kept and counted (stats()["hooks"]["recompute_kept_*"]), with a
one-time warning. The same happens for a block that takes keyword arguments, an input
the checkpoint cannot save, or no input that requires grad (the reentrant checkpoint
would cut the parameters' gradients). torch's selective activation checkpointing (2.4)
could recompute part of a block; it is not used yet.
"""

import contextlib
import ctypes
import os
import threading
import warnings

import torch
import torch.utils.checkpoint

from .._engine import OFFLOAD, RECOMPUTE, Engine, plan_actions
from .._engine import _lib as engine_lib
from .._lib import StashError, parse_bytes
from ._boundary import at_backward_end, mark_backward
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
        # Note [Recompute on torch without selective checkpointing]: None: not checked yet.
        self._whole = [None if RECOMPUTE in a else False for a in self.actions]
        self._hooks = {"recomputed_blocks": 0, "recompute_kept_count": 0,
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

    def _release(self, ptr, _nbytes, _stream):
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

    def _whole_block_ok(self, i, args, kwargs, resident):
        """Note [Recompute on torch without selective checkpointing]: whether block i can
        run under the reentrant checkpoint now, and the plan indices its inputs take."""
        if self._whole[i] is False:
            return None
        kept = [j for j, a in enumerate(self.actions[i]) if a != RECOMPUTE]
        why = None
        inputs = list(tensors_in(args))
        keys = {storage_of(t)[0] for t in inputs if storage_of(t)[1] and
                storage_of(t)[0] not in resident}
        if kwargs:
            why = "it takes keyword arguments"
        elif any(not isinstance(a, torch.Tensor) for a in args):
            why = "it takes arguments that are not tensors"
        elif not any(t.requires_grad for t in inputs):
            why = "no input requires grad (a reentrant checkpoint would cut its gradients)"
        elif len(keys) != len(kept):
            why = (f"the plan keeps or offloads {len(kept)} of its tensors, but only its "
                   f"{len(keys)} input storage(s) would be saved under a checkpoint: the plan "
                   "keeps or offloads recomputable tensors")
        if why:
            self._whole[i] = False
            self._warn_once(("whole", i), (
                f"block {i} is not recomputed ({why}); its recompute tensors are kept on the "
                "device and counted in stats()['hooks']. Selective recompute is not "
                "supported yet."))
            return None
        return kept

    def _wrap(self, i, forward):
        def wrapped(*args, **kwargs):
            if not torch.is_grad_enabled() or self.engine is None:
                return forward(*args, **kwargs)
            return self._forward(i, forward, args, kwargs)
        wrapped.__wrapped__ = forward
        return wrapped

    def _forward(self, i, forward, args, kwargs):
        step = self._begin_step(i)
        mb, engine = step.mb, self.engine
        engine.forward_begin(mb, i)
        inputs = {storage_of(t)[0] for t in tensors_in((args, kwargs))}
        order = SaveOrder(step.resident, inputs, inputs)
        held = []  # every storage the block saves, until its forward ends (Note [Offload hooks])
        fetched = {}
        whole = self._whole_block_ok(i, args, kwargs, step.resident)
        n_plan = len(self.actions[i])

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
                return t
            j, first = seen
            if whole is not None:
                if j >= len(whole):
                    raise StashError(f"stash.torch.offload: block {i} saved more inputs under "
                                     f"recompute than the {len(whole)} the plan keeps or offloads")
                j = whole[j]
            elif j >= n_plan:
                raise StashError(f"stash.torch.offload: block {i} saves more than the "
                                 f"{n_plan} tensors the plan lists for layer {i}")
            key = (mb, i, j)
            if first:
                held.append(t)
                action = self.actions[i][j]
                if action == OFFLOAD and (t.device != self.device or t.layout != torch.strided):
                    # A host scalar in a CUDA model, a sparse tensor: nothing to copy.
                    self._hooks["not_on_device_count"] += 1
                    fetched[j] = None
                    return t
                ptr, nbytes = storage_of(t)
                self._hand_over(step, key, ptr, nbytes, t if action == OFFLOAD else None)
                if action != OFFLOAD:
                    if action == RECOMPUTE:
                        self._hooks["recompute_kept_count"] += 1
                        self._hooks["recompute_kept_bytes"] += nbytes
                    fetched[j] = None
                    return t
                fetched[j] = _Fetched(step, key)
            f = fetched[j]
            return t if f is None else _Packed(f, t)

        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                if whole is not None:
                    out = torch.utils.checkpoint.checkpoint(
                        self._recompute(i, forward), *args, use_reentrant=True,
                        preserve_rng_state=True)
                    self._hooks["recomputed_blocks"] += 1
                else:
                    out = forward(*args, **kwargs)
            if whole is None and len(order) != n_plan:
                raise StashError(f"stash.torch.offload: block {i} saved {len(order)} tensors, "
                                 f"but the plan lists {n_plan} for layer {i}; make the plan "
                                 "from this model's record pass (stash.torch.record)")
            if whole is not None and len(order) != len(whole):
                raise StashError(f"stash.torch.offload: block {i} saved {len(order)} inputs "
                                 f"under recompute, but the plan keeps or offloads {len(whole)}")
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

    def _recompute(self, i, forward):
        """The function the checkpoint runs: as is in forward (no grad), and in backward's
        recompute also checked against the plan once (Note [Recompute on torch ...])."""
        def run(*args):
            if not torch.is_grad_enabled() or self._whole[i] is True:
                return forward(*args)
            resident = resident_storages(self.blocks)
            inputs = {storage_of(t)[0] for t in tensors_in(args)}
            order = SaveOrder(resident, inputs, inputs)

            def count(t):
                order.see(t)
                return t

            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                out = forward(*args)
            n_plan = len(self.actions[i])
            if len(order) != n_plan:
                raise StashError(f"stash.torch.offload: block {i} saved {len(order)} tensors "
                                 f"when recomputed, but the plan lists {n_plan} for layer {i}")
            fixed = [j for j, e in enumerate(order.entries) if not e["recomputable"]]
            planned = [j for j, a in enumerate(self.actions[i]) if a != RECOMPUTE]
            if fixed == planned:
                self._whole[i] = True
            else:
                self._whole[i] = False
                self._warn_once(("whole", i), (
                    f"the plan keeps or offloads recomputable tensors of block {i} (indices "
                    f"{sorted(set(planned) - set(fixed))}) and recomputes others; it is "
                    "recomputed whole only in this step. From the next step its recompute "
                    "tensors are kept on the device and counted in stats()['hooks']. "
                    "Selective recompute is not supported yet."))
            return out
        return run

    # --- backward ------------------------------------------------------------------------

    def _unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        f = packed.fetched
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
        return f.flat.view(packed.dtype).as_strided(packed.size, packed.stride, packed.offset)

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
        "pinned") and the hooks' own under "hooks": blocks run under whole-block recompute,
        recompute tensors kept instead, offload tensors not on the device, micro-batches
        whose forward was dropped without a backward."""
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
    one block ahead in backward; keep tensors stay; blocks the plan recomputes whole run
    under checkpoint (Note [Recompute on torch without selective checkpointing]). Run the
    blocks on the current CUDA stream at the time of this call (Note [Stream order with
    torch's allocator]). Use ``handle.micro_batch(i)`` when several forwards run before
    their backwards. Raises StashError when the plan does not match the blocks (layer
    count here; tensor counts at the first forward) or the engine fails.

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
