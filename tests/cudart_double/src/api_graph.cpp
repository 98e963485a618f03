// api_graph.cpp: stream capture and graph entry points. The rules live in capture.h
// (Note [Capture rules], Note [Graph replay], Note [Graph memory]); this file validates
// arguments and takes the lock.
#include <mutex>

#include "capture.h"

namespace stash::dbl {
namespace {

bool valid_mode(int mode) {
  return mode == cudaStreamCaptureModeGlobal || mode == cudaStreamCaptureModeThreadLocal ||
         mode == cudaStreamCaptureModeRelaxed;
}

cudaStreamCaptureStatus status_of(const Stream& s) {
  if (!s.capture) return cudaStreamCaptureStatusNone;
  return s.capture->invalidated ? cudaStreamCaptureStatusInvalidated
                                : cudaStreamCaptureStatusActive;
}

cudaError_t instantiate_call(cudaGraphExec_t* out, cudaGraph_t graph, unsigned long long flags) {
  // Instantiation flags change nothing the double models; unknown bits are refused.
  constexpr unsigned long long kKnown =
      cudaGraphInstantiateFlagAutoFreeOnLaunch | cudaGraphInstantiateFlagUpload |
      cudaGraphInstantiateFlagDeviceLaunch | cudaGraphInstantiateFlagUseNodePriority;
  if (out == nullptr || (flags & ~kKnown) != 0) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Graph* g = find_graph(st, graph);
  if (g == nullptr) return fail(cudaErrorInvalidValue);
  return ret(instantiate(st, *g, out));
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

STASHDBL_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream,
                                                  cudaStreamCaptureMode mode) {
  STASHDBL_ENTER("cudaStreamBeginCapture");
  if (!valid_mode(enum_value(mode))) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return ret(begin_capture(st, *s, mode));
}

STASHDBL_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  STASHDBL_ENTER("cudaStreamEndCapture");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return ret(end_capture(st, *s, pGraph));
}

STASHDBL_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                                 cudaStreamCaptureStatus* pCaptureStatus) {
  STASHDBL_ENTER("cudaStreamIsCapturing");
  if (pCaptureStatus == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = legacy_query(st, *s); e != cudaSuccess) return fail(e);
  *pCaptureStatus = status_of(*s);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                    cudaStreamCaptureStatus* captureStatus_out,
                                                    unsigned long long* id_out,
                                                    cudaGraph_t* graph_out,
                                                    const cudaGraphNode_t** dependencies_out,
                                                    const cudaGraphEdgeData** edgeData_out,
                                                    size_t* numDependencies_out) {
  STASHDBL_ENTER("cudaStreamGetCaptureInfo");
  if (captureStatus_out == nullptr) return fail(cudaErrorInvalidValue);
  if (edgeData_out != nullptr && dependencies_out == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = legacy_query(st, *s); e != cudaSuccess) return fail(e);
  *captureStatus_out = status_of(*s);
  if (*captureStatus_out != cudaStreamCaptureStatusActive) return cudaSuccess;
  // Valid data only for an active capture, as documented. The arrays live in the stream
  // until its next capture call.
  Graph& g = *s->capture->graph;
  s->capture_dep_handles.clear();
  for (size_t i : s->capture_deps) {
    s->capture_dep_handles.push_back(reinterpret_cast<cudaGraphNode_t>(&g.nodes[i]));
  }
  s->capture_edges.assign(s->capture_deps.size(), cudaGraphEdgeData{});
  if (id_out) *id_out = s->capture->id;
  if (graph_out) *graph_out = reinterpret_cast<cudaGraph_t>(&g);
  if (dependencies_out) *dependencies_out = s->capture_dep_handles.data();
  if (edgeData_out) *edgeData_out = s->capture_edges.data();
  if (numDependencies_out) *numDependencies_out = s->capture_deps.size();
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  STASHDBL_ENTER("cudaThreadExchangeStreamCaptureMode");
  if (mode == nullptr || !valid_mode(enum_value(*mode))) return fail(cudaErrorInvalidValue);
  std::swap(thread_capture_mode(), *mode);
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph,
                                                unsigned long long flags) {
  STASHDBL_ENTER("cudaGraphInstantiate");
  return instantiate_call(pGraphExec, graph, flags);
}

STASHDBL_EXPORT cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* pGraphExec,
                                                         cudaGraph_t graph,
                                                         unsigned long long flags) {
  STASHDBL_ENTER("cudaGraphInstantiateWithFlags");
  return instantiate_call(pGraphExec, graph, flags);
}

STASHDBL_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  STASHDBL_ENTER("cudaGraphLaunch");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  GraphExec* exec = find_exec(st, graphExec);
  if (exec == nullptr) return fail(cudaErrorInvalidValue);
  Stream* s = find_stream(st, stream);
  if (s == nullptr) return fail(cudaErrorInvalidResourceHandle);
  return ret(launch_graph(st, *exec, *s));
}

// Inspection of a captured graph: its nodes in capture order (a topological order) and
// each node's type, as the runtime reports them (a node handle is the node's address).
STASHDBL_EXPORT cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes,
                                              size_t* numNodes) {
  STASHDBL_ENTER("cudaGraphGetNodes");
  if (numNodes == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  Graph* g = find_graph(st, graph);
  if (g == nullptr) return fail(cudaErrorInvalidValue);
  if (nodes != nullptr) {
    // As documented: at most *numNodes handles; fewer nodes leave the rest null.
    for (size_t i = 0; i < *numNodes; ++i)
      nodes[i] = i < g->nodes.size() ? reinterpret_cast<cudaGraphNode_t>(&g->nodes[i]) : nullptr;
    if (*numNodes > g->nodes.size()) *numNodes = g->nodes.size();
  } else {
    *numNodes = g->nodes.size();
  }
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, cudaGraphNodeType* type) {
  STASHDBL_ENTER("cudaGraphNodeGetType");
  if (node == nullptr || type == nullptr) return fail(cudaErrorInvalidValue);
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  const Node* n = nullptr;
  for (auto& [handle, g] : st.graphs) {
    (void)handle;
    for (const Node& x : g->nodes)
      if (reinterpret_cast<cudaGraphNode_t>(const_cast<Node*>(&x)) == node) n = &x;
  }
  if (n == nullptr) return fail(cudaErrorInvalidValue);
  switch (n->kind) {
    case NodeKind::kMemcpy: *type = cudaGraphNodeTypeMemcpy; break;
    case NodeKind::kMemset: *type = cudaGraphNodeTypeMemset; break;
    case NodeKind::kHost: *type = cudaGraphNodeTypeHost; break;
    case NodeKind::kCompute: *type = cudaGraphNodeTypeEmpty; break;  // emulated compute
    case NodeKind::kAlloc: *type = cudaGraphNodeTypeMemAlloc; break;
    case NodeKind::kFree: *type = cudaGraphNodeTypeMemFree; break;
  }
  return cudaSuccess;
}

// Returns at once; launched work still runs (its lanes drain, Note [Stream workers]).
STASHDBL_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  STASHDBL_ENTER("cudaGraphExecDestroy");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (find_exec(st, graphExec) == nullptr) return fail(cudaErrorInvalidValue);
  destroy_exec(st, graphExec);
  return cudaSuccess;
}

// Executable graphs instantiated from it keep what they need.
STASHDBL_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  STASHDBL_ENTER("cudaGraphDestroy");
  State& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  if (st.graphs.erase(graph) == 0) return fail(cudaErrorInvalidValue);
  return cudaSuccess;
}

// --- per-thread default stream variants (Note [Legacy default stream]) -----------------

STASHDBL_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s,
                                                       cudaStreamCaptureMode mode) {
  return cudaStreamBeginCapture(s, mode);
}
STASHDBL_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t* g) {
  return cudaStreamEndCapture(s, g);
}
STASHDBL_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s,
                                                      cudaStreamCaptureStatus* c) {
  return cudaStreamIsCapturing(s, c);
}
STASHDBL_EXPORT cudaError_t cudaStreamGetCaptureInfo_ptsz(
    cudaStream_t s, cudaStreamCaptureStatus* c, unsigned long long* id, cudaGraph_t* g,
    const cudaGraphNode_t** d, const cudaGraphEdgeData** e, size_t* n) {
  return cudaStreamGetCaptureInfo(s, c, id, g, d, e, n);
}
STASHDBL_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t e, cudaStream_t s) {
  return cudaGraphLaunch(e, s);
}
