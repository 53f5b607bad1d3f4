// The decode kernel of the fused GEMM + all-reduce (fused_allreduce.hpp: up to
// kFusedDecodeMaxTokens tokens). Included only by the translation units in cpp/src/runtime/ that
// instantiate it (one per dtype, every token width in it).
//
// Why not CUTLASS here: at 1..32 tokens the GEMM only streams the weight (each element is used by
// a few tokens), so what counts is bytes in flight per SM and a short fixed cost, not
// tensor-core throughput.
//
// Mainloop: one CTA per SM, a producer warp and four consumer warps. The producer streams the
// CTA's weight rows and the token rows through a ring of shared-memory stages with TMA (2-D
// tensor maps, one 64-row x 64-element box per operand and K step, completing on the stage's
// mbarrier), as many stages ahead as shared memory holds (kStages: about 200 KB in flight per
// SM), and runs on into the CTA's next piece while the consumers finish the current one.
// Boxes are few and large on purpose: an SM keeps only so many TMA requests in flight, so small
// requests (a bulk copy per 512-byte row) cap its bandwidth (docs/tuning.md). The boxes land
// 128-byte swizzled, so the consumers' fragment loads are free of bank conflicts, and TMA fills
// rows past m or n and K past k with zeros. Consumer warp w takes K step w of every stage, all
// kFusedDecodeTileN weight rows of the CTA's tile (the MMA's M side, swapped: D^T = W X^T; four
// m16 blocks) by the tokens (its N side, Width padded tokens: Width/8 n8 fragments), mma.sync
// m16n8k16 with fp32 accumulation. Splitting K rather than the rows over the warps has each byte
// of a stage read from shared memory once (split by rows, every warp read every token fragment)
// and gives each warp 4 x Width/8 independent accumulator chains. Each of a row's 4 threads
// (lane % 4 = q) takes 16 consecutive elements of the 64-element K step: MMA j (0..3) of the step
// takes elements 4j..4j+3 of each thread's 16 as its A fragment, and the token fragment is loaded
// with the same permutation, so the sum over K is the same sum in another order. At the end of a
// piece the warps exchange their sums through shared memory, warp w keeping m16 block w.
//
// Work: every tile's K steps, cut into contiguous shares of whole tiles or of K steps, one per
// CTA (fused_decode_work.hpp); the part of a tile in one CTA's share is a piece. A CTA takes its
// pieces in order:
//   1. after each piece's mainloop it pushes the piece's partial (alpha x the fp32 sum, in the
//      element type) into every rank's receive buffer, at this launch's parity, source (this
//      rank, piece j), as generation-tagged lines (fused_allreduce.hpp: kFusedLineBytes), and
//      goes on to its next piece without waiting;
//   2. after its last piece, for each of its pieces, it polls the lines of slice j of the tile
//      from every (rank, piece) in its own receive buffer until each carries this launch's
//      generation, and sums them in a fixed order (+ beta * c + bias) into the output;
//   3. at the end, advances its own generation word (fused_tail.cuh's fused_finish_cta).
// Every CTA is resident at once (the launch checks) and pushes all of its partials before it
// waits for any, so no wait depends on a CTA that has not started, and a tile's sum starts one
// NVLink store after its last partial. Parity keeps a launch's pushes off the lines a peer may
// still read from the previous launch (a peer is at most one launch behind), and the generation
// tells this launch's lines from older ones (the receive buffer holds only such lines, zeroed at
// allocation). Waits: the line polls of step 2 are bounded (the timeout, the error record, the
// abort word). The mbarrier waits for this CTA's own TMA copies are not, as in CUTLASS's mainloops:
// they depend on no other rank or launch, and a faulting copy ends the kernel with a CUDA error
// rather than a hang. The producer's wait for a free stage also ends when the consumers stop.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "distgemm/device/check.hpp"
#include "distgemm/device/driver_entry.hpp"
#include "distgemm/kernel/fused_tail.cuh"
#include "distgemm/kernel/ll_line.cuh"  // st_line, ld_line, line_arrived

namespace distgemm::kernel::decode {

inline constexpr int kConsumerWarps = 4;
// m16 blocks of a tile's weight rows (the MMA's M); after the exchange, consumer warp w owns
// block w.
inline constexpr int kBlockRows = 16;
inline constexpr int kMBlocks = kFusedDecodeTileN / kBlockRows;
static_assert(kConsumerWarps == kMBlocks, "one m16 block of the tile per consumer warp");
inline constexpr int kConsumers = kConsumerWarps * 32;
inline constexpr int kThreads = kConsumers + 32;  // + the producer warp
// K steps per stage (a box of each operand per step) and the bytes of a box row: one K step of
// 2-byte elements, the 128-byte swizzle span.
inline constexpr int kStepsPerStage = 4;
static_assert(kStepsPerStage == kConsumerWarps, "one K step of a stage per consumer warp");
inline constexpr int kStageK = kStepsPerStage * kFusedDecodeKStep;
inline constexpr int kBoxRowBytes = kFusedDecodeKStep * 2;
static_assert(kBoxRowBytes == 128, "one K step per 128-byte swizzled box row");
inline constexpr int kSmemBudget = 200 * 1024;  // of the 227 KB an SM gives one CTA
inline constexpr int kMaxStages = 8;
inline constexpr int kSmemAlign = 1024;  // a 128-byte-swizzled box starts on 1024 bytes
// Sources (rank, piece) whose two lines a thread loads before it checks any, in the sum of step 2.
inline constexpr int kSumSources = 4;

inline constexpr int kWeightBoxBytes = kFusedDecodeTileN * kBoxRowBytes;
template <int Width>
inline constexpr int kTokenBoxBytes = Width * kBoxRowBytes;
// A stage: the weight boxes of its K steps, then the token boxes.
template <int Width>
inline constexpr int kStageBytes = kStepsPerStage * (kWeightBoxBytes + kTokenBoxBytes<Width>);
template <int Width>
inline constexpr int kStages =
    kSmemBudget / kStageBytes<Width> < kMaxStages ? kSmemBudget / kStageBytes<Width> : kMaxStages;
template <int Width>
inline constexpr int kSmemBytes = kStages<Width> * kStageBytes<Width> + kSmemAlign;
static_assert(kStages<kFusedTokenTileSmall> >= 2,
              "at least double buffering at the widest token block");
static_assert(kTokenBoxBytes<16> % kSmemAlign == 0, "every box on a 1024-byte boundary");

// The operands' tensor maps (kernel parameters, aligned as CUtensorMap requires).
struct DecodeMaps {
  CUtensorMap w;  // [n, k] rows of ldw: 64-row x 64-element boxes
  CUtensorMap a;  // [m, k] rows of lda: Width-row x 64-element boxes
};

// The GEMM's scalars of one launch (its operands are in DecodeMaps, the tail's in FusedTail).
struct DecodeOperands {
  int64_t k;
  float alpha;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

// True once the phase of parity `parity` has completed (try_wait suspends a while first).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t.reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t}"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0u;
}

// The box of `map` at (element k, row `row`) into this CTA's shared `dst`, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int k, int row,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_u32(bar))
      : "memory");
}

// Fetches `map` into the TMA unit's descriptor cache ahead of its first copy.
__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Byte offset of 16-byte chunk `c` of row `r` in a 128-byte-swizzled box.
__device__ __forceinline__ int swizzled(int r, int c) {
  return r * kBoxRowBytes + ((c ^ (r & 7)) << 4);
}

__device__ __forceinline__ uint4 lds_v4(const void* p) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_u32(p)));
  return v;
}

// Line `line` of source (rank q, piece sp) at `parity` in a receive buffer: each parity (at
// parity x parity_bytes) holds [source rank][piece][m][n / kFusedLineElements] lines, t.splits
// pieces per rank (the most of any tile).
__device__ __forceinline__ int64_t receive_line(const FusedTail& t, uint32_t parity, int q, int sp,
                                                int64_t line) {
  return int64_t(parity) * (t.parity_bytes / kFusedLineBytes) +
         (int64_t(q) * t.splits + sp) * fused_decode_source_lines(t.m, t.n) + line;
}

// One thread: poll line `p` (already read once into `v`) until it carries `gen`, bounded like
// every wait of the runtime (leading_barrier.cuh's keep_waiting; `start`: one bound for all of
// this thread's waits). False on timeout or when the device has aborted.
__device__ inline bool wait_line(const FusedTail& t, const void* p, uint4& v, uint32_t gen,
                                 uint64_t& start, int tile, int q) {
  while (!line_arrived(v, gen)) {
    if (!keep_waiting(t.abort, t.record, t.timeout_ns, start, kWaitFusedTile, t.rank, tile, q, gen,
                      line_observed(v, gen), 20))
      return false;
    v = ld_line(p);
  }
  return true;
}

// Consumer threads: slice s of the `pieces` slices of tile (nb, tb), summed over every rank's
// pieces of it, lines in this rank's receive buffer, in a fixed order (rank 0.., piece 0..: the
// same bits on every rank), + beta * c + bias, stored to out in 16-byte pieces (two lines).
// False when a wait failed.
template <class Element>
__device__ bool sum_slice(const FusedTail& t, int nb, int tb, int s, int pieces, uint32_t parity,
                          uint32_t gen, int tid, uint64_t& start) {
  const FusedSlice<kFusedTokenTileSmall, kFusedDecodeTileN> sl(t, nb, tb, s, pieces);
  const uint4* recv = static_cast<const uint4*>(t.partial[t.rank]);
  const int srcs = t.tp * pieces;
  const int tile = fused_tile_index(t, nb, tb, s);
  for (int v = sl.begin + tid; v < sl.end; v += kConsumers) {
    const int64_t line = sl.offset(v, t.n) / kFusedLineElements;
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    for (int g0 = 0; g0 < srcs; g0 += kSumSources) {
      const uint4* p[kSumSources];
      uint4 x[kSumSources][2];
#pragma unroll
      for (int i = 0; i < kSumSources; ++i) {
        const int g = g0 + i;
        if (g >= srcs) continue;
        p[i] = recv + receive_line(t, parity, g / pieces, g % pieces, line);
        x[i][0] = ld_line(p[i]);
        x[i][1] = ld_line(p[i] + 1);
      }
#pragma unroll
      for (int i = 0; i < kSumSources; ++i) {
        const int g = g0 + i;
        if (g >= srcs) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (!wait_line(t, p[i] + h, x[i][h], gen, start, tile, g / pieces)) return false;
          const uint32_t words[2] = {x[i][h].x, x[i][h].z};
#pragma unroll
          for (int w = 0; w < 2; ++w) {
            const Element* pair = reinterpret_cast<const Element*>(&words[w]);
            acc[4 * h + 2 * w] += float(pair[0]);
            acc[4 * h + 2 * w + 1] += float(pair[1]);
          }
        }
      }
    }
    store_sum<Element>(t, sl, v, acc);
  }
  return true;
}

// Named barrier of the consumer warps (barrier 0 is __syncthreads).
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"r"(kConsumers) : "memory");
}

template <class Element>
__device__ __forceinline__ void mma_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                          uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Element, __half>, "bf16 or fp16");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// This launch's division of the work (fused_decode_work.hpp): the grid is its CTAs.
__device__ __forceinline__ FusedDecodeWork decode_work(const FusedTail& t, int64_t k) {
  return {uint32_t(t.n_blocks) * uint32_t(t.token_blocks), fused_decode_steps(k), gridDim.x};
}

// The piece of this CTA's share [u, end) that starts at unit u: tile (nb, tb), piece j of the
// tile's `pieces`, its weight rows [row0, row0 + rows_w), token rows [tok0, tok0 + rows_t), K
// range [k0, k1), and `next`, the unit after it. 32-bit divisions only (kFusedDecodeMaxUnits).
struct Piece {
  int nb, tb, j, pieces;
  int64_t row0, tok0;
  int rows_w, rows_t;
  int64_t k0, k1;
  uint32_t next;
  template <int Width>
  __device__ static Piece at(const FusedTail& t, const FusedDecodeWork& w, int64_t k, uint32_t u,
                             uint32_t end) {
    Piece p;
    const uint32_t tile = u / w.steps, tile_u0 = tile * w.steps;
    p.tb = static_cast<int>(tile % uint32_t(t.token_blocks));
    p.nb = static_cast<int>(tile / uint32_t(t.token_blocks));
    p.j = static_cast<int>(blockIdx.x - w.first_cta(tile));
    p.pieces = static_cast<int>(w.pieces(tile));
    p.row0 = int64_t(p.nb) * kFusedDecodeTileN;
    p.tok0 = int64_t(p.tb) * kFusedTokenTileSmall;
    const int64_t rw = t.n - p.row0, rt = t.m - p.tok0;
    p.rows_w = static_cast<int>(rw < kFusedDecodeTileN ? rw : kFusedDecodeTileN);
    p.rows_t = static_cast<int>(rt < Width ? rt : Width);
    p.next = end < tile_u0 + w.steps ? end : tile_u0 + w.steps;
    p.k0 = int64_t(u - tile_u0) * kFusedDecodeKStep;
    const int64_t k1 = int64_t(p.next - tile_u0) * kFusedDecodeKStep;
    p.k1 = k1 < k ? k1 : k;
    return p;
  }
};

// The producer warp (lane 0 issues): every stage of every piece of this CTA, in the consumers'
// order. Stops early when the consumers do (`stop`). Returns only after every stage it issued
// has landed: no copy may still write this CTA's shared memory when it exits, also where the
// consumers stopped without taking them.
template <int Width>
__device__ void produce(const DecodeMaps& maps, int64_t k, const FusedTail& t,
                        unsigned char* stages, uint64_t* full, uint64_t* empty,
                        const volatile uint32_t* stop) {
  constexpr int S = kStages<Width>;
  const FusedDecodeWork w = decode_work(t, k);
  const uint32_t end = w.begin(blockIdx.x + 1);
  uint32_t issued = 0;
  for (uint32_t u = w.begin(blockIdx.x); u < end;) {
    const Piece it = Piece::at<Width>(t, w, k, u, end);
    u = it.next;
    for (int64_t kk = it.k0; kk < it.k1; kk += kStageK, ++issued) {
      const int stage = static_cast<int>(issued % S);
      const uint32_t use = issued / S;
      if (use > 0) {  // the consumers' release of the stage's previous use
        bool stopped = false;
        while (!mbar_try_wait(&empty[stage], (use - 1) & 1u))
          if (*stop) {
            stopped = true;
            break;
          }
        if (stopped) goto drain;
      }
      {
        // Boxes past k are zero-filled by TMA; a piece's range ends on a K step otherwise.
        const int64_t kc = it.k1 - kk < kStageK ? it.k1 - kk : kStageK;
        const int steps = static_cast<int>(fused_decode_steps(kc));
        mbar_arrive_expect_tx(&full[stage], steps * (kWeightBoxBytes + kTokenBoxBytes<Width>));
        unsigned char* sw = stages + stage * kStageBytes<Width>;
        unsigned char* st = sw + kStepsPerStage * kWeightBoxBytes;
        for (int j = 0; j < steps; ++j) {
          const int kj = static_cast<int>(kk) + j * kFusedDecodeKStep;
          tma_load_2d(sw + j * kWeightBoxBytes, &maps.w, kj, static_cast<int>(it.row0),
                      &full[stage]);
          tma_load_2d(st + j * kTokenBoxBytes<Width>, &maps.a, kj, static_cast<int>(it.tok0),
                      &full[stage]);
        }
      }
    }
  }
drain:  // every stage issued has landed (at once where the consumers took them)
  for (uint32_t i = issued > S ? issued - S : 0; i < issued; ++i)
    while (!mbar_try_wait(&full[i % S], (i / S) & 1u)) {
    }
}

// A consumer thread's MMAs on one K step: weight rows 16 mb + g and 16 mb + g + 8 (mb <
// kMBlocks) of the step's weight box `bw`, token rows g + 8f (f < Frags) of its token box `bt`,
// chunks 2q and 2q + 1 of each.
template <class Element, int Width>
__device__ __forceinline__ void consume_step(float (&acc)[kMBlocks][Width / 8][4],
                                             const unsigned char* bw, const unsigned char* bt,
                                             uint32_t valid, int g, int q) {
  constexpr int kFrags = Width / 8;
  uint4 b[kFrags][2];
#pragma unroll
  for (int f = 0; f < kFrags; ++f)
#pragma unroll
    for (int v = 0; v < 2; ++v)
      b[f][v] =
          (valid >> f) & 1u ? lds_v4(bt + swizzled(8 * f + g, 2 * q + v)) : make_uint4(0, 0, 0, 0);
  // The weight fragments of kGroup blocks at a time: all four at once leave the widest token
  // block no registers to spare.
  constexpr int kGroup = kFrags > 2 ? 2 : kMBlocks;
#pragma unroll
  for (int m0 = 0; m0 < kMBlocks; m0 += kGroup) {
    uint4 wa[kGroup][2], wb[kGroup][2];
#pragma unroll
    for (int u = 0; u < kGroup; ++u)
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        wa[u][v] = lds_v4(bw + swizzled(kBlockRows * (m0 + u) + g, 2 * q + v));
        wb[u][v] = lds_v4(bw + swizzled(kBlockRows * (m0 + u) + g + 8, 2 * q + v));
      }
    // MMA i of every (block, fragment) of the group before MMA i + 1 of any: consecutive MMAs
    // are independent.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int v = i / 2, w0 = (i % 2) * 2;
#pragma unroll
      for (int u = 0; u < kGroup; ++u)
#pragma unroll
        for (int f = 0; f < kFrags; ++f)
          mma_16816<Element>(acc[m0 + u][f], word(wa[u][v], w0), word(wb[u][v], w0),
                             word(wa[u][v], w0 + 1), word(wb[u][v], w0 + 1), word(b[f][v], w0),
                             word(b[f][v], w0 + 1));
    }
  }
}

template <class Element, int Width>
__global__ void __launch_bounds__(kThreads, 1)
    fused_decode_kernel(const __grid_constant__ DecodeMaps maps,
                        const __grid_constant__ DecodeOperands p,
                        const __grid_constant__ FusedTail t) {
  constexpr int kFrags = Width / 8;
  constexpr int S = kStages<Width>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* stages = smem_raw + ((kSmemAlign - smem_u32(smem_raw) % kSmemAlign) % kSmemAlign);
  __shared__ __align__(8) uint64_t full[S], empty[S];
  // This CTA's partial of the current piece, rows padded by 16 bytes (fewer bank conflicts).
  __shared__ __align__(16) Element out_tile[Width][kFusedDecodeTileN + 8];
  // The warps' exchange of their sums: [source slot][m16 block][fragment][lane], the slots of a
  // block being its kConsumerWarps - 1 non-owning warps.
  __shared__ float4 exchange[(kConsumerWarps - 1) * kMBlocks * kFrags * 32];
  __shared__ uint32_t gen_smem, live_smem;
  __shared__ volatile uint32_t stop;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (warp == kConsumerWarps && lane == 0) {  // the producer, while thread 0 sets up the ring
    prefetch_map(&maps.w);
    prefetch_map(&maps.a);
  }
  // The producer starts streaming before the abort word and the generation are read (two global
  // round trips): its loads only fill this CTA's shared memory, and a broken communicator stops
  // it before anything is written.
  if (tid == 0) {
    stop = 0u;
    for (int i = 0; i < S; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps);
    }
    // The barriers' initialisation visible to the bulk copies (async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::
                     : "memory");
  }
  __syncthreads();

  if (warp == kConsumerWarps) {
    if (lane == 0) produce<Width>(maps, p.k, t, stages, full, empty, &stop);
  } else {
    if (tid == 0) {
      // A previous launch timed out: the communicator is broken, this launch writes nothing.
      live_smem = aborted(t.abort) ? 0u : 1u;
      gen_smem = fused_launch_generation(t);
      if (!live_smem) stop = 1u;
    }
    consumers_sync();
    const uint32_t gen = gen_smem;
    const uint32_t parity = gen & 1u;
    const int g = lane / 4, q = lane % 4;
    const FusedDecodeWork w = decode_work(t, p.k);
    const uint32_t begin = w.begin(blockIdx.x), end = w.begin(blockIdx.x + 1);
    uint32_t used = 0;
    for (uint32_t u = live_smem ? begin : end; u < end;) {
      const Piece it = Piece::at<Width>(t, w, p.k, u, end);
      u = it.next;
      uint32_t valid = 0;
#pragma unroll
      for (int f = 0; f < kFrags; ++f) valid |= (8 * f + g < it.rows_t ? 1u : 0u) << f;
      float acc[kMBlocks][kFrags][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
#pragma unroll
        for (int f = 0; f < kFrags; ++f)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[mb][f][e] = 0.f;
      for (int64_t kk = it.k0; kk < it.k1; kk += kStageK, ++used) {
        const int stage = static_cast<int>(used % S);
        while (!mbar_try_wait(&full[stage], (used / S) & 1u)) {
        }
        const int64_t kc = it.k1 - kk < kStageK ? it.k1 - kk : kStageK;
        const int steps = static_cast<int>(fused_decode_steps(kc));
        if (warp < steps) {
          const unsigned char* sw = stages + stage * kStageBytes<Width>;
          consume_step<Element, Width>(
              acc, sw + warp * kWeightBoxBytes,
              sw + kStepsPerStage * kWeightBoxBytes + warp * kTokenBoxBytes<Width>, valid, g, q);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[stage]);
      }

      // The sum over the warps' K steps: each warp hands the blocks it does not own to their
      // owners, each owner adds the other warps' sums to its own in slot order (a fixed order).
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb) {
        if (mb == warp) continue;
        const int slot = warp < mb ? warp : warp - 1;
#pragma unroll
        for (int f = 0; f < kFrags; ++f)
          exchange[((slot * kMBlocks + mb) * kFrags + f) * 32 + lane] =
              make_float4(acc[mb][f][0], acc[mb][f][1], acc[mb][f][2], acc[mb][f][3]);
      }
      float own[kFrags][4];
#pragma unroll
      for (int mb = 0; mb < kMBlocks; ++mb)
        if (mb == warp)
#pragma unroll
          for (int f = 0; f < kFrags; ++f)
#pragma unroll
            for (int e = 0; e < 4; ++e) own[f][e] = acc[mb][f][e];
      consumers_sync();
#pragma unroll
      for (int slot = 0; slot < kConsumerWarps - 1; ++slot)
#pragma unroll
        for (int f = 0; f < kFrags; ++f) {
          const float4 o = exchange[((slot * kMBlocks + warp) * kFrags + f) * 32 + lane];
          own[f][0] += o.x;
          own[f][1] += o.y;
          own[f][2] += o.z;
          own[f][3] += o.w;
        }
      // 1. This piece's partial (alpha x the sum, in the element type): own[f] holds rows (g,
      //    g + 8) of block `warp` x tokens (2q, 2q + 1) of fragment f. Through shared memory, so
      //    that it leaves in whole 16-byte pieces instead of 2-byte stores from every thread
      //    into shared lines.
      {
        const int c0 = warp * kBlockRows + g;
#pragma unroll
        for (int f = 0; f < kFrags; ++f)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            out_tile[8 * f + 2 * q + (e & 1)][c0 + (e < 2 ? 0 : 8)] = Element(p.alpha * own[f][e]);
      }
      consumers_sync();
      // Pushed to every rank, the peers first (their stores take longest), in 8-byte pieces of
      // the tile's rows: n is a multiple of 8, so a line is all in or all out.
      {
        constexpr int kLinesPerRow = kFusedDecodeTileN / kFusedLineElements;
        for (int v = tid; v < it.rows_t * kLinesPerRow; v += kConsumers) {
          const int r = v / kLinesPerRow, c = (v % kLinesPerRow) * kFusedLineElements;
          if (c >= it.rows_w) continue;
          const uint2 d = *reinterpret_cast<const uint2*>(&out_tile[r][c]);
          const int64_t line = receive_line(
              t, parity, t.rank, it.j, ((it.tok0 + r) * t.n + it.row0 + c) / kFusedLineElements);
          for (int i = 1; i <= t.tp; ++i) {
            const int dst = (t.rank + i) % t.tp;
            st_line(static_cast<uint4*>(const_cast<void*>(t.partial[dst])) + line, d.x, d.y, gen);
          }
        }
      }
      consumers_sync();  // out_tile is free for the next piece
    }
    // 2. Slice j of each tile this CTA has piece j of, summed over every rank's pieces.
    uint64_t start = 0;
    for (uint32_t u = live_smem ? begin : end; u < end;) {
      const Piece it = Piece::at<Width>(t, w, p.k, u, end);
      u = it.next;
      if (!sum_slice<Element>(t, it.nb, it.tb, it.j, it.pieces, parity, gen, tid, start)) break;
    }
  }

  // 3. The generation.
  __syncthreads();
  if (live_smem) fused_finish_cta(t, gen_smem, tid, kThreads);
}

// cuTensorMapEncodeTiled through the runtime (no libcuda at link time), looked up once.
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const auto fn = device::driver_entry<PFN_cuTensorMapEncodeTiled_v12000>(
      "cuTensorMapEncodeTiled", 12000, "fused decode kernel");
  return fn;
}

// A 2-D bf16/fp16 tensor map of `rows` x `cols` (row stride `ld` elements), boxes of `box_rows`
// x one K step, 128-byte swizzled, out-of-bounds elements read as zero. L2 promotion of 128 bytes,
// a box row: 256 bytes slows the long-K GEMMs (docs/tuning.md).
inline CUtensorMap make_map(const void* base, int64_t rows, int64_t cols, int64_t ld,
                            int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld * 2)};
  const cuuint32_t box[2] = {kFusedDecodeKStep, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(
      &map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, const_cast<void*>(base), dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("fused decode kernel: cuTensorMapEncodeTiled failed (" +
                             std::to_string(int(r)) + ") for a " + std::to_string(rows) + " x " +
                             std::to_string(cols) + " operand with row stride " +
                             std::to_string(ld));
  return map;
}

template <class Element, int Width>
struct DecodeRunner {
  static auto kernel_fn() { return fused_decode_kernel<Element, Width>; }

  static int resident(int device) {
    return fused_occupancy(reinterpret_cast<const void*>(kernel_fn()), kThreads, kSmemBytes<Width>,
                           device)
        .second;
  }

  static void launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream) {
    const int res = resident(device);
    if (f.ctas > res)
      throw std::runtime_error(
          "fused GEMM + all-reduce (decode kernel): ctas=" + std::to_string(f.ctas) +
          " exceeds the " + std::to_string(res) + " CTAs resident at once on device " +
          std::to_string(device) + " (a tile's pieces wait for each other; fused_ctas)");
    const FusedTail t = make_fused_tail(f);
    DecodeOperands p{};
    p.k = f.k;
    p.alpha = f.alpha;
    DecodeMaps maps;
    maps.w = make_map(f.w, f.n, f.k, f.ldw, kFusedDecodeTileN);
    maps.a = make_map(f.a, f.m, f.k, f.lda, Width);
    fused_decode_kernel<Element, Width>
        <<<dim3(unsigned(f.ctas)), dim3(kThreads), kSmemBytes<Width>, stream>>>(maps, p, t);
    DISTGEMM_CUDA_CHECK(cudaGetLastError());
  }
};

// The instantiation for m tokens.
template <class Element, class Fn>
decltype(auto) with_decode_width(int64_t m, Fn&& fn) {
  switch (fused_decode_token_width(m)) {
    case 16:
      return fn(DecodeRunner<Element, 16>{});
    default:
      return fn(DecodeRunner<Element, kFusedTokenTileSmall>{});
  }
}

}  // namespace distgemm::kernel::decode

// The decode kernel's entry points for one dtype (every token width).
#define DISTGEMM_DEFINE_FUSED_DECODE_ENTRY_POINTS(SUFFIX, ELEMENT)                               \
  namespace distgemm::kernel::detail {                                                           \
  void fused_launch_##SUFFIX(const FusedAllReduceDesc& f, int device, cudaStream_t s) {          \
    decode::with_decode_width<ELEMENT>(f.m, [&](auto r) { decltype(r)::launch(f, device, s); }); \
  }                                                                                              \
  int fused_resident_##SUFFIX(int64_t m, int device) {                                           \
    return decode::with_decode_width<ELEMENT>(                                                   \
        m, [&](auto r) { return decltype(r)::resident(device); });                               \
  }                                                                                              \
  }
