// Partition: which mode of each operand is sharded across the TP devices, and therefore
// what the user hands device d and what device d hands back.
//
// Problem (global view): D[L, M, N] = alpha * A[L, M, K] @ B[L, N, K]^T + beta * C + bias[N].
// B is in nn.Linear layout ([N, K], K contiguous). Device d always owns shard d of a sharded
// mode (contiguous, in device order); a mode that is not sharded is replicated in full.
// Local user tensors are dense row-major per batch: A_d[L, rows, cols] with ld = cols.
//
// Host + device friendly: no CUDA runtime, no allocation, no exceptions.
#pragma once

#include <cstdint>

#include "distgemm/host_device.hpp"

namespace distgemm::schedule {

enum class Mode : uint8_t { None = 0, M = 1, N = 2, K = 3 };

inline const char* mode_name(Mode m) {
  switch (m) {
    case Mode::M:
      return "M";
    case Mode::N:
      return "N";
    case Mode::K:
      return "K";
    default:
      return "none";
  }
}

struct Problem {
  int64_t m = 0, n = 0, k = 0, l = 1;
};

// The rows/cols of a 2-D operand (per batch) in global coordinates.
struct Extent2 {
  int64_t rows = 0, cols = 0;
};

// Sharding of each operand. C, D and bias follow `d` (bias shares D's N sharding).
struct Partition {
  Mode a = Mode::None;  // A[M, K]: None, M or K
  Mode b = Mode::None;  // B[N, K]: None, N or K
  Mode d = Mode::None;  // C/D[M, N]: None, M or N

  // Global extent of A, B, D (rows, cols).
  DISTGEMM_HD static Extent2 global_a(const Problem& p) { return {p.m, p.k}; }
  DISTGEMM_HD static Extent2 global_b(const Problem& p) { return {p.n, p.k}; }
  DISTGEMM_HD static Extent2 global_d(const Problem& p) { return {p.m, p.n}; }

  // Local extent of an operand whose global extent is g, rows in mode `row_mode`, cols in
  // `col_mode`, sharded on `sharded`.
  DISTGEMM_HD static Extent2 shard(Extent2 g, Mode row_mode, Mode col_mode, Mode sharded, int tp) {
    if (sharded != Mode::None && sharded == row_mode) return {g.rows / tp, g.cols};
    if (sharded != Mode::None && sharded == col_mode) return {g.rows, g.cols / tp};
    return g;
  }
  DISTGEMM_HD Extent2 local_a(const Problem& p, int tp) const {
    return shard(global_a(p), Mode::M, Mode::K, a, tp);
  }
  DISTGEMM_HD Extent2 local_b(const Problem& p, int tp) const {
    return shard(global_b(p), Mode::N, Mode::K, b, tp);
  }
  DISTGEMM_HD Extent2 local_d(const Problem& p, int tp) const {
    return shard(global_d(p), Mode::M, Mode::N, d, tp);
  }
  // Length of the bias vector device d holds: D's local column count.
  DISTGEMM_HD int64_t local_bias(const Problem& p, int tp) const { return local_d(p, tp).cols; }
};

}  // namespace distgemm::schedule
