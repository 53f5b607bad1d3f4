// cuBLASLt as a GEMM kernel of the runtime (GemmDesc::cublas_algo): the library loaded at first
// use, the GEMM's layouts and epilogue in cuBLASLt's terms, its heuristic's algorithms cached per
// shape, and the launch behind a one-thread kernel that waits for the GEMM's flags.
//
// Which algorithm runs: rank cublas_algo of the heuristic's list for the GEMM's own shape. With
// row buckets on (cublaslt_process.hpp; off by default), rank cublas_algo of the list for the GEMM
// with its rows rounded up to a row bucket (heuristic_rows), where cuBLASLt accepts that algorithm
// for the GEMM's own rows (cublasLtMatmulAlgoCheck): a bucket asks the heuristic once (about
// 0.17 ms on H200) for all its row counts, but its algorithm ran up to 1.32x slower than the
// heuristic's own choice on rows inside it. Each algorithm's kernel loads at its first use (about
// 3 ms on H200), loaded ahead once per shape and algorithm (cublaslt_preload).
//
// Why dlopen: torch's CUDA wheels bring libcublasLt.so.13 and load it on `import torch`; opening
// the same soname finds that copy (or, without torch, the one found at build time,
// DISTGEMM_CUBLASLT_LIBRARY), so distgemm adds no second cuBLAS and its import never fails for
// a missing one: the candidate is then unavailable, with the reason. Only the header is needed
// to build (the nvidia-cublas wheel's, cpp/cuda.cmake).
//
// The mapping: D[m, n] = A[m, k] B[n, k]^T row-major is D^T = B A^T column-major, so cuBLASLt's
// A is our B (k x n column-major, transposed; an N-contiguous B is n x k, not transposed), its B
// is our A (k x m, not transposed), and C and D are n x m with our row strides as leading
// dimensions. The bias (one per column of D) is cuBLASLt's per-row bias of D^T. partial (scale 1)
// or user_c (scale beta) is its C; D itself with beta 0 where there is neither. fp8 (e4m3): the
// scales swap sides with the operands, a row-wise one is cuBLASLt's outer-vector scale, and
// fast_accum is its fast accumulation.
//
// cublaslt_preload loads a GEMM's kernels before a plan enqueues anything (gemm.hpp says why).
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/kernel/cublaslt_process.hpp"
#include "distgemm/kernel/gemm.hpp"

#if DISTGEMM_WITH_CUBLASLT
#include <cublasLt.h>
#include <dlfcn.h>
#endif

namespace distgemm::kernel {

namespace {
std::atomic<int64_t> launches{0};
std::atomic<bool> row_buckets{false};
std::array<std::atomic<int64_t>, static_cast<int>(CublasLtHostWork::kCount)> host_ns{};

// Adds the host time of its scope to one kind of cublaslt_host_ns.
class HostTime {
 public:
  explicit HostTime(CublasLtHostWork work) : work_(work) {}
  ~HostTime() {
    host_ns[static_cast<int>(work_)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
            .count();
  }
  HostTime(const HostTime&) = delete;
  HostTime& operator=(const HostTime&) = delete;

 private:
  CublasLtHostWork work_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};
}  // namespace

int64_t cublaslt_launches() { return launches.load(); }
void set_cublaslt_row_buckets(bool on) { row_buckets.store(on); }
bool cublaslt_row_buckets() { return row_buckets.load(); }
int64_t cublaslt_host_ns(CublasLtHostWork work) {
  const int i = static_cast<int>(work);
  if (i < 0 || i >= static_cast<int>(CublasLtHostWork::kCount))
    throw std::invalid_argument("cublaslt_host_ns: no such kind of work: " + std::to_string(i));
  return host_ns[i].load();
}

#if DISTGEMM_WITH_CUBLASLT
namespace {

std::string s(int64_t v) { return std::to_string(v); }

// The entry points distgemm calls, resolved from the loaded library.
struct Lt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtGetVersion) version = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoCheck) algo_check = nullptr;
  cublasLtHandle_t handle = nullptr;
  std::string problem;  // why the library is unavailable ("" when loaded)
};

template <class F>
bool resolve(void* lib, const char* name, F& out, std::string& problem) {
  out = reinterpret_cast<F>(dlsym(lib, name));
  if (!out && problem.empty()) problem = std::string("cuBLASLt has no symbol ") + name;
  return out != nullptr;
}

const Lt& lt() {
  static const Lt* loaded = [] {
    auto* l = new Lt();  // never freed: cuBLASLt outlives every graph that captured it
    void* lib = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_GLOBAL);
#ifdef DISTGEMM_CUBLASLT_LIBRARY
    if (!lib) lib = dlopen(DISTGEMM_CUBLASLT_LIBRARY, RTLD_NOW | RTLD_GLOBAL);
#endif
    if (!lib) {
      const char* e = dlerror();
      l->problem = std::string("cuBLASLt could not be loaded (libcublasLt.so.13: ") +
                   (e ? e : "not found") + "); import torch first, or install nvidia-cublas";
      return l;
    }
    std::string& p = l->problem;
    resolve(lib, "cublasLtCreate", l->create, p);
    resolve(lib, "cublasLtGetVersion", l->version, p);
    resolve(lib, "cublasLtMatmul", l->matmul, p);
    resolve(lib, "cublasLtMatmulDescCreate", l->desc_create, p);
    resolve(lib, "cublasLtMatmulDescDestroy", l->desc_destroy, p);
    resolve(lib, "cublasLtMatmulDescSetAttribute", l->desc_set, p);
    resolve(lib, "cublasLtMatrixLayoutCreate", l->layout_create, p);
    resolve(lib, "cublasLtMatrixLayoutDestroy", l->layout_destroy, p);
    resolve(lib, "cublasLtMatrixLayoutSetAttribute", l->layout_set, p);
    resolve(lib, "cublasLtMatmulPreferenceCreate", l->pref_create, p);
    resolve(lib, "cublasLtMatmulPreferenceDestroy", l->pref_destroy, p);
    resolve(lib, "cublasLtMatmulPreferenceSetAttribute", l->pref_set, p);
    resolve(lib, "cublasLtMatmulAlgoGetHeuristic", l->heuristic, p);
    resolve(lib, "cublasLtMatmulAlgoCheck", l->algo_check, p);
    if (p.empty()) {
      const cublasStatus_t st = l->create(&l->handle);
      if (st != CUBLAS_STATUS_SUCCESS)
        p = "cublasLtCreate failed (cublasStatus " + std::to_string(static_cast<int>(st)) +
            "; a machine without a GPU driver gets this)";
    }
    return l;
  }();
  return *loaded;
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt ") + what + " failed (cublasStatus " +
                             std::to_string(static_cast<int>(st)) + ")");
}

// The C operand cuBLASLt reads, and its scale.
struct COperand {
  const void* ptr;
  int64_t ld, batch;
  float beta;
};
COperand c_operand(const GemmDesc& g) {
  if (g.partial) return {g.partial, g.ld_partial, g.batch_partial, 1.0f};
  if (g.user_c) return {g.user_c, g.ldc, g.batch_c, g.beta};
  return {g.d, g.ldd, g.batch_d, 0.0f};
}

// The GEMM's descriptors (RAII over cuBLASLt's handles).
struct Descs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descs(const GemmDesc& g, int64_t workspace_bytes) {
    try {
      build(g, workspace_bytes);
    } catch (...) {
      release();  // a constructor that throws runs no destructor
      throw;
    }
  }
  void build(const GemmDesc& g, int64_t workspace_bytes) {
    const Lt& L = lt();
    // The output's type (and C's and the bias's): bf16 for bf16 and e4m3 inputs, else fp16.
    const cudaDataType_t t = g.dtype == DType::FP16 ? CUDA_R_16F : CUDA_R_16BF;
    const cudaDataType_t in = g.dtype == DType::E4M3 ? CUDA_R_8F_E4M3 : t;
    check(L.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = g.b_n_major ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(L.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "set TRANSA");
    check(L.desc_set(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "set TRANSB");
    if (g.dtype == DType::E4M3) {
      // cuBLASLt's A is our B and its B our A, so their scales swap; a row-wise scale is
      // cuBLASLt's outer vector (one per row of its A, one per column of its B).
      scale(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, g.scale_b,
            g.scale_b_rows);
      scale(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, g.scale_a,
            g.scale_a_rows);
      const int8_t fast = g.fast_accum ? 1 : 0;
      check(L.desc_set(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)), "set FAST_ACCUM");
    }
    if (g.bias) {
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      check(L.desc_set(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)), "set EPILOGUE");
      check(L.desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)), "set BIAS type");
      check(L.desc_set(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)),
            "set BIAS_POINTER");
    }
    const COperand c_op = c_operand(g);
    layout(a, in, g.b_n_major ? g.n : g.k, g.b_n_major ? g.k : g.n, g.ldb, g.batch_b, g.l);
    layout(b, in, g.k, g.m, g.lda, g.batch_a, g.l);
    layout(c, t, g.n, g.m, c_op.ld, c_op.batch, g.l);
    layout(d, t, g.n, g.m, g.ldd, g.batch_d, g.l);
    check(L.pref_create(&pref), "MatmulPreferenceCreate");
    const uint64_t ws = static_cast<uint64_t>(workspace_bytes);
    check(L.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
          "set MAX_WORKSPACE_BYTES");
    // The heuristic's choice may depend on the operands' alignment; every operand is 16-byte
    // aligned (gemm_can_implement) and the same is promised for every call, so that a graph
    // captured at one address runs the same kernels at another.
    const uint32_t align = 16;
    for (auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      check(L.pref_set(pref, attr, &align, sizeof(align)), "set MIN_ALIGNMENT");
  }
  void scale(cublasLtMatmulDescAttributes_t pointer, cublasLtMatmulDescAttributes_t mode,
             const float* values, bool rows) {
    const Lt& L = lt();
    check(L.desc_set(op, pointer, &values, sizeof(values)), "set SCALE_POINTER");
    const int32_t m =
        rows ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    check(L.desc_set(op, mode, &m, sizeof(m)), "set SCALE_MODE");
  }
  void layout(cublasLtMatrixLayout_t& out, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
              int64_t batch, int64_t l) {
    const Lt& L = lt();
    check(L.layout_create(&out, t, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
          "MatrixLayoutCreate");
    if (l > 1) {
      const int32_t count = static_cast<int32_t>(l);
      check(L.layout_set(out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
            "set BATCH_COUNT");
      check(L.layout_set(out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch, sizeof(batch)),
            "set STRIDED_BATCH_OFFSET");
    }
  }
  ~Descs() { release(); }
  void release() {
    const Lt& L = lt();
    if (pref) L.pref_destroy(pref);
    for (auto* x : {a, b, c, d})
      if (x) L.layout_destroy(x);
    if (op) L.desc_destroy(op);
    pref = nullptr;
    a = b = c = d = nullptr;
    op = nullptr;
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
};

// The bytes of the caller's workspace cuBLASLt may use: all but the stream-K tail, whose split
// counters must stay zero between launches (GemmDesc::workspace).
int64_t usable_workspace(const GemmDesc& g) {
  return g.workspace && g.workspace_bytes > kStreamKTailBytes
             ? g.workspace_bytes - kStreamKTailBytes
             : 0;
}

// The heuristic's algorithms for a shape: everything the choice depends on but the addresses.
// An unbatched GEMM's batch strides are left out: a plan's steps carry strides sized for the
// whole plan's buffers, which cuBLASLt does not read at one batch, and which would otherwise key
// every token count apart (the heuristic would be asked again at each).
using ShapeKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, bool, int, bool, int64_t, int, int>;
ShapeKey shape_key(const GemmDesc& g, int device) {
  const COperand c = c_operand(g);
  const int c_kind = g.partial ? 1 : g.user_c ? 2 : 0;
  const bool batched = g.l > 1;
  return {static_cast<int>(g.dtype), g.m, g.n, g.k, g.l, g.lda, g.ldb, g.ldd, c.ld,
          batched ? g.batch_a : 0, batched ? g.batch_b : 0, batched ? g.batch_d : 0, g.b_n_major,
          c_kind, g.bias != nullptr, usable_workspace(g), device,
          // fp8: the scale kinds and the accumulation choose among other kernels
          (g.scale_a_rows ? 1 : 0) | (g.scale_b_rows ? 2 : 0) | (g.fast_accum ? 4 : 0)};
}

const std::vector<cublasLtMatmulHeuristicResult_t>& algorithms(const GemmDesc& g, int device) {
  static std::mutex mu;
  static auto* cache = new std::map<ShapeKey, std::vector<cublasLtMatmulHeuristicResult_t>>();
  const ShapeKey key = shape_key(g, device);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  const HostTime timed(CublasLtHostWork::kHeuristic);
  // The heuristic is asked as a launch asks it, with non-null scale pointers (a null one reads as
  // "no scale", which an outer-vector scale mode cannot be): a query without the GEMM's scales
  // (cublaslt_algo_count) gets a placeholder address, which nothing dereferences.
  GemmDesc query = g;
  const float* placeholder = reinterpret_cast<const float*>(uintptr_t{256});
  if (query.dtype == DType::E4M3 && !query.scale_a) query.scale_a = placeholder;
  if (query.dtype == DType::E4M3 && !query.scale_b) query.scale_b = placeholder;
  Descs ds(query, usable_workspace(g));
  std::vector<cublasLtMatmulHeuristicResult_t> found(kCublasLtMaxAlgos);
  int returned = 0;
  int prev = 0;
  DISTGEMM_CUDA_CHECK(cudaGetDevice(&prev));
  DISTGEMM_CUDA_CHECK(cudaSetDevice(device));
  const cublasStatus_t st = lt().heuristic(lt().handle, ds.op, ds.a, ds.b, ds.c, ds.d, ds.pref,
                                           kCublasLtMaxAlgos, found.data(), &returned);
  DISTGEMM_CUDA_CHECK(cudaSetDevice(prev));
  // A row-wise fp8 scale is cuBLASLt's outer-vector scale mode. Where cuBLASLt refuses it with
  // INVALID_VALUE, that counts as no algorithm, as NOT_SUPPORTED does, and such a GEMM runs
  // distgemm's kernel.
  const bool outer_vec_refused =
      st == CUBLAS_STATUS_INVALID_VALUE && (g.scale_a_rows || g.scale_b_rows);
  if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED && !outer_vec_refused)
    check(st, "MatmulAlgoGetHeuristic");
  found.resize(st == CUBLAS_STATUS_SUCCESS && returned > 0 ? returned : 0);
  return cache->emplace(key, std::move(found)).first->second;
}

}  // namespace

std::string cublaslt_problem(const GemmDesc& g) {
  if (!lt().problem.empty()) return lt().problem;
  if (g.dtype == DType::E4M3 && g.b_n_major)
    return "an fp8 (e4m3) B must be K-contiguous for cuBLASLt too (its fp8 GEMMs are TN only)";
  // cuBLASLt asks 16-byte alignment of its matrices; a row-wise scale (a step's slice of the
  // rows) is held to the same, where an unaligned one runs distgemm's kernel.
  for (const auto& [rows, ptr] :
       {std::pair{g.scale_a_rows, g.scale_a}, {g.scale_b_rows, g.scale_b}})
    if (g.dtype == DType::E4M3 && rows && reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      return "a row-wise fp8 scale for cuBLASLt starts on a 16-byte boundary, as its matrices "
             "do; this one starts " +
             s(static_cast<int64_t>(reinterpret_cast<uintptr_t>(ptr) % 16)) +
             " bytes past one: it runs distgemm's kernel";
  if (g.partial && g.user_c)
    return "cuBLASLt adds one C matrix: this GEMM has both a partial and a user C (the last "
           "reduce-scatter step with beta * C); it runs distgemm's kernel";
  if (g.config != 0 || g.tile_n != 0)
    return "cublas_algo=" + s(g.cublas_algo) + " with config=" + config_name(g.config) +
           " tile_n=" + s(g.tile_n) + ": cuBLASLt has no distgemm configuration; leave both unset";
  if (g.decomposition != 0 || g.splits != 1)
    return "decomposition and splits are for distgemm's stream-K configurations, not cuBLASLt";
  return "";
}

int cublaslt_algo_count(const GemmDesc& g, int device) {
  const std::string why = cublaslt_problem(g);
  if (!why.empty()) throw std::invalid_argument(why);
  return static_cast<int>(algorithms(g, device).size());
}

int64_t cublaslt_version() {
  return lt().problem.empty() ? static_cast<int64_t>(lt().version()) : 0;
}

namespace {

// The rows the heuristic is asked about for a GEMM of g.m rows under row buckets: g.m rounded
// up to kRowBucketBits significant bits (with 3: 1024, 1280, 1536, 1792, 2048, ...), so that the
// GEMMs of one bucket share an algorithm and its kernel while asking about at most a quarter more
// rows than they have. Without buckets, or for a batched GEMM (its batch strides are sized for
// its rows), or above 2^30 rows (the bucket would pass the int32 extents of a GEMM): g.m.
constexpr int kRowBucketBits = 3;

int64_t heuristic_rows(const GemmDesc& g) {
  if (!cublaslt_row_buckets() || g.l > 1 || g.m > (int64_t{1} << 30)) return g.m;
  int64_t unit = 1;  // the bucket's step: g.m's leading bit, shifted right by kRowBucketBits - 1
  while ((unit << kRowBucketBits) <= g.m) unit <<= 1;
  return (g.m + unit - 1) / unit * unit;
}

// Whether cuBLASLt runs `h`'s algorithm for g, within g's workspace; h's workspace size becomes
// g's.
bool accepts(const GemmDesc& g, cublasLtMatmulHeuristicResult_t& h) {
  const HostTime timed(CublasLtHostWork::kCheck);
  const int64_t ws_bytes = usable_workspace(g);
  Descs ds(g, ws_bytes);
  cublasLtMatmulHeuristicResult_t checked{};
  const cublasStatus_t st =
      lt().algo_check(lt().handle, ds.op, ds.a, ds.b, ds.c, ds.d, &h.algo, &checked);
  if (st != CUBLAS_STATUS_SUCCESS || static_cast<int64_t>(checked.workspaceSize) > ws_bytes)
    return false;
  h.workspaceSize = checked.workspaceSize;
  return true;
}

// The algorithm g runs (the file's header says which), kept per shape and rank.
const cublasLtMatmulHeuristicResult_t& chosen(const GemmDesc& g, int device) {
  static std::mutex mu;
  static auto* cache = new std::map<std::pair<ShapeKey, int>, cublasLtMatmulHeuristicResult_t>();
  const auto key = std::make_pair(shape_key(g, device), g.cublas_algo);
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  const int64_t rows = heuristic_rows(g);
  if (rows != g.m && g.cublas_algo >= 0) {
    GemmDesc bucket = g;
    bucket.m = rows;
    bool taken = false;
    cublasLtMatmulHeuristicResult_t h{};
    try {
      const auto& algos = algorithms(bucket, device);
      if (g.cublas_algo < static_cast<int>(algos.size())) {
        h = algos[g.cublas_algo];
        taken = accepts(g, h);
      }
    } catch (const std::exception&) {
      taken = false;  // the bucket is only a shortcut: the GEMM's own list below decides
    }
    if (taken) {
      std::lock_guard<std::mutex> lock(mu);
      return cache->emplace(key, h).first->second;
    }
  }
  const auto& algos = algorithms(g, device);
  if (g.cublas_algo < 0 || g.cublas_algo >= static_cast<int>(algos.size()))
    throw std::invalid_argument(
        "cublas_algo=" + s(g.cublas_algo) + ": cuBLASLt's heuristic has " +
        s(static_cast<int64_t>(algos.size())) + " algorithm(s) for this " + s(g.m) + "x" + s(g.n) +
        "x" + s(g.k) + " GEMM" +
        (algos.empty() && (g.scale_a_rows || g.scale_b_rows)
             ? " (a row-wise fp8 scale is its outer-vector scale mode, which it refuses here)"
             : ""));
  std::lock_guard<std::mutex> lock(mu);
  return cache->emplace(key, algos[g.cublas_algo]).first->second;
}

void matmul(const GemmDesc& g, const cublasLtMatmulHeuristicResult_t& h, cudaStream_t stream) {
  const HostTime timed(CublasLtHostWork::kEnqueue);
  const int64_t ws_bytes = usable_workspace(g);
  Descs ds(g, ws_bytes);
  const COperand c = c_operand(g);
  const float alpha = g.alpha;
  if (static_cast<int64_t>(h.workspaceSize) > ws_bytes)
    throw std::logic_error("internal: cuBLASLt's algorithm needs more workspace than offered");
  check(lt().matmul(lt().handle, ds.op, &alpha, g.b, ds.a, g.a, ds.b, &c.beta, c.ptr, ds.c, g.d,
                    ds.d, &h.algo, ws_bytes > 0 ? g.workspace : nullptr,
                    static_cast<size_t>(ws_bytes), stream),
        "Matmul");
}

}  // namespace

int cublaslt_rank_to_run(const GemmDesc& g, int device) {
  if (!cublaslt_problem(g).empty()) return -1;
  const int wanted = g.cublas_algo < 0 ? 0 : g.cublas_algo;
  GemmDesc run = g;
  run.m = heuristic_rows(g);  // the bucket's list (asked once per bucket), else g's own
  const int n = static_cast<int>(algorithms(run, device).size());
  run = g;
  run.cublas_algo = wanted < n ? wanted : 0;
  if (n > 0) {
    try {
      chosen(run, device);  // which chosen() keeps for g's launches
      return run.cublas_algo;
    } catch (const std::invalid_argument&) {
      // the bucket's algorithm does not take g, and g's own list is shorter: asked below
    }
  }
  const int count = static_cast<int>(algorithms(g, device).size());
  return count == 0 ? -1 : (wanted < count ? wanted : 0);
}

void cublaslt_preload(const GemmDesc& g, int device) {
  const cublasLtMatmulHeuristicResult_t& h = chosen(g, device);
  static std::mutex mu;
  // Kept per shape and algorithm, since one algorithm may launch other kernels for other rows.
  // Under a key per algorithm and layout (all row counts as one), a 4-rank 405B O reduce-scatter
  // at S = 8, whose 512-row steps shared their algorithm's bytes with the preloaded 1024-row
  // steps of the S = 4 plan before it, timed out on its flags at its first call on 4x H200
  // (benchmarks/results/2026-11-28-h200-tp4-first-calls-buckets.md): a lazy load behind a
  // spinning GEMM fits that, unproven.
  using AlgoBytes = std::array<uint64_t, sizeof(h.algo) / sizeof(uint64_t)>;
  static auto* loaded = new std::set<std::pair<ShapeKey, AlgoBytes>>();
  std::pair<ShapeKey, AlgoBytes> key{shape_key(g, device), {}};
  std::memcpy(key.second.data(), &h.algo, sizeof(h.algo));
  std::lock_guard<std::mutex> lock(mu);
  if (loaded->count(key)) return;
  const HostTime timed(CublasLtHostWork::kPreload);  // its enqueue counts here too
  // A private stream, captured in relaxed mode (the caller may be capturing a stream of its
  // own); the graph is instantiated, which loads its kernels, and destroyed unlaunched.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  DISTGEMM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  int prev = 0;
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess) e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed);
  std::string failed;
  if (e == cudaSuccess) {
    try {
      matmul(g, h, stream);
    } catch (const std::exception& ex) {
      failed = ex.what();
    }
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (failed.empty() && ended != cudaSuccess) e = ended;
  }
  if (e == cudaSuccess && failed.empty()) e = cudaGraphInstantiate(&exec, graph, 0);
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  if (stream) cudaStreamDestroy(stream);
  cudaSetDevice(prev);
  cudaThreadExchangeStreamCaptureMode(&mode);
  if (!failed.empty()) throw std::runtime_error("cuBLASLt preload: " + failed);
  DISTGEMM_CUDA_CHECK(e);
  loaded->insert(key);
}

void cublaslt_launch(const GemmDesc& g, const WaitSpec& wait, int device, cudaStream_t stream) {
  const cublasLtMatmulHeuristicResult_t& h = chosen(g, device);
  if (wait.num_flags > 0) copy_wait_launch(wait, stream);
  matmul(g, h, stream);
  ++launches;
}

#else  // built without cuBLASLt's header

namespace {
const char* kNoHeader =
    "distgemm was built without cuBLASLt's header (cublasLt.h: the nvidia-cublas wheel or the "
    "CUDA toolkit's; cpp/cuda.cmake): the cuBLASLt candidate is unavailable";
}

std::string cublaslt_problem(const GemmDesc&) { return kNoHeader; }
int cublaslt_algo_count(const GemmDesc&, int) { throw std::invalid_argument(kNoHeader); }
int cublaslt_rank_to_run(const GemmDesc&, int) { return -1; }
int64_t cublaslt_version() { return 0; }
void cublaslt_preload(const GemmDesc&, int) { throw std::invalid_argument(kNoHeader); }
void cublaslt_launch(const GemmDesc&, const WaitSpec&, int, cudaStream_t) {
  throw std::invalid_argument(kNoHeader);
}

#endif

}  // namespace distgemm::kernel
