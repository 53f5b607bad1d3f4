// Which of the two GEMM kernels (output tile 128x256 or 128x128, see kernel/gemm_sm90.cuh) runs
// one GEMM. Host-only and pure, so that the choice is testable without a GPU and the same on
// every rank.
//
// Why two tiles: the persistent kernel runs its output tiles in waves of one tile per resident
// CTA. A GEMM with few tiles leaves SMs idle for its whole duration: a 512x4096 step (one of two
// steps of Llama-8B's O projection at 1024 tokens, TP=2) has 64 tiles of 128x256 for an H200's
// 132 SMs, so each step takes as long as the undivided GEMM. Halving the tile doubles the
// tiles; each one costs about half. Where the 128x256 grid is full, the larger tile wins: it
// reads less operand data per flop.
//
// The model: time ~ waves x cost of one tile, waves = ceil(tiles / resident CTAs), the cost of a
// 128x128 tile relative to a 128x256 one kTile128RelativeCost. The narrow tile must win by
// kTile128MinGain: inside a plan, programmatic dependent launch lets the next step's GEMM fill
// the last wave's idle SMs, which the model does not see, so a small modelled gain is not a real
// one. The measurements behind both constants are in docs/tuning.md.
#pragma once

#include <cstdint>
#include <string>

namespace distgemm::kernel {

// The cost of a 128x128 output tile relative to a 128x256 one, same K (time ratio x waves ratio
// of single-GPU GEMMs; docs/tuning.md).
inline constexpr double kTile128RelativeCost = 0.56;
// 128x128 only where the model rates it at least this much cheaper (see above).
inline constexpr double kTile128MinGain = 0.10;

// 0: chosen per GEMM by choose_tile_n; 128 or 256: that kernel for every GEMM.
inline std::string tile_n_problem(int tile_n) {
  if (tile_n == 0 || tile_n == 128 || tile_n == 256) return "";
  return "tile_n=" + std::to_string(tile_n) + " is not 0 (auto), 128 or 256";
}

struct TileEstimate {
  int64_t tiles = 0;  // output tiles of the GEMM (all batches)
  int64_t waves = 0;  // ceil(tiles / resident CTAs)
  double cost = 0;    // waves x relative cost of one tile (128x256 = 1)
};

inline TileEstimate estimate_tiles(int64_t m, int64_t n, int64_t l, int tile_n, int slots) {
  TileEstimate e;
  const int64_t s = slots > 0 ? slots : 1;
  e.tiles = ((m + 127) / 128) * ((n + tile_n - 1) / tile_n) * (l > 0 ? l : 1);
  e.waves = (e.tiles + s - 1) / s;
  e.cost = double(e.waves) * (tile_n == 128 ? kTile128RelativeCost : 1.0);
  return e;
}

// The tile width for an m x n (x l batches) GEMM given each kernel's resident CTAs on the device
// (persistent grid size): 128 where that kernel's estimate is below (1 - kTile128MinGain) of
// the 128x256 one, else 256.
inline int choose_tile_n(int64_t m, int64_t n, int64_t l, int slots_n256, int slots_n128) {
  const TileEstimate wide = estimate_tiles(m, n, l, 256, slots_n256);
  const TileEstimate narrow = estimate_tiles(m, n, l, 128, slots_n128);
  return narrow.cost < (1.0 - kTile128MinGain) * wide.cost ? 128 : 256;
}

}  // namespace distgemm::kernel
