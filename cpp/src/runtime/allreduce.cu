// The one-shot and two-shot all-reduce kernels (kernel/allreduce.hpp: the protocols, the parity
// argument and the host rules), flag and LL, instantiated for bf16 and fp16, their dispatch and
// boundary checks. No CUTLASS.
//
// Flag kernel (one_shot, two_shot), per CTA c (slot c), one launch:
//   0. thread 0 reads the abort word (a previous launch timed out: write nothing) and the
//      generation (its control word + 1);
//   1. push: its slice(s) into the peers' receive buffers (plain 16-byte stores), a CTA barrier,
//      then thread 0 fences (fence.acq_rel.sys: the barrier ordered every thread's stores before
//      it) and sets flag [phase 0][source me][c] to the generation on each destination;
//   2. threads 0..tp-1 wait (bounded) for the peers' flags of slot c in this rank's control
//      region, a CTA barrier, then every thread reads the peers' data from its own receive
//      buffer with ld.global.cg (never a stale L1 line of an earlier launch) and sums over ranks
//      0..tp-1 in float32 (its own data from src);
//   two_shot only: 3. the sum of its own chunk's slice is pushed to every peer (area 2) and
//      flagged [phase 1][source me][c]; 4. the peers' sums of their chunks' slice c are waited for
//      and copied into out. In steps 1 and 4 of two_shot (flag and LL) a thread loads its
//      vector or line of every peer's chunk before it stores or waits on any, so it waits one
//      load latency per index, not tp - 1;
//   5. a CTA barrier, then the generation words advance (the fused kernels' scheme).
// LL kernel (one_shot_ll, two_shot_ll): steps 0 and 5 the same; in between each thread works on
// its own lines (8 bytes of data each) with no CTA barrier: it pushes its lines of the slice(s)
// to the peers as LL lines tagged with the generation, then polls (bounded, wait_line) the lines
// it sums in its own receive buffer until each carries the generation, sums in rank order and
// (two_shot_ll) pushes its sums as lines, and after a CTA barrier (every piece of the CTA's
// slice of its own chunk arrived) polls the peers' sums the same way. A thread whose wait fails
// stops pushing (a peer never sees a line of this launch that holds no sum).
// two_shot_pull: steps 0 and 5 the same; the inputs are read where they lie, in the ranks'
// receive buffers (allreduce.hpp), see two_shot_pull.
// In place (out == src) is safe: CTA c alone reads and writes slice c of every chunk, and reads
// each element of src before the same thread (or, after a barrier, the same CTA) writes it (LL:
// the same thread, since every loop over a slice gives a thread the same indices).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/allreduce.hpp"
#include "distgemm/kernel/fused_tail.cuh"  // ld_partial_v4, fused_occupancy
#include "distgemm/kernel/leading_barrier.cuh"
#include "distgemm/kernel/ll_line.cuh"

namespace distgemm::kernel {

namespace {

// What the kernel needs of one launch (AllReduceDesc, flattened for the device).
struct AllReduceArgs {
  const uint4* src;
  uint4* out;
  uint4* receive[kMaxDevices];
  uint4* shared_out[kMaxDevices];  // two_shot_pull: every rank's out, or all null
  uint32_t* control[kMaxDevices];
  uint32_t* abort;
  ErrorRecord* record;
  int64_t vecs;         // numel / 8 (LL: 2 x vecs lines)
  int64_t chunk_vecs;   // two_shot: allreduce_chunk_elems / 8
  int64_t parity_vecs;  // parity_bytes / 16 (16-byte vectors or LL lines)
  uint64_t timeout_ns;
  int tp, rank;
};

template <class Element>
struct Convert;
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Convert<__half> {
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
};

// acc[i] += element i of `v` (a 16-byte vector: 8 elements; an LL line's data words: 4).
template <class Element, int N, class Vec>
__device__ __forceinline__ void add_elems(float (&acc)[N], const Vec& v) {
  static_assert(sizeof(Vec) == N * sizeof(Element), "one accumulator per element of v");
  const Element* e = reinterpret_cast<const Element*>(&v);
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i] += Convert<Element>::to_float(e[i]);
}

// The accumulators rounded to the element type, as a vector of N elements.
template <class Element, class Vec, int N>
__device__ __forceinline__ Vec round_elems(const float (&acc)[N]) {
  static_assert(sizeof(Vec) == N * sizeof(Element), "one accumulator per element of the result");
  Vec v;
  Element* e = reinterpret_cast<Element*>(&v);
#pragma unroll
  for (int i = 0; i < N; ++i) e[i] = Convert<Element>::from_float(acc[i]);
  return v;
}

// The sum of x[0..tp-1] (8 elements each) in float32, in rank order, rounded to Element.
template <class Element>
__device__ __forceinline__ uint4 sum_in_rank_order(const uint4 (&x)[kMaxDevices], int tp) {
  float acc[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
  for (int q = 0; q < kMaxDevices; ++q)
    if (q < tp) add_elems<Element>(acc, x[q]);
  return round_elems<Element, uint4>(acc);
}

// Vectors [begin, end) of slice `cta` of `vecs` vectors over the grid: the same cut on every rank
// and at every launch of the same numel.
struct Slice {
  int64_t begin, end;
  __device__ Slice(int64_t vecs, int cta, int ctas)
      : begin(vecs * cta / ctas), end(vecs * (cta + 1) / ctas) {}
};

// two_shot: slice `cta` of rank r's chunk of a vector of `units` units (vectors or LL lines) cut
// in chunks of `chunk` units; a chunk ends at the vector's end.
__device__ inline Slice chunk_slice(int64_t units, int64_t chunk, int r, int cta, int ctas) {
  int64_t len = units - r * chunk;
  len = len < 0 ? 0 : (len > chunk ? chunk : len);
  return Slice(len, cta, ctas);
}

// two_shot: slice `cta` of every peer's chunk, units [begin[i], end[i]) of peer (rank + i) % tp's
// (i = 1..tp-1), and the most units of any of them: what a thread walks when it handles unit k of
// every peer's slice at once (its loads first, then its stores or waits).
struct PeerSlices {
  int64_t begin[kMaxDevices], end[kMaxDevices], longest = 0;
  __device__ PeerSlices(int rank, int tp, int64_t units, int64_t chunk, int cta, int ctas) {
#pragma unroll
    for (int i = 0; i < kMaxDevices; ++i) {
      begin[i] = end[i] = 0;
      if (i > 0 && i < tp) {
        const Slice s = chunk_slice(units, chunk, (rank + i) % tp, cta, ctas);
        begin[i] = s.begin, end[i] = s.end;
        longest = s.end - s.begin > longest ? s.end - s.begin : longest;
      }
    }
  }
  // Whether peer i (1..tp-1) has a unit k in its slice.
  __device__ bool has(int i, int64_t k) const { return begin[i] + k < end[i]; }
};

// This rank's receive buffer of this launch's parity, as seen from here, of rank q.
__device__ __forceinline__ uint4* receive_of(const AllReduceArgs& a, int q, uint32_t parity) {
  return a.receive[q] + int64_t(parity) * a.parity_vecs;
}

__device__ __forceinline__ uint32_t* flag_of(const AllReduceArgs& a, int q, int phase, int source,
                                             int slot) {
  return a.control[q] + allreduce_flag_word(phase, source, slot);
}

// Thread 0, after a CTA barrier that follows this CTA's pushes of `phase`: flag [phase][me][slot]
// set to `gen` on every peer (one fence covers them all).
__device__ __forceinline__ void signal_peers(const AllReduceArgs& a, int phase, int slot,
                                             uint32_t gen) {
  fence_acq_rel_sys();
  for (int i = 1; i < a.tp; ++i)
    st_relaxed_sys(flag_of(a, (a.rank + i) % a.tp, phase, a.rank, slot), gen);
}

// Whole CTA: threads 0..tp-1 (but this rank's) each wait for peer tid's flag [phase][tid][slot]
// to reach `gen`, then a CTA barrier. False on timeout or when the device has aborted.
__device__ inline bool wait_peers(const AllReduceArgs& a, int phase, int slot, uint32_t gen,
                                  uint32_t* ok) {
  const int q = threadIdx.x;
  if (q < a.tp && q != a.rank) {
    uint64_t start = 0;
    if (!wait_reached(flag_of(a, a.rank, phase, q, slot), gen, a.abort, a.record, a.timeout_ns,
                      start, kWaitAllReduce, a.rank, phase * kAllReduceMaxCtas + slot, q, 20))
      *ok = 0u;
  }
  __syncthreads();
  return *ok != 0u;
}

// Threads of the CTA: out[v] = the sum over ranks 0..tp-1 of vector v (this rank's from `own`,
// a peer q's from `peer + q * stride`) for v in the slice; with `push`, the sum also goes to
// `push_to + q_vec` on every peer (two_shot's area 2).
template <class Element>
__device__ inline void sum_slice(const AllReduceArgs& a, const Slice& s, const uint4* own,
                                 const uint4* peer, int64_t stride, uint4* out, int64_t push_offset,
                                 uint32_t parity, bool push) {
  for (int64_t v = s.begin + threadIdx.x; v < s.end; v += kAllReduceThreads) {
    uint4 x[kMaxDevices];
#pragma unroll
    for (int q = 0; q < kMaxDevices; ++q)
      if (q < a.tp) x[q] = q == a.rank ? own[v] : ld_partial_v4(peer + q * stride + v);
    const uint4 y = sum_in_rank_order<Element>(x, a.tp);
    out[v] = y;
    if (push)
      for (int i = 1; i < a.tp; ++i)
        receive_of(a, (a.rank + i) % a.tp, parity)[push_offset + v] = y;
  }
}

// Whole CTA, at entry: false when the device has aborted (a previous launch timed out: the
// communicator is broken, write nothing), else true with this launch's generation (the CTA's
// control word + 1).
__device__ __forceinline__ bool begin_launch(const AllReduceArgs& a, uint32_t& gen) {
  __shared__ uint32_t gen_s, live_s;
  // A chained launch (AllReduceDesc::chained) starts while the kernel before it ends: wait for
  // it to complete and its writes (the input, a previous launch's generation) to be visible.
  // Without programmatic dependent launch this returns at once.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  if (threadIdx.x == 0) {
    live_s = aborted(a.abort) ? 0u : 1u;
    gen_s = *reinterpret_cast<volatile uint32_t*>(a.control[a.rank] + blockIdx.x) + 1u;
  }
  __syncthreads();
  gen = gen_s;
  return live_s != 0u;
}

// Whole CTA, at the end: the generation, into this CTA's word and, by CTA 0, the slots the grid
// leaves unused. Plain stores: the next launch on the stream reads them after this one has ended.
__device__ __forceinline__ void finish_launch(const AllReduceArgs& a, uint32_t gen) {
  __syncthreads();
  uint32_t* words = a.control[a.rank];
  if (threadIdx.x == 0) words[blockIdx.x] = gen;
  if (blockIdx.x == 0)
    for (int i = gridDim.x + threadIdx.x; i < kAllReduceMaxCtas; i += kAllReduceThreads)
      words[i] = gen;
}

// Threads of the CTA: the peers' sums of their chunks' slices (`p`) from `sums`, laid out as the
// vector (chunk r at r * chunk_vecs), into out; each thread loads its vector of every peer's
// slice before it stores any (two_shot's step 4, two_shot_pull's last step).
__device__ inline void copy_peer_sums(const AllReduceArgs& a, const PeerSlices& p,
                                      const uint4* sums) {
  const int64_t cv = a.chunk_vecs;
  for (int64_t k = threadIdx.x; k < p.longest; k += kAllReduceThreads) {
    uint4 x[kMaxDevices];
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i)
      if (p.has(i, k)) x[i] = ld_partial_v4(sums + ((a.rank + i) % a.tp) * cv + p.begin[i] + k);
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i)
      if (p.has(i, k)) a.out[((a.rank + i) % a.tp) * cv + p.begin[i] + k] = x[i];
  }
}

// two_shot_pull (allreduce.hpp), per CTA c (slot c), between the flag kernel's steps 0 and 5. The
// ranks' inputs lie at the start of their receive buffers; with shared outputs the sums go
// straight into every rank's out (uniform over the grid: a.shared_out[0] is set or not).
template <class Element>
__device__ inline void two_shot_pull(const AllReduceArgs& a, uint32_t gen, uint32_t* ok) {
  const int tid = threadIdx.x, cta = blockIdx.x, ctas = gridDim.x;
  const int64_t cv = a.chunk_vecs, base = a.rank * cv;
  const bool shared = a.shared_out[0] != nullptr;
  // 1. Arrival: this rank's input was written by work that completed before this kernel began.
  if (tid == 0)
    for (int i = 1; i < a.tp; ++i)
      st_relaxed_sys(flag_of(a, (a.rank + i) % a.tp, 0, a.rank, cta), gen);
  if (!wait_peers(a, 0, cta, gen, ok)) return;
  // 2. Slice c of this rank's chunk from every rank's input, summed in rank order; the sum to out
  // and over every peer's input of the slice (read here only).
  const Slice s = chunk_slice(a.vecs, cv, a.rank, cta, ctas);
  for (int64_t v = s.begin + tid; v < s.end; v += kAllReduceThreads) {
    uint4 x[kMaxDevices];
#pragma unroll
    for (int q = 0; q < kMaxDevices; ++q)
      if (q < a.tp) x[q] = ld_partial_v4(a.receive[q] + base + v);
    const uint4 y = sum_in_rank_order<Element>(x, a.tp);
    a.out[base + v] = y;
    for (int i = 1; i < a.tp; ++i) {
      const int q = (a.rank + i) % a.tp;
      (shared ? a.shared_out[q] : a.receive[q])[base + v] = y;
    }
  }
  __syncthreads();
  if (tid == 0) signal_peers(a, 1, cta, gen);
  // 3. The peers' sums of their chunks' slice c: in out already (shared outputs, or out is this
  // rank's buffer: in place on the input), or stored into this rank's buffer and copied into
  // out (every load issued before any store, as the flag kernel's step 4).
  if (!wait_peers(a, 1, cta, gen, ok) || shared || a.out == a.receive[a.rank]) return;
  copy_peer_sums(a, PeerSlices(a.rank, a.tp, a.vecs, cv, cta, ctas), a.receive[a.rank]);
}

template <class Element, AllReduceAlgorithm Algorithm>
__global__ void __launch_bounds__(kAllReduceThreads, 1)
    allreduce_kernel(const __grid_constant__ AllReduceArgs a) {
  __shared__ uint32_t ok_s;
  const int tid = threadIdx.x, cta = blockIdx.x, ctas = gridDim.x;
  if (tid == 0) ok_s = 1u;
  uint32_t gen;
  if (!begin_launch(a, gen)) return;
  const uint32_t parity = gen & 1u;
  uint4* mine = receive_of(a, a.rank, parity);

  if (Algorithm == AllReduceAlgorithm::TwoShotPull) {
    two_shot_pull<Element>(a, gen, &ok_s);
  } else if (Algorithm == AllReduceAlgorithm::OneShot) {
    // [parity][source][numel]: push slice `cta` of src to every peer at [me].
    const Slice s(a.vecs, cta, ctas);
    for (int64_t v = s.begin + tid; v < s.end; v += kAllReduceThreads) {
      const uint4 x = a.src[v];
      for (int i = 1; i < a.tp; ++i)
        receive_of(a, (a.rank + i) % a.tp, parity)[a.rank * a.vecs + v] = x;
    }
    __syncthreads();
    if (tid == 0) signal_peers(a, 0, cta, gen);
    if (wait_peers(a, 0, cta, gen, &ok_s))
      sum_slice<Element>(a, s, a.src, mine, a.vecs, a.out, 0, parity, false);
  } else {
    // [parity][area 1: source][chunk], then [area 2: owner][chunk].
    const int64_t cv = a.chunk_vecs, area2 = int64_t(a.tp) * cv;
    const PeerSlices p(a.rank, a.tp, a.vecs, cv, cta, ctas);
    // Each thread loads its vector of every peer's chunk before it stores any: one load latency
    // per vector index, not tp - 1 in a row (a store needs its loaded value).
    for (int64_t k = tid; k < p.longest; k += kAllReduceThreads) {
      uint4 x[kMaxDevices];
#pragma unroll
      for (int i = 1; i < kMaxDevices; ++i)
        if (p.has(i, k)) x[i] = a.src[((a.rank + i) % a.tp) * cv + p.begin[i] + k];
#pragma unroll
      for (int i = 1; i < kMaxDevices; ++i)
        if (p.has(i, k))
          receive_of(a, (a.rank + i) % a.tp, parity)[a.rank * cv + p.begin[i] + k] = x[i];
    }
    __syncthreads();
    if (tid == 0) signal_peers(a, 0, cta, gen);
    if (wait_peers(a, 0, cta, gen, &ok_s)) {
      const int64_t base = a.rank * cv;
      sum_slice<Element>(a, chunk_slice(a.vecs, cv, a.rank, cta, ctas), a.src + base, mine, cv,
                         a.out + base, area2 + base, parity, true);
      __syncthreads();
      if (tid == 0) signal_peers(a, 1, cta, gen);
      if (wait_peers(a, 1, cta, gen, &ok_s)) copy_peer_sums(a, p, mine + area2);
    }
  }

  finish_launch(a, gen);
}

// LL: line `l` of rank q's receive buffer of this launch's parity, as seen from here.
__device__ __forceinline__ uint4* line_of(const AllReduceArgs& a, int q, uint32_t parity,
                                          int64_t l) {
  return receive_of(a, q, parity) + l;
}

// LL, one thread: line `p` (already read once as `v`) once it carries `gen`, polled and bounded
// by keep_waiting (`start`: one bound for all of this thread's waits); a timeout is reported as
// rank q's data (phase 0) or chunk sum (phase 1) of this CTA's slot not arriving. On timeout or
// when the device has aborted, the last line read, which has not arrived (the caller checks
// line_arrived). By value: a line passed by reference would live in local memory.
__device__ __forceinline__ uint4 wait_line(const AllReduceArgs& a, const uint4* p, uint4 v,
                                           uint32_t gen, uint64_t& start, int phase, int q) {
  while (!line_arrived(v, gen)) {
    if (!keep_waiting(a.abort, a.record, a.timeout_ns, start, kWaitAllReduce, a.rank,
                      phase * kAllReduceMaxCtas + int(blockIdx.x), q, gen, line_observed(v, gen),
                      20))
      break;
    v = ld_line(p);
  }
  return v;
}

// LL, one thread: the sum over ranks 0..tp-1 of line `l` (this rank's data from `own`, peer q's
// from line `q * stride + l` of this rank's receive buffer, polled until it carries `gen`),
// rounded, into `y`. False when a wait failed.
template <class Element>
__device__ inline bool sum_lines(const AllReduceArgs& a, const uint2* own, int64_t stride,
                                 int64_t l, uint32_t parity, uint32_t gen, uint64_t& start,
                                 uint2& y) {
  const uint4* mine = line_of(a, a.rank, parity, l);
  uint4 x[kMaxDevices];
#pragma unroll
  for (int q = 0; q < kMaxDevices; ++q)
    if (q < a.tp && q != a.rank) x[q] = ld_line(mine + q * stride);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int q = 0; q < kMaxDevices; ++q) {
    if (q >= a.tp) continue;
    if (q == a.rank) {
      const uint2 o = own[l];
      add_elems<Element>(acc, o);
      continue;
    }
    const uint4 v = wait_line(a, mine + q * stride, x[q], gen, start, 0, q);
    if (!line_arrived(v, gen)) return false;
    add_elems<Element>(acc, make_uint2(v.x, v.z));
  }
  y = round_elems<Element, uint2>(acc);
  return true;
}

// LL, one thread: `v` as line `l` of every peer's receive buffer of this parity.
__device__ __forceinline__ void push_line(const AllReduceArgs& a, uint32_t parity, int64_t l,
                                          const uint2& v, uint32_t gen) {
  for (int i = 1; i < a.tp; ++i) st_line(line_of(a, (a.rank + i) % a.tp, parity, l), v.x, v.y, gen);
}

// LL, one thread: one_shot_ll. [parity][source][lines]: its lines of slice `cta` of src to every
// peer at [me], then the sum of each over the ranks into out.
template <class Element>
__device__ inline void one_shot_lines(const AllReduceArgs& a, uint32_t gen) {
  const uint32_t parity = gen & 1u;
  const uint2* src = reinterpret_cast<const uint2*>(a.src);
  uint2* out = reinterpret_cast<uint2*>(a.out);
  const int64_t lines = 2 * a.vecs;
  const Slice s(lines, blockIdx.x, gridDim.x);
  for (int64_t l = s.begin + threadIdx.x; l < s.end; l += kAllReduceThreads)
    push_line(a, parity, a.rank * lines + l, src[l], gen);
  uint64_t start = 0;
  for (int64_t l = s.begin + threadIdx.x; l < s.end; l += kAllReduceThreads) {
    uint2 y;
    if (!sum_lines<Element>(a, src, lines, l, parity, gen, start, y)) return;
    out[l] = y;
  }
}

// LL, one thread: two_shot_ll. [parity][area 1: source][chunk lines], then [area 2: owner][chunk
// lines]: its lines of slice `cta` of chunk r to rank r (area 1, at [me]); the sum of each of
// its lines of its own chunk into out and to every peer (area 2, at [me]); then the peers' sums
// of their chunks from area 2 into out.
template <class Element>
__device__ inline void two_shot_lines(const AllReduceArgs& a, uint32_t gen) {
  const uint32_t parity = gen & 1u;
  const uint2* src = reinterpret_cast<const uint2*>(a.src);
  uint2* out = reinterpret_cast<uint2*>(a.out);
  const int64_t lines = 2 * a.vecs, cl = 2 * a.chunk_vecs, area2 = int64_t(a.tp) * cl;
  const PeerSlices p(a.rank, a.tp, lines, cl, blockIdx.x, gridDim.x);
  // Each thread loads its line of every peer's chunk before it pushes any (one load latency per
  // index, not tp - 1 in a row), as the flag kernel does.
  for (int64_t k = threadIdx.x; k < p.longest; k += kAllReduceThreads) {
    uint2 x[kMaxDevices];
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i)
      if (p.has(i, k)) x[i] = src[((a.rank + i) % a.tp) * cl + p.begin[i] + k];
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i)
      if (p.has(i, k))
        st_line(line_of(a, (a.rank + i) % a.tp, parity, a.rank * cl + p.begin[i] + k), x[i].x,
                x[i].y, gen);
  }
  uint64_t start = 0;
  const int64_t base = a.rank * cl;
  const Slice own = chunk_slice(lines, cl, a.rank, blockIdx.x, gridDim.x);
  bool ok = true;
  for (int64_t l = own.begin + threadIdx.x; l < own.end; l += kAllReduceThreads) {
    uint2 y;
    ok = sum_lines<Element>(a, src + base, cl, l, parity, gen, start, y);
    if (!ok) break;
    out[base + l] = y;
    push_line(a, parity, area2 + base + l, y, gen);
  }
  // The CTA waits for the chunk sums only once all of its own chunk's pieces arrived (as the
  // flag kernel does): a timeout then names the rank whose piece is missing, not an owner that
  // waits for it.
  if (!__syncthreads_and(ok)) return;
  const uint4* sums = line_of(a, a.rank, parity, area2);
  // Every peer's sum line of this index read once before any is waited for (as above).
  for (int64_t k = threadIdx.x; k < p.longest; k += kAllReduceThreads) {
    uint4 x[kMaxDevices];
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i)
      if (p.has(i, k)) x[i] = ld_line(sums + ((a.rank + i) % a.tp) * cl + p.begin[i] + k);
#pragma unroll
    for (int i = 1; i < kMaxDevices; ++i) {
      if (!p.has(i, k)) continue;
      const int r = (a.rank + i) % a.tp;
      const uint4 v = wait_line(a, sums + r * cl + p.begin[i] + k, x[i], gen, start, 1, r);
      if (!line_arrived(v, gen)) return;
      out[r * cl + p.begin[i] + k] = make_uint2(v.x, v.z);
    }
  }
}

template <class Element, bool TwoShot>
__global__ void __launch_bounds__(kAllReduceThreads, 1)
    allreduce_ll_kernel(const __grid_constant__ AllReduceArgs a) {
  uint32_t gen;
  if (!begin_launch(a, gen)) return;
  if (TwoShot)
    two_shot_lines<Element>(a, gen);
  else
    one_shot_lines<Element>(a, gen);
  finish_launch(a, gen);
}

// The kernel of (element, algorithm).
template <class Element>
const void* kernel_of(AllReduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllReduceAlgorithm::OneShot:
      return reinterpret_cast<const void*>(allreduce_kernel<Element, AllReduceAlgorithm::OneShot>);
    case AllReduceAlgorithm::TwoShot:
      return reinterpret_cast<const void*>(allreduce_kernel<Element, AllReduceAlgorithm::TwoShot>);
    case AllReduceAlgorithm::OneShotLL:
      return reinterpret_cast<const void*>(allreduce_ll_kernel<Element, false>);
    case AllReduceAlgorithm::TwoShotLL:
      return reinterpret_cast<const void*>(allreduce_ll_kernel<Element, true>);
    case AllReduceAlgorithm::TwoShotPull:
      return reinterpret_cast<const void*>(
          allreduce_kernel<Element, AllReduceAlgorithm::TwoShotPull>);
  }
  return nullptr;
}

const void* kernel_of(DType dtype, AllReduceAlgorithm algorithm) {
  return dtype == DType::BF16 ? kernel_of<__nv_bfloat16>(algorithm) : kernel_of<__half>(algorithm);
}

std::string aligned16(const char* name, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    return std::string(name) + ": address is not 16-byte aligned";
  return "";
}

}  // namespace

std::string allreduce_can_implement(const AllReduceDesc& d) {
  const char* name = kAllReduceAlgorithmNames[static_cast<int>(d.algorithm)];
  if (d.dtype != DType::BF16 && d.dtype != DType::FP16) return "dtype must be bf16 or fp16";
  std::string e = allreduce_problem(name, d.numel, dtype_bytes(d.dtype), d.tp);
  if (!e.empty()) return e;
  if (d.rank < 0 || d.rank >= d.tp)
    return "rank=" + std::to_string(d.rank) + " is not in 0.." + std::to_string(d.tp - 1);
  if (d.ctas < 1 || d.ctas > kAllReduceMaxCtas)
    return "ctas=" + std::to_string(d.ctas) + " is not in 1.." + std::to_string(kAllReduceMaxCtas) +
           " (the control region's CTA slots)";
  if (!d.src || !d.out) return "src and out must not be null";
  if (!(e = aligned16("src", d.src)).empty()) return e;
  if (!(e = aligned16("out", d.out)).empty()) return e;
  const int64_t bytes = d.numel * dtype_bytes(d.dtype);
  const auto s = reinterpret_cast<uintptr_t>(d.src), o = reinterpret_cast<uintptr_t>(d.out);
  if (s != o && s < o + bytes && o < s + bytes)
    return "out overlaps src without being src (in place needs out == src)";
  for (int q = 0; q < d.tp; ++q) {
    if (!d.receive[q] || !d.control[q])
      return "internal: no receive buffer or control region of rank " + std::to_string(q);
    if (!(e = aligned16("receive buffer", d.receive[q])).empty()) return e;
  }
  if (!d.abort || !d.record) return "internal: all-reduce without an error sink";
  const bool shared = d.shared_out[0] != nullptr;
  for (int q = 0; q < d.tp; ++q) {
    if ((d.shared_out[q] != nullptr) != shared)
      return "shared_out must hold every rank's output or none (rank " + std::to_string(q) + ")";
    if (shared && !(e = aligned16("shared output", d.shared_out[q])).empty()) return e;
  }
  if (shared && !allreduce_pull(d.algorithm)) return "shared outputs are only for two_shot_pull";
  if (shared && d.shared_out[d.rank] != d.out) return "shared_out[rank] must be out itself";
  if (allreduce_pull(d.algorithm)) {
    if (d.src != d.receive[d.rank])
      return "two_shot_pull reads this rank's input at the start of its receive buffer: src "
             "must be that address";
    return "";  // one region, no parity
  }
  const int64_t half = allreduce_receive_bytes(name, d.numel, dtype_bytes(d.dtype), d.tp) / 2;
  if (d.parity_bytes < half || d.parity_bytes % 16 != 0)
    return "parity_bytes=" + std::to_string(d.parity_bytes) +
           " must be a multiple of 16 and at least " + std::to_string(half) +
           " (half of allreduce_receive_bytes)";
  return "";
}

int allreduce_resident_ctas(int device) {
  // One occupancy for every instantiation: the smallest (they differ only in code).
  int sms = 0, resident = kAllReduceMaxCtas;
  for (DType dtype : {DType::BF16, DType::FP16})
    for (int i = 0; i < kAllReduceAlgorithms; ++i) {
      const void* fn = kernel_of(dtype, static_cast<AllReduceAlgorithm>(i));
      const std::pair<int, int> occ = fused_occupancy(fn, kAllReduceThreads, 0, device);
      sms = occ.first;
      if (occ.second < resident) resident = occ.second;
    }
  return resident < sms ? resident : sms;
}

void allreduce_launch(const AllReduceDesc& d, int device, cudaStream_t stream) {
  const std::string why = allreduce_can_implement(d);
  if (!why.empty()) throw std::invalid_argument("all-reduce rejected: " + why);
  const int resident = allreduce_resident_ctas(device);
  if (d.ctas > resident)
    throw std::invalid_argument("all-reduce rejected: ctas=" + std::to_string(d.ctas) +
                                " exceeds the " + std::to_string(resident) +
                                " CTAs resident at once on device " + std::to_string(device) +
                                " (a CTA waits for the peers' CTAs of its index)");
  AllReduceArgs a{};
  a.src = static_cast<const uint4*>(d.src);
  a.out = static_cast<uint4*>(d.out);
  for (int q = 0; q < d.tp; ++q) {
    a.receive[q] = static_cast<uint4*>(d.receive[q]);
    a.shared_out[q] = static_cast<uint4*>(d.shared_out[q]);
    a.control[q] = d.control[q];
  }
  a.abort = d.abort;
  a.record = d.record;
  a.vecs = d.numel / kAllReduceVecElems;
  a.chunk_vecs = allreduce_chunk_elems(d.numel, d.tp) / kAllReduceVecElems;
  a.parity_vecs = d.parity_bytes / 16;
  a.timeout_ns = d.timeout_ns;
  a.tp = d.tp;
  a.rank = d.rank;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(d.ctas));
  cfg.blockDim = dim3(kAllReduceThreads);
  cfg.stream = stream;
  cudaLaunchAttribute chain{};
  chain.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  chain.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &chain;
  cfg.numAttrs = d.chained ? 1 : 0;
  void* args[] = {&a};
  DISTGEMM_CUDA_CHECK(cudaLaunchKernelExC(&cfg, kernel_of(d.dtype, d.algorithm), args));
}

}  // namespace distgemm::kernel
