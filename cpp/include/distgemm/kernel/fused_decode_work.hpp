// How the decode kernel of the fused GEMM + all-reduce divides its work over its CTAs, shared by
// the kernel (fused_decode_sm90.cuh) and the host rules that size its buffers and grid
// (fused_allreduce.hpp: fused_ctas, fused_splits).
//
// The work is every tile's K steps in tile-major order (unit u: tile u / steps, K step u % steps),
// cut into `ctas` contiguous shares, CTA c taking [begin(c), begin(c + 1)). The cut falls on
// whole tiles where there are at least as many tiles as CTAs (shares of whole tiles, their
// counts differing by at most one), and on K steps otherwise (shares differing by at most one
// step). A share that crosses a tile boundary splits that tile: the part of a tile one CTA
// computes is a piece, and a tile's pieces come from consecutive CTAs, piece j from CTA
// first_cta(tile) + j. Each CTA pushes the partial of every piece, and the CTA of piece j sums
// slice j of the tile's `pieces(tile)` slices over every rank's pieces.
//
// The grid (fused_ctas) gives every CTA the same whole tiles or the same fraction of one tile
// where that keeps nearly every SM busy, so that no CTA computes more than one piece of a tile:
// each piece's partial and exchange cost more than the SMs a finer cut would keep busy.
//
// Every share is at least one unit long (ctas <= units), so no CTA of a tile's pieces is idle.
#pragma once

#include <cstdint>

#include "distgemm/host_device.hpp"

namespace distgemm::kernel {

// The decode kernel's K step: each of a row's 4 threads takes 16 consecutive elements (two
// 16-byte loads), so one step covers 64 elements, a 128-byte line of each of its weight rows.
inline constexpr int kFusedDecodeKStep = 64;

// K steps of `k` elements, the last one partial where k is not a multiple of the step.
DISTGEMM_HD inline uint32_t fused_decode_steps(int64_t k) {
  return static_cast<uint32_t>((k + kFusedDecodeKStep - 1) / kFusedDecodeKStep);
}

// At most this many units (fused_shape_problem refuses more), so that the division's products
// (units x CTAs, at most 2^31) fit the 32-bit arithmetic the kernel does per piece: 64-bit
// divisions are software routines of hundreds of cycles, on the path to the first weight load.
inline constexpr uint32_t kFusedDecodeMaxUnits = 1u << 21;

struct FusedDecodeWork {
  uint32_t tiles = 1;  // output tiles
  uint32_t steps = 1;  // K steps per tile
  uint32_t ctas = 1;   // the grid, 1..units() (and at most kFusedMaxCtas)

  DISTGEMM_HD uint32_t units() const { return tiles * steps; }
  // Units per grain of the cut: a tile, or a K step where the tiles are fewer than the CTAs.
  DISTGEMM_HD uint32_t grain() const { return tiles >= ctas ? steps : 1u; }
  // First unit of CTA c's share (c = ctas: the end of the work).
  DISTGEMM_HD uint32_t begin(uint32_t c) const {
    const uint32_t g = grain();
    return units() / g * c / ctas * g;
  }
  // The CTA whose share holds unit x: the last c with begin(c) <= x.
  DISTGEMM_HD uint32_t cta_of(uint32_t x) const {
    const uint32_t g = grain(), grains = units() / g;
    return ((x / g + 1) * ctas + grains - 1) / grains - 1;
  }
  DISTGEMM_HD uint32_t first_cta(uint32_t tile) const { return cta_of(tile * steps); }
  // CTAs that compute a piece of `tile`.
  DISTGEMM_HD uint32_t pieces(uint32_t tile) const {
    return cta_of((tile + 1) * steps - 1) - first_cta(tile) + 1;
  }
  // The most pieces of any tile: the sources per rank of a tile's sum. Shares of whole tiles
  // give every tile one; shares of K steps (fewer tiles than CTAs) are counted tile by tile.
  DISTGEMM_HD uint32_t max_pieces() const {
    if (grain() == steps) return 1u;
    uint32_t most = 1;
    for (uint32_t t = 0; t < tiles; ++t) {
      const uint32_t p = pieces(t);
      most = p > most ? p : most;
    }
    return most;
  }
};

}  // namespace distgemm::kernel
