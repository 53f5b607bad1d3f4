// The decode kernel of the fused GEMM + all-reduce (fused_allreduce.hpp: up to
// kFusedDecodeMaxTokens tokens). Included only by the translation units in cpp/src/runtime/ that
// instantiate it (one per dtype, every token width in it).
//
// Why not CUTLASS here: at 1..64 tokens the GEMM only streams the weight (each element is used by
// a few tokens), so what counts is bytes in flight per SM, not tensor-core throughput. A warp
// loads its weight rows straight into registers with 16-byte loads that bypass L1, several
// steps ahead, and feeds them to mma.sync m16n8k16 (bf16/fp16 in, fp32 accumulate) as they are;
// no shared-memory round trip, no pipeline barriers.
//
// Layout (swapped, D^T = W X^T): a CTA is 8 warps; warp w owns weight rows 16w..16w+15 of the
// CTA's 128-row tile (the MMA's M side), the tokens of one 64-token block are its N side (Width
// padded tokens: Width/8 n8 fragments), and the CTA covers split s of K (fused_splits). Each of
// a row's 4 threads (lane % 4 = q) loads 16 consecutive K elements of a 64-element K step. MMA j
// (0..3) of the step takes elements 4j..4j+3 of each thread's 16 as its A fragment; the token
// fragment is loaded with the same permutation (token g, the same 16 elements), so the sum over
// K is the same sum in another order. The token block (a few KB) is read through L1, which the 8
// warps share (they read the same tokens for the same K).
//
// After the mainloop each CTA:
//   1. stores its fp32 partial (split s) into this rank's scratch and releases local flag
//      (tile, s);
//   2. waits for the local flags of every split of its tile, sums slice s of the tile over the
//      splits in a fixed order (x alpha) into this rank's partial buffer of this launch's parity
//      (the element type: the one tile that crosses NVLink), and releases flag (tile, s) on every
//      rank;
//   3. waits for flag (tile, s) of every rank and sums slice s over the ranks (+ beta * c + bias)
//      into the output (fused_tail.cuh's reduce_slice: the same code as the CUTLASS kernel's);
//   4. the last CTA to finish advances the generation.
// The CTAs of a tile wait for each other, so the launch never has more CTAs than fit at once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <type_traits>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/fused_tail.cuh"

namespace distgemm::kernel::decode {

inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kRowsPerWarp = 16;
static_assert(kWarps * kRowsPerWarp == kFusedTileN, "a CTA's warps cover one output tile's N");
static_assert(kThreads == 256, "reduce_slice's thread count");
// 16-byte loads in flight per thread in the sums over splits (two per split) and over ranks.
inline constexpr int kSplitsInFlight = 4;
inline constexpr int kTailLoads = 8;

// The GEMM operands of one launch (the tail's are in FusedTail).
struct DecodeOperands {
  const void* w;  // [n, k], ldw
  const void* a;  // [m, k], lda
  int64_t ldw, lda, k;
  float* scratch;  // this rank's fp32 split partials [splits][m][n]
  float alpha;
};

// Weight: read once, so it does not displace the token block from L1.
__device__ __forceinline__ uint4 ld_stream_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Tokens: read by every warp of the CTA, kept in L1.
__device__ __forceinline__ uint4 ld_cached_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
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

// K steps per batch of weight loads in flight per thread (4 x 16 bytes each) and CTAs per SM the
// registers are budgeted for (launch bounds): as many bytes in flight per SM as the
// accumulators leave registers for, without spills (-Xptxas -v): 16 tokens two CTAs of two
// steps, 32 and 64 tokens (more than 128 registers a thread) one CTA of four and two steps.
template <int Width>
inline constexpr int kStepsPerBatch = Width == 32 ? 4 : 2;
template <int Width>
inline constexpr int kMinCtasPerSm = Width <= 16 ? 2 : 1;

// One K step on weight rows g and g + 8 (`ra`, `rb`: two vectors of 8 elements each): per token
// fragment f, its token g's same two vectors (at `tok` + f * tok_stride) and 4 MMAs. Token
// loads are guarded when `Guard` (the split's last steps: `k_left` elements of K from this
// thread's first; k is a multiple of 8, so a vector is all in or all out); `valid` has a bit per
// fragment whose token g is inside m.
template <class Element, int Frags, bool Guard>
__device__ __forceinline__ void mma_step(float (&acc)[Frags][4], const uint4 (&ra)[2],
                                         const uint4 (&rb)[2], const Element* tok,
                                         int64_t tok_stride, uint32_t valid, int k_left) {
#pragma unroll
  for (int f = 0; f < Frags; ++f) {
    uint4 b[2];
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const bool in = ((valid >> f) & 1u) && (!Guard || 8 * v < k_left);
      b[v] = in ? ld_cached_v4(tok + f * tok_stride + 8 * v) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int v = j / 2, w0 = (j % 2) * 2;
      mma_16816<Element>(acc[f], word(ra[v], w0), word(rb[v], w0), word(ra[v], w0 + 1),
                         word(rb[v], w0 + 1), word(b[v], w0), word(b[v], w0 + 1));
    }
  }
}

template <class Element, int Width>
__global__ void __launch_bounds__(kThreads, kMinCtasPerSm<Width>)
    fused_decode_kernel(const DecodeOperands p, const FusedTail t) {
  constexpr int kFrags = Width / 8;
  constexpr int kBatch = kStepsPerBatch<Width>;
  __shared__ uint32_t word_smem;
  if (aborted(t.abort)) return;  // a previous launch timed out: the communicator is broken
  if (threadIdx.x == 0) word_smem = fused_launch_generation(t);
  __syncthreads();
  const uint32_t gen = word_smem;
  const uint32_t parity = gen & 1u;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  // Work items (tile, split): one per CTA, or, where the tiles outnumber the CTAs that fit at
  // once (then with one split, fused_splits), round after round; every rank runs the same
  // rounds, so a tile's flags never wait on a later round.
  const int items = t.n_blocks * t.token_blocks * t.splits;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int tb = item % t.token_blocks;
    const int nb = (item / t.token_blocks) % t.n_blocks;
    const int s = item / (t.token_blocks * t.n_blocks);

    // This thread's weight rows (clamped into the matrix; rows past n are computed, not stored),
    // token rows (a bit per fragment: token inside m) and K steps [st0, st1).
    const int64_t col_a = int64_t(nb) * kFusedTileN + warp * kRowsPerWarp + g, col_b = col_a + 8;
    const Element* w = static_cast<const Element*>(p.w);
    const Element* wa = w + (col_a < t.n ? col_a : t.n - 1) * p.ldw + 16 * q;
    const Element* wb = w + (col_b < t.n ? col_b : t.n - 1) * p.ldw + 16 * q;
    const int64_t tok0 = int64_t(tb) * kFusedTokenTileSmall + g;
    const Element* a_row = static_cast<const Element*>(p.a) + tok0 * p.lda + 16 * q;
    uint32_t valid = 0;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) valid |= (tok0 + 8 * f < t.m ? 1u : 0u) << f;
    const int k = static_cast<int>(p.k), steps = (k + kFusedDecodeKStep - 1) / kFusedDecodeKStep;
    const int st0 = steps * s / t.splits, st1 = steps * (s + 1) / t.splits;
    const int full_end = k / kFusedDecodeKStep < st1 ? k / kFusedDecodeKStep : st1;
    const int64_t tok_stride = 8 * p.lda;

    float acc[kFrags][4];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][e] = 0.f;

    int st = st0;
    wa += st0 * kFusedDecodeKStep;
    wb += st0 * kFusedDecodeKStep;
    a_row += st0 * kFusedDecodeKStep;
    for (; st + kBatch <= full_end; st += kBatch) {
      uint4 ra[kBatch][2], rb[kBatch][2];  // every weight load of the batch in flight at once
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
#pragma unroll
        for (int v = 0; v < 2; ++v) {
          ra[u][v] = ld_stream_v4(wa + u * kFusedDecodeKStep + 8 * v);
          rb[u][v] = ld_stream_v4(wb + u * kFusedDecodeKStep + 8 * v);
        }
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        mma_step<Element, kFrags, false>(acc, ra[u], rb[u], a_row + u * kFusedDecodeKStep,
                                         tok_stride, valid, 0);
      wa += kBatch * kFusedDecodeKStep;
      wb += kBatch * kFusedDecodeKStep;
      a_row += kBatch * kFusedDecodeKStep;
    }
    for (; st < st1; ++st) {  // the last steps: fewer than a batch, the last one maybe partial
      const int k_left = k - st * kFusedDecodeKStep - 16 * q;
      uint4 ra[2], rb[2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        ra[v] = 8 * v < k_left ? ld_stream_v4(wa + 8 * v) : make_uint4(0, 0, 0, 0);
        rb[v] = 8 * v < k_left ? ld_stream_v4(wb + 8 * v) : make_uint4(0, 0, 0, 0);
      }
      mma_step<Element, kFrags, true>(acc, ra, rb, a_row, tok_stride, valid, k_left);
      wa += kFusedDecodeKStep;
      wb += kFusedDecodeKStep;
      a_row += kFusedDecodeKStep;
    }

    // 1. This split's fp32 partial: acc[f] = rows (g, g + 8) x tokens (2q, 2q + 1) of fragment f.
    {
      float* scr = p.scratch + int64_t(s) * t.m * t.n;
#pragma unroll
      for (int f = 0; f < kFrags; ++f) {
        const int64_t tok = int64_t(tb) * kFusedTokenTileSmall + 8 * f + 2 * q;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t row = tok + (e & 1), col = e < 2 ? col_a : col_b;
          if (row < t.m && col < t.n) scr[row * t.n + col] = acc[f][e];
        }
      }
    }
    const int idx = fused_tile_index(t, nb, tb, s);
    __syncthreads();
    if (tid == 0) {
      __threadfence();
      st_release_sys(fused_flag(t, t.rank, kFusedLocalSection, idx), gen);
      uint64_t start = 0;
      bool ok = true;
      for (int sp = 0; sp < t.splits && ok; ++sp) {
        const int i = fused_tile_index(t, nb, tb, sp);
        ok =
            wait_fused_flag(t, fused_flag(t, t.rank, kFusedLocalSection, i), i, t.rank, gen, start);
      }
      word_smem = ok ? 1u : 0u;
    }
    __syncthreads();
    bool ok = word_smem != 0u;
    __syncthreads();  // every thread has read the word before it is rewritten

    // 2. Slice s of the tile summed over the splits (fixed order) into this rank's partial.
    if (ok) {
      const FusedSlice<kFusedTokenTileSmall> sl(t, nb, tb, s);
      Element* mine = static_cast<Element*>(const_cast<void*>(t.partial[t.rank])) +
                      int64_t(parity) * t.parity_elems;
      const int64_t split_floats = t.m * t.n;
      for (int64_t v = sl.begin + tid; v < sl.end; v += kThreads) {
        const int64_t off = sl.offset(v, t.n);
        float sum[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        for (int s0 = 0; s0 < t.splits; s0 += kSplitsInFlight) {
          uint4 x[kSplitsInFlight][2];  // loads first, then the sums in split order
#pragma unroll
          for (int i = 0; i < kSplitsInFlight; ++i)
            if (s0 + i < t.splits) {
              x[i][0] = ld_volatile_v4(p.scratch + (s0 + i) * split_floats + off);
              x[i][1] = ld_volatile_v4(p.scratch + (s0 + i) * split_floats + off + 4);
            }
#pragma unroll
          for (int i = 0; i < kSplitsInFlight; ++i)
            if (s0 + i < t.splits) {
              const float* xf = reinterpret_cast<const float*>(&x[i][0]);
#pragma unroll
              for (int e = 0; e < 8; ++e) sum[e] += xf[e];
            }
        }
        uint4 ov;
        Element* oe = reinterpret_cast<Element*>(&ov);
#pragma unroll
        for (int e = 0; e < 8; ++e) oe[e] = Element(p.alpha * sum[e]);
        *reinterpret_cast<uint4*>(mine + off) = ov;
      }
      __syncthreads();
      if (tid == 0) {
        __threadfence_system();
        for (int r = 0; r < t.tp; ++r) st_release_sys(fused_flag(t, r, t.rank, idx), gen);
        // 3. Every rank's slice s of the tile.
        uint64_t start = 0;
        for (int r = 0; r < t.tp && ok; ++r)
          ok = wait_fused_flag(t, fused_flag(t, t.rank, r, idx), idx, r, gen, start);
        word_smem = ok ? 1u : 0u;
      }
      __syncthreads();
      ok = word_smem != 0u;
      if (ok) reduce_slice<Element, kFusedTokenTileSmall, kTailLoads>(t, nb, tb, s, parity, tid);
    }
    if (!ok) break;
    __syncthreads();  // the shared word is reused by the next item
  }

  // 4. The generation.
  __syncthreads();
  if (tid == 0) fused_finish_cta(t, gen);
}

template <class Element, int Width>
struct DecodeRunner {
  static auto kernel_fn() { return fused_decode_kernel<Element, Width>; }

  static int resident(int device) {
    return fused_occupancy(reinterpret_cast<const void*>(kernel_fn()), kThreads, 0, device).second;
  }

  static void launch(const FusedAllReduceDesc& f, int device, cudaStream_t stream) {
    const int res = resident(device);
    const int64_t esize = 2;  // bf16 / fp16
    const FusedTail t = make_fused_tail(f, kFusedTokenTileSmall, 1);
    const int64_t items = int64_t(t.n_blocks) * t.token_blocks * f.splits;
    if (items > res && f.splits > 1)
      throw std::runtime_error("fused GEMM + all-reduce (decode kernel): " + std::to_string(items) +
                               " tiles x splits exceed the " + std::to_string(res) +
                               " CTAs resident at once with splits=" + std::to_string(f.splits) +
                               " (the splits of a tile wait for each other; fused_splits)");
    const int64_t ctas = items < res ? items : res;
    DecodeOperands p{};
    p.w = f.w;
    p.a = f.a;
    p.ldw = f.ldw;
    p.lda = f.lda;
    p.k = f.k;
    p.scratch = reinterpret_cast<float*>(static_cast<char*>(f.partial[f.rank]) +
                                         fused_decode_scratch_offset_bytes(f.m, f.n, esize));
    p.alpha = f.alpha;
    fused_decode_kernel<Element, Width><<<dim3(unsigned(ctas)), dim3(kThreads), 0, stream>>>(p, t);
    DISTGEMM_CUDA_CHECK(cudaGetLastError());
  }
};

// The instantiation for m tokens.
template <class Element, class Fn>
decltype(auto) with_decode_width(int64_t m, Fn&& fn) {
  switch (fused_decode_token_width(m)) {
    case 16:
      return fn(DecodeRunner<Element, 16>{});
    case 32:
      return fn(DecodeRunner<Element, 32>{});
    default:
      return fn(DecodeRunner<Element, 64>{});
  }
}

}  // namespace distgemm::kernel::decode

// The decode kernel's entry points for one dtype (every token width).
#define DISTGEMM_DEFINE_FUSED_DECODE_ENTRY_POINTS(SUFFIX, ELEMENT)                               \
  namespace distgemm::kernel::detail {                                                           \
  std::string fused_can_implement_##SUFFIX(const FusedAllReduceDesc&) { return ""; }             \
  void fused_launch_##SUFFIX(const FusedAllReduceDesc& f, int device, cudaStream_t s) {          \
    decode::with_decode_width<ELEMENT>(f.m, [&](auto r) { decltype(r)::launch(f, device, s); }); \
  }                                                                                              \
  int fused_resident_##SUFFIX(int64_t m, int device) {                                           \
    return decode::with_decode_width<ELEMENT>(                                                   \
        m, [&](auto r) { return decltype(r)::resident(device); });                               \
  }                                                                                              \
  }
