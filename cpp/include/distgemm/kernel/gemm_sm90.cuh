// The CUTLASS 3.x SM90 GEMM behind gemm.hpp, with its leading barrier. Included only by the
// per-dtype translation units in cpp/src/runtime/ (each instantiates one kernel).
//
// Kernel: TMA warp-specialized, cooperative (two consumer warpgroups share a 128x256 tile, so the
// fp32 accumulators of both wgmma streams stay in flight; pingpong at 128x256 serialises them),
// tile TileM x TileN x 64, cluster ClusterM x ClusterN (the operand tile shared along the cluster
// multicast to it), persistent grid visiting its tiles in exact_swizzle_scheduler.cuh's order
// (stream-K: CUTLASS's). The configurations (tile_choice.hpp's kConfigs): 128x256 and
// 128x128 with cluster 2x1, and for bf16 128x128 with cluster 1x1, 256x192 with cluster 1x2 and
// 128x256 and 128x128 with CUTLASS's stream-K scheduler (its workspace is the caller's, see
// StreamKReset; GemmDesc::decomposition and splits its runtime arguments);
// kernel/tile_choice.hpp picks one per GEMM.
// B is K-contiguous ([n, k], nn.Linear's weight), or with BNMajor N-contiguous ([k, n], a
// transposed view of that weight: what a backward dgrad GEMM reads); TMA and wgmma read both
// layouts of 16-bit types, so the transposed weight is never copied.
//
// Epilogue, an EVT tree computing in fp32:
//     D = beta * user_c + ((alpha * acc + bias[n]) + partial)
//   partial : the epilogue source C, loaded by TMA. OptionalSrcFetch (below) skips the load when
//             the op has no partial, so one kernel serves first visits and later ones.
//   user_c  : Sm90AuxLoad without shared memory (direct vector loads, null pointer = absent): it
//             is only read at a tile's last visit, so it gets no TMA pipeline of its own and
//             costs the mainloop no shared-memory stages.
//   bias    : Sm90RowBroadcast (null pointer = absent).
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "distgemm/device/check.hpp"
#include "distgemm/kernel/exact_swizzle_scheduler.cuh"
#include "distgemm/kernel/fp8_split_promotion.cuh"
#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/leading_barrier.cuh"
#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::kernel::sm90 {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

// The epilogue source C as an EVT leaf that can be switched off per launch. CUTLASS's
// Sm90SrcFetch always loads C when the kernel has a C type, so a launch without a partial would
// need a second kernel; this leaf reports "no C load needed" when disabled and then yields zeros
// (the collective skips the TMA load and the smem wait). The C pointer of a disabled launch
// must still be a valid address for the TMA descriptor (the runtime passes D; it is never read).
template <class Element>
struct OptionalSrcFetch {
  struct SharedStorage {};
  struct Arguments {
    bool enabled = false;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args,
                                                  void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*,
                                              cudaStream_t, cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE OptionalSrcFetch() {}
  CUTLASS_HOST_DEVICE OptionalSrcFetch(Params const& params, SharedStorage const&)
      : params_(params) {}

  Params params_;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return params_.enabled; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return params_.enabled; }
  CUTLASS_DEVICE bool is_zero() const { return !params_.enabled; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(fusion::ProducerLoadArgs<Args...> const&) {
    return fusion::EmptyProducerLoadCallbacks{};
  }

  template <class SrcTensor>
  struct ConsumerStoreCallbacks : fusion::EmptyConsumerStoreCallbacks {
    CUTLASS_DEVICE ConsumerStoreCallbacks(SrcTensor const& tCrC, bool enabled)
        : tCrC(tCrC), enabled(enabled) {}
    SrcTensor const& tCrC;
    bool enabled;

    template <typename ElementAccumulator, int FragmentSize>
    CUTLASS_DEVICE cutlass::Array<typename SrcTensor::value_type, FragmentSize> visit(
        cutlass::Array<ElementAccumulator, FragmentSize> const&, int epi_v, int, int) {
      using Frag = cutlass::Array<typename SrcTensor::value_type, FragmentSize>;
      if (enabled) return recast<Frag>(tCrC)(epi_v);
      Frag zero;
      zero.fill(typename SrcTensor::value_type(0));
      return zero;
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(fusion::ConsumerStoreArgs<Args...> const& args) {
    return ConsumerStoreCallbacks<cute::remove_cvref_t<decltype(args.tCrC)>>(args.tCrC,
                                                                             params_.enabled);
  }
};

// The epilogue every configuration shares (output type ElementOut): the leaves beta, the user's C
// (Sm90AuxLoad without shared memory), the bias row and the optional partial, and the top of
// the tree over a configuration's scaled accumulator `ScaledAcc` (alpha * acc + bias, or the fp8
// scales' version):  D = beta * user_c + (ScaledAcc + partial).
template <class ElementOut, class TileShape>
struct CommonLeaves {
  static constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;  // 16 bytes
  using LayoutC = cutlass::layout::RowMajor;  // C, D [m, n], N contiguous
  static constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;
  using Beta = fusion::Sm90ScalarBroadcast<float>;
  using Bias =
      fusion::Sm90RowBroadcast<0, TileShape, ElementOut, float, Stride<_0, _1, _0>, kAlignOut>;
  using UserC = fusion::Sm90AuxLoad<0, void, ElementOut, LayoutC, void, void, kAlignOut, true>;
  using Partial = OptionalSrcFetch<ElementOut>;

  static auto bias_arguments(const GemmDesc& g) {
    return typename Bias::Arguments{static_cast<ElementOut const*>(g.bias), ElementOut(0), {}};
  }
  template <class StrideFn>
  static auto user_c_arguments(const GemmDesc& g, StrideFn stride) {
    return typename UserC::Arguments{static_cast<ElementOut const*>(g.user_c), ElementOut(0),
                                     stride(g.ldc, g.batch_c)};
  }
  static auto beta_arguments(const GemmDesc& g) {
    typename Beta::Arguments beta{};
    beta.scalars[0] = g.user_c ? g.beta : 0.0f;
    return beta;
  }

  // ScaledAcc + partial
  template <class ScaledAcc>
  using WithPartial =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::plus, float, float, kRound>, ScaledAcc, Partial>;
  // beta * user_c + ...
  template <class ScaledAcc>
  using Root = fusion::Sm90EVT<
      fusion::Sm90Compute<cutlass::homogeneous_multiply_add, ElementOut, float, kRound>, Beta,
      UserC, WithPartial<ScaledAcc>>;
  template <class ScaledAcc, class ClusterShape>
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementOut, LayoutC, kAlignOut,
      ElementOut, LayoutC, kAlignOut, cutlass::epilogue::TmaWarpSpecializedCooperative,
      Root<ScaledAcc>>::CollectiveOp;

  template <class ScaledAcc, class StrideFn>
  static typename Root<ScaledAcc>::Arguments root_arguments(
      const GemmDesc& g, const typename ScaledAcc::Arguments& scaled, StrideFn stride) {
    typename WithPartial<ScaledAcc>::Arguments with_partial{
        scaled, typename Partial::Arguments{g.partial != nullptr}, {}};
    return typename Root<ScaledAcc>::Arguments{
        beta_arguments(g), user_c_arguments(g, stride), with_partial, {}};
  }
};

// A 16-bit configuration: bf16 or fp16 in and out, tile K 64.
//   D = beta * user_c + ((alpha * acc + bias[n]) + partial)
template <class Element, int TileM, int TileN, int ClusterM, int ClusterN, bool BNMajor,
          bool StreamK = false>
struct Config {
  static_assert((TileM == 128 && (TileN == 128 || TileN == 256)) || (TileM == 256 && TileN == 192),
                "output tile 128x256, 128x128 or 256x192 (a consumer warpgroup's fp32 "
                "accumulators must fit its registers)");
  static_assert(ClusterM * ClusterN <= 2, "cluster 1x1, 2x1 or 1x2");
  using ElementAB = Element;
  using ElementOut = Element;
  static constexpr int kTileM = TileM, kTileN = TileN, kTileK = 64;
  static constexpr int kClusterM = ClusterM, kClusterN = ClusterN;
  static constexpr bool kBNMajor = BNMajor, kStreamK = StreamK;
  using TileShape = Shape<Int<TileM>, Int<TileN>, Int<kTileK>>;
  using ClusterShape = Shape<Int<ClusterM>, Int<ClusterN>, _1>;
  static constexpr int kAlign = 128 / cutlass::sizeof_bits<Element>::value;  // 16 bytes
  using LayoutA = cutlass::layout::RowMajor;  // A [m, k], K contiguous
  // B [n, k], K contiguous ("TN"), or BNMajor: B stored [k, n], N contiguous ("NN").
  using LayoutB =
      std::conditional_t<BNMajor, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor>;
  using Leaves = CommonLeaves<Element, TileShape>;
  static constexpr auto kRound = Leaves::kRound;

  using Alpha = fusion::Sm90ScalarBroadcast<float>;
  // alpha * acc + bias
  using ScaledAcc =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,
                      Alpha, fusion::Sm90AccFetch, typename Leaves::Bias>;
  using Root = typename Leaves::template Root<ScaledAcc>;
  using Epilogue = typename Leaves::template Epilogue<ScaledAcc, ClusterShape>;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element,
      LayoutB, kAlign, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;

  // Data-parallel: CUTLASS's persistent scheduler with the unpadded swizzle of
  // exact_swizzle_scheduler.cuh. Stream-K: CUTLASS's hybrid stream-K scheduler (tile_choice.hpp
  // says when the model picks it).
  using TileScheduler =
      std::conditional_t<StreamK, cutlass::gemm::StreamKScheduler, ExactSwizzleScheduler>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      TileScheduler>;

  template <class StrideFn>
  static typename Root::Arguments fusion_arguments(const GemmDesc& g, StrideFn stride) {
    typename Alpha::Arguments alpha{};
    alpha.scalars[0] = g.alpha;
    typename ScaledAcc::Arguments scaled{alpha, {}, Leaves::bias_arguments(g), {}};
    return Leaves::template root_arguments<ScaledAcc>(g, scaled, stride);
  }
};

// An fp8 configuration: A and B float8_e4m3fn (K-contiguous: wgmma reads fp8 operands K-major
// only), bf16 out, tile K 128 (128 bytes of an fp8 row, as 64 of a 16-bit one), cluster 2x1.
//   D = beta * user_c + ((scale_a[m] * (scale_b[n] * acc) + bias[n]) + partial)
// scale_a and scale_b are fp32 vectors read with a runtime stride of 0 or 1 (CUTLASS's dynamic
// broadcast): one kernel serves tensor-wise and row-wise scales. FastAccum: CUTLASS's
// fast-accumulation mainloop; otherwise CUTLASS's fp8 collective with the consumer loop of
// fp8_split_promotion.cuh (fp32 promotion every k-tile, no pipeline drain).
template <int TileM, int TileN, bool FastAccum>
struct Fp8Config {
  using ElementAB = cutlass::float_e4m3_t;
  using ElementOut = cutlass::bfloat16_t;
  static constexpr int kTileM = TileM, kTileN = TileN, kTileK = 128;
  static constexpr int kClusterM = 2, kClusterN = 1;
  static constexpr bool kBNMajor = false, kStreamK = false;
  using TileShape = Shape<Int<TileM>, Int<TileN>, Int<kTileK>>;
  using ClusterShape = Shape<_2, _1, _1>;
  static constexpr int kAlignAB = 16;  // 16 bytes of fp8
  using Leaves = CommonLeaves<ElementOut, TileShape>;
  static constexpr auto kRound = Leaves::kRound;

  // Alignment 1: a sub-GEMM's first row may sit anywhere in the scale vector.
  using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float, float, Stride<bool, _0, int64_t>, 1>;
  using ScaleB = fusion::Sm90RowBroadcast<0, TileShape, float, float, Stride<_0, bool, int64_t>, 1>;
  // scale_b[n] * acc
  using ScaledByB = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>,
                                    ScaleB, fusion::Sm90AccFetch>;
  // scale_a[m] * (...) + bias
  using ScaledAcc =
      fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, float, float, kRound>,
                      ScaleA, ScaledByB, typename Leaves::Bias>;
  using Root = typename Leaves::template Root<ScaledAcc>;
  using Epilogue = typename Leaves::template Epilogue<ScaledAcc, ClusterShape>;

  using Schedule =
      std::conditional_t<FastAccum, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum,
                         cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cutlass::layout::RowMajor,
      kAlignAB, ElementAB, cutlass::layout::ColumnMajor, kAlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Mainloop =
      std::conditional_t<FastAccum, BuiltMainloop, Fp8SplitPromotionMainloop<BuiltMainloop>>;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue,
                                                      ExactSwizzleScheduler>;

  template <class StrideFn>
  static typename Root::Arguments fusion_arguments(const GemmDesc& g, StrideFn stride) {
    // A null scale reads as 1 (never launched: can_implement requires both).
    typename ScaleA::Arguments scale_a{g.scale_a, 1.0f, {g.scale_a_rows, {}, int64_t(0)}};
    typename ScaleB::Arguments scale_b{g.scale_b, 1.0f, {{}, g.scale_b_rows, int64_t(0)}};
    typename ScaledByB::Arguments by_b{scale_b, {}, {}};
    typename ScaledAcc::Arguments scaled{scale_a, by_b, Leaves::bias_arguments(g), {}};
    return Leaves::template root_arguments<ScaledAcc>(g, scaled, stride);
  }
};

// Where a stream-K launch keeps the split counters it leaves behind: CUTLASS's fixup counts each
// tile's finished splits up and never back down, so the last consumer warpgroup of the launch
// to finish zeroes them (and its own arrival count), and the next launch on the same workspace
// finds it as allocated. Graph replays then need no memset node and no host work.
struct StreamKReset {
  uint32_t* arrivals = nullptr;  // consumer warpgroups of this launch that have finished
  uint4* counters = nullptr;     // CUTLASS's barrier region of the workspace
  uint32_t counter_vec4 = 0;     // its size in 16-byte words
  uint32_t consumers = 0;        // consumer warpgroups in the grid
};

__device__ inline void stream_k_finish(const StreamKReset& r) {
  // Thread 0 of each consumer warpgroup (warpgroups 1 and 2: CUTLASS's cooperative kernel has
  // its producer in warpgroup 0) issues that warpgroup's counter atomics, after the warpgroup's
  // named barrier, so once it returns its warpgroup touches the counters no more.
  if (threadIdx.x < 128 || threadIdx.x % 128 != 0) return;
  __threadfence();
  if (atomicAdd(r.arrivals, 1u) != r.consumers - 1) return;
  __threadfence();
  for (uint32_t i = 0; i < r.counter_vec4; ++i) r.counters[i] = make_uint4(0, 0, 0, 0);
  *r.arrivals = 0;
  __threadfence();
}

template <class GemmKernel, bool StreamK>
__global__ void __launch_bounds__(GemmKernel::MaxThreadsPerBlock,
                                  GemmKernel::MinBlocksPerMultiprocessor)
    waiting_gemm_kernel(CUTLASS_GRID_CONSTANT typename GemmKernel::Params const params,
                        CUTLASS_GRID_CONSTANT WaitSpec const wait,
                        CUTLASS_GRID_CONSTANT StreamKReset const reset) {
  extern __shared__ char smem[];
  // Lets a PDL-launched successor be scheduled once every CTA of this grid is resident; the
  // successor only takes SMs that this grid's finished CTAs give back (no-op without one).
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const bool ok = leading_barrier(wait, smem);
  if constexpr (StreamK) {
    // A stream-K CTA waits (unbounded, inside CUTLASS) for the splits of its tile that other
    // CTAs compute, so every CTA runs even after a failed wait: the host raises from the error
    // record, and no CTA is left waiting for one that returned early.
    (void)ok;
    GemmKernel op;
    op(params, smem);
    stream_k_finish(reset);
  } else {
    if (!ok) return;
    GemmKernel op;
    op(params, smem);
  }
}

// Launches one configuration (Config or Fp8Config) with its leading barrier.
template <class Cfg>
struct Runner {
  static constexpr int TileM = Cfg::kTileM, TileN = Cfg::kTileN;
  static constexpr int ClusterM = Cfg::kClusterM, ClusterN = Cfg::kClusterN;
  static constexpr bool BNMajor = Cfg::kBNMajor, StreamK = Cfg::kStreamK;
  using Kernel = typename Cfg::Kernel;
  using Arguments = typename Kernel::Arguments;

  static auto stride(int64_t ld, int64_t batch) {
    return cute::make_stride(ld, cute::Int<1>{}, batch);
  }
  // B in CUTLASS's (n, k, l) coordinates: K contiguous, or N contiguous with ld between k rows.
  static auto stride_b(int64_t ld, int64_t batch) {
    if constexpr (BNMajor)
      return cute::make_stride(cute::Int<1>{}, ld, batch);
    else
      return stride(ld, batch);
  }

  // sm_count and max_active_clusters describe the device. The persistent grid is sized to the
  // clusters that can be resident at once (cudaOccupancyMaxActiveClusters): a grid of one
  // cluster per SM pair would leave the clusters that do not fit (GPCs with an odd number of
  // free SMs) to run their tiles after everyone else, a tail of up to a few percent.
  // The swizzle the scheduler runs (kernel::scheduler_swizzle).
  static int scheduler_swizzle(const GemmDesc& g) {
    return ::distgemm::kernel::scheduler_swizzle(StreamK, (g.m + TileM - 1) / TileM,
                                                 (g.n + TileN - 1) / TileN, ClusterM, ClusterN,
                                                 g.swizzle);
  }

  static Arguments make_arguments(const GemmDesc& g, int sm_count, int max_active_clusters) {
    using E = typename Cfg::ElementAB;
    using Out = typename Cfg::ElementOut;
    auto root =
        Cfg::fusion_arguments(g, [](int64_t ld, int64_t batch) { return stride(ld, batch); });

    cutlass::KernelHardwareInfo hw;
    hw.sm_count = sm_count;
    hw.max_active_clusters = max_active_clusters;
    // A disabled partial still needs a valid address for its TMA descriptor: D (never read).
    const void* c_ptr = g.partial ? g.partial : g.d;
    const int64_t c_ld = g.partial ? g.ld_partial : g.ldd;
    const int64_t c_batch = g.partial ? g.batch_partial : g.batch_d;
    using Raster = cutlass::gemm::kernel::detail::RasterOrderOptions;
    typename Kernel::TileSchedulerArguments sched{};
    sched.max_swizzle_size = scheduler_swizzle(g);
    sched.raster_order = g.raster == 1   ? Raster::AlongM
                         : g.raster == 2 ? Raster::AlongN
                                         : Raster::Heuristic;
    if constexpr (StreamK) {
      using Mode = typename Kernel::TileScheduler::DecompositionMode;
      const Decomposition d = stream_k_decomposition(g.decomposition);
      sched.decomposition_mode = d == Decomposition::DataParallel ? Mode::DataParallel
                                 : d == Decomposition::SplitK     ? Mode::SplitK
                                 : d == Decomposition::StreamK    ? Mode::StreamK
                                                                  : Mode::Heuristic;
      sched.splits = g.splits;
    }
    return Arguments{cutlass::gemm::GemmUniversalMode::kGemm,
                     {static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k),
                      static_cast<int>(g.l)},
                     {static_cast<E const*>(g.a), stride(g.lda, g.batch_a),
                      static_cast<E const*>(g.b), stride_b(g.ldb, g.batch_b)},
                     {root, static_cast<Out const*>(c_ptr), stride(c_ld, c_batch),
                      static_cast<Out*>(g.d), stride(g.ldd, g.batch_d)},
                     hw,
                     sched};
  }

  static std::string can_implement(const GemmDesc& g) {
    if (g.swizzle != 1 && g.swizzle != 2 && g.swizzle != 4 && g.swizzle != 8)
      return "swizzle=" + std::to_string(g.swizzle) + " is not one of 1, 2, 4, 8";
    if (g.raster < 0 || g.raster > 2)
      return "raster=" + std::to_string(g.raster) + " is not 0 (heuristic), 1 (M) or 2 (N)";
    // The hardware info only sizes the persistent grid; can_implement checks shapes and strides.
    Arguments args = make_arguments(g, kShapeCheckSmCount, 0);
    if (!Kernel::can_implement(args))
      return "CUTLASS can_implement rejected the GEMM (m=" + std::to_string(g.m) +
             " n=" + std::to_string(g.n) + " k=" + std::to_string(g.k) +
             " l=" + std::to_string(g.l) + "): TMA needs K and N multiples of 8 elements";
    if constexpr (StreamK) {
      if (g.workspace == nullptr)
        return "a stream-K configuration needs a workspace (GemmDesc::workspace, "
               "gemm_workspace_bytes() bytes, zeroed once)";
      if (reinterpret_cast<uintptr_t>(g.workspace) % 16 != 0)
        return "the stream-K workspace must be 16-byte aligned";
    } else if (Kernel::get_workspace_size(args) != 0) {
      return "internal: the GEMM kernel asks for a workspace, which the runtime does not provide";
    }
    return "";
  }

  // The stream-K workspace: CUTLASS's partial accumulators (the reduction region, its size
  // depends on the shape) end where its split counters begin, and the counters sit at a fixed
  // place, the buffer's tail (kStreamKTailBytes: counters, then the launch's arrival count). Each
  // launch zeroes the counters it used, so the tail is all zeros between launches, and GEMMs of
  // any shape can share one buffer (one at a time, passed with the same size every time).
  static int64_t reduction_bytes(const typename Kernel::Params& params) {
    using SchedulerParams = std::remove_cv_t<decltype(params.scheduler)>;
    const SchedulerParams& sp = params.scheduler;
    uint64_t reduction_tiles = sp.sk_tiles_;
    if (sp.divmod_splits_.divisor > 1)
      reduction_tiles = sp.units_per_problem_;
    else if (sp.requires_separate_reduction())
      reduction_tiles =
          uint64_t(sp.sk_tiles_) * SchedulerParams::max_peers_per_tile(sp.sk_units_, sp.sk_tiles_);
    return static_cast<int64_t>(SchedulerParams::get_reduction_workspace_size(
        reduction_tiles, cutlass::gemm::GemmCoord(TileM, TileN, Cfg::kTileK), 32));
  }

  struct StreamKLayout {
    int64_t reduction = 0;  // bytes of CUTLASS's partial accumulators
    int64_t counters = 0;   // bytes of its split counters
  };

  static StreamKLayout stream_k_layout(const Arguments& args) {
    StreamKLayout l;
    const int64_t total = static_cast<int64_t>(Kernel::get_workspace_size(args));
    l.reduction = reduction_bytes(Kernel::to_underlying_arguments(args, nullptr));
    l.counters = total - l.reduction;
    if (l.reduction % 16 != 0 || l.counters < 0 || l.counters > kStreamKCounterBytes)
      throw std::runtime_error("internal: stream-K workspace of " + std::to_string(total) +
                               " bytes (partials " + std::to_string(l.reduction) +
                               ") does not fit the " + std::to_string(kStreamKCounterBytes) +
                               "-byte counter region");
    return l;
  }

  // The partials (128-byte aligned), the tail, and slack for aligning the tail down to 128.
  static int64_t needed_bytes(const StreamKLayout& l) {
    return round_up(l.reduction, 128) + kStreamKTailBytes + 128;
  }

  static int64_t workspace_bytes(const GemmDesc& g, int device) {
    if constexpr (!StreamK) {
      return 0;
    } else {
      const DeviceInfo dev = prepare(device);
      return needed_bytes(
          stream_k_layout(make_arguments(g, dev.sm_count, dev.max_active_clusters)));
    }
  }

  // Where CUTLASS's workspace starts in the caller's buffer (its counters then begin at the
  // tail), and what stream_k_finish clears.
  static void* place_stream_k(const GemmDesc& g, const StreamKLayout& l, StreamKReset& r) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(g.workspace);
    const uintptr_t tail = (base + g.workspace_bytes - kStreamKTailBytes) / 128 * 128;
    if (g.workspace_bytes < kStreamKTailBytes || tail < base + uintptr_t(l.reduction))
      throw std::invalid_argument("stream-K workspace of " + std::to_string(g.workspace_bytes) +
                                  " bytes is below the " + std::to_string(needed_bytes(l)) +
                                  " this GEMM needs (gemm_workspace_bytes)");
    r.counters = reinterpret_cast<uint4*>(tail);
    r.counter_vec4 = static_cast<uint32_t>(l.counters / 16);
    r.arrivals = reinterpret_cast<uint32_t*>(tail + kStreamKCounterBytes);
    return reinterpret_cast<void*>(tail - l.reduction);
  }

  // Any positive SM count: make_arguments needs one, can_implement does not depend on it.
  static constexpr int kShapeCheckSmCount = 1;

  static int smem_bytes() { return static_cast<int>(Kernel::SharedStorageSize); }

  struct DeviceInfo {
    bool ready = false;
    int sm_count = 0;
    int max_active_clusters = 0;
  };

  // Once per device (function attributes are per device): raise the kernel's dynamic
  // shared-memory limit, read the SM count and how many clusters fit at once.
  static DeviceInfo prepare(int device) {
    static std::mutex mu;
    static DeviceInfo info[64];
    std::lock_guard<std::mutex> lock(mu);
    if (device < 0 || device >= 64) throw std::runtime_error("device index out of range");
    if (info[device].ready) return info[device];
    int current = -1;
    DISTGEMM_CUDA_CHECK(cudaGetDevice(&current));
    DISTGEMM_CUDA_CHECK(cudaSetDevice(device));
    DISTGEMM_CUDA_CHECK(cudaFuncSetAttribute(waiting_gemm_kernel<Kernel, StreamK>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             smem_bytes()));
    DeviceInfo d;
    DISTGEMM_CUDA_CHECK(
        cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, device));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cute::size<0>(typename Cfg::ClusterShape{}),
                       cute::size<1>(typename Cfg::ClusterShape{}), 1);
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = smem_bytes();
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cfg.gridDim.x;
    attr[0].val.clusterDim.y = cfg.gridDim.y;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    DISTGEMM_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&d.max_active_clusters,
                                                       waiting_gemm_kernel<Kernel, StreamK>, &cfg));
    DISTGEMM_CUDA_CHECK(cudaSetDevice(current));
    d.ready = true;
    info[device] = d;
    return d;
  }

  static void launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream) {
    const DeviceInfo dev = prepare(device);
    Arguments args = make_arguments(g, dev.sm_count, dev.max_active_clusters);
    StreamKReset reset;
    void* cutlass_workspace = nullptr;
    if constexpr (StreamK) cutlass_workspace = place_stream_k(g, stream_k_layout(args), reset);
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, cutlass_workspace);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = Kernel::get_grid_shape(params);
    reset.consumers = cfg.gridDim.x * cfg.gridDim.y * cfg.gridDim.z * 2;  // 2 per CTA
    cfg.blockDim = Kernel::get_block_shape();
    cfg.dynamicSmemBytes = smem_bytes();
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cute::size<0>(typename Cfg::ClusterShape{});
    attr[0].val.clusterDim.y = cute::size<1>(typename Cfg::ClusterShape{});
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = g.pdl ? 2 : 1;
    DISTGEMM_CUDA_CHECK(
        cudaLaunchKernelEx(&cfg, waiting_gemm_kernel<Kernel, StreamK>, params, wait, reset));
  }
};

}  // namespace distgemm::kernel::sm90

// One kernel's entry points, defined by a translation unit that instantiates Runner<CONFIG>
// (a Config or Fp8Config). prepare_* returns the kernel's resident CTAs (the persistent grid
// size), the input of choose_config; workspace_bytes_* what GemmDesc::workspace must hold.
#define DISTGEMM_DEFINE_GEMM_ENTRY_POINTS(SUFFIX, ...)                                     \
  namespace distgemm::kernel::detail {                                                     \
  using Runner_##SUFFIX = sm90::Runner<__VA_ARGS__>;                                       \
  int64_t workspace_bytes_##SUFFIX(const GemmDesc& g, int device) {                        \
    return Runner_##SUFFIX::workspace_bytes(g, device);                                    \
  }                                                                                        \
  std::string can_implement_##SUFFIX(const GemmDesc& g) {                                  \
    return Runner_##SUFFIX::can_implement(g);                                              \
  }                                                                                        \
  void launch_##SUFFIX(const GemmDesc& g, const WaitSpec& w, int device, cudaStream_t s) { \
    Runner_##SUFFIX::launch(g, w, device, s);                                              \
  }                                                                                        \
  int prepare_##SUFFIX(int device) {                                                       \
    const auto d = Runner_##SUFFIX::prepare(device);                                       \
    return d.max_active_clusters * Runner_##SUFFIX::ClusterM * Runner_##SUFFIX::ClusterN;  \
  }                                                                                        \
  }
