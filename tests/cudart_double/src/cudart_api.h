// cudart_api.h: include the runtime API (and stashdbl.h) through this header only.
//
// The library compiles with hidden visibility; declaring the runtime's functions under
// visibility(default) makes their definitions here exported, and the version script
// (libcudart.map) then decides what is public: cuda*, __cuda* and stashdbl_* under the
// node libcudart.so.13, everything else local.
#pragma once

#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#include "stashdbl.h"

// nvcc's registration and launch entry points, as crt/host_runtime.h and
// crt/device_functions.h declare them (those headers are internal to nvcc's output).
extern "C" {
void** __cudaRegisterFatBinary(void* fatCubin);
void __cudaRegisterFatBinaryEnd(void** fatCubinHandle);
void __cudaUnregisterFatBinary(void** fatCubinHandle);
void __cudaRegisterVar(void** fatCubinHandle, char* hostVar, char* deviceAddress,
                       const char* deviceName, int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void** fatCubinHandle, void** hostVarPtrAddress,
                              char* deviceAddress, const char* deviceName, int ext, size_t size,
                              int constant, int global);
char __cudaInitModule(void** fatCubinHandle);
void __cudaRegisterFunction(void** fatCubinHandle, const char* hostFun, char* deviceFun,
                            const char* deviceName, int thread_limit, uint3* tid, uint3* bid,
                            dim3* bDim, dim3* gDim, int* wSize);
unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
                                     struct CUstream_st* stream);
cudaError_t __cudaPopCallConfiguration(dim3* gridDim, dim3* blockDim, size_t* sharedMem,
                                       void* stream);
cudaError_t __cudaGetKernel(cudaKernel_t* kernel, const void* func);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void** args,
                               size_t sharedMem, cudaStream_t stream);
cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
                                    void** args, size_t sharedMem, cudaStream_t stream);
}
#pragma GCC visibility pop
