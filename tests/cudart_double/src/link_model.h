// link_model.h: the virtual clock's model of the host<->device link.
//
// Note [Virtual clock]
// Every op gets a virtual start and end when it is enqueued, never when a worker thread
// happens to run it, so virtual times are a pure function of the program's call order and
// tests that compare them are exact on any machine. Rules (stashdbl.h states the contract):
//  - start = max(end of the previous op on the stream, completion of every event the
//    stream waited on, the implicit legacy-stream dependencies, the host's virtual time);
//  - H2D and D2H each have one copy engine: copies of one direction serialize across
//    streams, in enqueue order (an engine is FIFO, so a later-enqueued copy never slips in
//    front of an earlier one even when it would fit in a gap);
//  - while copies of both directions overlap, each runs at min(its bandwidth, bidir / 2).
//    A copy is slowed for the time it overlaps opposite-direction copies that were
//    enqueued before it; copies already scheduled keep their times (they were promised to
//    earlier event records), which makes the model slightly optimistic for the first copy.
//  - emulated compute takes its declared time; event records, waits, memsets, host
//    functions, D2D and H2H copies take no virtual time.
#pragma once

#include <cstddef>
#include <deque>

namespace stash::dbl {

enum class CopyDir { kH2D = 0, kD2H = 1 };

struct LinkConfig {
  double h2d_gbps = 50.0;
  double d2h_gbps = 50.0;
  double bidir_gbps = 100.0;  // both directions at once: bidir / 2 each
};

struct Interval {
  double start;
  double end;
};

class LinkModel {
 public:
  // Schedules a copy of `bytes` in direction `dir` that may start no earlier than
  // `earliest`; books the engine and returns the virtual [start, end) in ms.
  Interval schedule(CopyDir dir, double earliest, size_t bytes, const LinkConfig& cfg);

  void reset();

 private:
  static constexpr size_t kKeepIntervals = 256;  // older bookings can no longer overlap
  double free_at_[2] = {0.0, 0.0};
  std::deque<Interval> busy_[2];
};

}  // namespace stash::dbl
