// The kernel table's rows as Python hands them to _core (dicts of distgemm.runtime.kernel_table's
// format), read once for both bindings that take them: set_kernel_table (gemm.cpp) and
// kernel_table_row (tile_choice.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "distgemm/kernel/gemm.hpp"  // parse_dtype
#include "distgemm/kernel/kernel_table.hpp"
#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::bindings {

// A row {'dtype', 'm', 'n', 'k', 'kernel' (a configuration name or 'cublaslt'), 'algo',
// fp8: 'scale_a_rows', 'scale_b_rows', 'fast_accum'}, or a dtype's default {'dtype',
// 'any_shape': True, 'kernel', 'algo', ...} without m, n and k; `kernel` may be absent where
// only the lookup's key is wanted. std::invalid_argument (ValueError) naming the constraint.
inline kernel::KernelTableRow table_row_of(const pybind11::dict& r, bool needs_kernel) {
  namespace k = distgemm::kernel;
  auto flag = [&](const char* name) { return r.contains(name) && r[name].cast<bool>(); };
  k::KernelTableRow row;
  row.dtype = static_cast<int>(k::parse_dtype(r["dtype"].cast<std::string>()));
  row.any_shape = flag("any_shape");
  if (!row.any_shape) {
    row.m = r["m"].cast<int64_t>();
    row.n = r["n"].cast<int64_t>();
    row.k = r["k"].cast<int64_t>();
  }
  if (!row.any_shape && (row.m < 1 || row.n < 1 || row.k < 1))
    throw std::invalid_argument(
        "kernel table: m, n and k must be >= 1, got m=" + std::to_string(row.m) +
        " n=" + std::to_string(row.n) + " k=" + std::to_string(row.k));
  if (row.dtype == static_cast<int>(k::DType::E4M3))
    row.fp8_kind = k::fp8_kind_of(flag("scale_a_rows"), flag("scale_b_rows"), flag("fast_accum"));
  if (!needs_kernel) return row;
  const std::string kernel = r["kernel"].cast<std::string>();
  if (kernel == "cublaslt") {
    row.cublas_algo = r.contains("algo") ? r["algo"].cast<int>() : 0;
    if (row.cublas_algo < 0)
      throw std::invalid_argument("kernel table: algo must be >= 0, got " +
                                  std::to_string(row.cublas_algo));
  } else {
    row.config = k::parse_config(kernel);
    if (row.config <= 0)
      throw std::invalid_argument("kernel table: kernel '" + kernel +
                                  "' is not 'cublaslt' or one of " + k::config_list());
  }
  return row;
}

}  // namespace distgemm::bindings
