// capture.h: stream capture into graphs, the rules that refuse calls during a capture,
// and the replay of an instantiated graph.
//
// Every function here expects state().mu held by the caller. Functions that return a
// cudaError_t return it unrecorded; the entry point records it (fail()).
//
// Note [Capture rules]
// A capture sequence starts with cudaStreamBeginCapture on a stream other than the legacy
// one (the double models cudaStreamPerThread as the legacy stream, so it cannot capture
// either: cudaErrorStreamCaptureUnsupported). Ops pushed into a capturing stream are
// recorded as graph nodes and not run: copies, memsets, host functions, emulated compute,
// cudaMallocAsync (an allocation node, Note [Graph memory]) and cudaFreeAsync of a graph
// allocation (a free node; other memory: cudaErrorInvalidValue, as documented).
//  - Fork and join. cudaEventRecord on a capturing stream records no node: the event
//    remembers the stream's dependency set. A stream that is not capturing and waits on
//    such an event joins the capture, its next node depending on that set; a member
//    waiting on it adds the set to its own. A capturing stream waiting on an event of
//    another capture fails with cudaErrorStreamCaptureMerge, on an event recorded outside
//    any capture with cudaErrorStreamCaptureIsolation (both invalidate).
//    cudaStreamEndCapture on the origin stream fails with cudaErrorStreamCaptureUnjoined
//    when a node has no successor and is not in the origin's dependency set (a fork that
//    was never joined back). Ending on another member: cudaErrorStreamCaptureUnmatched,
//    and the capture is invalidated; on a stream that does not capture:
//    cudaErrorIllegalState; from another thread when the mode is not relaxed:
//    cudaErrorStreamCaptureWrongThread, and the capture is over (no graph). A null
//    pGraph ends the capture and drops the graph (cudaSuccess). However it ends, every
//    member leaves the capture; a failed capture yields no graph. (Those three answers
//    are the real runtime's, seen on an H200 with CUDA 13; the double first had them
//    otherwise.)
//  - Invalidation. A refused call invalidates the capture(s) it conflicts with: their
//    later stream ops fail with cudaErrorStreamCaptureInvalidated and EndCapture returns
//    that error and no graph. Argument errors (a bad kind, a bad pointer) do not
//    invalidate: the call did nothing.
//  - Syncs. cudaStreamSynchronize and cudaStreamQuery of a capturing stream, and
//    cudaDeviceSynchronize while any capture is under way, fail with
//    cudaErrorStreamCaptureUnsupported (every mode: they necessarily conflict).
//    cudaEventQuery and cudaEventSynchronize of an event last recorded in a capture still
//    under way fail with cudaErrorCapturedEvent and invalidate its capture (the real
//    runtime's answers, seen on an H200 with CUDA 13: a host that polls a captured event
//    has broken the capture). cudaEventElapsedTime
//    fails with cudaErrorCapturedEvent and invalidates nothing (not checked on a GPU).
//    Once the capture ended the event
//    reads as it did before that record (the double's choice; the real runtime's answer
//    was not checked).
//  - The legacy stream. While a blocking stream (not cudaStreamNonBlocking) is a member
//    of a capture, any op on the legacy stream, a sync or query of it, and a synchronous
//    copy or memset (they run on it) fail with cudaErrorStreamCaptureImplicit and
//    invalidate those captures; cudaStreamIsCapturing and cudaStreamGetCaptureInfo of the
//    legacy stream fail with it without invalidating, as documented.
//  - Potentially unsafe calls: cudaMalloc, cudaFree, cudaMemset, pinned memory's
//    cudaHostAlloc, cudaMallocHost and cudaFreeHost, and cudaEventQuery and
//    cudaEventSynchronize of an event recorded outside the capture (torch's caching
//    allocator defers its event queries while a capture runs for this reason; the real
//    runtime refuses them so, seen on an H200) (cudaMemcpy is not
//    one: the real runtime, on an H200 with CUDA 13, lets a synchronous host-to-device
//    copy run during a Global capture of a non-blocking stream, and so does the
//    double; cudaMemset's and cudaFree's answers there were not checked). As
//    cudaThreadExchangeStreamCaptureMode documents: under the calling thread's mode Global
//    they are refused while the thread has a capture of its own not begun relaxed, or any
//    other thread has a capture begun Global; under ThreadLocal only the thread's own
//    non-relaxed capture counts; under Relaxed nothing does. The refusal is
//    cudaErrorStreamCaptureUnsupported and invalidates the captures that caused it.
//  - Not modelled: kernel launches keep failing (Note [Kernel launches] in
//    api_launch.cpp) and record nothing; cudaEventRecordExternal and
//    cudaEventWaitExternal, cudaStreamAddCallback and cudaGraphLaunch on a capturing
//    stream return cudaErrorNotSupported; cudaStreamDestroy of a member invalidates its
//    capture (of the origin: ends it).
//
// Note [Graph replay]
// cudaGraphLaunch enqueues the graph's nodes, in capture order (a topological order), as
// the ops the captured calls would have enqueued, on one lane per stream that took part
// in the capture: the origin's nodes run on the launch stream, every other member's on a
// hidden non-blocking stream the executable graph owns. Cross-lane dependencies become
// event waits; every hidden lane first waits for the launch stream's prior work and the
// launch stream finally waits for every lane. The checker and the virtual clock therefore
// see exactly the forks and joins of the captured code, and a race between two unjoined
// branches is reported as it would be when enqueued directly. The lanes belong to the
// executable graph, so launches of one executable graph are ordered after each other on
// every lane. Before enqueueing anything a launch rebuilds every op against the memory
// table of that moment (op_specs.h): a node whose memory was freed, or changed kind,
// fails the launch with the error the direct call would return, with nothing enqueued.
// A captured copy whose host side is pageable replays asynchronously: graph launches
// never wait for the host.
//
// Note [Graph memory]
// A captured cudaMallocAsync maps its block at capture time and returns its address,
// which the graph keeps for its whole life (as the real runtime reserves graph
// allocations' addresses). During the capture the block is in the memory table, so the
// capture's copies into it pass the kind checks; it leaves the table when the capture
// ends. Each launch puts it back and counts it as default-pool memory (the double has no
// separate graph pool), stream-ordered like cudaMallocAsync; a free node (in the graph or
// a later cudaFreeAsync/cudaFree) returns it. Launching while an allocation of the graph
// is still live fails with cudaErrorInvalidValue. Not enforced: the runtime's limit of
// one executable graph at a time for a graph with memory nodes.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "op_specs.h"
#include "streams.h"

namespace stash::dbl {

enum class NodeKind { kMemcpy, kMemset, kHost, kCompute, kAlloc, kFree };

struct Node {
  NodeKind kind = NodeKind::kHost;
  const char* api = "";
  size_t lane = 0;           // index of the capture member it was captured on
  std::vector<size_t> deps;  // indices of earlier nodes
  // kMemcpy: dst, src, count, copy_kind. kMemset: dst, value, count.
  void* dst = nullptr;
  const void* src = nullptr;
  size_t count = 0;
  int copy_kind = 0;
  int value = 0;
  cudaHostFn_t fn = nullptr;  // kHost
  void* user = nullptr;
  ComputeArgs compute;  // kCompute
  BlockRef block;       // kAlloc, kFree
};

struct Graph {
  std::deque<Node> nodes;  // a deque: node handles (cudaGraphNode_t) are addresses
  size_t lanes = 1;
  std::vector<BlockRef> allocations;  // this graph's kAlloc blocks
};

struct Capture {
  uint64_t id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  bool invalidated = false;
  bool ended = false;
  std::vector<Stream*> members;  // origin first; null once destroyed
  std::unique_ptr<Graph> graph;
};

struct GraphExec {
  std::shared_ptr<const Graph> graph;
  std::vector<Stream*> lanes;        // hidden streams of the lanes other than the origin's
  std::vector<size_t> lane_index;    // capture lane -> 1 + index into `lanes` (0: origin)
  std::vector<bool> signals;     // per node: a later node on another lane waits for it
  std::vector<Event> node_done;  // per node, recorded when `signals`
  Event start;
  std::vector<Event> lane_done;
};

// The calling thread's interaction mode (cudaThreadExchangeStreamCaptureMode).
cudaStreamCaptureMode& thread_capture_mode();

// Note [Capture rules]: what an entry point does with an op for stream `s`. Returns an
// error (the capture is invalidated as the Note says), or cudaSuccess with `*captured`
// telling whether to add a node (add_node) instead of enqueueing.
cudaError_t route_op(State& st, Stream& s, bool* captured);
void add_node(State& st, Stream& s, Node node);

cudaError_t refuse_unsafe(State& st);                // Note [Capture rules]: the unsafe calls
cudaError_t refuse_stream_sync(State& st, Stream& s);  // cudaStreamSynchronize/Query
cudaError_t refuse_device_sync(State& st);           // cudaDeviceSynchronize
// The legacy stream's answer to a capture query (Implicit, without invalidating).
cudaError_t legacy_query(State& st, Stream& s);
bool in_active_capture(const Event& ev);  // cudaErrorCapturedEvent applies

cudaError_t begin_capture(State& st, Stream& s, cudaStreamCaptureMode mode);
cudaError_t end_capture(State& st, Stream& s, cudaGraph_t* out);
// cudaEventRecord / cudaStreamWaitEvent on or by a stream, capture-aware: these do the
// whole call (enqueueing when nothing captures).
cudaError_t capture_aware_record(State& st, Event& ev, Stream& s);
cudaError_t capture_aware_wait(State& st, Stream& s, Event& ev);
void leave_capture(State& st, Stream& s);  // cudaStreamDestroy
void abort_all_captures(State& st);        // stashdbl_reset, cudaDeviceReset

Graph* find_graph(State& st, cudaGraph_t g);
GraphExec* find_exec(State& st, cudaGraphExec_t e);
cudaError_t instantiate(State& st, Graph& g, cudaGraphExec_t* out);
cudaError_t launch_graph(State& st, GraphExec& exec, Stream& s);
void destroy_exec(State& st, cudaGraphExec_t e);

}  // namespace stash::dbl
