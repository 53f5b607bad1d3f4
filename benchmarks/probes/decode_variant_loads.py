"""Rewrites the decode kernel's weight loads into a timing-only variant (probe; never committed)."""

import sys

p = "cpp/include/distgemm/kernel/fused_decode_sm90.cuh"
s = open(p).read()
v = sys.argv[1]
if v in ("l2none", "l2_128"):
    old = "CU_TENSOR_MAP_L2_PROMOTION_L2_256B"
    assert old in s
    s = s.replace(
        old,
        "CU_TENSOR_MAP_L2_PROMOTION_NONE"
        if v == "l2none"
        else "CU_TENSOR_MAP_L2_PROMOTION_L2_128B",
    )
elif v == "evict":
    old = "// Fetches `map` into the TMA unit's descriptor cache ahead of its first copy."
    assert old in s
    s = s.replace(
        old,
        """__device__ __forceinline__ void tma_load_2d_ef(void* dst, const CUtensorMap* map, int k, int row,
                                            uint64_t* bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k), "r"(row), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}

"""
        + old,
    )
    old = "          tma_load_2d(sw + j * kWeightBoxBytes, &maps.w,"
    assert old in s
    s = s.replace(old, "          tma_load_2d_ef(sw + j * kWeightBoxBytes, &maps.w,")
else:
    raise SystemExit("unknown variant " + v)
open(p, "w").write(s)
print("variant", v)
