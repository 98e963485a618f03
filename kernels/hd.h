// hd.h: STASH_HD marks an element function shared by host and device code: compiled for
// both by nvcc, a plain inline function everywhere else (CPU tests, sanitizer builds).
#pragma once

#if defined(__CUDACC__)
#define STASH_HD __host__ __device__ __forceinline__
#else
#define STASH_HD inline
#endif
