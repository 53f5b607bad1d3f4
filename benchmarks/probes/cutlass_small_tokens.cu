// Probe (not shipped): CUTLASS SM90 bf16 GEMM schedules for 33..128 tokens x weight^T (the fused
// GEMM + all-reduce's CUTLASS range), split-K over the batch mode as the fused kernel does.
// VARIANT picks the schedule; SWAP: the weight is A (its rows on the MMA's M side).
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"

using namespace cute;
using PE = cutlass::bfloat16_t;
using Coop = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using PP = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using ECoop = cutlass::epilogue::TmaWarpSpecializedCooperative;
using EPP = cutlass::epilogue::TmaWarpSpecialized;

#if VARIANT == 0
using PTile = Shape<_128, _128, _64>;
using KS = Coop;
using ES = ECoop;
#define SWAP 0
#elif VARIANT == 1
using PTile = Shape<_64, _128, _64>;
using KS = PP;
using ES = EPP;
#define SWAP 0
#elif VARIANT == 2
using PTile = Shape<_64, _256, _64>;
using KS = PP;
using ES = EPP;
#define SWAP 0
#elif VARIANT == 3
using PTile = Shape<_128, _64, _64>;
using KS = Coop;
using ES = ECoop;
#define SWAP 1
#elif VARIANT == 4
using PTile = Shape<_64, _64, _64>;
using KS = PP;
using ES = EPP;
#define SWAP 1
#endif
using Cl = Shape<_1, _1, _1>;
using LA = cutlass::layout::RowMajor;     // A [M, K]
using LB = cutlass::layout::ColumnMajor;  // B [N, K]
// Not swapped: D = tokens x w^T, [m, n] row-major. Swapped: D' [n, m] column-major = same bytes.
#if SWAP
using LD = cutlass::layout::ColumnMajor;
#else
using LD = cutlass::layout::RowMajor;
#endif
using Fusion = cutlass::epilogue::fusion::LinearCombination<PE, float, void, float>;

constexpr int kAlign = 8;
using Epi = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, PTile, Cl,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LD, kAlign, PE, LD, kAlign,
    ES, Fusion>::CollectiveOp;
using Main = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, PE, LA, kAlign, PE, LB, kAlign, float,
    PTile, Cl,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
        sizeof(typename Epi::SharedStorage))>,
    KS>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Main, Epi>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#define FN(name) CAT(CAT(CAT(dg_small_, VARIANT), _), name)

static std::map<std::tuple<void*, void*, void*, int, int, int, int>, Gemm*> g_cache;

extern "C" int FN(stages)() { return Main::DispatchPolicy::Stages; }

// x [m, k] tokens, w [n, k] weight, d [splits, m, n]; each split a k/splits slice of K.
extern "C" int FN(prepare)(void* x, void* w, void* d, int m, int n, int k, int splits) {
  auto key = std::make_tuple(x, w, d, m, n, k, splits);
  if (g_cache.count(key)) return 0;
  const int64_t kp = k / splits;
  typename Kernel::StrideA sa;
  typename Kernel::StrideB sb;
  typename Kernel::StrideD sd;
  void *pa, *pb;
  int M, N;
  sa = make_stride(int64_t(k), Int<1>{}, kp);
  sb = make_stride(int64_t(k), Int<1>{}, kp);
#if !SWAP
  sd = make_stride(int64_t(n), Int<1>{}, int64_t(m) * n);
  pa = x;
  pb = w;
  M = m;
  N = n;
#else
  sd = make_stride(Int<1>{}, int64_t(n), int64_t(m) * n);
  pa = w;
  pb = x;
  M = n;
  N = m;
#endif
  cutlass::KernelHardwareInfo hw;
  cudaGetDevice(&hw.device_id);
  hw.sm_count = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(hw.device_id);
  typename Kernel::EpilogueArguments epi{};
  epi.thread.alpha = 1.0f;
  epi.thread.beta = 0.0f;
  epi.ptr_C = nullptr;
  epi.dC = sd;
  epi.ptr_D = static_cast<PE*>(d);
  epi.dD = sd;
  typename Kernel::TileSchedulerArguments sched{};
  sched.max_swizzle_size = 1;
  sched.raster_order = SWAP ? cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN
                            : cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {M, N, int(kp), splits},
                                {static_cast<PE*>(pa), sa, static_cast<PE*>(pb), sb},
                                epi,
                                hw,
                                sched};
  Gemm* g = new Gemm;
  if (g->can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (Gemm::get_workspace_size(args) != 0) return 2;
  if (g->initialize(args, nullptr) != cutlass::Status::kSuccess) return 3;
  g_cache[key] = g;
  return 0;
}

extern "C" int FN(launch)(void* x, void* w, void* d, int m, int n, int k, int splits,
                          cudaStream_t s) {
  auto it = g_cache.find(std::make_tuple(x, w, d, m, n, k, splits));
  if (it == g_cache.end()) return 4;
  return it->second->run(s) == cutlass::Status::kSuccess ? 0 : 5;
}
