// distgemm._core.gemm / gemm_problem: one GEMM of distgemm's own kernel (or of cuBLASLt, as the
// runtime runs it) on caller-owned device memory with no waits, so that single-GPU benchmarks
// time the kernel against cuBLAS on the same tensors; and the process's kernel table
// (set_kernel_table). Pointers and streams cross as Python ints (tensor.data_ptr(),
// stream.cuda_stream).
//
// The GEMM is dense: D[m, n] = A[m, k] @ B[n, k]^T (B[k, n] with b_n_major), every operand
// contiguous, no bias, no C, alpha 1 (kernel/gemm.hpp); at fp8 (e4m3) scaled by scale_a and
// scale_b (tensor-wise, or row-wise with *_rows) into a bf16 D. Shapes and pointers are checked by
// kernel::gemm_can_implement before anything reaches the device; a rejection is a ValueError
// with the reason.
#include "distgemm/kernel/gemm.hpp"

#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/kernel/cublaslt_process.hpp"
#include "distgemm/kernel/gemm_extents.hpp"
#include "kernel_table_rows.hpp"

namespace py = pybind11;

namespace {

using distgemm::device::ErrorSink;
using distgemm::kernel::GemmDesc;

const void* as_ptr(uint64_t v) { return reinterpret_cast<const void*>(static_cast<uintptr_t>(v)); }

// The GemmDesc::config number of a configuration name ("auto" = 0); ValueError otherwise.
int config_number(const std::string& name) {
  const int c = distgemm::kernel::parse_config(name);
  if (c < 0) {
    std::string names = "auto";
    for (const auto& s : distgemm::kernel::kConfigs) names += std::string(", ") + s.name;
    throw std::invalid_argument("config '" + name + "' is not one of " + names);
  }
  return c;
}

// The GemmDesc::decomposition number of a decomposition name; ValueError otherwise.
int decomposition_number(const std::string& name) {
  const int d = distgemm::kernel::parse_decomposition(name);
  if (d < 0) throw std::invalid_argument(distgemm::kernel::unknown_decomposition(name));
  return d;
}

// The fp8 arguments of gemm() and gemm_problem(): float32 scale addresses (0: none).
struct Fp8Args {
  uint64_t scale_a = 0, scale_b = 0;
  bool scale_a_rows = false, scale_b_rows = false, fast_accum = false;
};

GemmDesc dense_desc(uint64_t a, uint64_t b, uint64_t d, int64_t m, int64_t n, int64_t k,
                    const std::string& dtype, int tile_n, bool b_n_major, const std::string& config,
                    const Fp8Args& fp8 = {}) {
  GemmDesc g;
  g.scale_a = static_cast<const float*>(as_ptr(fp8.scale_a));
  g.scale_a_rows = fp8.scale_a_rows;
  g.scale_b = static_cast<const float*>(as_ptr(fp8.scale_b));
  g.scale_b_rows = fp8.scale_b_rows;
  g.fast_accum = fp8.fast_accum;
  g.dtype = distgemm::kernel::parse_dtype(dtype);  // std::invalid_argument -> ValueError
  g.m = m;
  g.n = n;
  g.k = k;
  g.a = as_ptr(a);
  g.lda = k;
  g.batch_a = m * k;
  g.b = as_ptr(b);
  g.ldb = b_n_major ? n : k;
  g.batch_b = n * k;
  g.b_n_major = b_n_major;
  g.d = const_cast<void*>(as_ptr(d));
  g.ldd = n;
  g.batch_d = m * n;
  g.tile_n = tile_n;
  g.config = config_number(config);
  return g;
}

// "" when the kernel runs this dense GEMM, else the reason (host-only: no device is touched).
std::string dense_problem(const GemmDesc& g) {
  if (!g.a || !g.b || !g.d)
    return "a, b and d must be device addresses, got a=" +
           std::to_string(reinterpret_cast<uintptr_t>(g.a)) +
           " b=" + std::to_string(reinterpret_cast<uintptr_t>(g.b)) +
           " d=" + std::to_string(reinterpret_cast<uintptr_t>(g.d));
  return distgemm::kernel::gemm_can_implement(g);
}

// The abort word every WaitSpec points at (the kernel reads it even with no flag to wait for,
// leading_barrier.cuh), one per device. Never freed: the sinks live until the process exits,
// and freeing device memory during static destruction races the CUDA runtime's own teardown.
ErrorSink& error_sink(int cuda_device) {
  static std::mutex mu;
  static auto* sinks = new std::map<int, std::unique_ptr<ErrorSink>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& s = (*sinks)[cuda_device];
  if (!s) s = std::make_unique<ErrorSink>(cuda_device);
  return *s;
}

int run_gemm(uint64_t a, uint64_t b, uint64_t d, int64_t m, int64_t n, int64_t k,
             const std::string& dtype, int tile_n, bool b_n_major, int cuda_device, uint64_t stream,
             const std::string& config, uint64_t workspace, int64_t workspace_bytes,
             uint64_t scale_a, bool scale_a_rows, uint64_t scale_b, bool scale_b_rows,
             bool fast_accum, int swizzle, int raster, const std::string& decomposition, int splits,
             int cublas_algo) {
  GemmDesc g = dense_desc(a, b, d, m, n, k, dtype, tile_n, b_n_major, config,
                          {scale_a, scale_b, scale_a_rows, scale_b_rows, fast_accum});
  g.cublas_algo = cublas_algo;
  g.swizzle = swizzle;  // checked with the rest in dense_problem
  g.raster = raster;
  g.decomposition = decomposition_number(decomposition);
  g.splits = splits;
  if ((workspace == 0) != (workspace_bytes == 0) || workspace_bytes < 0)
    throw std::invalid_argument(
        "gemm: give workspace and workspace_bytes together (both 0: no workspace), got "
        "workspace=" +
        std::to_string(workspace) + " workspace_bytes=" + std::to_string(workspace_bytes));
  g.workspace = const_cast<void*>(as_ptr(workspace));
  g.workspace_bytes = workspace_bytes;
  const std::string why = dense_problem(g);
  if (!why.empty()) throw std::invalid_argument("gemm: " + why);
  if (cuda_device < 0)
    throw std::invalid_argument("gemm: cuda_device must be >= 0, got " +
                                std::to_string(cuda_device));
  py::gil_scoped_release nogil;
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device));
  distgemm::kernel::WaitSpec wait;  // num_flags = 0: nothing to wait for
  wait.abort = error_sink(cuda_device).abort();
  wait.record = error_sink(cuda_device).record_dev();
  wait.device = cuda_device;
  distgemm::kernel::resolve_kernel(g, cuda_device);  // once: the launch runs what it reports
  distgemm::kernel::gemm_launch(g, wait, cuda_device,
                                reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
  return g.cublas_algo >= 0 ? 0 : distgemm::kernel::config_shape(g.config)->tile_n;
}

// The kernel name gemm_resolve_config reports: a configuration's, or "cublaslt:<rank>".
std::string kernel_name(const GemmDesc& g) {
  return g.cublas_algo >= 0 ? "cublaslt:" + std::to_string(g.cublas_algo)
                            : distgemm::kernel::config_name(g.config);
}

}  // namespace

void register_gemm(py::module_& m) {
  m.def(
      "gemm_problem",
      [](uint64_t a, uint64_t b, uint64_t d, int64_t m_, int64_t n, int64_t k,
         const std::string& dtype, int tile_n, bool b_n_major, const std::string& config,
         uint64_t scale_a, bool scale_a_rows, uint64_t scale_b, bool scale_b_rows,
         bool fast_accum) {
        return dense_problem(
            dense_desc(a, b, d, m_, n, k, dtype, tile_n, b_n_major, config,
                       {scale_a, scale_b, scale_a_rows, scale_b_rows, fast_accum}));
      },
      py::arg("a"), py::arg("b"), py::arg("d"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("dtype") = "bf16", py::arg("tile_n") = 0, py::arg("b_n_major") = false, py::kw_only(),
      py::arg("config") = "auto", py::arg("scale_a") = 0, py::arg("scale_a_rows") = false,
      py::arg("scale_b") = 0, py::arg("scale_b_rows") = false, py::arg("fast_accum") = false,
      "'' when gemm() runs this dense GEMM (kernel::gemm_can_implement: extents, 16-byte "
      "alignment of every operand, the tile or configuration), else the reason. Touches no "
      "device.");
  m.def("gemm", &run_gemm, py::arg("a"), py::arg("b"), py::arg("d"), py::arg("m"), py::arg("n"),
        py::arg("k"), py::arg("dtype") = "bf16", py::arg("tile_n") = 0,
        py::arg("b_n_major") = false, py::kw_only(), py::arg("cuda_device"), py::arg("stream"),
        py::arg("config") = "auto", py::arg("workspace") = 0, py::arg("workspace_bytes") = 0,
        py::arg("scale_a") = 0, py::arg("scale_a_rows") = false, py::arg("scale_b") = 0,
        py::arg("scale_b_rows") = false, py::arg("fast_accum") = false,
        py::arg("swizzle") = distgemm::kernel::kDefaultSwizzle,
        py::arg("raster") = distgemm::kernel::kDefaultRaster, py::arg("decomposition") = "auto",
        py::arg("splits") = 1, py::arg("cublas_algo") = -1,
        "Enqueue D[m, n] = A[m, k] @ B[n, k]^T (B[k, n] with b_n_major) on `stream` of "
        "`cuda_device` with distgemm's kernel: contiguous bf16/fp16 operands, fp32 accumulate. "
        "dtype 'e4m3': A and B float8_e4m3fn, D bf16, D = scale_a * scale_b * A @ B^T with "
        "float32 scales at device addresses scale_a / scale_b, one value each or one per row of "
        "its operand (scale_a_rows / scale_b_rows); fast_accum picks CUTLASS's "
        "fast-accumulation kernel. "
        "The kernel: `config` (a gemm_config_names() name), else output tile 128 x tile_n, else "
        "(both unset) the model's choice (kernel::choose_config), among the stream-K "
        "configurations too where `workspace` (a zeroed device buffer of gemm_workspace_bytes(), "
        "used by one GEMM at a time) is given. `swizzle` (1, 2, 4, 8) and `raster` (0 the "
        "configuration's rule, kernel::choose_raster; 1 along M; 2 along N): the persistent "
        "scheduler's tile order. `decomposition` ('auto', 'heuristic', 'data_parallel', "
        "'split_k' with `splits` K ranges per tile, 'stream_k'; kernel::Decomposition) for a "
        "stream-K configuration only. `cublas_algo` >= 0: cuBLASLt instead, the algorithm of that "
        "rank in its heuristic's list for the GEMM's shape (0: the one cuBLAS itself runs; "
        "cublaslt_algo_count()); with row buckets on (set_cublaslt_row_buckets), the list of "
        "its row bucket where cuBLASLt accepts that algorithm for the GEMM; "
        "config and tile_n unset. With everything unset the machine's kernel table "
        "(set_kernel_table) chooses where it has a row near the shape, else the model. Returns "
        "the output tile width it ran with (0 for cuBLASLt); "
        "ValueError with gemm_problem's reason when the kernel cannot run the GEMM.");
  m.attr("STREAM_K_TAIL_BYTES") = distgemm::kernel::kStreamKTailBytes;
  m.def(
      "gemm_workspace_bytes",
      [](int64_t m_, int64_t n, int64_t k, const std::string& dtype, bool b_n_major,
         const std::string& config, int cuda_device, const std::string& decomposition, int splits) {
        GemmDesc g = dense_desc(0, 0, 0, m_, n, k, dtype, 0, b_n_major, config);
        g.decomposition = decomposition_number(decomposition);
        g.splits = splits;
        std::string why = distgemm::kernel::gemm_extent_problem(
            m_, n, k, 1, distgemm::kernel::dtype_bytes(g.dtype));
        if (why.empty()) why = distgemm::kernel::gemm_config_problem(g.dtype, g.config, b_n_major);
        if (why.empty()) why = distgemm::kernel::gemm_decomposition_problem(g);
        if (!why.empty()) throw std::invalid_argument("gemm_workspace_bytes: " + why);
        py::gil_scoped_release nogil;
        return distgemm::kernel::gemm_workspace_bytes(g, cuda_device);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype") = "bf16",
      py::arg("b_n_major") = false, py::kw_only(), py::arg("config") = "auto",
      py::arg("cuda_device"), py::arg("decomposition") = "auto", py::arg("splits") = 1,
      "Bytes of the zeroed workspace gemm(workspace=...) needs for this GEMM on `cuda_device`: 0 "
      "unless `config` (or, with 'auto', the model given a workspace) is a stream-K "
      "configuration; `decomposition` and `splits` as gemm() will be given them.");
  m.def(
      "gemm_resolve_config",
      [](int64_t m_, int64_t n, const std::string& dtype, int tile_n, bool b_n_major,
         const std::string& config, int cuda_device, bool stream_k, int64_t k_) {
        // The dense GEMM gemm() runs (its strides: the kernel table's cuBLASLt rows ask the
        // heuristic about this very layout); k = 0 names no K, which no table row has.
        GemmDesc g = dense_desc(0, 0, 0, m_, n, k_, dtype, tile_n, b_n_major, config);
        g.workspace = stream_k ? &g : nullptr;  // only "a workspace is offered" matters here
        std::string why = distgemm::kernel::tile_n_problem(tile_n);
        if (why.empty()) why = distgemm::kernel::gemm_config_problem(g.dtype, g.config, b_n_major);
        if (!why.empty()) throw std::invalid_argument("gemm_resolve_config: " + why);
        py::gil_scoped_release nogil;
        distgemm::kernel::resolve_kernel(g, cuda_device);
        return kernel_name(g);
      },
      py::arg("m"), py::arg("n"), py::arg("dtype") = "bf16", py::arg("tile_n") = 0,
      py::arg("b_n_major") = false, py::kw_only(), py::arg("config") = "auto",
      py::arg("cuda_device"), py::arg("stream_k") = false, py::arg("k") = 0,
      "The kernel gemm() runs an m x n (x k) GEMM with on `cuda_device`: with config 'auto' and "
      "tile_n 0, the machine's kernel table's choice where it has a row near the shape (k "
      "given; a configuration name or 'cublaslt:<rank>'), else the model's choice with the "
      "device's resident CTAs, among the stream-K configurations too with `stream_k`, i.e. "
      "when gemm() is given a workspace.");
  m.def(
      "cublaslt_algo_count",
      [](int64_t m_, int64_t n, int64_t k_, const std::string& dtype, bool b_n_major,
         int cuda_device, bool scale_a_rows, bool scale_b_rows, bool fast_accum) {
        GemmDesc g = dense_desc(0, 0, 0, m_, n, k_, dtype, 0, b_n_major, "auto",
                                {0, 0, scale_a_rows, scale_b_rows, fast_accum});
        g.cublas_algo = 0;
        std::string why = distgemm::kernel::gemm_extent_problem(
            m_, n, k_, 1, distgemm::kernel::dtype_bytes(g.dtype));
        if (why.empty()) why = distgemm::kernel::cublaslt_problem(g);
        if (!why.empty()) throw std::invalid_argument("cublaslt_algo_count: " + why);
        py::gil_scoped_release nogil;
        return distgemm::kernel::cublaslt_algo_count(g, cuda_device);
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("dtype") = "bf16",
      py::arg("b_n_major") = false, py::kw_only(), py::arg("cuda_device"),
      py::arg("scale_a_rows") = false, py::arg("scale_b_rows") = false,
      py::arg("fast_accum") = false,
      "How many algorithms cuBLASLt's heuristic offers for the dense GEMM gemm() runs (no "
      "workspace, no bias, no C) on `cuda_device`: the ranks gemm(cublas_algo=) takes. dtype "
      "'e4m3' with its scale kinds (row-wise: cuBLASLt's outer-vector scales) and fast_accum; "
      "0 where cuBLASLt has no algorithm for them.");
  m.def(
      "cublaslt_problem",
      [] {
        GemmDesc g;
        g.cublas_algo = 0;
        return distgemm::kernel::cublaslt_problem(g);
      },
      "'' when cuBLASLt is available to gemm(cublas_algo=) and the kernel table (the library "
      "opens at first use: torch's libcublasLt.so.13 where torch is loaded), else why.");
  m.def("cublaslt_launches", &distgemm::kernel::cublaslt_launches,
        "cuBLASLt GEMMs this process has enqueued or captured (eager calls, graph captures).");
  m.def(
      "cublaslt_host_ms",
      [] {
        using distgemm::kernel::CublasLtHostWork;
        std::map<std::string, double> out;
        for (const auto& [name, work] : {std::pair{"heuristic", CublasLtHostWork::kHeuristic},
                                         {"check", CublasLtHostWork::kCheck},
                                         {"preload", CublasLtHostWork::kPreload},
                                         {"enqueue", CublasLtHostWork::kEnqueue}})
          out[name] = distgemm::kernel::cublaslt_host_ns(work) / 1e6;
        return out;
      },
      "Host ms this process has spent in cuBLASLt's work, per kind: 'heuristic' (its queries), "
      "'check' (a bucket's algorithm checked for a GEMM's own rows), 'preload' (graphs that "
      "load kernels), 'enqueue' (GEMMs enqueued or captured; a preload's own counts in both).");
  m.def("set_cublaslt_row_buckets", &distgemm::kernel::set_cublaslt_row_buckets, py::arg("on"),
        "Whether cuBLASLt GEMMs run the algorithm of their row bucket (rows rounded up to 3 "
        "significant bits) where cuBLASLt accepts it; off (the default) asks the heuristic "
        "about every row count. Set before the first cuBLASLt GEMM: a shape's algorithm, once "
        "chosen, is kept.");
  m.def("cublaslt_row_buckets", &distgemm::kernel::cublaslt_row_buckets,
        "Whether cuBLASLt GEMMs share their row bucket's algorithm (set_cublaslt_row_buckets).");
  m.def("cublaslt_version", &distgemm::kernel::cublaslt_version,
        "cuBLASLt's version number (cublasLtGetVersion), 0 when it cannot be loaded.");
  m.def(
      "set_kernel_table",
      [](const std::vector<py::dict>& rows, bool all_plans) {
        std::vector<distgemm::kernel::KernelTableRow> out;
        for (const auto& r : rows) out.push_back(distgemm::bindings::table_row_of(r, true));
        distgemm::kernel::set_kernel_table(std::move(out), all_plans);
      },
      py::arg("rows"), py::arg("all_plans") = false,
      "Replace the process's kernel table (kernel/kernel_table.hpp): rows {'dtype', 'm', 'n', "
      "'k', 'kernel' (a configuration name or 'cublaslt'), 'algo' (cuBLASLt's rank); e4m3 rows "
      "also 'scale_a_rows', 'scale_b_rows', 'fast_accum'}. An empty list leaves every choice to "
      "the model. all_plans: plans of several ranks consult it too (else only single GEMMs and "
      "one-rank plans do: kernel/gemm.hpp's GemmDesc::kernel_table).");
  m.def("kernel_table_all_plans", &distgemm::kernel::kernel_table_all_plans,
        "Whether plans of several ranks consult the kernel table (set_kernel_table's all_plans).");
  m.def(
      "kernel_table_size", [] { return distgemm::kernel::kernel_table().size(); },
      "Rows of the process's kernel table (0 until set_kernel_table).");
  m.def(
      "gemm_resident_ctas",
      [](const std::string& dtype, int tile_n, int cuda_device, const std::string& config) {
        const auto dt = distgemm::kernel::parse_dtype(dtype);
        const int c = config_number(config);
        if ((tile_n == 0) == (c == 0))
          throw std::invalid_argument(
              "gemm_resident_ctas: give tile_n (128 or 256) or config, "
              "exactly one; got tile_n=" +
              std::to_string(tile_n) + " config=" + config);
        return c != 0 ? distgemm::kernel::gemm_config_resident_ctas(dt, c, cuda_device)
                      : distgemm::kernel::gemm_resident_ctas(dt, tile_n, cuda_device);
      },
      py::arg("dtype"), py::arg("tile_n") = 0, py::arg("cuda_device") = 0, py::kw_only(),
      py::arg("config") = "auto",
      "Resident CTAs (persistent grid size) on `cuda_device` of the kernel with output tile "
      "128 x tile_n (cluster 2x1) or of configuration `config`: the slot counts the model "
      "(choose_config) works with.");
}
