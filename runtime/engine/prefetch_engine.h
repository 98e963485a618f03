// prefetch_engine.h: carries out a plan's offload decisions on a compute stream: D2H after
// the producer, one layer in flight, prefetch `lookahead` layers ahead of backward.
//
// Note [Engine streams and events]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The engine owns two non-blocking streams, "stash d2h" and "stash h2d", named for nsys.
//  * offload(k, ptr, bytes, producer): an event on `producer` after the work enqueued so
//    far; the D2H stream waits on it and copies into a pinned block. The device block is
//    then handed back (to stash's device pool, or through the caller's release function,
//    always from an engine call on the caller's thread, never from a CUDA host-function
//    thread: a Python caller would deadlock on the GIL) as Note [Handing offloaded blocks
//    back] says.
//  * forward_begin(mb, i): the compute stream waits on the event recorded after the latest
//    D2H of the layer the schedule names (i-2: one layer in flight, Note [The step's
//    schedule] in planner/model/schedule.h); the host never blocks. A micro-batch's first
//    backward_begin waits likewise for the latest of all its D2H copies (the loss turn):
//    the D2H stream is FIFO, so one event covers every earlier copy.
//  * backward_begin(mb, i): for each offloaded tensor of its prefetch window's layers (the
//    same Note) not prefetched yet, a device block is allocated for the compute stream (it
//    is that stream's memory from this point of its order), then an event is recorded on
//    the compute stream *after* the allocation, and the H2D stream waits on it and on the
//    tensor's own D2H event before copying. Waiting on the compute stream is what makes the
//    block safe to write: the pool may hand out a block the compute stream just freed, and
//    a stream-ordered caller allocator (cudaMallocAsync) enqueues the allocation there. (The
//    checker caught the first version, which recorded the event before allocating.) It
//    also times the prefetch exactly as the simulator does: when backward of i begins.
//  * acquire(k, consumer): the consumer waits on that tensor's H2D event only, never on
//    the whole H2D stream, so a late tensor delays only its own consumer.
//  * release(k): the consumer block goes back to the compute stream at once (to the pool,
//    guarded only by a consumer other than the compute stream, or to the release
//    callback): its consumer already waited for the H2D copy into it (a never-acquired
//    tensor makes the compute stream wait for it first). No event on the H2D stream: that
//    stream runs ahead with later prefetches, and a block guarded by it came back to the
//    compute stream only when the host saw those end too, which put the next
//    gradient-accumulation pass over budget. The pinned block goes back to the pinned pool
//    guarded by the D2H and H2D streams that used it.
//
// Note [Handing offloaded blocks back]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The planner's peak assumes an offloaded block is free memory once its copy is done. Two
// ways to make that true, whichever comes first:
//  * in compute-stream order: forward_begin(i) enqueues the compute stream's wait for
//    layer i-2's copies, and the loss turn its wait for all of them. Every copy up to that
//    layer's latest (the D2H stream is FIFO, so whatever was enqueued before it, of any
//    micro-batch) is then finished *for all work enqueued on the compute stream from now
//    on*, so each such block is handed back right there, with no event, as memory of the
//    compute stream: to the device pool when the block is the compute stream's (its free
//    list takes it back at once), or release(ptr, bytes, compute stream). Only blocks whose
//    producer is the compute stream qualify.
//  * when the copy is observed complete (cudaEventQuery at every engine call, or the
//    in-flight cap's wait): any remaining block goes back with no pending work at all.
// The first is what keeps the measured peak at the planned one. Host code runs ahead of
// the GPU by design, so "observed complete" comes late: a first version handed pool blocks
// back guarded by the D2H event, the pool could reuse them only after polling that event,
// and with the host a few layers ahead every offload plan ran at the keep-all peak (the
// built-in workload's measured peak showed it; docs/workload.md). Compute-order handback
// needs no host wait and is exactly the planner's rule.
//
// Note [In-flight cap]
// The cap (bytes, count) bounds pinned memory in transit on the D2H stream. An offload
// that would exceed it first retires completed copies (cudaEventQuery), then blocks the
// host on the oldest copy's event until it fits: bounded host back-pressure, counted in
// stats().cap_waits. A single tensor larger than the byte cap is let through alone.
//
// Note [Capturing a step]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A plan is static, so one whole step (every micro-batch's forward_begin to its last
// release, with the caller's own work on the compute stream) can be captured into a CUDA
// graph once and replayed: begin_capture, the step's calls, end_capture, then replay()
// per step. The step's host-side bookkeeping (tensor states, pool and pinned-pool carving,
// compute-order handback) runs once, at capture; the graph bakes in its addresses, and a
// replay enqueues only the graph launch. That is sound because a step leaves the engine as
// it found it (every tensor released, every block back in its pool) and every address the
// step uses is produced inside the step before it is read: replaying the same ops on the
// same addresses is the same step.
// What capture forbids, and where it went:
//  * host waits (the in-flight cap's cudaEventSynchronize, the pinned pool's wait,
//    synchronize()) and queries (retire()'s cudaEventQuery of a captured event): begin
//    waits for and retires every earlier copy; during capture retire() does nothing (the
//    captured copies are retired at end_capture, by bookkeeping alone); the cap and the
//    pinned wait are refused, not waited for;
//  * allocations: pinned slabs are pinned before (begin's pinned_bytes, or an
//    eager step first), and the pinned pool is frozen (no cudaHostAlloc, no wait); the
//    device pool never grows while its stream captures (device_pool.h), so an eager step
//    first sizes it; events are reserved at begin for max_micro_batches steps' worth and
//    the event pool is frozen (no cudaEventCreate);
//  * timing: the trace's events would be queried by harvest, so the trace is parked for
//    the capture and replays are not traced (trace and overlap cover eager steps only);
//  * set_plan: a re-plan changes the step, so it is refused during capture, and after it
//    the captured graph is dropped; replay() then fails naming set_plan: capture again.
// A refused call returns capture (STASH_ERROR_CAPTURE) naming what it would have done,
// without making the forbidden CUDA call, so the CUDA capture stays valid; end_capture
// then ends it, discards the graph and returns the first refusal. end_capture also
// refuses a step that is not whole (a tensor still live) or in which a tensor failed.
// Pinned blocks freed during the capture are guarded by capturing streams, so they come
// back only after it (event_guard.h): a captured step of several micro-batches holds
// pinned memory for all of them, which begin's pinned_bytes must cover.
// Replay launches the graph on the compute stream, then makes the engine's D2H and H2D
// streams wait for the compute stream: the graph's copies ran on its own hidden lanes, so
// this orders the engine's later copies (into the same pinned blocks) after the replay.
// Producers must be the compute stream during capture: a block handed back at end_capture
// is the compute stream's memory, safe for its work after the launch, not another's.
//
// Note [Capture begun by the caller]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A framework may capture the step itself: torch.cuda.graph begins a capture of a stream
// of its own (a side stream, not the engine's compute stream) and ends it when its block
// exits; the step's graph is the caller's and the caller replays it. join_capture(stream)
// puts the engine in capture mode for that capture with the same rules as Note
// [Capturing a step], but begins nothing and ends nothing:
//  * `stream` must be capturing already (cudaStreamIsCapturing: active). For the capture's
//    length it is the engine's compute stream: the waits of forward_begin and the loss
//    turn, the order events of prefetches, the prefetch blocks (allocated for it), the
//    compute-order handback. The engine's D2H and H2D streams fork from it by event
//    record and wait, as eagerly, so they join the caller's capture; backward_end of
//    layer 0, once no micro-batch holds tensors, joins them back into `stream` (an event
//    recorded on each, waited for by `stream`), so the caller's end of capture finds no
//    unjoined fork.
//  * before it joins, the engine retires its earlier copies: it queries their events and
//    waits for the ones not done yet (host waits on events outside the capture; the double
//    allows them, as the runtime's rules say: the capture forbids waits on its own work).
//    It reserves the step's events and freezes the pinned and event pools, so the step
//    pins nothing and creates no event: an eager step of the plan must come first (it
//    sizes the pinned pool), as torch asks for warm-up steps before a capture anyway.
//  * offloads whose producer is not `stream` are refused (the rule of the Note above). An
//    offload from a producer that is capturing while the engine is not in capture mode is
//    refused too, naming join_capture: eager bookkeeping would query captured events.
//    forward_begin joins by itself when the configured compute stream is capturing.
//  * pinned blocks released during the capture are held, not given back: the caller's
//    graph copies into them at every replay, and the engine never sees a replay, so no
//    later step may have them while the graph lives (its pinned slots are fixed for the
//    graph's life). release_held() gives them all back, ordered after the compute
//    stream's work so far (the caller's replays must be finished or enqueued there), and
//    so does the destructor. set_plan keeps them: an earlier shape's graph may still be
//    replayed after a re-plan. The engine must outlive the caller's graphs.
//  * settle_capture(), after the caller ended the capture, leaves capture mode: the
//    compute stream is the configured one again, the pools thaw, the captured copies are
//    retired by bookkeeping (nothing of the capture ran), and it returns the capture's
//    verdict as end_capture would: the first refusal, a step not whole, a failed tensor.
//    While `stream` still captures it refuses and changes nothing. forward_begin and
//    join_capture settle by themselves a capture that has ended (the verdict is then
//    dropped: the call that refused, during the capture, returned it already).
// The engine does not count the caller's replays (graph().replays is its own graph's);
// graph().captures counts caller captures that settled whole.
//
// Note [Pinned pool exhausted]
// keep_on_device: the tensor stays where it is (ON_DEVICE, the engine owns the block and
//   frees it at release), counted in kept_on_device; offload returns ok. Data never moves,
//   so nothing is lost; the cost is device memory, which the stats make visible.
// wait: the pinned pool waits (up to pinned_wait_timeout_ms) for blocks still guarded by
//   in-flight copies. If none is pending or the wait runs out, the tensor is kept as
//   above, counted, and offload returns out_of_memory / timeout so the caller knows.
//
// Thread safety: every public method may be called from any thread; one mutex serializes
// them. Release callbacks run inside engine calls on the calling thread and must not call
// the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "cuda_prim.h"
#include "device_pool.h"
#include "engine_plan.h"
#include "engine_status.h"
#include "pinned_pool.h"
#include "planner/model/trace.h"
#include "tensor_table.h"

namespace stash::engine {

// Caller's allocator. alloc returns 0 on success; release frees stream-ordered on `stream`.
using device_alloc_fn = int (*)(void** out, std::size_t bytes, cudaStream_t stream, void* user);
using device_release_fn = void (*)(void* ptr, std::size_t bytes, cudaStream_t stream,
                                   void* user);

enum class pinned_exhausted : int { keep_on_device = 0, wait = 1 };

struct engine_config {
  cudaStream_t compute = nullptr;      // the stream layers run on (nullptr: legacy default)
  int lookahead = 1;                   // the prefetch window's depth (planner/model/schedule.h)
  std::size_t max_in_flight_bytes = 0; // D2H bytes in transit; 0: unbounded
  std::size_t max_in_flight_count = 0; // D2H copies in transit; 0: unbounded
  pinned_pool_config pinned;           // the engine's own pinned pool
  pinned_exhausted on_pinned_exhausted = pinned_exhausted::keep_on_device;
  device_pool* pool = nullptr;         // stash's device pool, or:
  device_alloc_fn alloc = nullptr;     // the caller's allocator (both functions)
  device_release_fn release = nullptr;
  void* user = nullptr;
  bool timing = true;                  // time every op with CUDA events (trace, overlap)
  std::size_t max_micro_batches = 8;   // micro-batches live at once
};

struct tensor_info {
  tensor_state state = tensor_state::absent;
  tensor_action action = tensor_action::keep;
  status error = status::ok;
  const char* message = "";  // valid until the tensor's slot is reused
  void* device = nullptr;    // where acquire would point (null while only on the host)
  std::size_t bytes = 0;
};

struct engine_stats {
  std::uint64_t offloaded_count = 0, offloaded_bytes = 0;    // D2H copies enqueued
  std::uint64_t prefetched_count = 0, prefetched_bytes = 0;  // H2D copies enqueued
  std::uint64_t kept_on_device_count = 0, kept_on_device_bytes = 0;  // pinned exhausted
  std::uint64_t keep_count = 0, recompute_count = 0;  // pass-through tensors offered
  std::uint64_t failed_count = 0;                     // tensors whose copy failed
  std::uint64_t released_count = 0;
  std::uint64_t in_flight_count = 0, in_flight_bytes = 0;
  std::uint64_t peak_in_flight_count = 0, peak_in_flight_bytes = 0;
  std::uint64_t cap_waits = 0;             // host waits imposed by the in-flight cap
  std::uint64_t release_callbacks = 0;     // device blocks handed to the caller's release
  // Offloaded blocks handed back in compute-stream order (Note [Handing offloaded blocks
  // back]) rather than when their copy was observed complete.
  std::uint64_t ordered_handback_count = 0, ordered_handback_bytes = 0;
  pool_stats pinned;
};

class engine_trace;
struct timed_op;

class prefetch_engine {
 public:
  // Throws stash::error (invalid_argument for a bad config; cuda_error).
  explicit prefetch_engine(const engine_config& config);
  // Waits for the engine's streams, hands back every block it holds, destroys its streams.
  ~prefetch_engine();
  prefetch_engine(const prefetch_engine&) = delete;
  prefetch_engine& operator=(const prefetch_engine&) = delete;

  // Replaces the plan. Fails (illegal_transition) while a micro-batch holds tensors.
  status set_plan(engine_plan plan) noexcept;
  const engine_plan& plan() const noexcept { return plan_; }
  status action(std::uint32_t layer, std::uint32_t index, tensor_action* out) noexcept;

  // Layer hooks, on the compute stream, in program order.
  status forward_begin(std::uint32_t mb, std::uint32_t layer) noexcept;
  status forward_end(std::uint32_t mb, std::uint32_t layer) noexcept;
  status backward_begin(std::uint32_t mb, std::uint32_t layer) noexcept;
  status backward_end(std::uint32_t mb, std::uint32_t layer) noexcept;

  status offload(tensor_key k, void* device, std::size_t bytes, cudaStream_t producer) noexcept;
  status acquire(tensor_key k, cudaStream_t consumer, void** out) noexcept;
  status release(tensor_key k) noexcept;
  status info(tensor_key k, tensor_info* out) noexcept;

  // Waits for the engine's streams; retires every copy (runs pending release callbacks).
  status synchronize() noexcept;

  // Note [Capturing a step]. begin: no micro-batch may hold tensors; waits for the engine's
  // copies, pins what is missing for pinned_bytes to be free, reserves events, begins a
  // global-mode capture of the compute stream. end: ends it and instantiates the step's graph (replacing an
  // earlier one). replay: launches it on the compute stream.
  status begin_capture(std::size_t pinned_bytes) noexcept;
  status end_capture() noexcept;
  status replay() noexcept;
  // Note [Capture begun by the caller]. join: `stream` is capturing; no micro-batch may
  // hold tensors. settle: after the caller ended that capture; the capture's verdict.
  // release_held: gives back the pinned blocks the caller's graphs hold; *bytes (may be
  // null): how many.
  status join_capture(cudaStream_t stream) noexcept;
  status settle_capture() noexcept;
  status release_held(std::size_t* bytes) noexcept;
  struct graph_state {
    bool capturing = false, ready = false;
    std::uint64_t captures = 0, replays = 0;
  };
  graph_state graph() noexcept;
  engine_stats stats() noexcept;

  // Waits for the engine's timed work, then returns the spans recorded so far (compute,
  // "stash d2h", "stash h2d", waits) in planner/model/trace.h's format. Throws stash::error.
  planner::trace_writer trace();
  void write_trace(const std::string& path);
  planner::overlap_report overlap();

  cudaStream_t d2h_stream() const noexcept { return d2h_.get(); }
  cudaStream_t h2d_stream() const noexcept { return h2d_.get(); }
  cudaStream_t compute_stream() const noexcept { return config_.compute; }
  const engine_config& config() const noexcept { return config_; }

 private:
  friend class engine_trace;
  // All below: lock held.
  status find(tensor_key k, const char* op, bool create, micro_batch_slot** slot, tensor_record** rec,
              std::size_t* flat) noexcept;
  status slot_for(std::uint32_t mb, bool create, micro_batch_slot** out) noexcept;
  void reset_slot(micro_batch_slot& s) noexcept;
  status issue_prefetch(micro_batch_slot& s, std::uint32_t layer, std::size_t flat,
                        cudaStream_t order) noexcept;
  status prefetch_layer(micro_batch_slot& s, std::uint32_t layer) noexcept;
  // The loss turn's wait for every D2H copy of the micro-batch, once per step: at the
  // last layer's forward_end, or its backward_begin when that came without one.
  status loss_turn(micro_batch_slot& s, std::uint32_t mb) noexcept;
  status make_room(std::size_t bytes) noexcept;
  void retire(bool block) noexcept;
  void retire_front() noexcept;
  void hand_back_through(std::uint64_t seq) noexcept;
  status free_device(void* p, std::size_t bytes, cudaStream_t stream,
                     const cudaStream_t* users, std::size_t n_users) noexcept;
  status alloc_device(std::size_t bytes, void** out) noexcept;
  status keep_on_device(micro_batch_slot& s, tensor_record& r, status why) noexcept;
  status tensor_fail(tensor_record& r, status why) noexcept;
  // Note [Measured device bytes]: the pool's held bytes (and, for a compute span, the
  // highest level since the previous one) into `t`; nothing without stash's pool.
  void sample_device(timed_op& t, bool compute) noexcept;
  // Note [Capturing a step]: records the first refusal of this capture; returns capture.
  status refuse(const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));
  void drop_graph() noexcept;  // waits for the compute stream, destroys the graph
  // Note [Capture begun by the caller]
  status join_locked(cudaStream_t stream, const char* op) noexcept;
  status settle_locked() noexcept;
  void join_side_streams() noexcept;  // d2h and h2d, where capture members, into compute
  // Note [Capturing a step]: the state every capture starts in, the engine's own
  // (begin_capture) or the caller's (capture_join): no refusal yet, the pinned and event
  // pools frozen, the trace parked.
  void enter_capture() noexcept;
  bool joined_stream_ended() noexcept;  // joined, and the caller's capture is over
  void settle_if_ended() noexcept {     // the verdict is dropped (the refusal returned it)
    if (joined_ && joined_stream_ended()) settle_locked();
  }

  engine_config config_;
  std::mutex mutex_;
  engine_plan plan_;
  prim::stream_owner d2h_, h2d_;
  std::unique_ptr<pinned_pool> pinned_;
  event_pool events_;
  std::vector<micro_batch_slot> slots_;
  in_flight_queue in_flight_;
  engine_stats stats_;
  std::uint64_t d2h_seq_ = 0;        // D2H copies enqueued so far (in_flight_copy::seq)
  std::uint64_t pinned_in_use_ = 0;  // bytes of pinned blocks the engine holds (trace counter)
  std::unique_ptr<engine_trace> trace_;
  // Note [Capturing a step]
  bool capturing_ = false;
  bool refused_ = false;
  char refusal_[256] = {};
  std::uint64_t failed_at_begin_ = 0;
  std::unique_ptr<engine_trace> parked_trace_;
  cudaGraphExec_t graph_ = nullptr;
  bool dropped_by_plan_ = false;
  prim::event_owner replayed_;  // after a launch: the copy streams wait on it
  std::uint64_t captures_ = 0, replays_ = 0;
  // Note [Capture begun by the caller]
  bool joined_ = false;                    // capturing_ for the caller's capture
  cudaStream_t own_compute_ = nullptr;     // config_.compute outside it
  struct held_block {
    void* host;
    std::size_t bytes;
  };
  std::vector<held_block> held_;           // pinned blocks of the caller's graphs
};

// Whether `stream` is in an active capture by a query that succeeded (a failed query, as
// of the legacy stream beside another stream's capture, is cleared and answers false).
bool actively_capturing(cudaStream_t stream) noexcept;

}  // namespace stash::engine
