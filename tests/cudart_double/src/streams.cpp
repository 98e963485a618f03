#include "streams.h"

#include <algorithm>
#include <utility>

namespace stash::dbl {

namespace {

bool deps_done(const Op& op) {
  return std::all_of(op.deps.begin(), op.deps.end(),
                     [](const CompletionRef& c) { return c->done; });
}

template <class F>
void for_each_stream(State& st, F&& f) {
  if (st.legacy) f(*st.legacy);
  for (auto& [h, s] : st.streams) f(*s);
  for (auto& s : st.graveyard) f(*s);
}

// A completion can unblock host waiters and workers whose next op has dependencies.
void completed(State& st) {
  st.cv.notify_all();
  for_each_stream(st, [](Stream& s) {
    if (!s.queue.empty() && !s.queue.front().deps.empty()) s.wake.notify_one();
  });
}

void worker_main(State* st, Stream* s) {
  std::unique_lock<std::mutex> lk(st->mu);
  for (;;) {
    s->wake.wait(lk, [&] {
      return st->shutting_down || (s->destroyed && s->queue.empty()) ||
             (!s->paused && !s->queue.empty() && deps_done(s->queue.front()));
    });
    if (st->shutting_down || s->queue.empty()) break;
    Op op = std::move(s->queue.front());
    s->queue.pop_front();
    lk.unlock();
    if (op.run) op.run();
    lk.lock();
    if (op.finish) op.finish(*st);
    op.done->done = true;
    completed(*st);
  }
  s->exited = true;
  st->cv.notify_all();
}

void start_worker(State& st, Stream& s) { s.worker = std::thread(worker_main, &st, &s); }

Stream* new_stream(State& st, bool legacy, unsigned flags, int priority) {
  auto s = std::make_unique<Stream>();
  s->legacy = legacy;
  s->id = legacy ? 1 : st.next_stream_id++;
  s->agent = st.next_agent++;
  s->flags = flags;
  s->priority = priority;
  Stream* raw = s.get();
  if (legacy) {
    st.legacy = std::move(s);
  } else {
    st.streams.emplace(raw, std::move(s));
  }
  start_worker(st, *raw);
  return raw;
}

}  // namespace

Stream* find_stream(State& st, cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    if (!st.legacy) new_stream(st, /*legacy=*/true, 0, 0);
    return st.legacy.get();
  }
  auto it = st.streams.find(handle);
  return it == st.streams.end() ? nullptr : it->second.get();
}

Stream* create_stream(State& st, unsigned flags, int priority) {
  reap_streams(st);
  return new_stream(st, /*legacy=*/false, flags, priority);
}

void destroy_stream(State& st, Stream* s) {
  auto it = st.streams.find(s);
  if (it == st.streams.end()) return;
  s->destroyed = true;
  s->paused = false;
  st.graveyard.push_back(std::move(it->second));
  st.streams.erase(it);
  s->wake.notify_one();
  reap_streams(st);
}

void reap_streams(State& st) {
  auto& g = st.graveyard;
  for (auto it = g.begin(); it != g.end();) {
    if ((*it)->exited) {
      // The worker set `exited` under the lock we hold and touches nothing after it.
      if ((*it)->worker.joinable()) (*it)->worker.join();
      it = g.erase(it);
    } else {
      ++it;
    }
  }
}

void wake_all_workers(State& st) {
  for_each_stream(st, [](Stream& s) { s.wake.notify_one(); });
}

Event* find_event(State& st, cudaEvent_t handle) {
  auto it = st.events.find(handle);
  return it == st.events.end() ? nullptr : it->second.get();
}

Enqueued enqueue(State& st, Stream& s, OpSpec spec) {
  Op op;
  op.deps = std::move(spec.deps);
  double start = std::max(s.last_end, st.host_now);

  // Note [Legacy default stream]: implicit dependencies.
  auto depend_on = [&](Stream& other) {
    if (other.last && !other.last->done) op.deps.push_back(other.last);
    s.clock.join(other.clock);
    start = std::max(start, other.last_end);
  };
  if (s.legacy) {
    // Destroyed streams still draining count too: their work was enqueued before.
    for (auto& [h, other] : st.streams) {
      if (other->blocking()) depend_on(*other);
    }
    for (auto& other : st.graveyard) {
      if (other->blocking()) depend_on(*other);
    }
  } else if (s.blocking() && st.legacy) {
    depend_on(*st.legacy);
  }

  // Note [Happens-before model]: the op is ordered after everything the host did so far.
  s.clock.join(st.host_clock);
  s.clock.tick(s.agent);
  st.host_clock.tick(kHostAgent);

  // Note [Virtual clock].
  double end = start + spec.duration_ms;
  if (spec.is_copy) end = st.link.schedule(spec.dir, start, spec.bytes, st.link_cfg).end;
  s.last_end = end;

  const AccessSite site{spec.api, s.id};
  for (const Access& a : spec.accesses) {
    st.checker.access(a.ptr, a.bytes, a.is_write, s.agent, s.clock, site);
  }
  if (st.checker.wants_prune()) st.checker.prune(st.host_clock);

  op.run = std::move(spec.run);
  op.finish = std::move(spec.finish);
  op.keep = std::move(spec.keep);
  op.done = std::make_shared<Completion>();
  s.last = op.done;
  Enqueued result{op.done, end};
  s.queue.push_back(std::move(op));
  s.wake.notify_one();
  return result;
}

void record_event(State& st, Event& ev, Stream& s) {
  OpSpec spec;
  spec.api = "cudaEventRecord";
  const Enqueued e = enqueue(st, s, std::move(spec));
  ev.recorded = true;
  ev.clock = s.clock;
  ev.end = e.end;
  ev.done = e.done;
}

void wait_event(State& st, Stream& s, const Event& ev) {
  if (!ev.recorded) return;  // CUDA: waiting on a never-recorded event is a no-op
  s.clock.join(ev.clock);
  s.last_end = std::max(s.last_end, ev.end);
  OpSpec spec;
  spec.api = "cudaStreamWaitEvent";
  if (!ev.done->done) spec.deps.push_back(ev.done);
  enqueue(st, s, std::move(spec));
}

void wait_done(State& st, std::unique_lock<std::mutex>& lk, const CompletionRef& c) {
  if (!c) return;
  st.cv.wait(lk, [&] { return c->done || st.shutting_down; });
}

void host_observe(State& st, const VectorClock& clock, double end) {
  st.host_clock.join(clock);
  st.host_now = std::max(st.host_now, end);
}

void sync_stream(State& st, std::unique_lock<std::mutex>& lk, Stream& s) {
  const CompletionRef last = s.last;
  const VectorClock clock = s.clock;
  const double end = s.last_end;
  wait_done(st, lk, last);
  host_observe(st, clock, end);
  st.memory.pool_sync_release();
}

void sync_event(State& st, std::unique_lock<std::mutex>& lk, const Event& ev) {
  if (!ev.recorded) return;
  const CompletionRef done = ev.done;
  const VectorClock clock = ev.clock;
  const double end = ev.end;
  wait_done(st, lk, done);
  host_observe(st, clock, end);
  st.memory.pool_sync_release();
}

void sync_device(State& st, std::unique_lock<std::mutex>& lk) {
  struct Pending {
    CompletionRef last;
    VectorClock clock;
    double end;
  };
  std::vector<Pending> pending;
  auto take = [&](Stream& s) { pending.push_back({s.last, s.clock, s.last_end}); };
  if (st.legacy) take(*st.legacy);
  for (auto& [h, s] : st.streams) take(*s);
  for (auto& s : st.graveyard) take(*s);
  for (const Pending& p : pending) wait_done(st, lk, p.last);
  for (const Pending& p : pending) host_observe(st, p.clock, p.end);
  st.memory.pool_sync_release();
}

bool query_stream(State& st, Stream& s) {
  if (s.last && !s.last->done) return false;
  host_observe(st, s.clock, s.last_end);
  return true;
}

bool query_event(State& st, const Event& ev) {
  if (!ev.recorded) return true;
  if (!ev.done->done) return false;
  host_observe(st, ev.clock, ev.end);
  return true;
}

void host_access(State& st, const void* p, size_t n, bool is_write, const char* api) {
  st.checker.access(p, n, is_write, kHostAgent, st.host_clock, AccessSite{api, 0});
  st.host_clock.tick(kHostAgent);
  if (st.checker.wants_prune()) st.checker.prune(st.host_clock);
}

}  // namespace stash::dbl
