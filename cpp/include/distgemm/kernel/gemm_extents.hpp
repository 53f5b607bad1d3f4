// The rule on a GEMM's extents that distgemm's kernel imposes without looking at pointers: TMA
// moves the rows of A and B (K contiguous) and of D (N contiguous) in 16-byte units, and CUTLASS
// takes the problem shape as int32. Host-only (no CUDA), so that the runtime's
// gemm_can_implement and the Python ops (through distgemm._core.gemm_extent_problem, before
// anything reaches a GPU) apply this one definition.
#pragma once

#include <cstdint>
#include <string>

namespace distgemm::kernel {

// "" when a sub-GEMM of m x n x k (batch l, elements of `elem_bytes`) is within the rule;
// otherwise the reason with the values and the fix.
inline std::string gemm_extent_problem(int64_t m, int64_t n, int64_t k, int64_t l, int elem_bytes) {
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (m < 1 || n < 1 || k < 1 || l < 1)
    return "GEMM extents must be positive, got m=" + s(m) + " n=" + s(n) + " k=" + s(k) +
           " l=" + s(l);
  const int64_t lim = (int64_t(1) << 31) - 1;
  if (m > lim || n > lim || k > lim || l > lim)
    return "GEMM extents must fit in int32 (CUTLASS problem shape), got m=" + s(m) + " n=" + s(n) +
           " k=" + s(k) + " l=" + s(l);
  const int64_t per16 = 16 / elem_bytes;
  if (k % per16 != 0)
    return "K=" + s(k) + " of a sub-GEMM is not a multiple of " + s(per16) +
           " elements: TMA needs 16-byte rows of A and B; pad K";
  if (n % per16 != 0)
    return "N=" + s(n) + " of a sub-GEMM is not a multiple of " + s(per16) +
           " elements: TMA needs 16-byte rows of D; pad N so that each of its tiles (N/TP per "
           "rank where N is split) is a multiple of " +
           s(per16);
  return "";
}

}  // namespace distgemm::kernel
