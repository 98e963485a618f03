// errors.cpp: names and descriptions of every cudaError_t value of CUDA 13.0
// (generated from driver_types.h; descriptions follow the real runtime's for the errors
// stash can meet, and spell out the enum name for the rest).
#include <cstddef>

#include "state.h"

namespace stash::dbl {
namespace {

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};

constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorProfilerDisabled, "cudaErrorProfilerDisabled", "profiler disabled while using external profiling tool"},
    {cudaErrorProfilerNotInitialized, "cudaErrorProfilerNotInitialized", "profiler not initialized"},
    {cudaErrorProfilerAlreadyStarted, "cudaErrorProfilerAlreadyStarted", "profiler already started"},
    {cudaErrorProfilerAlreadyStopped, "cudaErrorProfilerAlreadyStopped", "profiler already stopped"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidPitchValue, "cudaErrorInvalidPitchValue", "invalid pitch value"},
    {cudaErrorInvalidSymbol, "cudaErrorInvalidSymbol", "invalid symbol"},
    {cudaErrorInvalidHostPointer, "cudaErrorInvalidHostPointer", "invalid host pointer"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidTexture, "cudaErrorInvalidTexture", "invalid texture"},
    {cudaErrorInvalidTextureBinding, "cudaErrorInvalidTextureBinding", "invalid texture binding"},
    {cudaErrorInvalidChannelDescriptor, "cudaErrorInvalidChannelDescriptor", "invalid channel descriptor"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorAddressOfConstant, "cudaErrorAddressOfConstant", "address of constant"},
    {cudaErrorTextureFetchFailed, "cudaErrorTextureFetchFailed", "texture fetch failed"},
    {cudaErrorTextureNotBound, "cudaErrorTextureNotBound", "texture not bound"},
    {cudaErrorSynchronizationError, "cudaErrorSynchronizationError", "incorrect use of __syncthreads()"},
    {cudaErrorInvalidFilterSetting, "cudaErrorInvalidFilterSetting", "invalid filter setting"},
    {cudaErrorInvalidNormSetting, "cudaErrorInvalidNormSetting", "invalid norm setting"},
    {cudaErrorMixedDeviceExecution, "cudaErrorMixedDeviceExecution", "mixed device execution"},
    {cudaErrorNotYetImplemented, "cudaErrorNotYetImplemented", "function not yet implemented"},
    {cudaErrorMemoryValueTooLarge, "cudaErrorMemoryValueTooLarge", "value too large"},
    {cudaErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorCallRequiresNewerDriver, "cudaErrorCallRequiresNewerDriver", "API call is not supported in the installed CUDA driver"},
    {cudaErrorInvalidSurface, "cudaErrorInvalidSurface", "invalid surface"},
    {cudaErrorDuplicateVariableName, "cudaErrorDuplicateVariableName", "duplicate variable name"},
    {cudaErrorDuplicateTextureName, "cudaErrorDuplicateTextureName", "duplicate texture name"},
    {cudaErrorDuplicateSurfaceName, "cudaErrorDuplicateSurfaceName", "duplicate surface name"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorIncompatibleDriverContext, "cudaErrorIncompatibleDriverContext", "incompatible driver context"},
    {cudaErrorMissingConfiguration, "cudaErrorMissingConfiguration", "__global__ function call is not configured"},
    {cudaErrorPriorLaunchFailure, "cudaErrorPriorLaunchFailure", "unspecified launch failure in prior launch"},
    {cudaErrorLaunchMaxDepthExceeded, "cudaErrorLaunchMaxDepthExceeded", "launch max depth exceeded"},
    {cudaErrorLaunchFileScopedTex, "cudaErrorLaunchFileScopedTex", "launch file scoped tex"},
    {cudaErrorLaunchFileScopedSurf, "cudaErrorLaunchFileScopedSurf", "launch file scoped surf"},
    {cudaErrorSyncDepthExceeded, "cudaErrorSyncDepthExceeded", "sync depth exceeded"},
    {cudaErrorLaunchPendingCountExceeded, "cudaErrorLaunchPendingCountExceeded", "launch pending count exceeded"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceNotLicensed, "cudaErrorDeviceNotLicensed", "device not licensed"},
    {cudaErrorSoftwareValidityNotEstablished, "cudaErrorSoftwareValidityNotEstablished", "software validity not established"},
    {cudaErrorStartupFailure, "cudaErrorStartupFailure", "startup failure"},
    {cudaErrorInvalidKernelImage, "cudaErrorInvalidKernelImage", "device kernel image is invalid"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "device uninitialized"},
    {cudaErrorMapBufferObjectFailed, "cudaErrorMapBufferObjectFailed", "map buffer object failed"},
    {cudaErrorUnmapBufferObjectFailed, "cudaErrorUnmapBufferObjectFailed", "unmap buffer object failed"},
    {cudaErrorArrayIsMapped, "cudaErrorArrayIsMapped", "array is mapped"},
    {cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "already mapped"},
    {cudaErrorNoKernelImageForDevice, "cudaErrorNoKernelImageForDevice", "no kernel image is available for execution on the device"},
    {cudaErrorAlreadyAcquired, "cudaErrorAlreadyAcquired", "already acquired"},
    {cudaErrorNotMapped, "cudaErrorNotMapped", "not mapped"},
    {cudaErrorNotMappedAsArray, "cudaErrorNotMappedAsArray", "not mapped as array"},
    {cudaErrorNotMappedAsPointer, "cudaErrorNotMappedAsPointer", "not mapped as pointer"},
    {cudaErrorECCUncorrectable, "cudaErrorECCUncorrectable", "uncorrectable ECC error encountered"},
    {cudaErrorUnsupportedLimit, "cudaErrorUnsupportedLimit", "limit is not supported on this architecture"},
    {cudaErrorDeviceAlreadyInUse, "cudaErrorDeviceAlreadyInUse", "device already in use"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported", "peer access is not supported between these two devices"},
    {cudaErrorInvalidPtx, "cudaErrorInvalidPtx", "invalid ptx"},
    {cudaErrorInvalidGraphicsContext, "cudaErrorInvalidGraphicsContext", "invalid graphics context"},
    {cudaErrorNvlinkUncorrectable, "cudaErrorNvlinkUncorrectable", "nvlink uncorrectable"},
    {cudaErrorJitCompilerNotFound, "cudaErrorJitCompilerNotFound", "jit compiler not found"},
    {cudaErrorUnsupportedPtxVersion, "cudaErrorUnsupportedPtxVersion", "unsupported ptx version"},
    {cudaErrorJitCompilationDisabled, "cudaErrorJitCompilationDisabled", "jit compilation disabled"},
    {cudaErrorUnsupportedExecAffinity, "cudaErrorUnsupportedExecAffinity", "unsupported exec affinity"},
    {cudaErrorUnsupportedDevSideSync, "cudaErrorUnsupportedDevSideSync", "unsupported dev side sync"},
    {cudaErrorContained, "cudaErrorContained", "contained"},
    {cudaErrorInvalidSource, "cudaErrorInvalidSource", "invalid source"},
    {cudaErrorFileNotFound, "cudaErrorFileNotFound", "file not found"},
    {cudaErrorSharedObjectSymbolNotFound, "cudaErrorSharedObjectSymbolNotFound", "shared object symbol not found"},
    {cudaErrorSharedObjectInitFailed, "cudaErrorSharedObjectInitFailed", "shared object init failed"},
    {cudaErrorOperatingSystem, "cudaErrorOperatingSystem", "OS call failed or operation not supported on this OS"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorLossyQuery, "cudaErrorLossyQuery", "lossy query"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout", "the launch timed out and was terminated"},
    {cudaErrorLaunchIncompatibleTexturing, "cudaErrorLaunchIncompatibleTexturing", "launch incompatible texturing"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled", "peer access already enabled"},
    {cudaErrorPeerAccessNotEnabled, "cudaErrorPeerAccessNotEnabled", "peer access not enabled"},
    {cudaErrorSetOnActiveProcess, "cudaErrorSetOnActiveProcess", "set on active process"},
    {cudaErrorContextIsDestroyed, "cudaErrorContextIsDestroyed", "context is destroyed"},
    {cudaErrorAssert, "cudaErrorAssert", "device-side assert triggered"},
    {cudaErrorTooManyPeers, "cudaErrorTooManyPeers", "too many peers"},
    {cudaErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {cudaErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "illegal instruction"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorInvalidAddressSpace, "cudaErrorInvalidAddressSpace", "invalid address space"},
    {cudaErrorInvalidPc, "cudaErrorInvalidPc", "invalid pc"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorCooperativeLaunchTooLarge, "cudaErrorCooperativeLaunchTooLarge", "cooperative launch too large"},
    {cudaErrorTensorMemoryLeak, "cudaErrorTensorMemoryLeak", "tensor memory leak"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorSystemNotReady, "cudaErrorSystemNotReady", "system not ready"},
    {cudaErrorSystemDriverMismatch, "cudaErrorSystemDriverMismatch", "system driver mismatch"},
    {cudaErrorCompatNotSupportedOnDevice, "cudaErrorCompatNotSupportedOnDevice", "compat not supported on device"},
    {cudaErrorMpsConnectionFailed, "cudaErrorMpsConnectionFailed", "mps connection failed"},
    {cudaErrorMpsRpcFailure, "cudaErrorMpsRpcFailure", "mps rpc failure"},
    {cudaErrorMpsServerNotReady, "cudaErrorMpsServerNotReady", "mps server not ready"},
    {cudaErrorMpsMaxClientsReached, "cudaErrorMpsMaxClientsReached", "mps max clients reached"},
    {cudaErrorMpsMaxConnectionsReached, "cudaErrorMpsMaxConnectionsReached", "mps max connections reached"},
    {cudaErrorMpsClientTerminated, "cudaErrorMpsClientTerminated", "mps client terminated"},
    {cudaErrorCdpNotSupported, "cudaErrorCdpNotSupported", "cdp not supported"},
    {cudaErrorCdpVersionMismatch, "cudaErrorCdpVersionMismatch", "cdp version mismatch"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported", "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated", "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureMerge, "cudaErrorStreamCaptureMerge", "stream capture merge"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "stream capture unmatched"},
    {cudaErrorStreamCaptureUnjoined, "cudaErrorStreamCaptureUnjoined", "stream capture unjoined"},
    {cudaErrorStreamCaptureIsolation, "cudaErrorStreamCaptureIsolation", "stream capture isolation"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit", "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent", "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread", "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorTimeout, "cudaErrorTimeout", "wait operation timed out"},
    {cudaErrorGraphExecUpdateFailure, "cudaErrorGraphExecUpdateFailure", "graph exec update failure"},
    {cudaErrorExternalDevice, "cudaErrorExternalDevice", "external device"},
    {cudaErrorInvalidClusterSize, "cudaErrorInvalidClusterSize", "invalid cluster size"},
    {cudaErrorFunctionNotLoaded, "cudaErrorFunctionNotLoaded", "function not loaded"},
    {cudaErrorInvalidResourceType, "cudaErrorInvalidResourceType", "invalid resource type"},
    {cudaErrorInvalidResourceConfiguration, "cudaErrorInvalidResourceConfiguration", "invalid resource configuration"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const ErrorText* lookup(int e) {
  for (const ErrorText& t : kErrors) {
    if (t.code == e) return &t;
  }
  return nullptr;
}

}  // namespace
}  // namespace stash::dbl

using namespace stash::dbl;

// Neither can fail, so neither counts for fault injection. Unknown codes get the real
// runtime's answer.
STASHDBL_EXPORT const char* cudaGetErrorName(cudaError_t error) {
  const ErrorText* t = lookup(enum_value(error));
  return t ? t->name : "unrecognized error code";
}

STASHDBL_EXPORT const char* cudaGetErrorString(cudaError_t error) {
  const ErrorText* t = lookup(enum_value(error));
  return t ? t->text : "unrecognized error code";
}

STASHDBL_EXPORT cudaError_t cudaGetLastError(void) {
  STASHDBL_ENTER("cudaGetLastError");
  return take_last_error();
}

STASHDBL_EXPORT cudaError_t cudaPeekAtLastError(void) {
  STASHDBL_ENTER("cudaPeekAtLastError");
  return peek_last_error();
}
