#include "capture.h"

#include <algorithm>
#include <utility>

namespace stash::dbl {

cudaStreamCaptureMode& thread_capture_mode() {
  thread_local cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  return mode;
}

namespace {

bool has_blocking_member(const Capture& c) {
  return std::any_of(c.members.begin(), c.members.end(),
                     [](const Stream* m) { return m != nullptr && m->blocking(); });
}

// True when an op on the legacy stream would depend on a capture (Note [Capture rules]);
// optionally invalidates those captures.
bool legacy_conflicts(State& st, bool invalidate) {
  bool any = false;
  for (auto& c : st.captures) {
    if (!has_blocking_member(*c)) continue;
    any = true;
    if (invalidate) c->invalidated = true;
  }
  return any;
}

void clear_membership(Stream& s) {
  s.capture.reset();
  s.capture_lane = 0;
  s.capture_deps.clear();
  s.capture_dep_handles.clear();
  s.capture_edges.clear();
}

// Ends a capture however it went: members leave it, its allocations leave the table
// (Note [Graph memory]). The graph stays in `c` for the caller to take or drop.
void end(State& st, Capture& c) {
  c.ended = true;
  for (Stream* m : c.members) {
    if (m != nullptr) clear_membership(*m);
  }
  for (const BlockRef& b : c.graph->allocations) {
    if (st.memory.at_base(reinterpret_cast<void*>(b->base)) == b) st.memory.erase(b);
  }
  auto& cs = st.captures;
  cs.erase(std::remove_if(cs.begin(), cs.end(),
                          [&](const std::shared_ptr<Capture>& p) { return p.get() == &c; }),
           cs.end());
}

}  // namespace

cudaError_t route_op(State& st, Stream& s, bool* captured) {
  *captured = false;
  if (s.capture) {
    if (s.capture->invalidated) return cudaErrorStreamCaptureInvalidated;
    *captured = true;
    return cudaSuccess;
  }
  if (s.legacy && legacy_conflicts(st, /*invalidate=*/true)) {
    return cudaErrorStreamCaptureImplicit;
  }
  return cudaSuccess;
}

void add_node(State&, Stream& s, Node node) {
  Graph& g = *s.capture->graph;
  node.lane = s.capture_lane;
  node.deps = s.capture_deps;
  g.nodes.push_back(std::move(node));
  s.capture_deps.assign(1, g.nodes.size() - 1);
}

cudaError_t refuse_unsafe(State& st) {
  const cudaStreamCaptureMode mode = thread_capture_mode();
  const std::thread::id self = std::this_thread::get_id();
  bool refused = false;
  for (auto& c : st.captures) {
    bool prohibits = false;
    if (mode != cudaStreamCaptureModeRelaxed) {
      if (c->thread == self) {
        prohibits = c->mode != cudaStreamCaptureModeRelaxed;
      } else {
        prohibits = mode == cudaStreamCaptureModeGlobal && c->mode == cudaStreamCaptureModeGlobal;
      }
    }
    if (prohibits) {
      c->invalidated = true;
      refused = true;
    }
  }
  return refused ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
}

cudaError_t refuse_stream_sync(State& st, Stream& s) {
  if (s.capture) {
    s.capture->invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  if (s.legacy && legacy_conflicts(st, /*invalidate=*/true)) {
    return cudaErrorStreamCaptureImplicit;
  }
  return cudaSuccess;
}

cudaError_t refuse_device_sync(State& st) {
  if (st.captures.empty()) return cudaSuccess;
  for (auto& c : st.captures) c->invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t legacy_query(State& st, Stream& s) {
  if (s.legacy && legacy_conflicts(st, /*invalidate=*/false)) {
    return cudaErrorStreamCaptureImplicit;
  }
  return cudaSuccess;
}

bool in_active_capture(const Event& ev) { return ev.capture && !ev.capture->ended; }

cudaError_t begin_capture(State& st, Stream& s, cudaStreamCaptureMode mode) {
  if (s.legacy) return cudaErrorStreamCaptureUnsupported;
  if (s.capture) return cudaErrorIllegalState;
  auto c = std::make_shared<Capture>();
  c->id = st.next_capture_id++;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->members.push_back(&s);
  c->graph = std::make_unique<Graph>();
  clear_membership(s);
  s.capture = c;
  st.captures.push_back(std::move(c));
  return cudaSuccess;
}

cudaError_t end_capture(State& st, Stream& s, cudaGraph_t* out) {
  if (!s.capture) return cudaErrorIllegalState;
  std::shared_ptr<Capture> c = s.capture;
  // Note [Capture rules]: as the real runtime answers (seen on an H200, CUDA 13).
  if (c->members.front() != &s) {
    c->invalidated = true;
    return cudaErrorStreamCaptureUnmatched;
  }
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    end(st, *c);
    return cudaErrorStreamCaptureWrongThread;
  }
  // A node nothing depends on must be in the origin's dependency set: else some fork
  // was never joined back.
  const Graph& g = *c->graph;
  std::vector<bool> has_successor(g.nodes.size(), false);
  for (const Node& n : g.nodes) {
    for (size_t d : n.deps) has_successor[d] = true;
  }
  bool unjoined = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (!has_successor[i] &&
        std::find(s.capture_deps.begin(), s.capture_deps.end(), i) == s.capture_deps.end()) {
      unjoined = true;
    }
  }
  const bool invalidated = c->invalidated;
  end(st, *c);
  if (out != nullptr) *out = nullptr;
  if (invalidated) return cudaErrorStreamCaptureInvalidated;
  if (unjoined) return cudaErrorStreamCaptureUnjoined;
  if (out == nullptr) return cudaSuccess;  // ended, the graph dropped
  std::shared_ptr<Graph> graph(std::move(c->graph));
  graph->lanes = c->members.size();
  *out = reinterpret_cast<cudaGraph_t>(graph.get());
  st.graphs.emplace(graph.get(), std::move(graph));
  return cudaSuccess;
}

cudaError_t capture_aware_record(State& st, Event& ev, Stream& s) {
  bool captured = false;
  if (cudaError_t e = route_op(st, s, &captured); e != cudaSuccess) return e;
  if (captured) {
    ev.capture = s.capture;
    ev.capture_deps = s.capture_deps;
    return cudaSuccess;
  }
  ev.capture.reset();
  ev.capture_deps.clear();
  record_event(st, ev, s);
  return cudaSuccess;
}

cudaError_t capture_aware_wait(State& st, Stream& s, Event& ev) {
  Capture* const from = in_active_capture(ev) ? ev.capture.get() : nullptr;
  if (s.capture) {
    Capture& c = *s.capture;
    if (c.invalidated) return cudaErrorStreamCaptureInvalidated;
    if (from == &c) {
      auto& deps = s.capture_deps;
      deps.insert(deps.end(), ev.capture_deps.begin(), ev.capture_deps.end());
      std::sort(deps.begin(), deps.end());
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      return cudaSuccess;
    }
    if (from != nullptr) {
      c.invalidated = true;
      from->invalidated = true;
      return cudaErrorStreamCaptureMerge;
    }
    if (ev.recorded) {
      c.invalidated = true;
      return cudaErrorStreamCaptureIsolation;
    }
    return cudaSuccess;  // never recorded: a no-op, as outside capture
  }
  if (from != nullptr) {
    if (s.legacy) {  // the legacy stream cannot join a capture
      if (legacy_conflicts(st, /*invalidate=*/true)) return cudaErrorStreamCaptureImplicit;
      from->invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    }
    if (from->invalidated) return cudaErrorStreamCaptureInvalidated;
    clear_membership(s);
    s.capture = ev.capture;
    s.capture_lane = from->members.size();
    s.capture_deps = ev.capture_deps;
    from->members.push_back(&s);
    return cudaSuccess;
  }
  bool captured = false;
  if (cudaError_t e = route_op(st, s, &captured); e != cudaSuccess) return e;
  wait_event(st, s, ev);
  return cudaSuccess;
}

void leave_capture(State& st, Stream& s) {
  if (!s.capture) return;
  std::shared_ptr<Capture> c = s.capture;
  c->invalidated = true;
  if (c->members.front() == &s) {
    end(st, *c);  // nobody could end it any more
    return;
  }
  std::replace(c->members.begin(), c->members.end(), &s, static_cast<Stream*>(nullptr));
  clear_membership(s);
}

void abort_all_captures(State& st) {
  const std::vector<std::shared_ptr<Capture>> all = st.captures;
  for (const auto& c : all) end(st, *c);
}

Graph* find_graph(State& st, cudaGraph_t g) {
  auto it = st.graphs.find(g);
  return it == st.graphs.end() ? nullptr : it->second.get();
}

GraphExec* find_exec(State& st, cudaGraphExec_t e) {
  auto it = st.execs.find(e);
  return it == st.execs.end() ? nullptr : it->second.get();
}

namespace {

// Lane streams of an executable graph, indexed by capture lane (0: the launch stream).
struct Lanes {
  Stream* launch;
  const GraphExec& exec;
  const std::vector<size_t>& index;  // capture lane -> exec.lanes index + 1 (0: launch)
  Stream& of(size_t lane) const {
    const size_t i = index[lane];
    return i == 0 ? *launch : *exec.lanes[i - 1];
  }
};

}  // namespace

cudaError_t instantiate(State& st, Graph& g, cudaGraphExec_t* out) {
  auto it = st.graphs.find(&g);
  auto exec = std::make_unique<GraphExec>();
  exec->graph = it->second;
  exec->lane_index.assign(g.lanes, 0);
  for (const Node& n : g.nodes) {
    if (n.lane != 0 && exec->lane_index[n.lane] == 0) {
      exec->lanes.push_back(create_stream(st, cudaStreamNonBlocking, 0));
      exec->lane_index[n.lane] = exec->lanes.size();
    }
  }
  exec->signals.assign(g.nodes.size(), false);
  for (const Node& n : g.nodes) {
    for (size_t d : n.deps) {
      if (g.nodes[d].lane != n.lane) exec->signals[d] = true;
    }
  }
  exec->node_done.resize(g.nodes.size());
  exec->lane_done.resize(exec->lanes.size());
  *out = reinterpret_cast<cudaGraphExec_t>(exec.get());
  st.execs.emplace(exec.get(), std::move(exec));
  return cudaSuccess;
}

cudaError_t launch_graph(State& st, GraphExec& exec, Stream& s) {
  bool captured = false;
  if (cudaError_t e = route_op(st, s, &captured); e != cudaSuccess) return e;
  if (captured) return cudaErrorNotSupported;  // child graphs are not modelled
  const Graph& g = *exec.graph;

  // Note [Graph replay]: rebuild every op first; nothing is enqueued unless all hold.
  // The graph's allocations are in the table meanwhile, as they will be when it runs.
  for (const BlockRef& b : g.allocations) {
    if (st.memory.overlaps(reinterpret_cast<void*>(b->base), b->size)) {
      return cudaErrorInvalidValue;  // Note [Graph memory]: still live from a launch
    }
  }
  for (const BlockRef& b : g.allocations) st.memory.insert(b);
  std::vector<OpSpec> specs(g.nodes.size());
  std::vector<bool> skip(g.nodes.size(), false);
  cudaError_t err = cudaSuccess;
  for (size_t i = 0; i < g.nodes.size() && err == cudaSuccess; ++i) {
    const Node& n = g.nodes[i];
    OpSpec& spec = specs[i];
    bool empty = false, host_waits = false;
    switch (n.kind) {
      case NodeKind::kMemcpy:
        err = copy_spec(st, n.dst, n.src, n.count, n.copy_kind, n.api, &spec, &host_waits,
                        &empty);
        break;
      case NodeKind::kMemset:
        err = memset_spec(st, n.dst, n.value, n.count, n.api, &spec, &empty);
        break;
      case NodeKind::kHost:
        spec.api = n.api;
        spec.run = [fn = n.fn, user = n.user] { fn(user); };
        break;
      case NodeKind::kCompute: spec = compute_spec(st, n.compute); break;
      case NodeKind::kAlloc:
        spec.api = n.api;
        spec.accesses.push_back({reinterpret_cast<void*>(n.block->base), n.block->size, true});
        break;
      case NodeKind::kFree:
        if (st.memory.at_base(reinterpret_cast<void*>(n.block->base)) != n.block) {
          err = cudaErrorInvalidValue;  // freed already
          break;
        }
        spec.api = n.api;
        spec.accesses.push_back({reinterpret_cast<void*>(n.block->base), n.block->size, true});
        spec.finish = [b = n.block](State& s2) { s2.memory.release_device(b); };
        spec.keep.push_back(n.block);
        break;
    }
    skip[i] = empty;
  }
  for (const BlockRef& b : g.allocations) st.memory.erase(b);
  if (err == cudaSuccess) err = st.memory.adopt_pool(g.allocations);
  if (err != cudaSuccess) return err;

  const Lanes lanes{&s, exec, exec.lane_index};
  if (!exec.lanes.empty()) {
    record_event(st, exec.start, s);
    for (Stream* l : exec.lanes) wait_event(st, *l, exec.start);
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    Stream& ls = lanes.of(n.lane);
    for (size_t d : n.deps) {
      if (g.nodes[d].lane != n.lane) wait_event(st, ls, exec.node_done[d]);
    }
    if (n.kind == NodeKind::kAlloc) {
      st.checker.forget(reinterpret_cast<void*>(n.block->base), n.block->size);
    } else if (n.kind == NodeKind::kFree) {
      st.memory.erase(n.block);
    }
    if (!skip[i]) enqueue(st, ls, std::move(specs[i]));
    if (exec.signals[i]) record_event(st, exec.node_done[i], ls);
  }
  for (size_t k = 0; k < exec.lanes.size(); ++k) {
    record_event(st, exec.lane_done[k], *exec.lanes[k]);
    wait_event(st, s, exec.lane_done[k]);
  }
  return cudaSuccess;
}

void destroy_exec(State& st, cudaGraphExec_t e) {
  auto it = st.execs.find(e);
  if (it == st.execs.end()) return;
  for (Stream* l : it->second->lanes) destroy_stream(st, l);
  st.execs.erase(it);
}

}  // namespace stash::dbl
