// CUDA error checks for host code: every runtime call goes through DISTGEMM_CUDA_CHECK, which
// throws std::runtime_error naming the call, the error and the source line.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#define DISTGEMM_CUDA_CHECK(expr)                                                             \
  do {                                                                                        \
    cudaError_t distgemm_err_ = (expr);                                                       \
    if (distgemm_err_ != cudaSuccess)                                                         \
      throw std::runtime_error(std::string(#expr) +                                           \
                               " failed: " + cudaGetErrorName(distgemm_err_) + " (" +         \
                               cudaGetErrorString(distgemm_err_) + ") at " + __FILE__ + ":" + \
                               std::to_string(__LINE__));                                     \
  } while (0)
