"""The prefetch engine (stash.h, "Prefetch engine") through ctypes.

:class:`Engine` owns one stash_engine_t configured with the caller's allocator: the device
blocks it is handed and the ones it prefetches into belong to the caller (for PyTorch,
torch's own allocator), and it gives them back through the release callback. Every
failed call raises :class:`stash.StashError` with ``stash_last_error()``.

Plans: :func:`plan_actions` reads a stash.plan/1 document (path or dict) through the
library's plan reader (stash_plan_read_actions: the one the engine loads plan files with,
Note [One plan reader] in planner/model/plan.h), or checks a list of per-layer action lists, into
the per-layer action lists :meth:`Engine.set_plan` takes.
"""

from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._lib import PoolStats, StashError, load, status_string

# stash_action_t. Constants, so that importing needs no library; the first use of the
# library checks them against its stash_action_name (_check_actions).
KEEP, RECOMPUTE, OFFLOAD = 0, 1, 2
ACTION_NAMES = {"keep": KEEP, "recompute": RECOMPUTE, "offload": OFFLOAD}
ACTION_OF = {v: k for k, v in ACTION_NAMES.items()}

STATE_NAMES = {-1: "not_offered", 0: "on_device", 1: "offloading", 2: "on_host",
               3: "prefetching", 4: "ready", 5: "released"}

STASH_ERROR_BAD_PLAN = 101
STASH_ERROR_UNKNOWN_TENSOR = 102
STASH_ERROR_CAPTURE = 107

# A cudaStream_t as an int (None: the legacy default stream); a tensor key
# (micro-batch, layer, index).
Stream = Optional[int]
Key = Sequence[int]

# int (*)(void** out, size_t bytes, stash_stream_t stream, void* user)
DeviceAllocFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t,
                                 ctypes.c_void_p, ctypes.c_void_p)
# void (*)(void* ptr, size_t bytes, stash_stream_t stream, void* user)
DeviceReleaseFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                                   ctypes.c_void_p)


class EngineConfig(ctypes.Structure):
    """stash_engine_config_t; filled by stash_engine_config_init."""
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("version", ctypes.c_uint),
        ("compute_stream", ctypes.c_void_p),
        ("lookahead", ctypes.c_int),
        ("max_in_flight_bytes", ctypes.c_size_t),
        ("max_in_flight_count", ctypes.c_size_t),
        ("pinned_cap_bytes", ctypes.c_size_t),
        ("pinned_reserve_bytes", ctypes.c_size_t),
        ("on_pinned_exhausted", ctypes.c_int),
        ("pinned_wait_timeout_ms", ctypes.c_uint),
        ("device_pool", ctypes.c_void_p),
        ("device_alloc", DeviceAllocFn),
        ("device_release", DeviceReleaseFn),
        ("device_user", ctypes.c_void_p),
        ("timing", ctypes.c_int),
        ("max_micro_batches", ctypes.c_uint),
    ]


_STAT_FIELDS = (
    "offloaded_count", "offloaded_bytes", "prefetched_count", "prefetched_bytes",
    "kept_on_device_count", "kept_on_device_bytes", "keep_count", "recompute_count",
    "failed_count", "released_count", "in_flight_count", "in_flight_bytes",
    "peak_in_flight_count", "peak_in_flight_bytes", "cap_waits", "release_callbacks")
# After `pinned` (appended in 0.2.0; stash_engine_stats_init writes the whole C struct, so
# this mirror must match it field for field).
_STAT_FIELDS_2 = ("ordered_handback_count", "ordered_handback_bytes")


class EngineStats(ctypes.Structure):
    """stash_engine_stats_t; filled by stash_engine_stats_init."""
    _fields_ = ([("struct_size", ctypes.c_size_t)]
                + [(name, ctypes.c_uint64) for name in _STAT_FIELDS]
                + [("pinned", PoolStats)]
                + [(name, ctypes.c_uint64) for name in _STAT_FIELDS_2])

    def as_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {name: int(getattr(self, name))
                             for name in _STAT_FIELDS + _STAT_FIELDS_2}
        d["pinned"] = self.pinned.as_dict()
        return d


class TensorKey(ctypes.Structure):
    _fields_ = [("micro_batch", ctypes.c_uint32), ("layer", ctypes.c_uint32),
                ("index", ctypes.c_uint32)]


class Overlap(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_int), ("copy_ms", ctypes.c_double),
                ("hidden_ms", ctypes.c_double), ("exposed_ms", ctypes.c_double)]

    def as_dict(self) -> Dict[str, Union[int, float]]:
        return {"layer": self.layer, "copy_ms": self.copy_ms, "hidden_ms": self.hidden_ms,
                "exposed_ms": self.exposed_ms}


def _lib() -> ctypes.CDLL:
    lib = load("libstash.so")
    if getattr(lib, "_stash_engine_typed", False):
        return lib
    P, S, I, U32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_uint32
    sigs = {
        "stash_last_error": ([], ctypes.c_char_p),
        "stash_engine_config_init": ([ctypes.POINTER(EngineConfig)], None),
        "stash_engine_create": ([ctypes.POINTER(EngineConfig), ctypes.POINTER(P)], I),
        "stash_engine_destroy": ([P], None),
        "stash_engine_load_plan": ([P, ctypes.c_char_p], I),
        "stash_engine_set_plan": ([P, S, ctypes.POINTER(S), ctypes.POINTER(I)], I),
        "stash_engine_action": ([P, U32, U32, ctypes.POINTER(I)], I),
        "stash_engine_forward_begin": ([P, U32, U32], I),
        "stash_engine_forward_end": ([P, U32, U32], I),
        "stash_engine_backward_begin": ([P, U32, U32], I),
        "stash_engine_backward_end": ([P, U32, U32], I),
        "stash_engine_offload": ([P, TensorKey, P, S, P], I),
        "stash_engine_acquire": ([P, TensorKey, P, ctypes.POINTER(P)], I),
        "stash_engine_release": ([P, TensorKey], I),
        "stash_engine_tensor_state": ([P, TensorKey, ctypes.POINTER(I), ctypes.POINTER(I)], I),
        "stash_engine_synchronize": ([P], I),
        "stash_engine_stats_init": ([ctypes.POINTER(EngineStats)], None),
        "stash_engine_stats": ([P, ctypes.POINTER(EngineStats)], I),
        "stash_engine_write_trace": ([P, ctypes.c_char_p], I),
        "stash_engine_overlap": ([P, ctypes.POINTER(Overlap), ctypes.POINTER(Overlap), S,
                                  ctypes.POINTER(S)], I),
        "stash_engine_streams": ([P, ctypes.POINTER(P), ctypes.POINTER(P)], I),
        "stash_engine_capture_join": ([P, P], I),
        "stash_engine_capture_settle": ([P], I),
        "stash_engine_capture_release": ([P, ctypes.POINTER(S)], I),
        "stash_engine_graph_state": ([P, ctypes.POINTER(I), ctypes.POINTER(I),
                                      ctypes.POINTER(ctypes.c_uint64),
                                      ctypes.POINTER(ctypes.c_uint64)], I),
        "stash_action_name": ([I], ctypes.c_char_p),
        "stash_plan_read_actions": ([ctypes.c_char_p, ctypes.POINTER(S), ctypes.POINTER(S), S,
                                     ctypes.POINTER(S), ctypes.POINTER(I), S], I),
    }
    for name, (args, res) in sigs.items():
        f = getattr(lib, name)
        f.argtypes = args
        f.restype = res
    _check_actions(lib)
    setattr(lib, "_stash_engine_typed", True)
    return lib


def _check_actions(lib: ctypes.CDLL) -> None:
    """KEEP, RECOMPUTE and OFFLOAD are the library's numbers for those actions."""
    for name, value in ACTION_NAMES.items():
        got = lib.stash_action_name(value)
        if got is None or got.decode() != name:
            raise StashError(f"libstash names action {value} {got!r}, this package calls it "
                             f"{name!r}: the package and the library do not match")


def _check(status: int, what: str) -> None:
    if status != 0:
        msg = _lib().stash_last_error().decode(errors="replace")
        name = status_string(status)
        text = msg if msg.startswith(what) else f"{what}: {msg or name}"
        raise StashError(f"{text} ({name}, status {status})", status)


def _read_plan(text: bytes, where: str) -> List[List[int]]:
    """Per-layer action lists of stash.plan/1 text (bytes), read by the library; errors
    name `where` (the file, or "plan") and the JSON path."""
    lib = _lib()
    S = ctypes.c_size_t

    def check(status: int) -> None:
        if status != 0:
            msg = lib.stash_last_error().decode(errors="replace")
            for prefix in ("stash_plan_read_actions: ", "plan: "):
                msg = msg[len(prefix):] if msg.startswith(prefix) else msg
            raise StashError(f"{where}: {msg} ({status_string(status)}, status {status})",
                             status)

    n_layers, n_actions = S(), S()
    check(lib.stash_plan_read_actions(text, ctypes.byref(n_layers), None, 0,
                                      ctypes.byref(n_actions), None, 0))
    counts = (S * max(1, n_layers.value))()
    actions = (ctypes.c_int * max(1, n_actions.value))()
    check(lib.stash_plan_read_actions(text, None, counts, n_layers.value, None, actions,
                                      n_actions.value))
    out: List[List[int]] = []
    at = 0
    for n in counts[:n_layers.value]:
        out.append(list(actions[at:at + n]))
        at += n
    return out


def plan_actions(plan: Union[str, os.PathLike[str], Dict[str, Any],
                             Sequence[Sequence[Union[str, int]]]]) -> List[List[int]]:
    """Per-layer action lists (ints KEEP/RECOMPUTE/OFFLOAD) from a stash.plan/1 document (a
    path or the parsed dict, read as stash_engine_load_plan reads a plan file) or from a
    list of per-layer lists of actions ("keep", "recompute", "offload", or the ints).
    Raises StashError naming the bad field ("plan: layers[3].tensors[2].action: ...", or
    the file instead of "plan")."""
    if isinstance(plan, (str, os.PathLike)):
        try:
            with open(plan, "rb") as f:
                text = f.read()
        except OSError as e:
            raise StashError(f"cannot read plan {os.fspath(plan)!r}: {e}") from e
        return _read_plan(text, os.fspath(plan))
    if isinstance(plan, dict):
        try:
            text = json.dumps(plan, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise StashError(f"plan: the dict is not JSON: {e}") from e
        return _read_plan(text, "plan")
    if isinstance(plan, (list, tuple)):
        out = []
        for i, layer in enumerate(plan):
            actions = []
            for j, a in enumerate(layer):
                v = ACTION_NAMES.get(a) if isinstance(a, str) else a
                if v not in ACTION_OF or isinstance(v, bool):
                    raise StashError(f"plan[{i}][{j}] is {a!r}, expected keep, recompute or "
                                     "offload")
                actions.append(v)
            out.append(actions)
        return out
    raise StashError(f"plan: expected a stash.plan/1 path or dict, or per-layer action lists; "
                     f"got {type(plan).__name__}")


class Engine:
    """One stash_engine_t with the caller's allocator.

    alloc(bytes, stream) -> int pointer (0 on failure) and release(ptr, bytes, stream) are
    Python callables; the engine calls them inside engine calls, on the calling thread
    (never a CUDA callback thread), and they must not call the engine. stream arguments
    are cudaStream_t values as ints (None for the legacy default stream)."""

    def __init__(self, alloc: Callable[[int, Stream], int],
                 release: Callable[[int, int, Stream], None], compute_stream: Stream = None,
                 *, lookahead: int = 1, pinned_cap_bytes: int = 0,
                 max_in_flight_bytes: int = 0, max_in_flight_count: int = 0,
                 timing: bool = True, max_micro_batches: int = 8) -> None:
        lib = _lib()
        self._fn = lib
        self._handle: Optional[ctypes.c_void_p] = None
        cfg = EngineConfig()
        lib.stash_engine_config_init(ctypes.byref(cfg))
        cfg.compute_stream = compute_stream
        cfg.lookahead = int(lookahead)
        cfg.pinned_cap_bytes = int(pinned_cap_bytes)
        cfg.max_in_flight_bytes = int(max_in_flight_bytes)
        cfg.max_in_flight_count = int(max_in_flight_count)
        cfg.timing = 1 if timing else 0
        cfg.max_micro_batches = int(max_micro_batches)
        # exceptions raised inside callbacks (C cannot take them)
        self.callback_errors: List[BaseException] = []

        def c_alloc(out: Any, nbytes: int, stream: Stream, _user: Optional[int]) -> int:
            try:
                ptr = alloc(int(nbytes), stream)
            except BaseException as e:  # noqa: BLE001 -- must not unwind through C
                self.callback_errors.append(e)
                return 1
            if not ptr:
                return 1
            out[0] = ptr
            return 0

        def c_release(ptr: int, nbytes: int, stream: Stream, _user: Optional[int]) -> None:
            try:
                release(ptr, int(nbytes), stream)
            except BaseException as e:  # noqa: BLE001 -- must not unwind through C
                self.callback_errors.append(e)

        # The CFUNCTYPE objects must outlive the engine: C holds only their addresses.
        self._c_alloc = DeviceAllocFn(c_alloc)
        self._c_release = DeviceReleaseFn(c_release)
        cfg.device_alloc = self._c_alloc
        cfg.device_release = self._c_release
        handle = ctypes.c_void_p()
        self._check(lib.stash_engine_create(ctypes.byref(cfg), ctypes.byref(handle)),
                    "stash_engine_create")
        self._handle = handle
        self.timing = bool(timing)

    def _check(self, status: int, what: str) -> None:
        if self.callback_errors:
            errors, self.callback_errors = self.callback_errors, []
            raise StashError(f"{what}: a device allocator callback failed: {errors[0]!r}",
                             status) from errors[0]
        _check(status, what)

    def _live(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise StashError("the engine was closed")
        return self._handle

    def close(self) -> None:
        """Waits for the engine's copies, hands back every block it holds (through the
        release callback) and destroys it. Idempotent."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _lib().stash_engine_destroy(handle)

    def set_plan(self, layers: Sequence[Sequence[int]]) -> None:
        """layers: per-layer lists of KEEP/RECOMPUTE/OFFLOAD."""
        counts = (ctypes.c_size_t * len(layers))(*[len(l) for l in layers])
        flat = [a for l in layers for a in l]
        actions = (ctypes.c_int * max(1, len(flat)))(*flat)
        self._check(_lib().stash_engine_set_plan(self._live(), len(layers), counts, actions),
                    "stash_engine_set_plan")

    def load_plan(self, path: Union[str, os.PathLike[str]]) -> None:
        self._check(_lib().stash_engine_load_plan(self._live(), os.fsencode(path)),
                    "stash_engine_load_plan")

    def action(self, layer: int, index: int) -> int:
        out = ctypes.c_int()
        self._check(_lib().stash_engine_action(self._live(), layer, index, ctypes.byref(out)),
                    f"stash_engine_action(layer {layer}, index {index})")
        return int(out.value)

    # The per-tensor and per-layer calls run once per saved tensor or block: the message of
    # a failure is built only when there is one (an f-string per call costs microseconds).

    def forward_begin(self, mb: int, layer: int) -> None:
        st = self._fn.stash_engine_forward_begin(self._live(), mb, layer)
        if st or self.callback_errors:
            self._check(st, f"stash_engine_forward_begin(micro-batch {mb}, layer {layer})")

    def forward_end(self, mb: int, layer: int) -> None:
        st = self._fn.stash_engine_forward_end(self._live(), mb, layer)
        if st or self.callback_errors:
            self._check(st, f"stash_engine_forward_end(micro-batch {mb}, layer {layer})")

    def backward_begin(self, mb: int, layer: int) -> None:
        st = self._fn.stash_engine_backward_begin(self._live(), mb, layer)
        if st or self.callback_errors:
            self._check(st, f"stash_engine_backward_begin(micro-batch {mb}, layer {layer})")

    def backward_end(self, mb: int, layer: int) -> None:
        st = self._fn.stash_engine_backward_end(self._live(), mb, layer)
        if st or self.callback_errors:
            self._check(st, f"stash_engine_backward_end(micro-batch {mb}, layer {layer})")

    def offload(self, key: Key, ptr: int, nbytes: int, producer_stream: Stream) -> None:
        st = self._fn.stash_engine_offload(self._live(), TensorKey(*key), ptr, nbytes,
                                           producer_stream)
        if st or self.callback_errors:
            self._check(st, f"stash_engine_offload{tuple(key)}")

    def acquire(self, key: Key, consumer_stream: Stream) -> Optional[int]:
        out = ctypes.c_void_p()
        st = self._fn.stash_engine_acquire(self._live(), TensorKey(*key), consumer_stream,
                                           ctypes.byref(out))
        if st or self.callback_errors:
            self._check(st, f"stash_engine_acquire{tuple(key)}")
        return out.value

    def release(self, key: Key) -> None:
        st = self._fn.stash_engine_release(self._live(), TensorKey(*key))
        if st or self.callback_errors:
            self._check(st, f"stash_engine_release{tuple(key)}")

    def tensor_state(self, key: Key) -> Tuple[str, int]:
        """(state name, error status) of a tensor."""
        state, error = ctypes.c_int(), ctypes.c_int()
        self._check(_lib().stash_engine_tensor_state(self._live(), TensorKey(*key),
                                                     ctypes.byref(state), ctypes.byref(error)),
                    f"stash_engine_tensor_state{tuple(key)}")
        return STATE_NAMES.get(state.value, str(state.value)), int(error.value)

    def synchronize(self) -> None:
        self._check(_lib().stash_engine_synchronize(self._live()), "stash_engine_synchronize")

    def stats(self) -> Dict[str, Any]:
        """stash_engine_stats_t as a dict (the pinned pool's under "pinned")."""
        s = EngineStats()
        _lib().stash_engine_stats_init(ctypes.byref(s))
        self._check(_lib().stash_engine_stats(self._live(), ctypes.byref(s)), "stash_engine_stats")
        return s.as_dict()

    def write_trace(self, path: Union[str, os.PathLike[str]]) -> None:
        self._check(_lib().stash_engine_write_trace(self._live(), os.fsencode(path)),
                    f"stash_engine_write_trace({os.fspath(path)!r})")

    def overlap(self) -> Dict[str, Any]:
        """{"total": {...}, "layers": [{layer, copy_ms, hidden_ms, exposed_ms}, ...]}."""
        total, n = Overlap(), ctypes.c_size_t()
        lib, h = _lib(), self._live()
        self._check(lib.stash_engine_overlap(h, ctypes.byref(total), None, 0, ctypes.byref(n)),
                    "stash_engine_overlap")
        per = (Overlap * max(1, n.value))()
        self._check(lib.stash_engine_overlap(h, ctypes.byref(total), per, n.value,
                                             ctypes.byref(n)), "stash_engine_overlap")
        return {"total": total.as_dict(), "layers": [per[i].as_dict() for i in range(n.value)]}

    def streams(self) -> Tuple[Optional[int], Optional[int]]:
        """(d2h, h2d) cudaStream_t values of the engine's own streams."""
        d2h, h2d = ctypes.c_void_p(), ctypes.c_void_p()
        self._check(_lib().stash_engine_streams(self._live(), ctypes.byref(d2h),
                                                ctypes.byref(h2d)), "stash_engine_streams")
        return d2h.value, h2d.value

    # --- a capture begun by the caller (Note [Capture begun by the caller] in
    # runtime/engine/prefetch_engine.h) ----------------------------------------------------

    def capture_join(self, stream: Stream) -> None:
        """Runs the next step inside the caller's capture of `stream` (which must be
        capturing; no micro-batch may hold tensors): `stream` is the engine's compute
        stream until capture_settle."""
        self._check(self._fn.stash_engine_capture_join(self._live(), stream),
                    "stash_engine_capture_join")

    def capture_settle(self) -> None:
        """After the caller ended the capture: leaves capture mode; raises StashError
        (status STASH_ERROR_CAPTURE) while the stream still captures or when the captured
        step is not usable, saying why."""
        self._check(self._fn.stash_engine_capture_settle(self._live()),
                    "stash_engine_capture_settle")

    def capture_release(self) -> int:
        """Gives back the pinned blocks the caller's graphs hold (their replays must be
        finished or enqueued on the compute stream); returns their bytes."""
        n = ctypes.c_size_t()
        self._check(self._fn.stash_engine_capture_release(self._live(), ctypes.byref(n)),
                    "stash_engine_capture_release")
        return int(n.value)

    def graph_state(self) -> Dict[str, int]:
        """{"capturing", "ready", "captures", "replays"} (stash_engine_graph_state)."""
        capturing, ready = ctypes.c_int(), ctypes.c_int()
        captures, replays = ctypes.c_uint64(), ctypes.c_uint64()
        self._check(self._fn.stash_engine_graph_state(
            self._live(), ctypes.byref(capturing), ctypes.byref(ready),
            ctypes.byref(captures), ctypes.byref(replays)), "stash_engine_graph_state")
        return {"capturing": int(capturing.value), "ready": int(ready.value),
                "captures": int(captures.value), "replays": int(replays.value)}

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- interpreter teardown
            pass
