// How the decode kernel of the fused GEMM + all-reduce divides its work over its CTAs, shared by
// the kernel (fused_decode_sm90.cuh) and the host rules that size its buffers and grid
// (fused_allreduce.hpp: fused_ctas, fused_splits).
//
// The work is every tile's K steps in tile-major order (unit u: tile u / steps, K step u % steps),
// cut into `ctas` contiguous ranges whose lengths differ by at most one unit, CTA c taking
// [begin(c), begin(c + 1)). So every CTA streams the same share of the weight, whatever the
// number of tiles: tiles in rounds over the CTAs left SMs idle in the last round (256 tiles on
// 132 SMs: 8 idle, 3% of the stream; benchmarks/results/2026-11-25-decode-lines.md), as do
// tiles x a whole number of K splits. A range crosses tile boundaries where it must: the part of
// a tile one CTA computes is a piece, and a tile's pieces come from consecutive CTAs, piece j
// from CTA first_cta(tile) + j. Each CTA pushes the partial of every piece, and the CTA of
// piece j sums slice j of the tile's `pieces(tile)` slices over every rank's pieces.
//
// Every range is at least one unit long (ctas <= units), so that no CTA of a tile's pieces is
// idle; with ranges of at least steps / (p - 1) units no tile has more than p pieces.
#pragma once

#include <cstdint>

#include "distgemm/host_device.hpp"

namespace distgemm::kernel {

struct FusedDecodeWork {
  int64_t tiles = 1;  // output tiles
  int64_t steps = 1;  // K steps per tile
  int ctas = 1;       // the grid, 1..units()

  DISTGEMM_HD int64_t units() const { return tiles * steps; }
  // First unit of CTA c's range (c = ctas: the end of the work).
  DISTGEMM_HD int64_t begin(int c) const { return units() * c / ctas; }
  // The CTA whose range holds unit x: the last c with begin(c) <= x.
  DISTGEMM_HD int cta_of(int64_t x) const {
    return static_cast<int>(((x + 1) * ctas + units() - 1) / units()) - 1;
  }
  DISTGEMM_HD int first_cta(int64_t tile) const { return cta_of(tile * steps); }
  // CTAs that compute a piece of `tile`.
  DISTGEMM_HD int pieces(int64_t tile) const {
    return cta_of((tile + 1) * steps - 1) - first_cta(tile) + 1;
  }
  // The most pieces of any tile: the sources per rank of a tile's sum.
  DISTGEMM_HD int max_pieces() const {
    int most = 1;
    for (int64_t t = 0; t < tiles; ++t) {
      const int p = pieces(t);
      most = p > most ? p : most;
    }
    return most;
  }
};

}  // namespace distgemm::kernel
