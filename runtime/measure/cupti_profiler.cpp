#include "runtime/measure/cupti_profiler.h"

#include <cstdlib>
#include <cstring>

#include <cupti.h>
#include <nvtx3/nvToolsExt.h>
// After nvToolsExt.h: it uses NVTX's types without including them.
#include <generated_nvtx_meta.h>

#include "cuda_prim.h"
#include "runtime/measure/cupti_api.h"

namespace stash::measure {

namespace {

// Kind of the external correlation ids stash pushes. CUSTOM2: the least likely to be
// used by a framework in the same process (PyTorch's profiler uses CUSTOM0/CUSTOM1).
constexpr CUpti_ExternalCorrelationKind kExternalKind = CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM2;
constexpr size_t kBufferBytes = size_t{8} << 20;
constexpr size_t kBufferAlign = 8;

constexpr CUpti_ActivityKind kKinds[] = {
    CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
    CUPTI_ACTIVITY_KIND_RUNTIME,           CUPTI_ACTIVITY_KIND_DRIVER,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION};

const cupti_api* api_of(const void* p) { return static_cast<const cupti_api*>(p); }

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t* buffer, size_t,
                               size_t valid) {
  cupti_profiler::process().on_buffer(ctx, stream_id, buffer, valid);
  std::free(buffer);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                          const void* data) {
  if (domain == CUPTI_CB_DOMAIN_NVTX) cupti_profiler::process().on_nvtx(cbid, data);
}

copy_direction direction_of(uint8_t copy_kind) {
  switch (copy_kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return copy_direction::h2d;
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return copy_direction::d2h;
    default: return copy_direction::other;
  }
}

}  // namespace

cupti_profiler& cupti_profiler::process() {
  static cupti_profiler* p = new cupti_profiler;  // never destroyed: callbacks may outlive statics
  return *p;
}

bool cupti_profiler::active() const noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

std::uint64_t cupti_profiler::now() const {
  uint64_t t = 0;
  if (api_of(api_)->get_timestamp(&t) != CUPTI_SUCCESS) return 0;
  return t;
}

std::string cupti_profiler::start(const profiler_options& options) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (active_) return "a stash profiler is already running in this process";
  }
  if (options.ask_runtime) {
    // Without a driver CUPTI may fail late (at the first context) or say only 999; the
    // runtime names the problem up front (Note [Profiling unavailable]).
    std::string problem = prim::device_problem();
    if (!problem.empty()) return problem;
  }
  std::string why;
  const cupti_api* api = cupti(&why);
  if (!api) return why;
  api_ = api;
  options_ = options;
  tracker_ = std::make_unique<scope_tracker>();
  log_ = activity_log{};

  // Each step may fail; the reason for the first failure is what the user sees.
  auto failed = [&](CUptiResult r, const char* what) {
    std::string reason;
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
      reason = "another CUPTI client is attached to this process (Nsight Systems, Nsight "
               "Compute or another profiler): " + cupti_result_text(r);
    } else if (options.ask_runtime) {
      reason = prim::device_problem();
    }
    if (reason.empty()) reason = std::string(what) + ": " + cupti_result_text(r);
    teardown();
    return reason;
  };

  CUptiResult r = api->set_thread_id_type(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM);
  if (r != CUPTI_SUCCESS) return failed(r, "cuptiSetThreadIdType");
  CUpti_SubscriberHandle sub = nullptr;
  r = api->subscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(&on_callback), nullptr);
  if (r != CUPTI_SUCCESS) return failed(r, "cuptiSubscribe");
  subscriber_ = sub;
  if (options.follow_nvtx) {
    r = api->enable_domain(1, sub, CUPTI_CB_DOMAIN_NVTX);
    if (r != CUPTI_SUCCESS) return failed(r, "cuptiEnableDomain(NVTX)");
  }
  r = api->register_callbacks(&buffer_requested, &buffer_completed);
  if (r != CUPTI_SUCCESS) return failed(r, "cuptiActivityRegisterCallbacks");
  for (CUpti_ActivityKind k : kKinds) {
    r = api->activity_enable(k);
    if (r != CUPTI_SUCCESS) return failed(r, "cuptiActivityEnable");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  active_ = true;
  return "";
}

void cupti_profiler::teardown() {
  const cupti_api* api = api_of(api_);
  if (!api) return;
  for (CUpti_ActivityKind k : kKinds) (void)api->activity_disable(k);
  if (subscriber_) (void)api->unsubscribe(static_cast<CUpti_SubscriberHandle>(subscriber_));
  subscriber_ = nullptr;
}

activity_log cupti_profiler::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!active_) return {};
    active_ = false;
  }
  const cupti_api* api = api_of(api_);
  // Forced: also hands over buffers that are not full, and records still in flight.
  (void)api->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  teardown();
  (void)api->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mutex_);
  activity_log out = std::move(log_);
  log_ = activity_log{};
  out.scopes = tracker_->scopes();
  return out;
}

void cupti_profiler::apply(const scope_tracker::change& c) {
  if (!c.changed()) return;
  const cupti_api* api = api_of(api_);
  uint64_t last = 0;
  if (c.before != 0) (void)api->pop_external(kExternalKind, &last);
  if (c.after != 0) (void)api->push_external(kExternalKind, c.after);
}

void cupti_profiler::scope_push(std::string_view name) {
  if (!active()) return;
  apply(tracker_->push(system_thread_id(), 0, name, now()));
}

void cupti_profiler::scope_pop() {
  if (!active()) return;
  apply(tracker_->pop(system_thread_id(), 0, now()));
}

void cupti_profiler::on_nvtx(std::uint32_t cbid, const void* data) {
  if (!active()) return;
  const auto* d = static_cast<const CUpti_NvtxData*>(data);
  auto message = [&](const nvtxEventAttributes_t* a) -> std::string {
    if (!a) return {};
    if (a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii) return a->message.ascii;
    if (a->messageType == NVTX_MESSAGE_TYPE_REGISTERED) {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = registered_.find(reinterpret_cast<std::uintptr_t>(a->message.registered));
      if (it != registered_.end()) return it->second;
    }
    return {};  // unicode and unknown messages are never stash scopes
  };
  const std::uint64_t thread = system_thread_id();
  switch (cbid) {
    case CUPTI_CBID_NVTX_nvtxRangePushA: {
      const auto* p = static_cast<const nvtxRangePushA_params*>(d->functionParams);
      apply(tracker_->push(thread, 0, p->message ? p->message : "", now()));
      break;
    }
    case CUPTI_CBID_NVTX_nvtxRangePushW:
      apply(tracker_->push(thread, 0, "", now()));
      break;
    case CUPTI_CBID_NVTX_nvtxRangePushEx: {
      const auto* p = static_cast<const nvtxRangePushEx_params*>(d->functionParams);
      apply(tracker_->push(thread, 0, message(p->eventAttrib), now()));
      break;
    }
    case CUPTI_CBID_NVTX_nvtxRangePop:
      apply(tracker_->pop(thread, 0, now()));
      break;
    case CUPTI_CBID_NVTX_nvtxDomainRangePushEx: {
      const auto* p = static_cast<const nvtxDomainRangePushEx_params*>(d->functionParams);
      apply(tracker_->push(thread, reinterpret_cast<std::uintptr_t>(p->domain),
                           message(p->core.eventAttrib), now()));
      break;
    }
    case CUPTI_CBID_NVTX_nvtxDomainRangePop: {
      const auto* p = static_cast<const nvtxDomainRangePop_params*>(d->functionParams);
      apply(tracker_->pop(thread, reinterpret_cast<std::uintptr_t>(p->domain), now()));
      break;
    }
    case CUPTI_CBID_NVTX_nvtxDomainRegisterStringA: {
      const auto* p = static_cast<const nvtxDomainRegisterStringA_params*>(d->functionParams);
      const auto* h = static_cast<const nvtxStringHandle_t*>(d->functionReturnValue);
      if (h && *h && p->string) {
        std::lock_guard<std::mutex> lock(mutex_);
        registered_[reinterpret_cast<std::uintptr_t>(*h)] = p->string;
      }
      break;
    }
    default:
      break;
  }
}

// Note [Record fields read]
// Only fields every CUDA 13.x version of a record has, at offsets those versions share
// (CUPTI appends new fields at the end of a record): kernels: start, end, streamId,
// correlationId; copies: copyKind, bytes, start, end, streamId, correlationId; API calls:
// start, end, threadId, correlationId; external correlation: externalKind, externalId,
// correlationId.
void cupti_profiler::on_buffer(void* ctx, std::uint32_t stream_id, std::uint8_t* buffer,
                               size_t valid) {
  const cupti_api* api = api_of(api_);
  if (!api) return;
  activity_log part;
  CUpti_Activity* rec = nullptr;
  while (valid > 0 && api->get_next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        part.kernels.push_back({k->start, k->end, k->correlationId, k->streamId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
        part.copies.push_back({m->start, m->end, m->bytes, m->correlationId, m->streamId,
                               direction_of(m->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        part.api_calls.push_back({a->start, a->end, a->correlationId, a->threadId});
        break;
      }
      case CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION: {
        const auto* e = reinterpret_cast<const CUpti_ActivityExternalCorrelation*>(rec);
        if (e->externalKind == kExternalKind) part.external.push_back({e->externalId, e->correlationId});
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (api->get_num_dropped(static_cast<CUcontext>(ctx), stream_id, &dropped) != CUPTI_SUCCESS) {
    dropped = 0;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto append = [](auto& to, auto& from) { to.insert(to.end(), from.begin(), from.end()); };
  append(log_.kernels, part.kernels);
  append(log_.copies, part.copies);
  append(log_.api_calls, part.api_calls);
  append(log_.external, part.external);
  log_.dropped_records += dropped;
}

}  // namespace stash::measure
