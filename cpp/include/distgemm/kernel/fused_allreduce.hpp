// Host API of the fused GEMM + all-reduce of decode-sized row-parallel layers: one kernel per
// rank computes its partial product into its symmetric workspace, signals each finished tile to
// every rank, then sums the tiles it owns over every rank's partials (read over NVLink) into the
// output. No collective kernel, no copy engine, no host work between launches, so it records
// into a caller's CUDA graph as one kernel node. No CUTLASS in this header; the choices below are
// pure and host-only, so the bindings and the CPU tests use them without a GPU.
//
// The GEMM runs swapped (D^T = W X^T): the weight's N rows fill the 128-row side of the CUTLASS
// tile and the few tokens its narrow side, so a decode step of 8 tokens wastes 8x, not 16x, of
// the tensor-core work; the split-K factor (the kernel's batch mode over K slices) fills the SMs
// that the N tiles alone would leave idle. Every rank runs the same tiles; a tile's output rows
// are summed by the rank's CTA that computed split 0..S-1 of it, each CTA one slice of the rows.
//
// Launch generations: the kernel reads its generation from the control words at entry, the last
// CTA to finish advances them. Partials alternate between two buffers by generation parity, so a
// launch never overwrites the buffer a peer may still read from the previous launch (a peer
// can be at most one launch behind: it waits for this rank's tiles of every launch).
#pragma once

#include <cstdint>
#include <string>

#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/wait_spec.hpp"

namespace distgemm::kernel {

// Output tile of the swapped GEMM: 128 columns of N by kFusedTokenTile* tokens.
inline constexpr int kFusedTileN = 128;
inline constexpr int kFusedTokenTileSmall = 64;
inline constexpr int kFusedTokenTileLarge = 256;
// path="auto" runs gemm_all_reduce fused up to this many tokens. 0: never, because the kernel's
// GEMM alone takes 1.2-2.3x torch.mm's time at 1..256 tokens on an H200
// (benchmarks/results/2026-11-23-fused-decode.md), so the collective path is faster; the fused
// path runs where a caller asks for it (path="fused").
inline constexpr int64_t kFusedMaxAutoTokens = 0;
// At most this many splits of K (each a whole number of 64-element k-blocks).
inline constexpr int kFusedMaxSplits = 4;
// Flags per rank in the fused control region: tiles x splits of one launch.
inline constexpr int kFusedMaxTiles = 4096;
// The control region: the launch generation and the finished-CTA counter (one 128-byte line),
// then kMaxDevices sections of kFusedMaxTiles flags (section q is set by rank q).
inline constexpr int64_t kFusedHeaderBytes = 128;
inline constexpr int64_t fused_control_bytes() {
  return kFusedHeaderBytes + int64_t(kMaxDevices) * kFusedMaxTiles * 4;
}

// The token tile: the narrow one up to 128 tokens (two of its tiles on one weight slice run side
// by side and share the weight through L2), the wide one above.
inline int fused_token_tile(int64_t m) {
  return m <= 2 * kFusedTokenTileSmall ? kFusedTokenTileSmall : kFusedTokenTileLarge;
}

// Splits of K: the most (up to kFusedMaxSplits) that keep every tile resident at once on
// `resident_ctas` and each split a whole number of 64-element k-blocks.
inline int fused_splits(int64_t m, int64_t n, int64_t k, int resident_ctas) {
  const int64_t tt = fused_token_tile(m);
  const int64_t tiles = ((n + kFusedTileN - 1) / kFusedTileN) * ((m + tt - 1) / tt);
  int best = 1;
  for (int s = 2; s <= kFusedMaxSplits; ++s)
    if (tiles * s <= resident_ctas && k % (int64_t(s) * 64) == 0) best = s;
  return best;
}

// Elements of one rank's partial buffers: two parities x splits x m x n.
inline int64_t fused_partial_elems(int64_t m, int64_t n, int splits) {
  return 2 * int64_t(splits) * m * n;
}

// "" when the shapes fit the fused kernel, else the reason with the values.
inline std::string fused_shape_problem(int64_t m, int64_t n, int64_t k, int splits, int tp) {
  if (m < 1 || n < 1 || k < 1)
    return "m, n, k must be >= 1, got m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k);
  if (n % 8 != 0 || k % 8 != 0)
    return "n=" + std::to_string(n) + " and k=" + std::to_string(k) +
           " must be multiples of 8 (16-byte rows for TMA and the reduction)";
  if (splits < 1 || splits > kFusedMaxSplits || k % (int64_t(splits) * 8) != 0)
    return "splits=" + std::to_string(splits) + " must be in 1.." +
           std::to_string(kFusedMaxSplits) + " and divide k=" + std::to_string(k) +
           " into multiples of 8";
  if (tp < 1 || tp > kMaxDevices)
    return "tp=" + std::to_string(tp) + " is not in 1.." + std::to_string(kMaxDevices);
  const int64_t tt = fused_token_tile(m);
  const int64_t tiles = ((n + kFusedTileN - 1) / kFusedTileN) * ((m + tt - 1) / tt) * splits;
  if (tiles > kFusedMaxTiles)
    return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " needs " +
           std::to_string(tiles) + " tiles, more than the " + std::to_string(kFusedMaxTiles) +
           " flags of the fused control region (use the overlapped or collective path)";
  return "";
}

// One fused launch on one rank. Pointers are device addresses as seen from this rank (peers'
// through CUDA IPC). out[m, n] = sum over ranks q of (alpha * a_q @ w_q^T) + beta * c + bias.
struct FusedAllReduceDesc {
  DType dtype = DType::BF16;
  int64_t m = 0, n = 0, k = 0;  // this rank's GEMM: a [m, k], w [n, k], both K-contiguous
  const void* a = nullptr;
  int64_t lda = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  void* out = nullptr;  // [m, n], N-contiguous, ldo elements between rows
  int64_t ldo = 0;
  const void* bias = nullptr;  // [n] or null
  const void* c = nullptr;     // [m, n] (ldc) or null
  int64_t ldc = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int splits = 1;
  int tp = 1, rank = 0;
  void* partial[kMaxDevices] = {};      // every rank's partial buffers (both parities)
  uint32_t* control[kMaxDevices] = {};  // every rank's fused control region
  uint32_t* abort = nullptr;            // this rank's sticky abort word
  ErrorRecord* record = nullptr;        // where a timeout is reported
  uint64_t timeout_ns = static_cast<uint64_t>(kDefaultTimeoutS * 1e9);
};

// "" when the fused kernel can run `f` (shapes, pointers and their alignment), else the reason.
std::string fused_allreduce_can_implement(const FusedAllReduceDesc& f);
// CTAs of the fused kernel for m tokens resident at once on `device` (fused_splits' input).
int fused_allreduce_resident_ctas(DType dtype, int64_t m, int device);
// Records one launch on `stream` (capturable: no synchronisation, no allocation).
void fused_allreduce_launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream);

}  // namespace distgemm::kernel
