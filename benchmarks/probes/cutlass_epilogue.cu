// Probe (not shipped): CUTLASS SM90 bf16 GEMM variants that differ from distgemm's 128x256 kernel
// in the epilogue or the schedule, to see what the gap to cuBLAS on full-grid 70B shapes is made
// of. Compiled once per VARIANT; each object exports dg_probe_<VARIANT>_{prepare,launch}.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

using namespace cute;
using PE = cutlass::bfloat16_t;
using LA = cutlass::layout::RowMajor;
using LB = cutlass::layout::ColumnMajor;
using LD = cutlass::layout::RowMajor;

#if VARIANT == 0  // 128x256 cooperative, TMA epilogue, no C
using PTile = Shape<_128, _256, _64>;
using Cl = Shape<_2, _1, _1>;
using EC = void;
using ESched = cutlass::epilogue::TmaWarpSpecializedCooperative;
using KSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
#elif VARIANT == 1  // 128x256 cooperative, TMA epilogue with a C (beta = 0: not loaded)
using PTile = Shape<_128, _256, _64>;
using Cl = Shape<_2, _1, _1>;
using EC = PE;
using ESched = cutlass::epilogue::TmaWarpSpecializedCooperative;
using KSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
#elif VARIANT == 2  // 128x256 cooperative, epilogue without shared memory
using PTile = Shape<_128, _256, _64>;
using Cl = Shape<_2, _1, _1>;
using EC = void;
using ESched = cutlass::epilogue::NoSmemWarpSpecialized;
using KSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
#elif VARIANT == 3  // 128x128 ping-pong (one warpgroup's epilogue under the other's MMAs)
using PTile = Shape<_128, _128, _64>;
using Cl = Shape<_2, _1, _1>;
using EC = void;
using ESched = cutlass::epilogue::TmaWarpSpecialized;
using KSched = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
#elif VARIANT == 4  // 128x256 cooperative, cluster 1x2 (A multicast instead of B)
using PTile = Shape<_128, _256, _64>;
using Cl = Shape<_1, _2, _1>;
using EC = void;
using ESched = cutlass::epilogue::TmaWarpSpecializedCooperative;
using KSched = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
#endif

constexpr int kAlign = 8;
using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, PTile, Cl,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, EC, LD, kAlign, PE, LD, kAlign,
    ESched>::CollectiveOp;
using Main = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, PE, LA, kAlign, PE, LB, kAlign, float,
    PTile, Cl,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epi::SharedStorage))>,
    KSched>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(CAT(CAT(dg_probe_, VARIANT), _), name)

static std::map<std::tuple<void*, void*, void*, int, int, int>, Gemm*> g_cache;

extern "C" int FN(stages)() { return Main::DispatchPolicy::Stages; }

extern "C" int FN(prepare)(void* a, void* b, void* d, int m, int n, int k) {
  auto key = std::make_tuple(a, b, d, m, n, k);
  if (g_cache.count(key)) return 0;
  using SA = typename Kernel::StrideA;
  using SB = typename Kernel::StrideB;
  using SC = typename Kernel::StrideC;
  using SD = typename Kernel::StrideD;
  SA sa = cutlass::make_cute_packed_stride(SA{}, make_shape(m, k, 1));
  SB sb = cutlass::make_cute_packed_stride(SB{}, make_shape(n, k, 1));
  SC sc = cutlass::make_cute_packed_stride(SC{}, make_shape(m, n, 1));
  SD sd = cutlass::make_cute_packed_stride(SD{}, make_shape(m, n, 1));
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {m, n, k, 1},
                                {static_cast<PE*>(a), sa, static_cast<PE*>(b), sb},
                                {{1.0f, 0.0f}, nullptr, sc, static_cast<PE*>(d), sd},
                                hw};
  Gemm* g = new Gemm;
  if (g->can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (Gemm::get_workspace_size(args) != 0) return 2;
  if (g->initialize(args, nullptr) != cutlass::Status::kSuccess) return 3;
  g_cache[key] = g;
  return 0;
}

extern "C" int FN(launch)(void* a, void* b, void* d, int m, int n, int k, cudaStream_t s) {
  auto it = g_cache.find(std::make_tuple(a, b, d, m, n, k));
  if (it == g_cache.end()) return 4;
  return it->second->run(s) == cutlass::Status::kSuccess ? 0 : 5;
}
