// DS_HOST_DEVICE marks functions of plain headers that CUDA kernels and host code (also builds
// without CUDA) both call.
#pragma once

#ifdef __CUDACC__
#define DS_HOST_DEVICE __host__ __device__
#else
#define DS_HOST_DEVICE
#endif
