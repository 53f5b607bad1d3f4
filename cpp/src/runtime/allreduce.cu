// The one-shot and two-shot all-reduce kernel (kernel/allreduce.hpp: the protocol, the parity
// argument and the host rules), instantiated for bf16 and fp16, its dispatch and boundary checks.
// No CUTLASS.
//
// Per CTA c (slot c), one launch:
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
//      and copied into out;
//   5. a CTA barrier, then the generation words advance (the fused kernels' scheme).
// In place (out == src) is safe: CTA c alone reads and writes slice c of every chunk, and reads
// each element of src before the same thread (or, after a barrier, the same CTA) writes it.
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

namespace distgemm::kernel {

namespace {

// What the kernel needs of one launch (AllReduceDesc, flattened for the device).
struct AllReduceArgs {
  const uint4* src;
  uint4* out;
  uint4* receive[kMaxDevices];
  uint32_t* control[kMaxDevices];
  uint32_t* abort;
  ErrorRecord* record;
  int64_t vecs;         // numel / 8
  int64_t chunk_vecs;   // two_shot: allreduce_chunk_elems / 8
  int64_t parity_vecs;  // parity_bytes / 16
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

template <class Element>
__device__ __forceinline__ void add_vec(float (&acc)[8], const uint4& v) {
  const Element* e = reinterpret_cast<const Element*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] += Convert<Element>::to_float(e[i]);
}

template <class Element>
__device__ __forceinline__ uint4 round_vec(const float (&acc)[8]) {
  uint4 v;
  Element* e = reinterpret_cast<Element*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = Convert<Element>::from_float(acc[i]);
  return v;
}

// Vectors [begin, end) of slice `cta` of `vecs` vectors over the grid: the same cut on every rank
// and at every launch of the same numel.
struct Slice {
  int64_t begin, end;
  __device__ Slice(int64_t vecs, int cta, int ctas)
      : begin(vecs * cta / ctas), end(vecs * (cta + 1) / ctas) {}
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
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.f;
#pragma unroll
    for (int q = 0; q < kMaxDevices; ++q)
      if (q < a.tp) add_vec<Element>(acc, x[q]);
    const uint4 y = round_vec<Element>(acc);
    out[v] = y;
    if (push)
      for (int i = 1; i < a.tp; ++i)
        receive_of(a, (a.rank + i) % a.tp, parity)[push_offset + v] = y;
  }
}

template <class Element, bool TwoShot>
__global__ void __launch_bounds__(kAllReduceThreads, 1)
    allreduce_kernel(const __grid_constant__ AllReduceArgs a) {
  __shared__ uint32_t gen_s, live_s, ok_s;
  const int tid = threadIdx.x, cta = blockIdx.x, ctas = gridDim.x;
  if (tid == 0) {
    live_s = aborted(a.abort) ? 0u : 1u;
    gen_s = *reinterpret_cast<volatile uint32_t*>(a.control[a.rank] + cta) + 1u;
    ok_s = 1u;
  }
  __syncthreads();
  if (!live_s) return;  // a previous launch timed out: the communicator is broken
  const uint32_t gen = gen_s, parity = gen & 1u;
  uint4* mine = receive_of(a, a.rank, parity);

  if (!TwoShot) {
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
    auto chunk_slice = [&](int r) {
      int64_t len = a.vecs - r * cv;
      len = len < 0 ? 0 : (len > cv ? cv : len);
      return Slice(len, cta, ctas);
    };
    for (int i = 1; i < a.tp; ++i) {
      const int r = (a.rank + i) % a.tp;
      const Slice s = chunk_slice(r);
      uint4* dst = receive_of(a, r, parity) + a.rank * cv;
      for (int64_t v = s.begin + tid; v < s.end; v += kAllReduceThreads) dst[v] = a.src[r * cv + v];
    }
    __syncthreads();
    if (tid == 0) signal_peers(a, 0, cta, gen);
    if (wait_peers(a, 0, cta, gen, &ok_s)) {
      const int64_t base = a.rank * cv;
      sum_slice<Element>(a, chunk_slice(a.rank), a.src + base, mine, cv, a.out + base, area2 + base,
                         parity, true);
      __syncthreads();
      if (tid == 0) signal_peers(a, 1, cta, gen);
      if (wait_peers(a, 1, cta, gen, &ok_s))
        for (int i = 1; i < a.tp; ++i) {
          const int r = (a.rank + i) % a.tp;
          const Slice s = chunk_slice(r);
          const uint4* from = mine + area2 + r * cv;
          for (int64_t v = s.begin + tid; v < s.end; v += kAllReduceThreads)
            a.out[r * cv + v] = ld_partial_v4(from + v);
        }
    }
  }

  // The generation: this CTA's word, and CTA 0 the slots the grid leaves unused. Plain stores:
  // the next launch on the stream reads them after this one has ended.
  __syncthreads();
  uint32_t* words = a.control[a.rank];
  if (tid == 0) words[cta] = gen;
  if (cta == 0)
    for (int i = ctas + tid; i < kAllReduceMaxCtas; i += kAllReduceThreads) words[i] = gen;
}

template <class Element, bool TwoShot>
void launch_kernel(const AllReduceArgs& a, int ctas, cudaStream_t stream) {
  allreduce_kernel<Element, TwoShot>
      <<<dim3(unsigned(ctas)), dim3(kAllReduceThreads), 0, stream>>>(a);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
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
  const int64_t half = allreduce_receive_bytes(name, d.numel, dtype_bytes(d.dtype), d.tp) / 2;
  if (d.parity_bytes < half || d.parity_bytes % 16 != 0)
    return "parity_bytes=" + std::to_string(d.parity_bytes) +
           " must be a multiple of 16 and at least " + std::to_string(half) +
           " (half of allreduce_receive_bytes)";
  return "";
}

int allreduce_resident_ctas(int device) {
  // One occupancy for all four instantiations: the smallest (they differ only in code).
  const void* fns[] = {reinterpret_cast<const void*>(allreduce_kernel<__nv_bfloat16, false>),
                       reinterpret_cast<const void*>(allreduce_kernel<__nv_bfloat16, true>),
                       reinterpret_cast<const void*>(allreduce_kernel<__half, false>),
                       reinterpret_cast<const void*>(allreduce_kernel<__half, true>)};
  int sms = 0, resident = kAllReduceMaxCtas;
  for (const void* fn : fns) {
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
  const bool two = d.algorithm == AllReduceAlgorithm::TwoShot;
  if (d.dtype == DType::BF16)
    two ? launch_kernel<__nv_bfloat16, true>(a, d.ctas, stream)
        : launch_kernel<__nv_bfloat16, false>(a, d.ctas, stream);
  else
    two ? launch_kernel<__half, true>(a, d.ctas, stream)
        : launch_kernel<__half, false>(a, d.ctas, stream);
}

}  // namespace distgemm::kernel
