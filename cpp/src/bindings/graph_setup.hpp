// GraphSetup: what one rank's GraphLauncher of a plan needs besides the Plan and the user pointers
// (rank, device, dtype, epilogue, workspace bases, wait bound, GEMM tile), built once per op
// entry. Plain data, so that distgemm._core binds it in host-only builds too.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::python {

struct GraphSetup {
  int rank = 0;         // this device's index in the plan
  int cuda_device = 0;  // its CUDA ordinal in this process
  std::string dtype = "bf16";
  float alpha = 1.0f;
  float beta = 0.0f;                      // beta * C is added when beta != 0
  bool bias = false;                      // the calls pass a bias
  std::vector<uint64_t> workspace_bases;  // every rank's base, as seen from this device
  int64_t workspace_bytes = 0;            // bytes addressable from each base; 0: not checked
  double timeout_s = 5.0;                 // bound of every in-kernel wait
  int tile_n = 0;  // GEMM output tile 128 x tile_n: 0 = per GEMM (kernel::choose_config), 128, 256
  bool b_n_major = false;   // B stored [k, n] (a transposed weight view): device::GraphOptions
  bool fast_accum = false;  // fp8 only: device::GraphOptions::fast_accum

  GraphSetup(int rank_, int cuda_device_, std::string dtype_, std::vector<uint64_t> bases,
             int64_t workspace_bytes_, double timeout_s_, float alpha_, float beta_, bool bias_,
             int tile_n_ = 0, bool b_n_major_ = false, bool fast_accum_ = false)
      : rank(rank_),
        cuda_device(cuda_device_),
        dtype(std::move(dtype_)),
        alpha(alpha_),
        beta(beta_),
        bias(bias_),
        workspace_bases(std::move(bases)),
        workspace_bytes(workspace_bytes_),
        timeout_s(timeout_s_),
        tile_n(tile_n_),
        b_n_major(b_n_major_),
        fast_accum(fast_accum_) {
    if (workspace_bytes < 0)
      throw std::invalid_argument("workspace_bytes=" + std::to_string(workspace_bytes) +
                                  " is negative (0: not checked)");
    const std::string tile_problem = kernel::tile_n_problem(tile_n);
    if (!tile_problem.empty()) throw std::invalid_argument(tile_problem);
  }
};

}  // namespace distgemm::python
