// The machine's kernel table: which GEMM kernel runs a shape, measured on one GPU model
// (benchmarks/kernel/kernel_vs_cublas.py --table), shipped per GPU model as data
// (python/distgemm/data/kernels/) and handed to the runtime (set_kernel_table) by the Python
// layer. Host-only and pure, so that the lookup is testable without a GPU.
//
// Why a table beside the model: choose_config (tile_choice.hpp) ranks distgemm's own
// configurations by their waves, but has no term for cuBLAS, whose kernels differ per shape in
// ways no wave count predicts. Where a measured row is near the shape, its fastest kernel runs;
// elsewhere the table's default for the dtype (a row of any_shape: the kernel that beat the
// model's pick at the median of the measured shapes), and without one the model, as before.
//
// The lookup: rows of the same dtype, N and K (a layer's weight fixes both; the token count M
// varies per call), for fp8 also the same scale kinds and accumulation (fp8_kind_of), and the
// row whose M is nearest in ratio, if within kTableMaxMRatio; else the any_shape row of that
// dtype and fp8 kind. A GEMM with batches or an N-contiguous B (no row measures one) takes no
// row.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace distgemm::kernel {

// A row's M serves GEMMs of M within this factor of it (either way): the sweep's token counts
// step by 2x, so every M between two rows finds one.
inline constexpr double kTableMaxMRatio = 2.0;

struct KernelTableRow {
  int dtype = 0;  // DType's number (gemm.hpp)
  int64_t m = 0, n = 0, k = 0;
  int fp8_kind = 0;        // fp8 (e4m3) rows: fp8_kind_of the GEMM's scales and accumulation
  int config = 0;          // a configuration number (tile_choice.hpp), or 0 with cublas_algo >= 0
  int cublas_algo = -1;    // >= 0: cuBLASLt's algorithm of that rank (GemmDesc::cublas_algo)
  bool any_shape = false;  // the dtype's default: serves the GEMMs no measured row is near
};

// What else an fp8 GEMM's kernel depends on: row-wise scales of A (bit 0) and of B (bit 1), fast
// accumulation (bit 2). 0 for 16-bit GEMMs.
inline int fp8_kind_of(bool scale_a_rows, bool scale_b_rows, bool fast_accum) {
  return (scale_a_rows ? 1 : 0) | (scale_b_rows ? 2 : 0) | (fast_accum ? 4 : 0);
}

// The row that chooses the kernel of an m x n x k (x l) GEMM, or nullptr.
inline const KernelTableRow* table_row(const std::vector<KernelTableRow>& rows, int dtype,
                                       int64_t m, int64_t n, int64_t k, int64_t l, bool b_n_major,
                                       int fp8_kind = 0) {
  if (l != 1 || b_n_major || m < 1) return nullptr;
  const KernelTableRow* best = nullptr;
  const KernelTableRow* fallback = nullptr;
  double best_dist = 0;
  for (const auto& r : rows) {
    if (r.dtype != dtype || r.fp8_kind != fp8_kind) continue;
    if (r.any_shape) {
      if (!fallback) fallback = &r;
      continue;
    }
    if (r.n != n || r.k != k || r.m < 1) continue;
    const double dist = std::fabs(std::log(double(m) / double(r.m)));
    if (dist > std::log(kTableMaxMRatio) + 1e-12) continue;
    // Ties (M halfway between two rows in ratio) go to the larger row: the same kernel then
    // serves the upper half of each interval on every rank and every call.
    if (!best || dist < best_dist - 1e-12 ||
        (std::fabs(dist - best_dist) <= 1e-12 && r.m > best->m)) {
      best = &r;
      best_dist = dist;
    }
  }
  return best ? best : fallback;
}

// The process's kernel table, which resolve_kernel (gemm.hpp) consults; the CUDA runtime
// (kernels.cu) keeps it, one per process (the GPUs of one node are of one model), empty until
// set. set_kernel_table replaces it. `all_plans`: whether plans of several ranks consult it too
// (GemmDesc::kernel_table). Declared here, not in gemm.hpp, so that a change to the table's
// header rebuilds only the files that use it.
void set_kernel_table(std::vector<KernelTableRow> rows, bool all_plans = false);
std::vector<KernelTableRow> kernel_table();
bool kernel_table_all_plans();

}  // namespace distgemm::kernel
