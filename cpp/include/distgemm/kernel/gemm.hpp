// Host API of the GEMM with a leading barrier. No CUTLASS in this header: the kernels are
// compiled once into distgemm_runtime (per dtype, one instantiation per output tile width) and
// reached through these functions, so the graph builder, the examples and the bindings build
// fast.
//
// The GEMM (per batch l < L, row-major views, `ld*` = elements between rows):
//   D[m, n] = alpha * sum_k A[m, k] * B[n, k] + partial[m, n] + beta * user_c[m, n] + bias[n]
// A [m, k] K-contiguous, B [n, k] K-contiguous (nn.Linear layout: a "TN" GEMM) or, with
// b_n_major, B stored [k, n] N-contiguous (B[n, k] at b[k * ldb + n]), D, partial and
// user_c [m, n] N-contiguous; partial, user_c and bias may each be null (absent). bf16 or fp16
// in and out, fp32 accumulate; or fp8 (DType::E4M3): A and B float8_e4m3fn (B K-contiguous),
// D, partial, user_c and bias bf16, and the products scaled in the epilogue (GemmDesc::scale_a).
#pragma once

// The host-only core (the bindings' pure rules) includes this header on machines without the CUDA
// toolkit: there the stream handle is declared as the runtime declares it.
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
#endif

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/kernel/tile_choice.hpp"  // kDefaultSwizzle, GemmConfig
#include "distgemm/kernel/wait_spec.hpp"

namespace distgemm::kernel {

// The GEMM's input type. BF16 and FP16 also name the output; E4M3 (float8_e4m3fn inputs) writes
// bf16, the output torch's scaled GEMMs default to.
enum class DType : uint8_t { BF16 = 0, FP16 = 1, E4M3 = 2 };

inline const char* dtype_name(DType t) {
  return t == DType::BF16 ? "bf16" : t == DType::FP16 ? "fp16" : "e4m3";
}

// The inverse of dtype_name, also taking torch's names; std::invalid_argument otherwise.
inline DType parse_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp16" || s == "float16") return DType::FP16;
  if (s == "e4m3" || s == "float8_e4m3fn") return DType::E4M3;
  throw std::invalid_argument("dtype '" + s +
                              "' is not supported: use bf16, fp16 or e4m3 (float8_e4m3fn)");
}
// Bytes of one element of A and B.
inline int dtype_bytes(DType t) { return t == DType::E4M3 ? 1 : 2; }
// The type of D, the partials, C and bias: the input's for bf16 and fp16, bf16 for e4m3.
inline DType out_dtype(DType t) { return t == DType::E4M3 ? DType::BF16 : t; }
// Bytes of one element of D, the partials, C and bias.
inline int out_dtype_bytes(DType t) { return dtype_bytes(out_dtype(t)); }

struct GemmDesc {
  DType dtype = DType::BF16;
  int64_t m = 0, n = 0, k = 0, l = 1;
  const void* a = nullptr;
  int64_t lda = 0, batch_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, batch_b = 0;
  // B stored [k, n] (N contiguous; ldb = elements between k rows): the transposed view of an
  // nn.Linear weight, read without a copy. Only the 128x256 tile has this layout.
  bool b_n_major = false;
  void* d = nullptr;
  int64_t ldd = 0, batch_d = 0;
  const void* partial = nullptr;  // added with scale 1; null: absent
  int64_t ld_partial = 0, batch_partial = 0;
  const void* user_c = nullptr;  // added with scale beta; null: absent
  int64_t ldc = 0, batch_c = 0;
  const void* bias = nullptr;  // [n], broadcast over rows and batches; null: absent
  float alpha = 1.0f;          // bf16/fp16 only: fp8 scales through scale_a and scale_b
  float beta = 0.0f;
  // fp8 (E4M3) only, both required: acc[m, n] is multiplied by scale_a and scale_b, fp32 device
  // values, before bias, partial and C are added. Each is one value (tensor-wise), or with
  // *_rows one per row of its operand (row-wise: A's row m at scale_a[m], B's row n at
  // scale_b[n]; a sub-GEMM passes the pointers at its first row).
  const float* scale_a = nullptr;
  bool scale_a_rows = false;
  const float* scale_b = nullptr;
  bool scale_b_rows = false;
  // fp8 only: CUTLASS's fast-accumulation kernel (wgmma accumulates the whole K in its own
  // reduced-precision accumulator) instead of promoting into fp32 every 4 k-blocks of 128.
  bool fast_accum = false;
  // Persistent tile scheduler (runtime arguments of the one kernel, no extra instantiation):
  // tiles are walked in groups of `swizzle` (1, 2, 4, 8) along the raster order (tile_walk.hpp;
  // the last group is narrower where the swizzle does not divide the grid), raster 0 = the
  // configuration's rule (tile_choice.hpp's choose_raster), 1 = along M, 2 = along N. The
  // stream-K configuration runs CUTLASS's scheduler, which pads the grid to the swizzle: there
  // the swizzle is lowered until it divides the tile grid.
  int swizzle = kDefaultSwizzle;
  int raster = kDefaultRaster;
  // Programmatic dependent launch: this GEMM may start on SMs freed by the previous kernel of the
  // stream while that kernel's last tiles still run (every GEMM CTA signals
  // griddepcontrol.launch_dependents on entry). Only for a previous kernel this GEMM has no data
  // dependence on: the runtime's GEMMs exchange data only through flags.
  bool pdl = false;
  // Output tile 128 x tile_n: 0 = chosen from the shape, 128 or 256 = the cluster-2x1 kernel with
  // that tile (config 128x128 or 128x256).
  int tile_n = 0;
  // Kernel configuration (kernel/tile_choice.hpp's GemmConfig numbers): 0 = chosen from the shape
  // (choose_config) unless tile_n names one; else that kernel. A set config and tile_n must agree.
  int config = 0;
  // Workspace of a stream-K configuration: at least gemm_workspace_bytes(), zeroed once when
  // allocated, used by one GEMM at a time (launches on one stream in order; PDL successors need
  // their own) and always passed with the same workspace_bytes. Its last kStreamKTailBytes hold
  // the split counters, which every launch leaves zeroed, so GEMMs of any shape can share it.
  // Null: the model chooses among the data-parallel configurations only.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // Stream-K configurations only (runtime arguments of the one kernel): how the work divides
  // along K, a Decomposition number (tile_choice.hpp; 0 = stream_k_decomposition's rule), and
  // with split_k the number of K ranges per tile. Other configurations take 0 and 1.
  int decomposition = 0;
  int splits = 1;
  // cuBLASLt instead of distgemm's kernels (gemm_cublaslt.cpp): >= 0 runs the algorithm of that
  // rank in cuBLASLt's heuristic list for this GEMM (0: its first, the one cuBLAS itself would
  // run for that shape; with row buckets on, cublaslt_process.hpp, the list of its row bucket
  // where cuBLASLt accepts that algorithm for the GEMM), behind a one-thread kernel that waits for
  // the GEMM's flags; -1 (default) runs distgemm's kernel of `config`. Set by a caller, or by the
  // machine's kernel table (kernel_table.hpp) where config, tile_n and cublas_algo are all left
  // unset. Needs config 0 and tile_n 0, a 16-bit dtype, and at most one of partial and user_c
  // (cuBLASLt has one C).
  int cublas_algo = -1;
  // Whether the machine's kernel table may choose this GEMM's kernel (where config, tile_n and
  // cublas_algo are unset). A plan of several ranks clears it where set_kernel_table's all_plans
  // is off (DISTGEMM_KERNEL_TABLE_PLANS=one-rank). Before cublaslt_preload and gemm_prepare loaded
  // the kernels ahead, such a plan's first eager call with a cuBLASLt step once timed out on its
  // flags (lazy module loading behind a spinning GEMM; 70B O at TP=4,
  // benchmarks/results/2026-11-28-kernel-table.md).
  bool kernel_table = true;
};

// The tail of a stream-K workspace: CUTLASS's split counters (two 32-bit words per split tile,
// far below this bound at any SM count), then the launch's arrival count. All zero between
// launches.
inline constexpr int64_t kStreamKCounterBytes = 64 * 1024;
inline constexpr int64_t kStreamKTailBytes = kStreamKCounterBytes + 128;

// "" when the kernel can run `g`; otherwise the reason, in words, with the values and the fix.
std::string gemm_can_implement(const GemmDesc& g);

// Per-device setup of the kernels (their dynamic shared-memory limit). Call before capturing a
// graph on `device`: gemm_launch calls it too, but function attributes are better set outside a
// stream capture.
void gemm_prepare(DType dtype, int device);

// "" when configuration `config` (0 = auto) has a kernel for the dtype and B layout, else why.
std::string gemm_config_problem(DType dtype, int config, bool b_n_major);

// "" when g.decomposition and g.splits suit the configuration `g` names (g.config, else the one
// g.tile_n names, e4m3: the one g.fast_accum names; auto names none, so takes only the
// defaults), else why (tile_choice.hpp's decomposition_problem).
std::string gemm_decomposition_problem(const GemmDesc& g);

// The configuration gemm_launch runs `g` with on `device`: g.config, else the one g.tile_n names,
// else choose_config over the dtype's configurations with their resident CTAs on that device.
int gemm_config(const GemmDesc& g, int device);

// The workspace bytes `g` needs on `device` when the caller offers one: 0 unless the configuration
// gemm_launch would run with a workspace (g.config, else the model's choice) is stream-K.
int64_t gemm_workspace_bytes(const GemmDesc& g, int device);

// Resident CTAs (the persistent grid size) of a configuration's kernel on `device`: the slot
// counts choose_config works with. gemm_resident_ctas names the kernel by tile width (128 or
// 256: the cluster-2x1 configurations).
int gemm_config_resident_ctas(DType dtype, int config, int device);
int gemm_resident_ctas(DType dtype, int tile_n, int device);

// Enqueues the GEMM on `stream` (capturable). `device` is the CUDA device the stream belongs to.
// Throws std::runtime_error (with the CUDA/CUTLASS error) on failure; never launches a GEMM
// that gemm_can_implement rejects.
void gemm_launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream);

// The kernel `g` runs with on `device`, settled once (a graph resolves it at capture, for the
// launch and its statistics): where g leaves config, tile_n and cublas_algo unset, allows the
// table (kernel_table) and the machine's kernel table (set_kernel_table) has a choice for the
// shape, the table's (a configuration or a cuBLASLt algorithm); otherwise
// g.config = gemm_config(g, device).
void resolve_kernel(GemmDesc& g, int device);

// "" when cuBLASLt can run `g` (with its g.cublas_algo, or 0 where unset), else why: the
// library is loaded at first use (dlopen of libcublasLt.so.13, torch's own where torch is
// imported), a 16-bit dtype, at most one of partial and user_c, no stream-K settings.
std::string cublaslt_problem(const GemmDesc& g);

// How many algorithms cuBLASLt's heuristic offers for `g` on `device` (at most
// kCublasLtMaxAlgos), after cublaslt_problem; cached per shape.
inline constexpr int kCublasLtMaxAlgos = 8;
int cublaslt_algo_count(const GemmDesc& g, int device);
// The rank in cuBLASLt's list that g runs for the rank it asks (g.cublas_algo; 0 where it is
// beyond the list), or -1 where cuBLASLt cannot take g or offers no algorithm. With row buckets
// on (cublaslt_process.hpp) the list is the bucket's (asked once per bucket, not per row count),
// where its algorithm takes g; a failing heuristic throws.
int cublaslt_rank_to_run(const GemmDesc& g, int device);

// Loads the kernels cuBLASLt runs for `g` (g.cublas_algo >= 0) on `device`, once per shape and
// algorithm, by capturing the call into a graph that is instantiated and never launched. A plan
// calls it for each of its cuBLASLt GEMMs before it enqueues any work: with lazy module loading
// (CUDA's default), a kernel loads at its first launch, and the load waits for the device to go
// idle, which it never does while a GEMM enqueued before it spins on a flag that a later, not yet
// enqueued, node of the same plan sets.
void cublaslt_preload(const GemmDesc& g, int device);

// cuBLASLt's version (cublasLtGetVersion), or 0 when the library cannot be loaded.
int64_t cublaslt_version();
// cuBLASLt GEMMs enqueued or captured by this process so far (tests see which kernel ran).
int64_t cublaslt_launches();

// The single-block kernels of the runtime (entry barrier, wait before a copy).
void entry_barrier_launch(const EntryBarrierSpec& spec, cudaStream_t stream);
void copy_wait_launch(const WaitSpec& wait, cudaStream_t stream);

}  // namespace distgemm::kernel
