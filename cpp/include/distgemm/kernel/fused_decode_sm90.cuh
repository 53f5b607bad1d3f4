// The decode kernel of the fused GEMM + all-reduce (fused_allreduce.hpp: up to
// kFusedDecodeMaxTokens tokens). Included only by the translation units in cpp/src/runtime/ that
// instantiate it (one per dtype, every token width in it).
//
// Why not CUTLASS here: at 1..64 tokens the GEMM only streams the weight (each element is used by
// a few tokens), so what counts is bytes in flight per SM, not tensor-core throughput. Each
// thread copies the weight bytes it multiplies into a ring of kDecodeStages K steps in shared
// memory with 16-byte cp.async.cg (L2 only, asynchronous), kDecodeStages - 1 steps ahead of the
// step it computes, and reads them back itself: no barrier, not even between the lanes of a
// warp, and the copies stay in flight while the thread waits on its MMAs (mma.sync m16n8k16,
// bf16/fp16 in, fp32 accumulate) and its token loads.
//
// Layout (swapped, D^T = W X^T): a CTA is 8 warps; warp w owns weight rows 16w..16w+15 of the
// CTA's 128-row tile (the MMA's M side), the tokens of one 64-token block are its N side (Width
// padded tokens: Width/8 n8 fragments), and the CTA covers split s of K (fused_splits). Each of
// a row's 4 threads (lane % 4 = q) takes 16 consecutive K elements of a 64-element K step of
// rows g and g + 8 (g = lane / 4): four 16-byte vectors. MMA j (0..3) of the step takes elements
// 4j..4j+3 of each thread's 16 as its A fragment; the token fragment is loaded with the same
// permutation (token g, the same 16 elements), so the sum over K is the same sum in another
// order. The ring holds vector v of lane l of a warp's stage at 16 * (32 v + l) bytes, so both
// the copies in and the 16-byte reads back cover 512 contiguous bytes per warp (no bank
// conflicts). The token block (a few KB per step) is read through L1, which the 8 warps share
// (they read the same tokens for the same K).
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

// The weight ring: kDecodeStages K steps of a warp's 16 rows (2 KB each; all but one in flight
// while one is computed) per warp, one CTA an SM: 11 K steps of the SM's 128 rows in flight,
// 176 KB, three times what keeps HBM busy at ~1.5 us loaded latency (4.8 TB/s / 132 SMs x 1.5 us
// = 55 KB), so the SM keeps streaming while its warps wait on their MMAs and token loads. One
// CTA of 192 KB rather than two of 96 KB: the registers of the MMAs and the tail (255 a thread)
// fit without spills at every width (-Xptxas -v); at 128 a thread even 16 tokens spill.
inline constexpr int kDecodeStages = 12;
inline constexpr int kDecodeCtasPerSm = 1;
inline constexpr int kStageBytesPerWarp = kRowsPerWarp * kFusedDecodeKStep * 2;
inline constexpr int kDecodeSmemBytes = kWarps * kDecodeStages * kStageBytesPerWarp;
static_assert(kStageBytesPerWarp == 4 * 32 * 16, "a stage is 4 16-byte vectors per lane");

// 16 bytes global -> shared, L2 only; `bytes` 0 fills the 16 bytes with zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(gmem), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Every group of this thread but the newest `Pending` has landed in shared memory.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(Pending) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_v4(uint32_t smem) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem)
               : "memory");
  return v;
}

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
__global__ void __launch_bounds__(kThreads, kDecodeCtasPerSm)
    fused_decode_kernel(const DecodeOperands p, const FusedTail t) {
  constexpr int kFrags = Width / 8;
  constexpr int S = kDecodeStages;
  extern __shared__ uint4 decode_ring[];  // [warp][stage][vector][lane]
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
    const int k = static_cast<int>(p.k), steps = (k + kFusedDecodeKStep - 1) / kFusedDecodeKStep;
    const int st0 = steps * s / t.splits, st1 = steps * (s + 1) / t.splits;
    const Element* wa =
        w + (col_a < t.n ? col_a : t.n - 1) * p.ldw + 16 * q + int64_t(st0) * kFusedDecodeKStep;
    const Element* wb =
        w + (col_b < t.n ? col_b : t.n - 1) * p.ldw + 16 * q + int64_t(st0) * kFusedDecodeKStep;
    const int64_t tok0 = int64_t(tb) * kFusedTokenTileSmall + g;
    const Element* a_row =
        static_cast<const Element*>(p.a) + tok0 * p.lda + 16 * q + int64_t(st0) * kFusedDecodeKStep;
    uint32_t valid = 0;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) valid |= (tok0 + 8 * f < t.m ? 1u : 0u) << f;
    const int full_end = k / kFusedDecodeKStep < st1 ? k / kFusedDecodeKStep : st1;
    const int64_t tok_stride = 8 * p.lda;
    // This thread's vector 0 of stage 0; vector v of stage u is 512 v + kStageBytesPerWarp u on.
    const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(decode_ring)) +
                          warp * S * kStageBytesPerWarp + lane * 16;
    const int n_steps = st1 - st0;
    // Step i of the split into ring stage `dst`: this thread's four vectors, those past k
    // zero-filled (k is a multiple of 8, so a vector is all in or all out).
    auto copy_step = [&](int i, uint32_t dst) {
      const int k_left = k - (st0 + i) * kFusedDecodeKStep - 16 * q;
      const int64_t off = int64_t(i) * kFusedDecodeKStep;
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const bool in = 8 * v < k_left;
        cp_async_16(dst + 512 * v, in ? wa + off + 8 * v : wa, in ? 16 : 0);
        cp_async_16(dst + 512 * (2 + v), in ? wb + off + 8 * v : wb, in ? 16 : 0);
      }
    };
    constexpr uint32_t kRingBytes = S * kStageBytesPerWarp;
    auto next_stage = [&](uint32_t a) {
      return a + kStageBytesPerWarp == ring + kRingBytes ? ring : a + kStageBytesPerWarp;
    };

    float acc[kFrags][4];
#pragma unroll
    for (int f = 0; f < kFrags; ++f)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[f][e] = 0.f;

    // One commit group per step (empty past the split's end), so that wait_group<S - 2> always
    // means "step i has landed". Step i is in stage i % S: `rd` is step i's, `wr` step
    // i + S - 1's (the stage this thread read, and fed to its MMAs, one step before).
#pragma unroll
    for (int i = 0; i < S - 1; ++i) {
      if (i < n_steps) copy_step(i, ring + i * kStageBytesPerWarp);
      cp_async_commit();
    }
    uint32_t rd = ring, wr = ring + (S - 1) * kStageBytesPerWarp;
#pragma unroll 1
    for (int i = 0; i < n_steps; ++i) {
      cp_async_wait<S - 2>();
      uint4 ra[2], rb[2];
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        ra[v] = ld_shared_v4(rd + 512 * v);
        rb[v] = ld_shared_v4(rd + 512 * (2 + v));
      }
      if (i + S - 1 < n_steps) copy_step(i + S - 1, wr);
      cp_async_commit();
      rd = next_stage(rd);
      wr = next_stage(wr);
      const Element* tok = a_row + int64_t(i) * kFusedDecodeKStep;
      if (st0 + i < full_end) {
        mma_step<Element, kFrags, false>(acc, ra, rb, tok, tok_stride, valid, 0);
      } else {  // the last step of K, partial
        const int k_left = k - (st0 + i) * kFusedDecodeKStep - 16 * q;
        mma_step<Element, kFrags, true>(acc, ra, rb, tok, tok_stride, valid, k_left);
      }
    }
    cp_async_wait<0>();  // nothing in flight into the ring when the next item refills it

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
    return fused_occupancy(reinterpret_cast<const void*>(kernel_fn()), kThreads, kDecodeSmemBytes,
                           device)
        .second;
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
    fused_decode_kernel<Element, Width>
        <<<dim3(unsigned(ctas)), dim3(kThreads), kDecodeSmemBytes, stream>>>(p, t);
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
