// nvtx_tool.cpp: a tiny NVTX tool (an "injection library", as Nsight Systems is one) that
// records what stash emits: domain names, range messages with their domain, and names
// given to CUDA streams. Loaded by NVTX itself through NVTX_INJECTION64_PATH; the test
// reads the records back through nvtxtool_* (found with dlopen(RTLD_NOLOAD) + dlsym).
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <nvtx3/nvToolsExt.h>
#include <nvtx3/nvToolsExtCudaRt.h>

#define NVTXTOOL_API extern "C" __attribute__((visibility("default")))

namespace {

struct domain_record {
  std::string name;
};

std::mutex mu;
std::vector<std::string> lists[3];  // 0: domains, 1: "domain|message" ranges, 2: streams

void add(int list, std::string s) {
  std::lock_guard<std::mutex> lock(mu);
  lists[list].push_back(std::move(s));
}

nvtxDomainHandle_t domain_create(const char* name) {
  add(0, name ? name : "");
  return reinterpret_cast<nvtxDomainHandle_t>(new domain_record{name ? name : ""});
}

int range_push(nvtxDomainHandle_t d, const nvtxEventAttributes_t* a) {
  std::string m = d ? reinterpret_cast<domain_record*>(d)->name : std::string("<global>");
  m += "|";
  if (a && a->messageType == NVTX_MESSAGE_TYPE_ASCII && a->message.ascii) m += a->message.ascii;
  add(1, std::move(m));
  return 0;
}

int range_pop(nvtxDomainHandle_t) { return 0; }

void name_stream(cudaStream_t, const char* name) { add(2, name ? name : ""); }

}  // namespace

NVTXTOOL_API int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get_table) {
  const auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_table(NVTX_ETID_CALLBACKS));
  if (!cb) return 0;
  NvtxFunctionTable core = nullptr, cudart = nullptr;
  unsigned core_size = 0, cudart_size = 0;
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE2, &core, &core_size)) return 0;
  if (!cb->GetModuleFunctionTable(NVTX_CB_MODULE_CUDART, &cudart, &cudart_size)) return 0;
  *core[NVTX_CBID_CORE2_DomainCreateA] = reinterpret_cast<NvtxFunctionPointer>(&domain_create);
  *core[NVTX_CBID_CORE2_DomainRangePushEx] = reinterpret_cast<NvtxFunctionPointer>(&range_push);
  *core[NVTX_CBID_CORE2_DomainRangePop] = reinterpret_cast<NvtxFunctionPointer>(&range_pop);
  *cudart[NVTX_CBID_CUDART_NameCudaStreamA] = reinterpret_cast<NvtxFunctionPointer>(&name_stream);
  return 1;
}

NVTXTOOL_API std::size_t nvtxtool_count(int list) {
  std::lock_guard<std::mutex> lock(mu);
  return list >= 0 && list < 3 ? lists[list].size() : 0;
}

// Copies entry i of `list` into buf (NUL-terminated, truncated); returns its full length.
NVTXTOOL_API std::size_t nvtxtool_get(int list, std::size_t i, char* buf, std::size_t len) {
  std::lock_guard<std::mutex> lock(mu);
  if (list < 0 || list >= 3 || i >= lists[list].size()) return 0;
  const std::string& s = lists[list][i];
  if (buf && len) {
    const std::size_t n = s.size() < len - 1 ? s.size() : len - 1;
    s.copy(buf, n);
    buf[n] = '\0';
  }
  return s.size();
}
