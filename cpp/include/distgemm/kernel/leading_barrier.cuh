// Device side of the plan's synchronisation: acquire/release at system scope, bounded spins that
// end in an error record instead of a hang, and the cluster-wide agreement that lets a CUTLASS
// kernel exit early without stranding a partner CTA at a cluster barrier.
//
// Memory-model notes (why each fence is there):
//  - Flags are set by copy-engine memcpy nodes (4 bytes of the producer's epoch word) that are
//    ordered after the data they publish (a memcpy node or a kernel) by a graph edge. The reader
//    uses ld.acquire.sys so its later reads are ordered after the flag read.
//  - The GEMM reads the published data with TMA, i.e. through the async proxy. An acquire in the
//    generic proxy does not order async-proxy reads, so every thread issues
//    fence.proxy.async.global after the CTA-wide barrier that distributes the decision.
//  - The error record lives in mapped host memory: fields first, __threadfence_system(), then
//    `valid`, so the host never sees a half-written record.
#pragma once

#include <cstdint>

#include "distgemm/kernel/wait_spec.hpp"

namespace distgemm::kernel {

__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// A value released into several words (every rank's copy of a flag): fence_acq_rel_sys once,
// then st_relaxed_sys to each; with the fence each store is a release pattern. A st.release per
// word fences before each one, and each fence after the first waits for the previous word's
// NVLink write.
__device__ __forceinline__ void fence_acq_rel_sys() {
  asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ void st_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t cluster_num_ctas() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync_all() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::
                   : "memory");
}

// Reads a uint32 at the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ uint32_t ld_shared_cluster(const uint32_t* local, uint32_t rank) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(local)), remote, v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
  return v;
}

// "Flag value v has reached generation g": v is g, or g + 1. A writer is at most one launch
// ahead of a reader of its flag (the entry barrier: no rank passes launch g's barrier before
// every rank has arrived at it; the fused kernels and the all-reduce: a rank ends launch g only
// after every peer's pushes of launch g, and starts g + 1 only after its own launch g), so any
// other value is an older launch's, however old: a flag slot a launch leaves unused keeps its
// value, and "v - g >= 0 as int32" would take a slot left unused for 2^31 launches as reached.
// Generations wrap at 2^32.
__device__ __forceinline__ bool reached(uint32_t v, uint32_t g) { return v - g <= 1u; }

// Claims the device's abort word and, if this is the first failure, fills the error record.
__device__ inline void report_timeout(uint32_t* abort, ErrorRecord* rec, uint32_t kind, int device,
                                      int iteration, int flag, uint32_t expected, uint32_t observed,
                                      uint64_t timeout_ns) {
  if (atomicCAS(abort, 0u, 1u) != 0u) return;  // someone else already failed: keep the first cause
  volatile ErrorRecord* r = rec;
  r->kind = kind;
  r->device = device;
  r->iteration = iteration;
  r->flag = flag;
  r->expected = expected;
  r->observed = observed;
  r->timeout_ns = timeout_ns;
  __threadfence_system();
  r->valid = 1u;
  __threadfence_system();
}

__device__ __forceinline__ bool aborted(const uint32_t* abort) {
  return *reinterpret_cast<const volatile uint32_t*>(abort) != 0u;
}

// One thread, after a poll found what it waits for (generation `expected`) not there yet
// (`observed`): whether to poll again, after `sleep_ns`. `start` is the first moment this thread
// found something behind (0 before), so one bound covers all the polls of one wait. False when
// the device has aborted, or on timeout: the error record then gets (kind, device, iteration,
// flag) and the device aborts. Every bounded wait of the runtime goes through here (plan flags,
// entry barrier, fused tiles and lines).
__device__ inline bool keep_waiting(uint32_t* abort, ErrorRecord* rec, uint64_t timeout_ns,
                                    uint64_t& start, uint32_t kind, int device, int iteration,
                                    int flag, uint32_t expected, uint32_t observed,
                                    unsigned sleep_ns) {
  if (aborted(abort)) return false;
  const uint64_t now = global_timer_ns();
  if (start == 0) {
    start = now;
  } else if (now - start > timeout_ns) {
    report_timeout(abort, rec, kind, device, iteration, flag, expected, observed, timeout_ns);
    return false;
  }
  __nanosleep(sleep_ns);
  return true;
}

// One thread: spin until flag `f` reaches generation `gen` (system-scope acquire), bounded by
// keep_waiting. False on timeout or when the device has aborted.
__device__ inline bool wait_reached(const uint32_t* f, uint32_t gen, uint32_t* abort,
                                    ErrorRecord* rec, uint64_t timeout_ns, uint64_t& start,
                                    uint32_t kind, int device, int iteration, int flag,
                                    unsigned sleep_ns) {
  uint32_t v = ld_acquire_sys(f);
  while (!reached(v, gen)) {
    if (!keep_waiting(abort, rec, timeout_ns, start, kind, device, iteration, flag, gen, v,
                      sleep_ns))
      return false;
    v = ld_acquire_sys(f);
  }
  return true;
}

// One thread: spin until every flag of `w` reaches this launch's generation. False when the
// device has aborted (now or earlier): the caller skips its work.
__device__ inline bool wait_flags(const WaitSpec& w) {
  if (aborted(w.abort)) return false;
  if (w.num_flags == 0) return true;
  const uint32_t gen = *reinterpret_cast<const volatile uint32_t*>(w.epoch);
  uint64_t start = 0;
  for (int j = 0; j < w.num_flags && j < kMaxWaits; ++j)
    if (!wait_reached(w.flags + w.flag_ids[j], gen, w.abort, w.record, w.timeout_ns, start, w.kind,
                      w.device, w.iteration, w.flag_ids[j], 32))
      return false;
  return true;
}

// Whole CTA (all threads must call it, before the CUTLASS kernel touches shared memory): wait,
// then agree across the cluster. A CTA that exits while its cluster partner enters the GEMM would
// leave the partner stuck at the kernel's first cluster barrier, so the decision is the AND over
// the cluster, exchanged through distributed shared memory. `smem` is the kernel's dynamic
// shared memory, free until the kernel initialises its pipelines.
__device__ inline bool leading_barrier(const WaitSpec& w, char* smem) {
  uint32_t* status = reinterpret_cast<uint32_t*>(smem);
  if (threadIdx.x == 0) *status = wait_flags(w) ? 1u : 0u;
  __syncwarp();  // reconverge warp 0 before the .aligned cluster barrier
  const uint32_t ctas = cluster_num_ctas();
  if (ctas > 1) {
    cluster_sync_all();  // every CTA has written its status
    uint32_t all = 1u;
    if (threadIdx.x == 0)
      for (uint32_t r = 0; r < ctas; ++r) all &= ld_shared_cluster(status, r);
    __syncwarp();
    cluster_sync_all();  // every CTA has read the others' status before it is overwritten
    if (threadIdx.x == 0) *status = all;
  }
  __syncthreads();
  const bool ok = *status != 0u;
  __syncthreads();  // everyone has read `status` before the kernel reuses shared memory
  asm volatile("fence.proxy.async.global;" ::: "memory");
  return ok;
}

}  // namespace distgemm::kernel
