// Dtype and configuration dispatch and shape checks of the GEMM, and the two single-block runtime
// kernels (entry barrier, wait before a copy). The CUTLASS instantiations live in
// gemm_<dtype>_[m<tile m>_]n<tile n>[_c11][_bn][_sk].cu, one kernel per translation unit.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/gemm_extents.hpp"
#include "distgemm/kernel/kernel_table.hpp"
#include "distgemm/kernel/leading_barrier.cuh"
#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::kernel {

namespace detail {
// One set per kernel (gemm_<dtype>_...cu; _c11: cluster 1x1; _bn: B N-contiguous).
#define DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(SUFFIX)                                        \
  std::string can_implement_##SUFFIX(const GemmDesc& g);                                  \
  void launch_##SUFFIX(const GemmDesc& g, const WaitSpec& w, int device, cudaStream_t s); \
  int prepare_##SUFFIX(int device);                                                       \
  int64_t workspace_bytes_##SUFFIX(const GemmDesc& g, int device);
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n256)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n128)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n256)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n128)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n256_bn)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(fp16_n256_bn)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n128_c11)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_m256_n192)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n256_sk)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(bf16_n128_sk)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(e4m3_n192)
DISTGEMM_DECLARE_GEMM_ENTRY_POINTS(e4m3_n256_fa)
#undef DISTGEMM_DECLARE_GEMM_ENTRY_POINTS
}  // namespace detail

// gemm_cublaslt.cpp
void cublaslt_launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream);

namespace detail {

struct Kernels {
  std::string (*can_implement)(const GemmDesc&);
  void (*launch)(const GemmDesc&, const WaitSpec&, int, cudaStream_t);
  int (*prepare)(int);
  int64_t (*workspace_bytes)(const GemmDesc&, int);
};

#define DISTGEMM_KERNELS(SUFFIX) \
  Kernels { can_implement_##SUFFIX, launch_##SUFFIX, prepare_##SUFFIX, workspace_bytes_##SUFFIX }

// The kernel of configuration `config` (1..kConfigCount) for the dtype and B layout; the caller
// has checked config_available (b_n_major has the 128x256 tile only, fp16 the two cluster-2x1
// tiles), so any other configuration falls back to 128x256; e4m3 has its two kernels.
Kernels kernels(DType dtype, int config, bool b_n_major = false) {
  if (dtype == DType::E4M3)
    return config == static_cast<int>(GemmConfig::E4M3x128x256FA) ? DISTGEMM_KERNELS(e4m3_n256_fa)
                                                                  : DISTGEMM_KERNELS(e4m3_n192);
  const bool bf16 = dtype == DType::BF16;
  if (b_n_major) return bf16 ? DISTGEMM_KERNELS(bf16_n256_bn) : DISTGEMM_KERNELS(fp16_n256_bn);
  switch (static_cast<GemmConfig>(config)) {
    case GemmConfig::T128x128:
      return bf16 ? DISTGEMM_KERNELS(bf16_n128) : DISTGEMM_KERNELS(fp16_n128);
    case GemmConfig::T128x128C1:
      if (bf16) return DISTGEMM_KERNELS(bf16_n128_c11);
      break;
    case GemmConfig::T256x192:
      if (bf16) return DISTGEMM_KERNELS(bf16_m256_n192);
      break;
    case GemmConfig::T128x256SK:
      if (bf16) return DISTGEMM_KERNELS(bf16_n256_sk);
      break;
    case GemmConfig::T128x128SK:
      if (bf16) return DISTGEMM_KERNELS(bf16_n128_sk);
      break;
    default:
      break;
  }
  return bf16 ? DISTGEMM_KERNELS(bf16_n256) : DISTGEMM_KERNELS(fp16_n256);
}
#undef DISTGEMM_KERNELS
}  // namespace detail

namespace {

std::string s(int64_t v) { return std::to_string(v); }

// The configuration a request names: e4m3's by fast_accum, else g.config, else tile_n's, else 0
// (auto: the model's choice at launch).
int requested_config(const GemmDesc& g) {
  if (g.dtype == DType::E4M3) return e4m3_config(g.fast_accum);
  return g.config != 0 ? g.config : g.tile_n != 0 ? config_of_tile_n(g.tile_n) : 0;
}

// TMA reads and writes each operand through a tensor map: the base address must be 16-byte
// aligned and every stride but the contiguous one a multiple of 16 bytes.
std::string check_operand(const char* name, const void* p, int64_t ld, int64_t batch, int64_t l,
                          int eb, bool row_vector = false) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  if (addr % 16 != 0)
    return std::string("operand ") + name + ": address " + s(static_cast<int64_t>(addr)) +
           " is not 16-byte aligned (TMA requires it): start the tensor and every shard or tile "
           "offset on a multiple of " +
           s(16 / eb) + " elements";
  if (row_vector) return "";
  if ((ld * eb) % 16 != 0)
    return std::string("operand ") + name + ": row stride " + s(ld) + " elements (" + s(ld * eb) +
           " bytes) is not a multiple of 16 bytes (TMA requires it): make the contiguous "
           "extent a multiple of " +
           s(16 / eb) + " elements (e.g. " + s(ld) + " -> " +
           s((ld + 16 / eb - 1) / (16 / eb) * (16 / eb)) + ")";
  if (l > 1 && (batch * eb) % 16 != 0)
    return std::string("operand ") + name + ": batch stride " + s(batch) +
           " elements is not a multiple of 16 bytes (TMA requires it)";
  return "";
}

}  // namespace

// The fp8 (e4m3) side of a GEMM: both scales given for e4m3 and none otherwise, and the
// settings the fp8 kernels do not have.
std::string scale_problem(const GemmDesc& g) {
  if (g.dtype != DType::E4M3) {
    if (g.scale_a || g.scale_b || g.fast_accum)
      return std::string(
                 "scale_a, scale_b and fast_accum are for fp8 (e4m3) inputs; this GEMM "
                 "is ") +
             dtype_name(g.dtype);
    return "";
  }
  if (!g.scale_a || !g.scale_b)
    return std::string(
               "an fp8 (e4m3) GEMM needs both scales (one float32 per operand, or one per "
               "row): scale_a is ") +
           (g.scale_a ? "given" : "null") + ", scale_b is " + (g.scale_b ? "given" : "null");
  for (const float* p : {g.scale_a, g.scale_b})
    if (reinterpret_cast<uintptr_t>(p) % 4 != 0)
      return "fp8 scales are float32: their addresses must be 4-byte aligned, got " +
             s(static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)));
  if (g.alpha != 1.0f)
    return "alpha=" + std::to_string(g.alpha) +
           " with fp8 (e4m3): fold it into scale_a (the kernel multiplies scale_a and scale_b)";
  if (g.b_n_major)
    return "an fp8 (e4m3) B must be K-contiguous ([n, k], nn.Linear's layout): wgmma reads fp8 "
           "operands K-major only; pass the weight contiguous, not a transposed view";
  if (g.tile_n != 0)
    return "tile_n=" + s(g.tile_n) +
           " with fp8 (e4m3): its kernel follows fast_accum (config e4m3_128x192 or "
           "e4m3_128x256fa); leave tile_n 0";
  if (config_is_e4m3(g.config) && g.config != e4m3_config(g.fast_accum))
    return std::string("config=") + config_name(g.config) +
           " and fast_accum=" + (g.fast_accum ? "true" : "false") +
           " name different fp8 kernels: e4m3_128x256fa is " + "the fast-accumulation one";
  return "";
}

std::string gemm_can_implement(const GemmDesc& g) {
  const int eb = dtype_bytes(g.dtype), ob = out_dtype_bytes(g.dtype);
  if (g.cublas_algo < -1)
    return "cublas_algo=" + s(g.cublas_algo) + " is not -1 (distgemm's kernel) or a rank >= 0";
  std::string e = gemm_extent_problem(g.m, g.n, g.k, g.l, eb);
  if (!e.empty()) return e;
  if (!g.a || !g.b || !g.d) return "internal: GEMM without A, B or D pointer";
  if (!(e = check_operand("A", g.a, g.lda, g.batch_a, g.l, eb)).empty()) return e;
  if (!(e = check_operand("B", g.b, g.ldb, g.batch_b, g.l, eb)).empty()) return e;
  if (!(e = check_operand("D", g.d, g.ldd, g.batch_d, g.l, ob)).empty()) return e;
  if (g.partial &&
      !(e = check_operand("partial C", g.partial, g.ld_partial, g.batch_partial, g.l, ob)).empty())
    return e;
  if (g.user_c && !(e = check_operand("C", g.user_c, g.ldc, g.batch_c, g.l, ob)).empty()) return e;
  if (g.bias && !(e = check_operand("bias", g.bias, 0, 0, 1, ob, true)).empty()) return e;
  if (!(e = scale_problem(g)).empty()) return e;
  // cuBLASLt takes the same operands (16-byte aligned, as its heuristic is promised); the rank of
  // its algorithm is checked at launch, against the heuristic's list for the shape.
  if (g.cublas_algo >= 0) return cublaslt_problem(g);
  if (g.dtype == DType::E4M3) {
    if (!(e = gemm_config_problem(g.dtype, g.config, false)).empty()) return e;
    if (!(e = gemm_decomposition_problem(g)).empty()) return e;
    return detail::kernels(g.dtype, e4m3_config(g.fast_accum)).can_implement(g);
  }
  if (!(e = tile_n_problem(g.tile_n)).empty()) return e;
  if (g.b_n_major && g.tile_n == 128)
    return "tile_n=128 has no kernel for an N-contiguous B (a transposed weight view): use "
           "tile_n=0 or 256, or pass the weight K-contiguous";
  if (!(e = gemm_config_problem(g.dtype, g.config, g.b_n_major)).empty()) return e;
  if (g.config != 0 && g.tile_n != 0 && g.config != config_of_tile_n(g.tile_n))
    return "tile_n=" + s(g.tile_n) + " and config=" + config_name(g.config) +
           " name different kernels: set one of them (tile_n 128 is config 128x128, 256 is "
           "128x256)";
  if (!(e = gemm_decomposition_problem(g)).empty()) return e;
  // Every configuration takes the same shapes (TMA alignment); ask the one a request names.
  return detail::kernels(g.dtype, requested_config(g), g.b_n_major).can_implement(g);
}

std::string gemm_decomposition_problem(const GemmDesc& g) {
  const int c = requested_config(g);
  return decomposition_problem(g.decomposition, g.splits, config_is_stream_k(c),
                               config_name(c).c_str());
}

std::string gemm_config_problem(DType dtype, int config, bool b_n_major) {
  if (config == 0) return "";
  if (!config_shape(config)) return "config=" + s(config) + " is not one of " + config_list();
  if ((dtype == DType::E4M3) != config_is_e4m3(config))
    return std::string("config=") + config_name(config) +
           (config_is_e4m3(config) ? " is an fp8 (e4m3) kernel; " : " is a 16-bit kernel; ") +
           dtype_name(dtype) +
           (dtype == DType::E4M3 ? " has e4m3_128x192 and e4m3_128x256fa (fast accumulation)"
                                 : " has the others");
  if (dtype == DType::E4M3) return "";
  const bool bf16 = dtype == DType::BF16;
  if (config_shape(config)->bf16_only && !bf16)
    return std::string("config=") + config_name(config) + " is instantiated for bf16 only; " +
           dtype_name(dtype) + " has 128x256 and 128x128";
  if (!config_available(config, bf16, b_n_major))
    return std::string("config=") + config_name(config) +
           " has no kernel for an N-contiguous B (a transposed weight view): use config auto or "
           "128x256, or pass the weight K-contiguous";
  return "";
}

int gemm_config_resident_ctas(DType dtype, int config, int device) {
  const std::string why = gemm_config_problem(dtype, config, false);
  if (config == 0 || !why.empty())
    throw std::invalid_argument("gemm_config_resident_ctas: " +
                                (config == 0 ? "config=auto names no kernel" : why));
  // prepare_* is set up once per device and cached: a table lookup after the first call.
  return detail::kernels(dtype, config).prepare(device);
}

int gemm_resident_ctas(DType dtype, int tile_n, int device) {
  if (tile_n != 128 && tile_n != 256)
    throw std::invalid_argument("gemm_resident_ctas: tile_n=" + std::to_string(tile_n) +
                                " is not 128 or 256");
  return gemm_config_resident_ctas(dtype, config_of_tile_n(tile_n), device);
}

int gemm_config(const GemmDesc& g, int device) {
  if (g.config != 0) return g.config;
  if (g.dtype == DType::E4M3) return e4m3_config(g.fast_accum);
  if (g.tile_n != 0) return config_of_tile_n(g.tile_n);
  const std::vector<int> candidates =
      available_configs(g.dtype == DType::BF16, g.b_n_major, g.workspace != nullptr);
  if (candidates.size() == 1) return candidates[0];
  std::vector<int> slots;
  for (int c : candidates) slots.push_back(gemm_config_resident_ctas(g.dtype, c, device));
  return choose_config(g.m, g.n, g.l, candidates, slots, g.swizzle);
}

int64_t gemm_workspace_bytes(const GemmDesc& g, int device) {
  GemmDesc offered = g;
  if (offered.workspace == nullptr) offered.workspace = &offered;  // "a workspace is offered"
  resolve_kernel(offered, device);
  if (offered.cublas_algo >= 0 || !config_is_stream_k(offered.config)) return 0;
  return detail::kernels(g.dtype, offered.config, g.b_n_major).workspace_bytes(g, device);
}

namespace {
std::mutex& table_mutex() {
  static std::mutex mu;
  return mu;
}
std::vector<KernelTableRow>& table_rows() {
  static auto* rows = new std::vector<KernelTableRow>();  // never freed (static destruction)
  return *rows;
}
bool& table_all_plans() {
  static bool all_plans = false;
  return all_plans;
}
}  // namespace

void set_kernel_table(std::vector<KernelTableRow> rows, bool all_plans) {
  std::lock_guard<std::mutex> lock(table_mutex());
  table_rows() = std::move(rows);
  table_all_plans() = all_plans;
}

bool kernel_table_all_plans() {
  std::lock_guard<std::mutex> lock(table_mutex());
  return table_all_plans();
}

std::vector<KernelTableRow> kernel_table() {
  std::lock_guard<std::mutex> lock(table_mutex());
  return table_rows();
}

void resolve_kernel(GemmDesc& g, int device) {
  if (g.cublas_algo >= 0) return;
  if (g.kernel_table && g.config == 0 && g.tile_n == 0) {
    KernelTableRow row;
    bool found = false;
    const int fp8_kind =
        g.dtype == DType::E4M3 ? fp8_kind_of(g.scale_a_rows, g.scale_b_rows, g.fast_accum) : 0;
    {
      std::lock_guard<std::mutex> lock(table_mutex());
      if (const KernelTableRow* r = table_row(table_rows(), static_cast<int>(g.dtype), g.m, g.n,
                                              g.k, g.l, g.b_n_major, fp8_kind)) {
        row = *r;
        found = true;
      }
    }
    if (found && row.cublas_algo >= 0) {
      GemmDesc lt = g;
      lt.cublas_algo = row.cublas_algo;
      // A row names an algorithm by its rank in the heuristic's list for the measured shape;
      // where this GEMM's list is shorter (other epilogue, other M), its first runs. Where
      // cuBLASLt cannot take the GEMM (both a partial and C; a layout its heuristic refuses),
      // distgemm's kernel runs it, as without a row; a failing heuristic is an error.
      const int rank = cublaslt_rank_to_run(lt, device);
      if (rank >= 0) {
        g.cublas_algo = rank;
        return;
      }
    } else if (found && g.dtype != DType::E4M3 &&
               config_available(row.config, g.dtype == DType::BF16, g.b_n_major) &&
               (!config_is_stream_k(row.config) || g.workspace != nullptr)) {
      g.config = row.config;
      return;
    }
    // An fp8 row naming one of distgemm's kernels changes nothing: fast_accum names the one.
  }
  g.config = gemm_config(g, device);
}

void gemm_launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream) {
  const std::string why = gemm_can_implement(g);
  if (!why.empty()) throw std::invalid_argument("GEMM rejected before launch: " + why);
  GemmDesc run = g;
  resolve_kernel(run, device);
  if (run.cublas_algo >= 0) {
    cublaslt_launch(run, wait, device, stream);
    return;
  }
  const int config = run.config;
  if (run.raster == 0)
    run.raster = choose_raster(config, g.m, g.n, g.k,
                               gemm_config_resident_ctas(g.dtype, config, device), g.swizzle);
  detail::kernels(g.dtype, config, g.b_n_major).launch(run, wait, device, stream);
}

__global__ void entry_barrier_kernel(const EntryBarrierSpec s);
__global__ void copy_wait_kernel(const WaitSpec w);

namespace {
// The runtime's single-block kernels, loaded on `device` once. With lazy module loading (CUDA's
// default) a kernel loads at its first launch, and that load waits for the device to go idle,
// which it never does while a GEMM enqueued before it spins on a flag that a later node of the
// same plan sets: a plan's first wait kernel, launched after its spinning GEMMs, would wait for
// them forever. Asking for a kernel's attributes loads it.
void load_runtime_kernels(int device) {
  static std::mutex mu;
  static auto* loaded = new std::vector<int>();
  std::lock_guard<std::mutex> lock(mu);
  for (int d : *loaded)
    if (d == device) return;
  cudaFuncAttributes attr;
  DISTGEMM_CUDA_CHECK(cudaSetDevice(device));
  DISTGEMM_CUDA_CHECK(cudaFuncGetAttributes(&attr, entry_barrier_kernel));
  DISTGEMM_CUDA_CHECK(cudaFuncGetAttributes(&attr, copy_wait_kernel));
  loaded->push_back(device);
}
}  // namespace

void gemm_prepare(DType dtype, int device) {
  load_runtime_kernels(device);
  if (dtype == DType::E4M3) {
    for (bool fast : {false, true}) (void)detail::kernels(dtype, e4m3_config(fast)).prepare(device);
    return;
  }
  for (int c : available_configs(dtype == DType::BF16, false, /*stream_k=*/true))
    (void)detail::kernels(dtype, c).prepare(device);
  (void)detail::kernels(dtype, static_cast<int>(GemmConfig::T128x256), true).prepare(device);
}

// Entry barrier of a launch: bump this device's generation, publish it into every device's
// barrier slot `device`, then wait until every device has published it here. One thread.
__global__ void entry_barrier_kernel(const EntryBarrierSpec s) {
  if (threadIdx.x != 0) return;
  if (aborted(s.abort)) return;
  const uint32_t gen = *reinterpret_cast<volatile uint32_t*>(s.epoch) + 1u;
  *reinterpret_cast<volatile uint32_t*>(s.epoch) = gen;  // read by this graph's later nodes
  fence_acq_rel_sys();
  for (int r = 0; r < s.tp; ++r) st_relaxed_sys(s.peer_barrier[r] + s.device, gen);
  uint64_t start = 0;
  for (int r = 0; r < s.tp; ++r)
    if (!wait_reached(s.local_barrier + r, gen, s.abort, s.record, s.timeout_ns, start,
                      kWaitEntryBarrier, s.device, -1, r, 64))
      return;
}

// Wait before a copy-engine transfer (only ar_tile_a's local copies of pushed tiles need one).
// One thread; it never blocks a GEMM's progress (GEMMs never depend on the copy branch), see
// device/graph.hpp.
__global__ void copy_wait_kernel(const WaitSpec w) {
  if (threadIdx.x == 0) (void)wait_flags(w);
}

void entry_barrier_launch(const EntryBarrierSpec& spec, cudaStream_t stream) {
  entry_barrier_kernel<<<1, 32, 0, stream>>>(spec);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

void copy_wait_launch(const WaitSpec& wait, cudaStream_t stream) {
  copy_wait_kernel<<<1, 32, 0, stream>>>(wait);
  DISTGEMM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace distgemm::kernel
