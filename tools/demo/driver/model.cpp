// model.cpp: the model's memory (layout, parameters, data), its construction, read-back
// and peaks. The training step itself is in step.cpp.
#include "tools/demo/driver/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "tools/demo/driver/model_detail.h"
#include "tools/demo/driver/test_double.h"

namespace stash::workload {

namespace {

constexpr std::size_t kPadFloats = 64;  // 256 B: every packed array starts aligned for cuBLAS

std::size_t pad(std::size_t floats) { return (floats + kPadFloats - 1) / kPadFloats * kPadFloats; }

std::size_t round_up(std::size_t bytes, std::size_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// splitmix64: a counter-based generator, so every value depends only on (seed, stream, i)
// and initialisation is identical on every backend and machine.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1), exactly representable (24 random bits).
float uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t i) {
  const std::uint64_t r = mix(mix(seed ^ mix(stream)) + i);
  return static_cast<float>(static_cast<std::int64_t>(r >> 40) - (1 << 23)) / float(1 << 23);
}

void fill(float* dst, std::size_t n, float scale, float offset, std::uint64_t seed,
          std::uint64_t stream) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = offset + scale * uniform(seed, stream, i);
}

}  // namespace

const char* saved_name(int index) {
  static const char* const names[kSavedPerBlock] = {"input", "ln.stats", "ln.out", "fc1.out",
                                                    "act.out"};
  return index >= 0 && index < kSavedPerBlock ? names[index] : "?";
}

const char* to_string(backend_kind k) { return k == backend_kind::cuda ? "cuda" : "host"; }

std::string model_config::problem() const {
  auto positive = [](int v, const char* name) {
    return v > 0 ? std::string()
                 : std::string(name) + " must be positive, got " + std::to_string(v);
  };
  for (const std::string& p :
       {positive(layers, "layers"), positive(hidden, "hidden"), positive(seq, "seq"),
        positive(batch, "batch"), positive(ffn_mult, "ffn_mult"),
        positive(micro_batches, "micro_batches")}) {
    if (!p.empty()) return p;
  }
  // Sizes go to cuBLAS and the kernels as int: keep every matrix dimension and element
  // count of one tensor within int range.
  const long long t = 1LL * batch * seq, f = 1LL * ffn_mult * hidden;
  if (t > (1LL << 30) || f > (1LL << 30) || t * f > (1LL << 31) - 1)
    return "batch * seq * ffn_mult * hidden is too large (a tensor must hold fewer than 2^31 "
           "elements)";
  if (!(lr > 0) || !std::isfinite(lr)) return "lr must be a positive number";
  return "";
}

std::size_t memory_layout::block_saved_bytes() const {
  std::size_t s = 0;
  for (std::size_t b : saved_bytes) s += b;
  return s;
}

memory_layout layout_of(const model_config& c, backend_kind kind, std::size_t alignment) {
  memory_layout m;
  m.alignment = alignment;
  const std::size_t T = c.tokens(), H = c.hidden, F = c.ffn();
  const std::size_t f = sizeof(float);
  const std::size_t per_layer = detail::layer_floats(H, F);
  auto r = [&](std::size_t bytes) { return round_up(bytes, alignment); };
  m.params_bytes = r(per_layer * c.layers * f);
  m.grads_bytes = m.params_bytes;
  m.workspace_bytes = kind == backend_kind::cuda ? r(kCublasWorkspaceBytes) : 0;
  m.loss_bytes = r(c.micro_batches * f);
  m.saved_bytes[kInput] = r(T * H * f);
  m.saved_bytes[kLnStats] = r(T * 2 * f);
  m.saved_bytes[kLnOut] = r(T * H * f);
  m.saved_bytes[kFc1Out] = r(T * F * f);
  m.saved_bytes[kActOut] = r(T * F * f);
  m.dout_bytes = m.du_bytes = m.target_bytes = m.out_bytes = r(T * H * f);
  m.da_bytes = m.dh_bytes = r(T * F * f);
  return m;
}

namespace detail {

std::size_t layer_floats(std::size_t H, std::size_t F) {
  return pad(H * F) + pad(F) + pad(F * H) + pad(H) + pad(H) + pad(H);
}

layer_offsets offsets(std::size_t H, std::size_t F) {
  layer_offsets o;
  o.w1 = 0;
  o.b1 = o.w1 + pad(H * F);
  o.w2 = o.b1 + pad(F);
  o.b2 = o.w2 + pad(F * H);
  o.gamma = o.b2 + pad(H);
  o.beta = o.gamma + pad(H);
  return o;
}

[[noreturn]] void fail_stash(const char* what, stash_status_t st) {
  throw error(static_cast<status>(st), std::string("stash workload: ") + what + ": " +
                                           stash_status_string(st) + ": " + stash_last_error());
}

}  // namespace detail

bool cuda_backend_built() {
#ifdef STASH_WORKLOAD_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

model::model(const model_config& config, backend_kind kind, const runtime_handles& rt,
             std::function<std::unique_ptr<backend>(std::unique_ptr<backend>)> wrap)
    : config_(config), kind_(kind), rt_(rt) {
  if (const std::string p = config.problem(); !p.empty())
    throw std::invalid_argument("stash workload: " + p);
  if (!rt.pool || !rt.engine)
    throw std::invalid_argument("stash workload: a device pool and an engine are required");
  if (kind == backend_kind::cuda && !cuda_backend_built())
    throw std::invalid_argument(
        "stash workload: the CUDA backend is not built (configure with STASH_BUILD_KERNELS=ON)");
  // The host backend dereferences "device" pointers on the host: only stash's CPU test
  // double, whose device memory is host memory, can run it in stream mode.
  if (kind == backend_kind::host && !test_double::loaded())
    throw std::invalid_argument(
        "stash workload: the host backend runs only on stash's CPU test double (device memory "
        "must be host memory); use the CUDA backend on a GPU");
  layout_ = layout_of(config, kind, rt.pool_alignment);
  const std::size_t H = config.hidden, F = config.ffn(), T = config.tokens();
  layer_floats_ = detail::layer_floats(H, F);
  try {
    params_ = static_cast<float*>(alloc(layout_.params_bytes));
    grads_ = static_cast<float*>(alloc(layout_.grads_bytes));
    losses_ = static_cast<float*>(alloc(layout_.loss_bytes));
    if (kind == backend_kind::cuda) {
      workspace_ = alloc(layout_.workspace_bytes);
#ifdef STASH_WORKLOAD_HAVE_CUDA
      backend_ = make_cuda_backend(workspace_, layout_.workspace_bytes);
#endif
    } else {
      backend_ = make_host_backend(host_mode::stream);
    }
    if (wrap) backend_ = wrap(std::move(backend_));

    // Parameters: deterministic, on the host, then one upload.
    std::vector<float> host(layer_floats_ * config.layers, 0.0f);
    const detail::layer_offsets o = detail::offsets(H, F);
    for (int l = 0; l < config.layers; ++l) {
      float* p = host.data() + layer_floats_ * l;
      const std::uint64_t s = 16 * std::uint64_t(l);
      fill(p + o.w1, H * F, 1.0f / std::sqrt(float(H)), 0, config.seed, s + 1);
      fill(p + o.b1, F, 0.01f, 0, config.seed, s + 2);
      fill(p + o.w2, F * H, 1.0f / std::sqrt(float(F)), 0, config.seed, s + 3);
      fill(p + o.b2, H, 0.01f, 0, config.seed, s + 4);
      fill(p + o.gamma, H, 0.1f, 1.0f, config.seed, s + 5);
      fill(p + o.beta, H, 0.1f, 0, config.seed, s + 6);
    }
    STASH_CUDA_TRY(cudaMemcpyAsync(params_, host.data(), host.size() * sizeof(float),
                                   cudaMemcpyHostToDevice, rt.stream));
    backend_->zero(rt.stream, grads_, layout_.grads_bytes);
    backend_->zero(rt.stream, losses_, layout_.loss_bytes);

    // Data: one fixed set of micro-batches, reused every step (a benchmark, not a data
    // loader), in pinned memory so each micro-batch's upload is an async copy.
    const std::size_t n = T * H * config.micro_batches;
    STASH_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&host_data_), 2 * n * sizeof(float)));
    fill(host_data_, n, 1.0f, 0, config.seed, 1u << 30);
    fill(host_data_ + n, n, 0.5f, 0, config.seed, (1u << 30) + 1);
    STASH_CUDA_TRY(prim::stream_synchronize(rt.stream));
  } catch (...) {
    release();  // members are destroyed by the language; the pool's blocks are ours to free
    throw;
  }
  saved_.assign(std::size_t(config.layers) * kSavedPerBlock, nullptr);
}

model::~model() { release(); }

void model::release() noexcept {
  if (rt_.stream) cudaStreamSynchronize(rt_.stream);
  backend_.reset();  // before its workspace goes back to the pool
  // Frees that fail here (a pool already destroyed by a caller's bug) have nobody to report
  // to: a destructor must not throw.
  auto quiet_free = [this](void* p) {
    if (p) (void)stash_device_free(rt_.pool, p, nullptr, 0);
  };
  for (void*& p : saved_) quiet_free(std::exchange(p, nullptr));
  quiet_free(std::exchange(workspace_, nullptr));
  quiet_free(std::exchange(losses_, nullptr));
  quiet_free(std::exchange(grads_, nullptr));
  quiet_free(std::exchange(params_, nullptr));
  if (host_data_) cudaFreeHost(std::exchange(host_data_, nullptr));
}

void* model::alloc(std::size_t bytes) {
  void* p = nullptr;
  const stash_status_t st = stash_device_alloc(rt_.pool, bytes, rt_.stream, &p);
  if (st != STASH_OK) detail::fail_stash("stash_device_alloc", st);
  stash_pool_stats_t s;
  stash_pool_stats_init(&s);
  if (stash_device_stats(rt_.pool, &s) == STASH_OK)
    held_peak_ = std::max<std::uint64_t>(held_peak_, s.current_bytes + s.pending_bytes);
  return p;
}

void model::free(void* p) {
  if (!p) return;
  // Blocks are used on the compute stream only (their allocation stream): stream order
  // makes the free safe at once.
  const stash_status_t st = stash_device_free(rt_.pool, p, nullptr, 0);
  if (st != STASH_OK) detail::fail_stash("stash_device_free", st);
}

void model::upload(float* dst, const float* host, std::size_t bytes) {
  STASH_CUDA_TRY(prim::copy_h2d(dst, host, bytes, rt_.stream));
}

std::vector<float> model::download(const float* src, std::size_t n, const char* what) {
  std::vector<float> out(n);
  cudaError_t err = prim::copy_d2h(out.data(), src, n * sizeof(float), rt_.stream);
  if (err == cudaSuccess) err = prim::stream_synchronize(rt_.stream);
  if (err != cudaSuccess) prim::throw_cuda_error(err, what, __FILE__, __LINE__);
  return out;
}

float model::last_loss() {
  const std::vector<float> l = download(losses_, config_.micro_batches, "loss");
  double sum = 0;
  for (float v : l) sum += v;
  return static_cast<float>(sum / l.size());
}

std::vector<float> model::read_gradients() {
  return download(grads_, layer_floats_ * config_.layers, "gradients");
}

std::vector<float> model::read_params() {
  return download(params_, layer_floats_ * config_.layers, "parameters");
}

std::uint64_t fnv1a64(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::uint64_t model::gradient_checksum() {
  const std::vector<float> g = read_gradients();
  return fnv1a64(g.data(), g.size() * sizeof(float));
}

void model::reset_peaks() {
  const stash_status_t st = stash_device_reset_peak(rt_.pool);
  if (st != STASH_OK) detail::fail_stash("stash_device_reset_peak", st);
  stash_pool_stats_t s;
  stash_pool_stats_init(&s);
  if (stash_device_stats(rt_.pool, &s) == STASH_OK) held_peak_ = s.current_bytes + s.pending_bytes;
}

memory_peaks model::peaks() {
  stash_pool_stats_t s;
  stash_pool_stats_init(&s);
  const stash_status_t st = stash_device_stats(rt_.pool, &s);
  if (st != STASH_OK) detail::fail_stash("stash_device_stats", st);
  memory_peaks m;
  m.in_use_bytes = s.peak_bytes;
  m.held_bytes = std::max<std::uint64_t>(held_peak_, s.peak_bytes);
  return m;
}

}  // namespace stash::workload
