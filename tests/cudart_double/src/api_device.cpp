// api_device.cpp: the one device the double offers, its properties and attributes,
// device-wide synchronize and reset, versions.
//
// The device looks like a Hopper-class part ("stash test double", compute capability
// 9.0, 132 SMs) with the configured memory size, two copy engines (asyncEngineCount 2:
// one per direction, as the virtual clock models), unified addressing, memory pools, and
// host NUMA node 0. Host-located memory pools (cudaMemPoolCreate on a host NUMA node) are
// not modelled and reported unsupported.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "capture.h"
#include "streams.h"

namespace stash::dbl {
namespace {

constexpr int kVersion = 13000;

cudaDeviceProp properties() {
  cudaDeviceProp p{};
  std::strncpy(p.name, "stash test double", sizeof p.name - 1);
  const char uuid[16] = {'s', 't', 'a', 's', 'h', '-', 'd', 'o', 'u', 'b', 'l', 'e', 0, 0, 0, 1};
  std::memcpy(p.uuid.bytes, uuid, sizeof uuid);
  {
    State& st = state();
    std::lock_guard<std::mutex> lk(st.mu);
    p.totalGlobalMem = st.memory.total();
  }
  p.sharedMemPerBlock = 48 << 10;
  p.regsPerBlock = 65536;
  p.warpSize = 32;
  p.memPitch = 2147483647;
  p.maxThreadsPerBlock = 1024;
  p.maxThreadsDim[0] = 1024;
  p.maxThreadsDim[1] = 1024;
  p.maxThreadsDim[2] = 64;
  p.maxGridSize[0] = 2147483647;
  p.maxGridSize[1] = 65535;
  p.maxGridSize[2] = 65535;
  p.totalConstMem = 65536;
  p.major = 9;
  p.minor = 0;
  p.textureAlignment = 512;
  p.texturePitchAlignment = 32;
  p.multiProcessorCount = 132;
  p.canMapHostMemory = 1;
  p.surfaceAlignment = 512;
  p.concurrentKernels = 1;
  p.pciBusID = 1;
  p.asyncEngineCount = 2;
  p.unifiedAddressing = 1;
  p.memoryBusWidth = 5120;
  p.l2CacheSize = 50 << 20;
  p.persistingL2CacheMaxSize = 30 << 20;
  p.maxThreadsPerMultiProcessor = 2048;
  p.streamPrioritiesSupported = 1;
  p.globalL1CacheSupported = 1;
  p.localL1CacheSupported = 1;
  p.sharedMemPerMultiprocessor = 228 << 10;
  p.regsPerMultiprocessor = 65536;
  p.managedMemory = 1;
  p.concurrentManagedAccess = 1;
  p.computePreemptionSupported = 1;
  p.cooperativeLaunch = 1;
  p.sharedMemPerBlockOptin = 227 << 10;
  p.maxBlocksPerMultiProcessor = 32;
  p.accessPolicyMaxWindowSize = 128 << 20;
  p.reservedSharedMemPerBlock = 1024;
  p.hostRegisterSupported = 1;
  p.hostRegisterReadOnlySupported = 1;
  p.memoryPoolsSupported = 1;
  p.clusterLaunch = 1;
  p.unifiedFunctionPointers = 1;
  p.deviceNumaConfig = cudaDeviceNumaConfigNone;
  p.deviceNumaId = -1;
  p.hostNumaId = 0;
  return p;
}

cudaError_t attribute(int* value, int attr) {
  const cudaDeviceProp p = properties();
  int v = 0;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: v = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: v = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: v = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrTotalConstantMemory: v = static_cast<int>(p.totalConstMem); break;
    case cudaDevAttrWarpSize: v = p.warpSize; break;
    case cudaDevAttrMaxPitch: v = static_cast<int>(p.memPitch); break;
    case cudaDevAttrMaxRegistersPerBlock: v = p.regsPerBlock; break;
    case cudaDevAttrClockRate: v = 1980000; break;  // kHz
    case cudaDevAttrTextureAlignment: v = static_cast<int>(p.textureAlignment); break;
    case cudaDevAttrGpuOverlap: v = 1; break;
    case cudaDevAttrMultiProcessorCount: v = p.multiProcessorCount; break;
    case cudaDevAttrIntegrated: v = p.integrated; break;
    case cudaDevAttrCanMapHostMemory: v = p.canMapHostMemory; break;
    case cudaDevAttrComputeMode: v = cudaComputeModeDefault; break;
    case cudaDevAttrConcurrentKernels: v = p.concurrentKernels; break;
    case cudaDevAttrEccEnabled: v = p.ECCEnabled; break;
    case cudaDevAttrPciBusId: v = p.pciBusID; break;
    case cudaDevAttrPciDeviceId: v = p.pciDeviceID; break;
    case cudaDevAttrPciDomainId: v = p.pciDomainID; break;
    case cudaDevAttrMemoryClockRate: v = 2619000; break;  // kHz
    case cudaDevAttrGlobalMemoryBusWidth: v = p.memoryBusWidth; break;
    case cudaDevAttrL2CacheSize: v = p.l2CacheSize; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: v = p.maxThreadsPerMultiProcessor; break;
    case cudaDevAttrAsyncEngineCount: v = p.asyncEngineCount; break;
    case cudaDevAttrUnifiedAddressing: v = p.unifiedAddressing; break;
    case cudaDevAttrComputeCapabilityMajor: v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: v = p.minor; break;
    case cudaDevAttrStreamPrioritiesSupported: v = p.streamPrioritiesSupported; break;
    case cudaDevAttrGlobalL1CacheSupported: v = p.globalL1CacheSupported; break;
    case cudaDevAttrLocalL1CacheSupported: v = p.localL1CacheSupported; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor:
      v = static_cast<int>(p.sharedMemPerMultiprocessor);
      break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: v = p.regsPerMultiprocessor; break;
    case cudaDevAttrManagedMemory: v = p.managedMemory; break;
    case cudaDevAttrPageableMemoryAccess: v = p.pageableMemoryAccess; break;
    case cudaDevAttrConcurrentManagedAccess: v = p.concurrentManagedAccess; break;
    case cudaDevAttrComputePreemptionSupported: v = p.computePreemptionSupported; break;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: v = 1; break;
    case cudaDevAttrCooperativeLaunch: v = p.cooperativeLaunch; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: v = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrHostRegisterSupported: v = p.hostRegisterSupported; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: v = p.maxBlocksPerMultiProcessor; break;
    case cudaDevAttrMaxPersistingL2CacheSize: v = p.persistingL2CacheMaxSize; break;
    case cudaDevAttrMaxAccessPolicyWindowSize: v = p.accessPolicyMaxWindowSize; break;
    case cudaDevAttrReservedSharedMemoryPerBlock: v = static_cast<int>(p.reservedSharedMemPerBlock); break;
    case cudaDevAttrHostRegisterReadOnlySupported: v = p.hostRegisterReadOnlySupported; break;
    case cudaDevAttrMemoryPoolsSupported: v = p.memoryPoolsSupported; break;
    case cudaDevAttrMemoryPoolSupportedHandleTypes: v = 0; break;
    case cudaDevAttrClusterLaunch: v = p.clusterLaunch; break;
    case cudaDevAttrMemSyncDomainCount: v = 4; break;
    case cudaDevAttrNumaConfig: v = p.deviceNumaConfig; break;
    case cudaDevAttrNumaId: v = p.deviceNumaId; break;
    case cudaDevAttrMpsEnabled: v = 0; break;
    case cudaDevAttrHostNumaId: v = p.hostNumaId; break;
    case cudaDevAttrHostNumaMemoryPoolsSupported: v = 0; break;
    case cudaDevAttrHostMemoryPoolsSupported: v = 0; break;
    case cudaDevAttrKernelExecTimeout:
    case cudaDevAttrTccDriver:
    case cudaDevAttrIsMultiGpuBoard:
    case cudaDevAttrMultiGpuBoardGroupID:
    case cudaDevAttrHostNativeAtomicSupported:
    case cudaDevAttrPageableMemoryAccessUsesHostPageTables:
    case cudaDevAttrDirectManagedMemAccessFromHost:
    case cudaDevAttrSparseCudaArraySupported:
    case cudaDevAttrTimelineSemaphoreInteropSupported:
    case cudaDevAttrGPUDirectRDMASupported:
    case cudaDevAttrIpcEventSupport:
      v = 0;
      break;
    default: return fail(cudaErrorInvalidValue);
  }
  *value = v;
  return cudaSuccess;
}

thread_local unsigned device_flags = 0;

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

STASHDBL_EXPORT cudaError_t cudaGetDeviceCount(int* count) {
  STASHDBL_ENTER("cudaGetDeviceCount");
  if (count == nullptr) return fail(cudaErrorInvalidValue);
  *count = 1;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaSetDevice(int device) {
  STASHDBL_ENTER("cudaSetDevice");
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

STASHDBL_EXPORT cudaError_t cudaInitDevice(int device, unsigned int, unsigned int) {
  STASHDBL_ENTER("cudaInitDevice");
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice);
}

STASHDBL_EXPORT cudaError_t cudaGetDevice(int* device) {
  STASHDBL_ENTER("cudaGetDevice");
  if (device == nullptr) return fail(cudaErrorInvalidValue);
  *device = 0;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  STASHDBL_ENTER("cudaSetDeviceFlags");
  device_flags = flags;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaGetDeviceFlags(unsigned int* flags) {
  STASHDBL_ENTER("cudaGetDeviceFlags");
  if (flags == nullptr) return fail(cudaErrorInvalidValue);
  *flags = device_flags;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  STASHDBL_ENTER("cudaGetDeviceProperties");
  if (prop == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  *prop = properties();
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  STASHDBL_ENTER("cudaDeviceGetAttribute");
  if (value == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0) return fail(cudaErrorInvalidDevice);
  return attribute(value, enum_value(attr));
}

STASHDBL_EXPORT cudaError_t cudaDeviceCanAccessPeer(int* canAccessPeer, int device, int peerDevice) {
  STASHDBL_ENTER("cudaDeviceCanAccessPeer");
  if (canAccessPeer == nullptr) return fail(cudaErrorInvalidValue);
  if (device != 0 || peerDevice != 0) return fail(cudaErrorInvalidDevice);
  *canAccessPeer = 0;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaDeviceSynchronize(void) {
  STASHDBL_ENTER("cudaDeviceSynchronize");
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  if (cudaError_t e = refuse_device_sync(st); e != cudaSuccess) return fail(e);
  sync_device(st, lk);
  return cudaSuccess;
}

// Ends every capture, waits for all work, then destroys every stream, event, graph,
// executable graph and allocation, as CUDA does;
// their handles become invalid. Configuration (memory size, bandwidths) is kept.
STASHDBL_EXPORT cudaError_t cudaDeviceReset(void) {
  STASHDBL_ENTER("cudaDeviceReset");
  State& st = state();
  std::unique_lock<std::mutex> lk(st.mu);
  abort_all_captures(st);
  sync_device(st, lk);
  std::vector<cudaGraphExec_t> execs;
  for (auto& [h, e] : st.execs) execs.push_back(reinterpret_cast<cudaGraphExec_t>(e.get()));
  for (cudaGraphExec_t e : execs) destroy_exec(st, e);
  st.graphs.clear();
  std::vector<Stream*> live;
  for (auto& [h, s] : st.streams) live.push_back(s.get());
  for (Stream* s : live) destroy_stream(st, s);
  st.events.clear();
  st.memory.clear();
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaDriverGetVersion(int* driverVersion) {
  STASHDBL_ENTER("cudaDriverGetVersion");
  if (driverVersion == nullptr) return fail(cudaErrorInvalidValue);
  *driverVersion = kVersion;
  return cudaSuccess;
}

STASHDBL_EXPORT cudaError_t cudaRuntimeGetVersion(int* runtimeVersion) {
  STASHDBL_ENTER("cudaRuntimeGetVersion");
  if (runtimeVersion == nullptr) return fail(cudaErrorInvalidValue);
  *runtimeVersion = kVersion;
  return cudaSuccess;
}
