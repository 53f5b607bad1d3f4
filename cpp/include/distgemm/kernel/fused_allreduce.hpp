// Host API of the fused GEMM + all-reduce of decode-sized row-parallel layers: one kernel per
// rank computes its partial product, exchanges the partials of each finished tile with every
// rank over NVLink, and sums the tiles it owns over every rank's partials into the output. No
// collective kernel, no copy engine, no host work between launches, so it records into a
// caller's CUDA graph as one kernel node. No CUTLASS in this header; the choices below are pure
// and host-only, so the bindings and the CPU tests use them without a GPU.
//
// Two kernels compute the partial product:
//  - decode (up to kFusedDecodeMaxTokens tokens, fused_decode_sm90.cuh): swapped (D^T = W X^T:
//    the weight's rows on the MMA's wide side, the few tokens on its narrow side), 64-column
//    tiles, one CTA per SM whose producer warp streams the weight through a deep shared-memory
//    ring with TMA and whose consumer warps run warp-level MMAs; the tiles' K steps are cut into
//    contiguous shares of whole tiles or of K steps, one per CTA (fused_decode_work.hpp), a
//    tile's pieces coming from the CTAs whose shares cross it;
//  - cutlass (more tokens, fused_allreduce_sm90.cuh): CUTLASS's SM90 cooperative GEMM, swapped
//    too: tiles of 128 weight rows (output columns) by 64 to 256 tokens (fused_token_tile), K
//    split in its batch mode.
// The decode kernel pushes every piece's partial into every rank's receive buffer as
// generation-tagged lines (kFusedLineBytes); the CUTLASS kernel writes each split's into its own
// rank's partial buffer, signals the tile's flag on every rank, and the peers read it. Every rank
// runs the same tiles, and a tile's output is summed over every rank and split (piece) in a fixed
// order by the rank's CTAs of that tile, each CTA one slice of the rows. The CUTLASS kernel's
// tail does that on every rank (one-shot) or, per launch, on one owner rank per slice, which
// the others copy the finished slice from (two-shot: FusedTailMode).
//
// Launch generations: each CTA reads its generation from its own control word at entry and
// advances that word when it finishes; CTA 0 also advances the words of the slots this launch
// does not use, so that every word holds the same generation between launches, whatever the
// grid. No CTA waits for another to advance it: the next launch on the stream starts after every
// CTA of this one has finished. Partials alternate between two buffers by generation parity, so a
// launch never overwrites the buffer a peer may still read from the previous launch (a peer
// can be at most one launch behind: it waits for this rank's tiles of every launch); the
// parities sit parity_bytes apart, in the two halves of a region that launches of every shape
// share. The two-shot tail's sum buffers alternate the same way, in the same halves: a launch's
// partials are written before it waits for anything, so a sum of launch g a peer still copies
// must not lie where launch g + 1's partials go.
#pragma once

#include <cstdint>
#include <string>

#include "distgemm/kernel/fused_decode_work.hpp"
#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/wait_spec.hpp"

namespace distgemm::kernel {

// Output tile: fused_tile_n(m) columns of N by fused_token_tile(m) tokens.
inline constexpr int kFusedTileN = 128;          // the CUTLASS kernel's
inline constexpr int kFusedDecodeTileN = 64;     // the decode kernel's: a tile per SM on 70B/405B
inline constexpr int kFusedTokenTileSmall = 32;  // the decode kernel's token block
// The CUTLASS kernel's token tiles, one instantiation per dtype each (fused_token_tile picks;
// cpp/cuda.cmake reads this line to generate them). Not 160 or 224: on the same tokens they run
// slower than 192 and 256 by more than the padding costs (docs/tuning.md).
inline constexpr int kFusedTokenTiles[] = {64, 96, 128, 192, 256};
// The decode kernel runs up to this many tokens (one block of kFusedTokenTileSmall), the CUTLASS
// kernel above: at 64 tokens the CUTLASS kernel is the faster, at 1..32 the decode kernel's whole
// fused op takes about what the CUTLASS GEMM alone does (docs/tuning.md).
inline constexpr int64_t kFusedDecodeMaxTokens = 32;
// At most this many splits of K in the CUTLASS kernel's batches (each a whole number of
// 64-element k-blocks), and pieces of a tile in the decode kernel's grid (fused_ctas), so that on
// narrow outputs a tile's sum waits for at most this many sources per rank.
inline constexpr int kFusedMaxSplits = 4;
inline constexpr int kFusedDecodeMaxPieces = 8;
// Flags per section of the fused control region: tiles x splits of one launch.
inline constexpr int kFusedMaxTiles = 4096;
// A fused launch has at most this many CTAs (one generation word each, below).
inline constexpr int kFusedMaxCtas = 1024;
// The control region: one launch-generation word per CTA slot, then kMaxDevices sections of
// kFusedMaxTiles flags (section q is set by rank q: its partial of that tile and split is ready),
// then section kFusedSumSection of kFusedMaxTiles flags (the two-shot tail: flag (tile, slice) is
// set by the slice's owner, fused_slice_owner, once the finished slice is in its sum buffer).
// Every section is indexed as fused_tile_index (fused_tail.cuh) orders (tile, split).
inline constexpr int64_t kFusedHeaderBytes = int64_t(kFusedMaxCtas) * 4;
inline constexpr int kFusedSumSection = kMaxDevices;
inline constexpr int kFusedFlagSections = kMaxDevices + 1;
// Word `idx` of flag section `section` within a rank's control region.
inline constexpr int64_t fused_flag_word(int section, int idx) {
  return kFusedHeaderBytes / 4 + int64_t(section) * kFusedMaxTiles + idx;
}
inline constexpr int64_t fused_control_bytes() {
  return kFusedHeaderBytes + int64_t(kFusedFlagSections) * kFusedMaxTiles * 4;
}

// How the CUTLASS kernel's tail gets each tile's sum to every rank (the decode kernel's is
// always the one-shot):
//  - one_shot: every rank sums every tile's slices over every rank's partials: each rank reads
//    (tp - 1) x the output over NVLink;
//  - two_shot: each slice (a tile's split s) has an owner rank (fused_slice_owner), which sums it
//    as one_shot does, writes the finished slice (+ beta * c + bias, in the output's dtype) to
//    out and to its sum buffer, then sets the slice's sum flag on every other rank; the others
//    wait for that flag and copy the slice from the owner's sum buffer: each rank reads
//    2 (tp - 1) / tp x the output, one more NVLink hop on the way.
// Every rank gets the same bits either way (the owner's fixed-order sum).
enum class FusedTailMode { OneShot = 0, TwoShot = 1 };
inline constexpr int kFusedTailModes = 2;
inline constexpr const char* kFusedTailModeNames[kFusedTailModes] = {"one_shot", "two_shot"};

// False for an unknown name.
inline bool parse_fused_tail(const std::string& name, FusedTailMode& out) {
  const bool two = name == kFusedTailModeNames[int(FusedTailMode::TwoShot)];
  if (!two && name != kFusedTailModeNames[int(FusedTailMode::OneShot)]) return false;
  out = two ? FusedTailMode::TwoShot : FusedTailMode::OneShot;
  return true;
}

// The owner rank of slice s of tile (nb, tb) in the two-shot tail, of n_blocks x token_blocks
// tiles: the slice's place in the CUTLASS scheduler's walk (token blocks fastest, then n
// blocks, then splits; FusedRunner sets that raster) modulo tp. Consecutive slices of the walk
// go to consecutive ranks, so every rank owns tiles x splits / tp of them (one more for some),
// and on every rank the CTAs that own their slice (whose sum reads tp x what a copy does) are
// every tp-th CTA of the grid's first round, spread over the SMs rather than bunched. Shapes and
// tp only: every rank computes the same owner, whatever its grid.
inline constexpr int fused_slice_owner(int nb, int tb, int s, int n_blocks, int token_blocks,
                                       int tp) {
  return static_cast<int>(((int64_t(s) * n_blocks + nb) * token_blocks + tb) % tp);
}

enum class FusedKernel { Decode, Cutlass };

inline FusedKernel fused_kernel(int64_t m) {
  return m <= kFusedDecodeMaxTokens ? FusedKernel::Decode : FusedKernel::Cutlass;
}

inline const char* fused_kernel_name(int64_t m) {
  return fused_kernel(m) == FusedKernel::Decode ? "decode" : "cutlass";
}

// Tokens per output tile: the decode kernel's one block, or the CUTLASS kernel's tile that pads
// the fewest tokens (the larger tile on a tie: fewer tiles), so up to 256 tokens one token tile
// covers them all and each weight tile is read once. Where two token tiles share a weight tile
// they read it from L2 only while they run in step, and a tile mostly past m (its token boxes
// zero-filled by TMA) falls behind (docs/tuning.md).
inline int fused_token_tile(int64_t m) {
  if (fused_kernel(m) == FusedKernel::Decode) return kFusedTokenTileSmall;
  int best = 0;
  int64_t best_rows = 0;
  for (const int tile : kFusedTokenTiles) {
    const int64_t rows = (m + tile - 1) / tile * tile;
    if (best == 0 || rows <= best_rows) {
      best = tile;
      best_rows = rows;
    }
  }
  return best;
}

// The decode kernel's padded tokens per block: 16 or 32 (one n8 MMA fragment per 8), the
// compile-time width its instantiations are chosen by. 1..8 tokens run at width 16: the kernel
// streams the weight either way, and that instantiation fits its registers without spills.
inline int fused_decode_token_width(int64_t m) { return m <= 16 ? 16 : kFusedTokenTileSmall; }

// Columns of N per output tile: the decode kernel's, or the CUTLASS kernel's.
inline int fused_tile_n(int64_t m) {
  return fused_kernel(m) == FusedKernel::Decode ? kFusedDecodeTileN : kFusedTileN;
}

inline int64_t fused_tiles(int64_t m, int64_t n) {
  const int64_t tt = fused_token_tile(m), tn = fused_tile_n(m);
  return ((n + tn - 1) / tn) * ((m + tt - 1) / tt);
}

// The decode kernel's division of its work (fused_decode_work.hpp) over `ctas` CTAs.
// Shapes past fused_shape_problem's limit on units give a meaningless division.
inline FusedDecodeWork fused_decode_work(int64_t m, int64_t n, int64_t k, int ctas) {
  return {static_cast<uint32_t>(fused_tiles(m, n)), fused_decode_steps(k),
          static_cast<uint32_t>(ctas)};
}

// The decode kernel's grid (fused_decode_work.hpp): every CTA resident at once (a tile's
// pieces wait for each other), each with the same work where that keeps nearly every SM busy:
//  - with at least as many tiles as resident CTAs, the fewest CTAs that take the tiles in as few
//    rounds, whole tiles each, where they are at least kFusedDecodeMinBusyPercent of the
//    resident ones (256 tiles on an H200's 132: 128 CTAs of 2 tiles), else every resident CTA,
//    whole tiles in rounds (128 tiles on 114: 1 or 2 each, where 64 CTAs of 2 would leave half
//    the SMs idle). Equal rounds beat every resident CTA with unequal ones (docs/tuning.md);
//  - with fewer tiles, every tile in the most equal pieces, up to kFusedDecodeMaxPieces and one K
//    step each, that keep the CTAs resident (64 tiles on 132: 128 CTAs of half a tile).
// Not one equal share of K steps per resident CTA (every SM busy, most tiles in 2 pieces): each
// extra piece's exchange and partial cost more than the idle SMs (docs/tuning.md). 0 for the
// CUTLASS kernel, whose grid is its own.
inline constexpr int kFusedDecodeMinBusyPercent = 90;
inline int fused_ctas(int64_t m, int64_t n, int64_t k, int resident_ctas) {
  if (fused_kernel(m) != FusedKernel::Decode) return 0;
  const FusedDecodeWork w = fused_decode_work(m, n, k, 1);
  if (int64_t(w.tiles) * w.steps > kFusedDecodeMaxUnits) return 1;  // refused by the shape check
  const int64_t resident = resident_ctas < kFusedMaxCtas ? resident_ctas : kFusedMaxCtas;
  if (w.tiles >= resident) {
    const int64_t rounds = (w.tiles + resident - 1) / resident;
    const int64_t fewest = (w.tiles + rounds - 1) / rounds;
    return static_cast<int>(fewest * 100 >= resident * kFusedDecodeMinBusyPercent ? fewest
                                                                                  : resident);
  }
  int64_t pieces = 1;
  for (int64_t p = 2; p <= kFusedDecodeMaxPieces && p <= w.steps; ++p)
    if (w.tiles * p <= resident) pieces = p;
  return static_cast<int>(w.tiles * pieces);
}

// The partials per rank of a tile's sum. Decode: its most pieces over fused_ctas' grid. CUTLASS:
// splits of K, the most that keep every CTA (tiles x splits) resident at once on
// `resident_ctas`, up to kFusedMaxSplits, each a whole number of 64-element k-blocks.
inline int fused_splits(int64_t m, int64_t n, int64_t k, int resident_ctas) {
  if (fused_kernel(m) == FusedKernel::Decode)
    return static_cast<int>(
        fused_decode_work(m, n, k, fused_ctas(m, n, k, resident_ctas)).max_pieces());
  const int64_t tiles = fused_tiles(m, n);
  int best = 1;
  for (int s = 2; s <= kFusedMaxSplits; ++s)
    if (tiles * s <= resident_ctas && k % (int64_t(s) * 64) == 0) best = s;
  return best;
}

// The decode kernel's partials travel as lines of kFusedLineElements elements, each 32-bit word
// of data next to the launch generation (16 bytes: data, gen, data, gen), pushed by the writer
// into every rank's receive buffer: a reader knows from the line itself that it has arrived
// (each 8-byte half lands whole), so no fence, no flag and no read over NVLink stands between a
// tile's last MMA and its sum. Twice the bytes of the partial, which at 1..32 tokens is small.
inline constexpr int kFusedLineElements = 4;
inline constexpr int kFusedLineBytes = 16;

// Lines of one source's partial in the decode kernel's receive buffer: m x n elements.
inline constexpr int64_t fused_decode_source_lines(int64_t m, int64_t n) {
  return m * n / kFusedLineElements;
}

// Bytes of one rank's partial buffers. CUTLASS kernel: two parities x splits x m x n elements,
// every rank reading every split's partial from its writer. Decode kernel: its receive buffer,
// two parities x tp source ranks x `splits` pieces x m x n elements as lines (kFusedLineBytes per
// kFusedLineElements elements), every writer pushing into every rank's.
inline int64_t fused_partial_bytes(int64_t m, int64_t n, int splits, int element_bytes, int tp) {
  if (fused_kernel(m) == FusedKernel::Decode)
    return 2 * int64_t(tp) * splits * fused_decode_source_lines(m, n) * kFusedLineBytes;
  return 2 * int64_t(splits) * m * n * element_bytes;
}

// Bytes of one rank's two-shot sum buffers: two parities x m x n elements, the finished output
// of the slices it owns (the rest of each parity's [m, n] unused, so that a slice's place does
// not depend on its owner). 0 for the one-shot tail.
inline int64_t fused_sum_bytes(int64_t m, int64_t n, int element_bytes, FusedTailMode tail) {
  return tail == FusedTailMode::TwoShot ? 2 * m * n * element_bytes : 0;
}

// "" when the tail `tail` runs m tokens, else the reason.
inline std::string fused_tail_problem(FusedTailMode tail, int64_t m) {
  if (tail == FusedTailMode::TwoShot && fused_kernel(m) == FusedKernel::Decode)
    return "the two-shot tail is the CUTLASS kernel's (m > " +
           std::to_string(kFusedDecodeMaxTokens) + "); the decode kernel (m=" + std::to_string(m) +
           ") sums every tile on every rank";
  return "";
}

// "" when the shapes fit the fused kernel, else the reason with the values.
inline std::string fused_shape_problem(int64_t m, int64_t n, int64_t k, int splits, int tp) {
  if (m < 1 || n < 1 || k < 1)
    return "m, n, k must be >= 1, got m=" + std::to_string(m) + " n=" + std::to_string(n) +
           " k=" + std::to_string(k);
  if (n % 8 != 0 || k % 8 != 0)
    return "n=" + std::to_string(n) + " and k=" + std::to_string(k) +
           " must be multiples of 8 (16-byte row loads in the GEMM and the reduction)";
  if (fused_kernel(m) == FusedKernel::Decode) {
    const int64_t steps = fused_decode_steps(k);
    if (fused_tiles(m, n) * steps > kFusedDecodeMaxUnits)
      return "n=" + std::to_string(n) + " x k=" + std::to_string(k) + " is " +
             std::to_string(fused_tiles(m, n) * steps) + " tiles x K steps, more than the " +
             std::to_string(kFusedDecodeMaxUnits) +
             " the decode kernel divides (m=" + std::to_string(m) +
             " <= " + std::to_string(kFusedDecodeMaxTokens) + ")";
    if (splits < 1 || splits > kFusedDecodeMaxPieces || splits > steps)
      return "splits=" + std::to_string(splits) + " (pieces per tile) must be in 1.." +
             std::to_string(kFusedDecodeMaxPieces) + " and at most the " + std::to_string(steps) +
             " K steps of " + std::to_string(kFusedDecodeKStep) + " in k=" + std::to_string(k) +
             " (decode kernel, m=" + std::to_string(m) +
             " <= " + std::to_string(kFusedDecodeMaxTokens) + ")";
  } else if (splits < 1 || splits > kFusedMaxSplits || k % (int64_t(splits) * 8) != 0) {
    return "splits=" + std::to_string(splits) + " must be in 1.." +
           std::to_string(kFusedMaxSplits) + " and divide k=" + std::to_string(k) +
           " into multiples of 8 (CUTLASS kernel, m=" + std::to_string(m) + ")";
  }
  if (tp < 1 || tp > kMaxDevices)
    return "tp=" + std::to_string(tp) + " is not in 1.." + std::to_string(kMaxDevices);
  const int64_t tiles = fused_tiles(m, n) * splits;
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
  // Partials per rank of a tile's sum: the CUTLASS kernel's splits of K, the decode kernel's
  // most pieces of a tile over `ctas` CTAs (fused_splits).
  int splits = 1;
  int ctas = 0;  // the decode kernel's grid (fused_ctas); 0 for the CUTLASS kernel
  int tp = 1, rank = 0;
  FusedTailMode tail = FusedTailMode::OneShot;  // the CUTLASS kernel's only (fused_tail_problem)
  // Every rank's partial buffers (CUTLASS kernel) or receive buffers (decode kernel), both
  // parities (fused_partial_bytes).
  void* partial[kMaxDevices] = {};
  // The two-shot tail: every rank's sum buffer of parity 0 (fused_sum_bytes / 2), parity 1's
  // parity_bytes further, like the partials; null for the one-shot tail.
  void* sum[kMaxDevices] = {};
  // Bytes from parity 0's buffers to parity 1's, the same on every rank: at least half of
  // fused_partial_bytes and a multiple of kFusedLineBytes. The caller places the parities in the
  // two halves of a region shared by launches of every shape, so that a launch never writes where
  // a peer may still read the previous launch's partials or sums, whatever their shapes.
  int64_t parity_bytes = 0;
  uint32_t* control[kMaxDevices] = {};  // every rank's fused control region
  uint32_t* abort = nullptr;            // this rank's sticky abort word
  ErrorRecord* record = nullptr;        // where a timeout is reported
  uint64_t timeout_ns = static_cast<uint64_t>(kDefaultTimeoutS * 1e9);
};

// "" when the two-shot tail's sum buffers of `f` are usable (none for the one-shot tail), else
// the reason: every rank's, 16-byte aligned, and apart from that rank's partial buffers and
// from each other in both parities (parity_bytes apart), so that no store of a launch lands in
// a buffer a peer may still read. Addresses only: the CPU tests check the Python placement
// with it.
inline std::string fused_sum_buffers_problem(const FusedAllReduceDesc& f) {
  const int64_t sum_half = fused_sum_bytes(f.m, f.n, dtype_bytes(f.dtype), f.tail) / 2;
  const int64_t partial_half =
      fused_partial_bytes(f.m, f.n, f.splits, dtype_bytes(f.dtype), f.tp) / 2;
  for (int q = 0; q < f.tp; ++q) {
    const auto p0 = reinterpret_cast<uintptr_t>(f.partial[q]);
    const auto s0 = reinterpret_cast<uintptr_t>(f.sum[q]);
    const std::string who = "rank " + std::to_string(q) + "'s ";
    if (sum_half == 0) {
      if (s0 != 0) return "internal: " + who + "sum buffer given for the one-shot tail";
      continue;
    }
    if (s0 == 0) return "internal: no two-shot sum buffer of rank " + std::to_string(q);
    if (s0 % 16 != 0) return who + "sum buffer: address is not 16-byte aligned";
    // [begin, end) of parity 0 and 1 of the partials and of the sums: pairwise apart.
    const auto pb = static_cast<uintptr_t>(f.parity_bytes);
    const uintptr_t lo[4] = {p0, p0 + pb, s0, s0 + pb};
    const uintptr_t len[4] = {uintptr_t(partial_half), uintptr_t(partial_half), uintptr_t(sum_half),
                              uintptr_t(sum_half)};
    for (int i = 0; i < 4; ++i)
      for (int j = i + 1; j < 4; ++j)
        if (lo[i] < lo[j] + len[j] && lo[j] < lo[i] + len[i])
          return "internal: " + who + "two-shot sum buffers (" + std::to_string(sum_half) +
                 " bytes a parity, " + std::to_string(int64_t(s0 - p0)) +
                 " bytes past its partials) overlap its partial buffers (" +
                 std::to_string(partial_half) +
                 " bytes a parity) or each other (parity_bytes=" + std::to_string(f.parity_bytes) +
                 ")";
  }
  return "";
}

// "" when the fused kernel can run `f` (shapes, pointers and their alignment), else the reason.
// The CUTLASS kernel's own check runs in the launch, on the arguments it builds anyway.
std::string fused_allreduce_can_implement(const FusedAllReduceDesc& f);
// CTAs of the fused kernel for m tokens resident at once on `device` (fused_splits' input).
int fused_allreduce_resident_ctas(DType dtype, int64_t m, int device);
// Records one launch on `stream` (capturable: no synchronisation, no allocation).
void fused_allreduce_launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream);

}  // namespace distgemm::kernel
