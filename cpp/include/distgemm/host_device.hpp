// DISTGEMM_HD: marks the functions that the host rules and the kernels share (__host__ __device__
// under nvcc, nothing for the host compiler).
#pragma once

#if defined(__CUDACC__)
#define DISTGEMM_HD __host__ __device__
#else
#define DISTGEMM_HD
#endif
