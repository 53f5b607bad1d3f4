// LL lines (NCCL's low-latency protocol), shared by the fused decode kernel and the LL all-reduce:
// 16 bytes {data0, gen, data1, gen}, two 32-bit data words each beside the writer's launch
// generation, written by one 16-byte volatile store and polled by 16-byte volatile loads. Each
// 8-byte half is written whole, so a reader that sees the generation in a half also sees that
// half's data; a line has arrived when both halves carry the generation the reader expects. No
// fence and no flag: the data is its own signal.
#pragma once

#include <cstdint>

namespace distgemm::kernel {

__device__ __forceinline__ void st_line(void* p, uint32_t d0, uint32_t d1, uint32_t gen) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(d0), "r"(gen),
               "r"(d1), "r"(gen)
               : "memory");
}

__device__ __forceinline__ uint4 ld_line(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ bool line_arrived(const uint4& v, uint32_t gen) {
  return v.y == gen && v.w == gen;
}

// What a wait that gave up saw of the generation: the half that does not carry `gen`.
__device__ __forceinline__ uint32_t line_observed(const uint4& v, uint32_t gen) {
  return v.y == gen ? v.w : v.y;
}

}  // namespace distgemm::kernel
