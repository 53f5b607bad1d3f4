// distgemm_bench: runs one schedule on TP GPUs of this process, verifies it against a
// single-GPU reference GEMM of the full problem and times it; with --sweep, the Llama-3
// tensor-parallel layer sweep of benchmarks/llama_sweep.py from one process, on the same shapes
// (both read cpp/include/distgemm/llama_shapes.hpp), so single-process numbers sit beside the
// torchrun ones.
//
//   distgemm_bench --schedule ag_rotate_a --tp 2 --steps 2 --m 8192 --n 57344 --k 8192 \
//                  --l 1 --dtype bf16 --iterations 50 --warmup 10 [--beta 0.5] [--bias]
//                  [--timeout-s 5] [--replays 10000] [--simulate-missing-device D]
//                  [--check-update] [--no-verify] [--no-local] [--warmup-ms 1000]
//                  [--swizzle 8] [--raster 0] [--pdl|--no-pdl] [--partial-via epilogue|copy]
//                  [--tile-n auto|128|256] [--verify-rows R]
//   distgemm_bench --sweep [quick|full] [--tp T] [--models 8B,70B] [--tokens 4096,8192]
//                  [--layers QKV,O] [--csv PATH] [--dry-run] [--verify-rows 256]
//                  [--warmup-ms 300] [--iterations auto] [--dtype bf16] [--pdl|--no-pdl] ...
// --pdl/--no-pdl: programmatic dependent launch between the GEMM steps (default: where it pays,
// device::pdl_by_default); --partial-via: how reduce-scatter partials reach the next device
// (default: schedule::default_plan_options); --tile-n: the GEMM output tile 128 x 128 or
// 128 x 256 for every GEMM (default auto: per GEMM, kernel::choose_tile_n).
//
// Single case: prints one line `RESULT key=value ...` (parsed by tests/gpu/test_cpp_bench.py).
// Exit code: 0 verified (and timed), 1 verification failure or runtime error (a timeout report
// included), 2 bad arguments or a shape rejected before launch.
//
// Sweep: the cases of the full sweep (8B/70B/405B x QKV, O, FC1, FC2 x 1024..16384 tokens) or
// the quick one (70B, 4096 and 8192 tokens), narrowed by --models/--tokens/--layers; TP = --tp,
// default every visible GPU (at most 8). Per case, with the layer's default schedule (QKV, FC1:
// ag_rotate_a; O, FC2: rs_tile_a) and for S = TP and S = 2*TP: the distributed GEMM, verified
// and timed; once per case the same kernel alone on device 0 for the per-device problem (the
// "own kernel floor"). An S the plan rejects is skipped with the plan's reason, a case the TP
// ranks cannot split with that reason. A progress line per case on stderr; a table on stdout at
// the end, the same rows in --csv. Exit code 1 when any check fails or a case fails at run time,
// 2 for bad arguments. --dry-run lists the cases, their per-device shapes and skip reasons without
// calling into CUDA (it needs --tp: it does not count the GPUs).
//   Sweep timing: the Python sweep's protocol (llama::kSweepTiming): at least 300 ms of sustained
// replays before each timing (--warmup-ms; below 200 ms is refused in sweep mode: the clocks
// would not have settled), then ~150 ms of timed replays, 10 to 50 of them (--iterations auto).
// The whole full sweep at TP=2, setup and verification included, ran in 77 s on 2x H200.
//   Sweep verification: the reference is a plain SIMT kernel, tens of times slower than the GEMM
// under test (the 405B FC1 at 16384 tokens is 57 PFLOP: tens of minutes), so by default it is
// computed for 256 rows of D only: one random row in each of 256 equal bands of M, so every step
// tile and every device's shard has rows in the sample (--verify-rows R; 0 = every row). Every
// element of D is still checked for having been written: outputs are NaN-poisoned before the
// checked launch and the whole D is scanned for non-finite values.
//
// Problem (global): D[L, M, N] = alpha * A[L, M, K] @ B[L, N, K]^T + beta * C + bias[N]; each
// device gets its shards per the schedule's Partition. Timing: per replay and device, CUDA events
// around the graph launch; a replay's time is the max over devices; reported: the median.
// TF/s per GPU = 2*M*N*K*L / TP / time. Local GEMM time: the same runtime and kernel on one GPU
// for the per-device problem (a TP=1, S=1 plan of the schedule with the sharded extent divided
// by TP); overlap efficiency = local time / distributed time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "all.hpp"
#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/device/workspace.hpp"
#include "distgemm/llama_shapes.hpp"
#include "distgemm/schedule/plan.hpp"

using namespace distgemm;
using schedule::Extent2;
using schedule::Mode;
using schedule::Plan;
using schedule::Problem;

namespace {

constexpr double kTolerance = 1e-2;  // relative Frobenius error, bf16/fp16 out, fp32 accumulate
constexpr int kMaxTp = schedule::kMaxTp;

struct Args {
  std::string schedule = "ag_rotate_a";
  int tp = 2, steps = 2;
  int64_t m = 8192, n = 8192, k = 8192, l = 1;
  std::string dtype = "bf16";
  int iterations = 50, warmup = 10, warmup_ms = 1000;  // iterations 0: time-based ("auto")
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  double timeout_s = 5.0;
  long replays = 0;
  int missing = -1;
  bool check_update = false, verify = true, local = true;
  int swizzle = device::GraphOptions{}.swizzle, raster = device::GraphOptions{}.raster;
  device::GraphOptions::Pdl pdl = device::GraphOptions::Pdl::Auto;  // --pdl / --no-pdl
  std::optional<schedule::PartialVia> partial_via;  // --partial-via; none: the library default
  int tile_n = device::GraphOptions{}.tile_n;       // --tile-n auto|128|256 (0: auto)
  uint64_t seed = 1234;
  int64_t verify_rows = 0;  // rows of D checked against the reference; 0: all
  // Sweep mode (sweep non-empty: "quick" or "full").
  std::string sweep, csv;
  std::vector<std::string> models, layers;
  std::vector<int64_t> tokens;
  bool dry_run = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: distgemm_bench --schedule NAME --tp T --steps S --m M --n N "
               "--k K [--l L] [--dtype bf16|fp16] [--iterations I|auto] [--warmup W] "
               "[--warmup-ms T] [--alpha A] [--beta B] [--bias] [--timeout-s T] [--replays R] "
               "[--simulate-missing-device D] [--check-update] [--no-verify] [--no-local] "
               "[--seed X] [--swizzle 1|2|4|8] [--raster 0|1|2] [--pdl|--no-pdl] "
               "[--partial-via epilogue|copy] [--tile-n auto|128|256] [--verify-rows R]\n"
               "       distgemm_bench --sweep [quick|full] [--tp T] [--models 8B,70B,405B] "
               "[--tokens 1024,...,16384] [--layers QKV,O,FC1,FC2] [--csv PATH] [--dry-run] "
               "[--dtype bf16|fp16] [--iterations I|auto] [--warmup W] [--warmup-ms T>=200] "
               "[--timeout-s T] [--seed X] [--swizzle 1|2|4|8] [--raster 0|1|2] [--pdl|--no-pdl] "
               "[--partial-via epilogue|copy] [--tile-n auto|128|256] "
               "[--verify-rows R]\n",
               why.c_str());
  std::exit(2);
}

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Sweep mode: the filters are names of llama_shapes.hpp; single-case options do not apply.
void finish_sweep_args(Args& a, const std::set<std::string>& given) {
  if (a.sweep != "quick" && a.sweep != "full") usage("--sweep takes quick or full, got " + a.sweep);
  for (const char* k :
       {"--schedule", "--steps", "--m", "--n", "--k", "--l", "--alpha", "--beta", "--bias",
        "--replays", "--simulate-missing-device", "--check-update", "--no-verify", "--no-local"})
    if (given.count(k))
      usage(std::string(k) +
            " does not apply to --sweep (each case's shape, schedule and S come "
            "from the sweep; every case is verified and compared with its local "
            "GEMM)");
  try {
    for (const std::string& m : a.models) (void)llama::find_model(m);
    for (const std::string& l : a.layers) (void)llama::find_layer(l);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  for (int64_t t : a.tokens)
    if (std::find(std::begin(llama::kTokens), std::end(llama::kTokens), t) ==
        std::end(llama::kTokens)) {
      std::string valid;
      for (int64_t v : llama::kTokens) valid += (valid.empty() ? "" : ", ") + std::to_string(v);
      usage("--tokens " + std::to_string(t) + " is not a sweep size; valid tokens: " + valid);
    }
  if (!given.count("--tp")) {
    if (a.dry_run) usage("--dry-run needs --tp: it lists the cases without asking CUDA for GPUs");
    a.tp = 0;  // every visible GPU, at most kMaxTp: resolved when the GPUs are counted
  } else if (a.tp < 1 || a.tp > kMaxTp) {
    usage("--tp must be 1.." + std::to_string(kMaxTp));
  }
  if (!given.count("--warmup-ms")) a.warmup_ms = llama::kSweepTiming.warmup_ms;
  if (a.warmup_ms < 200)
    usage("--warmup-ms " + std::to_string(a.warmup_ms) +
          " is below 200 in --sweep mode: an idle "
          "GPU needs a few hundred ms of load to reach its steady clock");
  if (!given.count("--iterations")) a.iterations = 0;
  if (!given.count("--warmup")) a.warmup = 2;  // the time-based warm-up does the real work
  if (!given.count("--verify-rows")) a.verify_rows = 256;
}

Args parse(int argc, char** argv) {
  Args a;
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    given.insert(k);
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--schedule")
        a.schedule = val();
      else if (k == "--tp")
        a.tp = std::stoi(val());
      else if (k == "--steps")
        a.steps = std::stoi(val());
      else if (k == "--m")
        a.m = std::stoll(val());
      else if (k == "--n")
        a.n = std::stoll(val());
      else if (k == "--k")
        a.k = std::stoll(val());
      else if (k == "--l")
        a.l = std::stoll(val());
      else if (k == "--dtype")
        a.dtype = val();
      else if (k == "--iterations") {
        const std::string v = val();
        a.iterations = v == "auto" ? 0 : std::stoi(v);
        if (a.iterations < 1 && v != "auto") usage("--iterations must be >= 1 or auto");
      } else if (k == "--warmup")
        a.warmup = std::stoi(val());
      else if (k == "--warmup-ms")
        a.warmup_ms = std::stoi(val());
      else if (k == "--alpha")
        a.alpha = std::stof(val());
      else if (k == "--beta")
        a.beta = std::stof(val());
      else if (k == "--bias")
        a.bias = true;
      else if (k == "--timeout-s")
        a.timeout_s = std::stod(val());
      else if (k == "--replays")
        a.replays = std::stol(val());
      else if (k == "--simulate-missing-device")
        a.missing = std::stoi(val());
      else if (k == "--check-update")
        a.check_update = true;
      else if (k == "--no-verify")
        a.verify = false;
      else if (k == "--no-local")
        a.local = false;
      else if (k == "--seed")
        a.seed = std::stoull(val());
      else if (k == "--swizzle")
        a.swizzle = std::stoi(val());
      else if (k == "--raster")
        a.raster = std::stoi(val());
      else if (k == "--pdl")
        a.pdl = device::GraphOptions::Pdl::On;
      else if (k == "--no-pdl")
        a.pdl = device::GraphOptions::Pdl::Off;
      else if (k == "--partial-via") {
        const std::string v = val();
        try {
          a.partial_via = schedule::parse_partial_via(v);
        } catch (const std::invalid_argument&) {
          usage("--partial-via takes epilogue or copy, got " + v);
        }
      } else if (k == "--tile-n") {
        const std::string v = val();
        a.tile_n = v == "auto" ? 0 : std::stoi(v);
        if (!kernel::tile_n_problem(a.tile_n).empty())
          usage("--tile-n takes auto, 128 or 256, got " + v);
      } else if (k == "--verify-rows")
        a.verify_rows = std::stoll(val());
      else if (k == "--sweep") {
        // The kind is optional: `--sweep` alone is the full sweep.
        a.sweep = (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) ? val() : "full";
      } else if (k == "--csv")
        a.csv = val();
      else if (k == "--models")
        a.models = split_list(val());
      else if (k == "--layers")
        a.layers = split_list(val());
      else if (k == "--tokens") {
        for (const std::string& t : split_list(val())) a.tokens.push_back(std::stoll(t));
      } else if (k == "--dry-run")
        a.dry_run = true;
      else
        usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  if (a.dtype != "bf16" && a.dtype != "fp16") usage("--dtype must be bf16 or fp16");  // no aliases
  if (a.iterations < 0 || a.warmup < 0) usage("--iterations must be >= 1 and --warmup >= 0");
  if (a.verify_rows < 0) usage("--verify-rows must be >= 0 (0: every row)");
  if (!a.sweep.empty()) {
    finish_sweep_args(a, given);
  } else {
    for (const char* k : {"--csv", "--models", "--layers", "--tokens", "--dry-run"})
      if (given.count(k)) usage(std::string(k) + " needs --sweep");
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Device helpers: random fill, reference GEMM, comparison.

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_f(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_f(float v) {
  return __float2half(v);
}

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

// Uniform in [-1, 1): never zeros (zeros hide unwritten outputs and run faster).
template <class T>
__global__ void fill_random(T* p, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + uint64_t(i));
    p[i] = from_f<T>(float(h >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// Reference: Dref[l, r, n] = sum_k A[l, rows[r], k] * B[l, n, k] in fp32 for the R checked rows
// (rows == nullptr: every row, R == M), a plain shared-memory tiled SIMT kernel (deliberately
// unrelated to the CUTLASS path it checks). 64x64 tile, 4x4 per thread.
template <class T>
__global__ void __launch_bounds__(256)
    ref_gemm(const T* A, const T* B, float* D, const int64_t* rows, int64_t R, int64_t M, int64_t N,
             int64_t K) {
  __shared__ float As[16][64 + 1];
  __shared__ float Bs[16][64 + 1];
  const int64_t l = blockIdx.z;
  A += l * M * K;
  B += l * N * K;
  D += l * R * N;
  const int64_t m0 = int64_t(blockIdx.y) * 64, n0 = int64_t(blockIdx.x) * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 16 * 64; i += 256) {
      const int kk = i % 16, r = i / 16;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + kk;
      As[kk][r] = (gm < R && gk < K) ? to_f(A[(rows ? rows[gm] : gm) * K + gk]) : 0.0f;
      Bs[kk][r] = (gn < N && gk < K) ? to_f(B[gn * K + gk]) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
      if (gm < R && gn < N) D[gm * N + gn] = acc[i][j];
    }
}

// Over the checked rows (acc[L, R, N]; out and C are [L, M, N], row rows[r] or r):
// err[0] += sum (out - ref)^2, err[1] += sum ref^2, err[2] += #non-finite outputs, where
// ref = alpha * acc + beta * C + bias.
template <class T>
__global__ void compare(const T* out, const float* acc, const T* C, const T* bias, float alpha,
                        float beta, const int64_t* rows, int64_t L, int64_t R, int64_t M, int64_t N,
                        double* err) {
  double e = 0.0, r = 0.0, bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < L * R * N;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t l = i / (R * N), row = (i / N) % R, n = i % N;
    const int64_t o_i = (l * M + (rows ? rows[row] : row)) * N + n;
    float ref = alpha * acc[i];
    if (C) ref += beta * to_f(C[o_i]);
    if (bias) ref += to_f(bias[n]);
    const float o = to_f(out[o_i]);
    if (!isfinite(o))
      bad += 1.0;
    else
      e += double(o - ref) * double(o - ref);
    r += double(ref) * double(ref);
  }
  for (int off = 16; off > 0; off /= 2) {
    e += __shfl_down_sync(0xffffffffu, e, off);
    r += __shfl_down_sync(0xffffffffu, r, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if (threadIdx.x % 32 == 0) {
    atomicAdd(err + 0, e);
    atomicAdd(err + 1, r);
    atomicAdd(err + 2, bad);
  }
}

// err[2] += #non-finite values of out[total]: with NaN-poisoned outputs, every element the
// launch left unwritten, also in the rows a sampled check does not compare.
template <class T>
__global__ void count_nonfinite(const T* out, int64_t total, double* err) {
  double bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x)
    if (!isfinite(to_f(out[i]))) bad += 1.0;
  for (int off = 16; off > 0; off /= 2) bad += __shfl_down_sync(0xffffffffu, bad, off);
  if (threadIdx.x % 32 == 0 && bad > 0.0) atomicAdd(err + 2, bad);
}

void check_launch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + " launch failed: " + cudaGetErrorString(e));
}

struct DevBuf {
  void* p = nullptr;
  int dev = 0;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(int d, size_t b) : dev(d), bytes(b) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(d));
    DISTGEMM_CUDA_CHECK(cudaMalloc(&p, b > 0 ? b : 16));
  }
  DevBuf(DevBuf&& o) noexcept : p(o.p), dev(o.dev), bytes(o.bytes) { o.p = nullptr; }
  DevBuf& operator=(DevBuf&& o) noexcept {
    std::swap(p, o.p);
    std::swap(dev, o.dev);
    std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) {
      cudaSetDevice(dev);
      cudaFree(p);
    }
  }
};

template <class T>
void random_fill(const DevBuf& b, uint64_t seed) {
  DISTGEMM_CUDA_CHECK(cudaSetDevice(b.dev));
  fill_random<T><<<1024, 256>>>(static_cast<T*>(b.p), int64_t(b.bytes / sizeof(T)), seed);
  check_launch("fill_random");
}

// Copies the (row0, col0, rows, cols) window of a dense [L, g.rows, g.cols] tensor between a
// global tensor and a local dense [L, rows, cols] one.
void copy_window(void* local, const void* global, Extent2 g, int64_t row0, int64_t col0,
                 int64_t rows, int64_t cols, int64_t L, bool to_local) {
  const int64_t eb = 2;
  for (int64_t l = 0; l < L; ++l) {
    char* gp = (char*)global + (l * g.rows * g.cols + row0 * g.cols + col0) * eb;
    char* lp = (char*)local + l * rows * cols * eb;
    if (to_local)
      DISTGEMM_CUDA_CHECK(
          cudaMemcpy2D(lp, cols * eb, gp, g.cols * eb, cols * eb, rows, cudaMemcpyDefault));
    else
      DISTGEMM_CUDA_CHECK(
          cudaMemcpy2D(gp, g.cols * eb, lp, cols * eb, cols * eb, rows, cudaMemcpyDefault));
  }
}

// The window of device d's shard of a [rows, cols] operand whose rows are mode `rm` and columns
// mode `cm`, sharded on `sh`.
void shard_window(Extent2 g, Mode rm, Mode cm, Mode sh, int tp, int d, int64_t& r0, int64_t& c0,
                  int64_t& rows, int64_t& cols) {
  r0 = 0;
  c0 = 0;
  rows = g.rows;
  cols = g.cols;
  if (sh != Mode::None && sh == rm) {
    rows = g.rows / tp;
    r0 = d * rows;
  }
  if (sh != Mode::None && sh == cm) {
    cols = g.cols / tp;
    c0 = d * cols;
  }
}

double host_rss_mib() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096.0 / (1024.0 * 1024.0);
}

double device_used_mib(int dev) {
  size_t free_b = 0, total_b = 0;
  DISTGEMM_CUDA_CHECK(cudaSetDevice(dev));
  DISTGEMM_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return double(total_b - free_b) / (1024.0 * 1024.0);
}

// One distributed setup: a plan, its workspace, each device's user tensors and graph.
struct Setup {
  Plan plan;
  std::vector<int> devs;
  std::unique_ptr<device::LocalSymmetricWorkspace> ws;
  std::vector<DevBuf> A, B, C, D, bias;
  std::vector<std::unique_ptr<device::DeviceGraph>> graphs;
  std::vector<cudaStream_t> streams;

  ~Setup() {
    graphs.clear();
    for (size_t i = 0; i < streams.size(); ++i) {
      cudaSetDevice(devs[i]);
      cudaStreamDestroy(streams[i]);
    }
  }
  device::UserBuffers user(int d) const {
    return {A[d].p, B[d].p, C.empty() ? nullptr : C[d].p, D[d].p,
            bias.empty() ? nullptr : bias[d].p};
  }
};

template <class T>
std::unique_ptr<Setup> make_setup(const Args& a, const schedule::ScheduleDef& def, Problem prob,
                                  int tp, int steps, const std::vector<int>& devs,
                                  kernel::DType dt) {
  auto s = std::make_unique<Setup>();
  s->plan = schedule::build_plan(def, prob, tp, steps,
                                 schedule::plan_options(def, tp, steps, a.partial_via));
  s->devs = devs;
  const auto& pt = s->plan.partition();
  const Extent2 la = pt.local_a(prob, tp), lb = pt.local_b(prob, tp), ld = pt.local_d(prob, tp);
  for (int d = 0; d < tp; ++d) {
    s->A.emplace_back(devs[d], size_t(prob.l * la.rows * la.cols * 2));
    s->B.emplace_back(devs[d], size_t(prob.l * lb.rows * lb.cols * 2));
    s->D.emplace_back(devs[d], size_t(prob.l * ld.rows * ld.cols * 2));
    if (a.beta != 0.0f) s->C.emplace_back(devs[d], size_t(prob.l * ld.rows * ld.cols * 2));
    if (a.bias) s->bias.emplace_back(devs[d], size_t(pt.local_bias(prob, tp) * 2));
  }
  s->ws = std::make_unique<device::LocalSymmetricWorkspace>(devs, s->plan.extra_bytes(2));
  device::EpilogueArgs epi{a.alpha, a.beta, a.bias};
  device::GraphOptions opt;
  opt.timeout_s = a.timeout_s;
  opt.swizzle = a.swizzle;
  opt.raster = a.raster;
  opt.pdl = a.pdl;
  opt.tile_n = a.tile_n;
  opt.workspace_bytes = s->ws->bytes();
  for (int d = 0; d < tp; ++d) {
    // Rejects misaligned shapes here, before anything is launched.
    s->graphs.push_back(std::make_unique<device::DeviceGraph>(s->plan, d, devs[d], dt, epi,
                                                              s->ws->bases(), s->user(d), opt));
    cudaStream_t st;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(devs[d]));
    DISTGEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    s->streams.push_back(st);
  }
  return s;
}

void launch_all(Setup& s, int skip = -1) {
  for (size_t d = 0; d < s.graphs.size(); ++d)
    if (int(d) != skip) s.graphs[d]->launch(s.streams[d]);
}

// Synchronises every launched device, then raises the first timeout report, if any.
void sync_and_check(Setup& s, int skip = -1) {
  std::string errors;
  for (size_t d = 0; d < s.graphs.size(); ++d) {
    if (int(d) == skip) continue;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(s.devs[d]));
    DISTGEMM_CUDA_CHECK(cudaStreamSynchronize(s.streams[d]));
  }
  for (size_t d = 0; d < s.graphs.size(); ++d) {
    std::string e = s.graphs[d]->error();
    if (!e.empty()) errors += (errors.empty() ? "" : "\n") + e;
  }
  if (!errors.empty()) throw std::runtime_error(errors);
}

// Median over replays of the max over devices of the event-timed graph launch, in ms.
// iters <= 0: as many replays as fill llama::kSweepTiming.timed_ms, within its iteration bounds,
// judged by the last warm-up chunk.
double time_replays(Setup& s, int warmup, int iters, int warmup_ms) {
  using clock = std::chrono::steady_clock;
  const int tp = int(s.graphs.size());
  for (int i = 0; i < warmup; ++i) launch_all(s);
  sync_and_check(s);
  // Then at least warmup_ms of replays: an idle GPU sits at a low clock and needs a few hundred
  // ms of load to reach its steady boost clock; a short warm-up made the same kernel vary +-5%.
  double replay_ms = 0.0;
  for (auto t0 = clock::now(); clock::now() - t0 < std::chrono::milliseconds(warmup_ms) ||
                               (iters <= 0 && replay_ms == 0.0);) {
    const auto c0 = clock::now();
    for (int i = 0; i < 10; ++i) launch_all(s);
    sync_and_check(s);
    replay_ms = std::chrono::duration<double, std::milli>(clock::now() - c0).count() / 10;
  }
  if (iters <= 0) {
    const llama::SweepTiming& st = llama::kSweepTiming;
    iters = std::clamp(int(std::ceil(st.timed_ms / std::max(replay_ms, 1e-3))), st.min_iterations,
                       st.max_iterations);
  }
  std::vector<std::vector<cudaEvent_t>> ev(tp, std::vector<cudaEvent_t>(2 * iters));
  for (int d = 0; d < tp; ++d) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(s.devs[d]));
    for (auto& e : ev[d]) DISTGEMM_CUDA_CHECK(cudaEventCreate(&e));
  }
  for (int i = 0; i < iters; ++i)
    for (int d = 0; d < tp; ++d) {
      DISTGEMM_CUDA_CHECK(cudaSetDevice(s.devs[d]));
      DISTGEMM_CUDA_CHECK(cudaEventRecord(ev[d][2 * i], s.streams[d]));
      s.graphs[d]->launch(s.streams[d]);
      DISTGEMM_CUDA_CHECK(cudaEventRecord(ev[d][2 * i + 1], s.streams[d]));
    }
  sync_and_check(s);
  std::vector<double> t(iters, 0.0);
  for (int i = 0; i < iters; ++i)
    for (int d = 0; d < tp; ++d) {
      float ms = 0;
      DISTGEMM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[d][2 * i], ev[d][2 * i + 1]));
      t[i] = std::max(t[i], double(ms));
    }
  for (int d = 0; d < tp; ++d) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(s.devs[d]));
    for (auto& e : ev[d]) DISTGEMM_CUDA_CHECK(cudaEventDestroy(e));
  }
  std::sort(t.begin(), t.end());
  return t[iters / 2];
}

// Global inputs on device 0, the fp32 reference accumulator of the checked rows, and the scatter
// into a setup.
struct Global {
  DevBuf A, B, C, bias, acc, Dg;
  DevBuf err;
  DevBuf rows;          // the checked rows (int64, ascending); empty: every row
  int64_t checked = 0;  // how many rows of each batch are compared (R)
};

// The rows checked when only `want` of M are: one random row in each of `want` equal bands of M,
// so that every step tile and every device's shard of M has rows in the sample.
std::vector<int64_t> sample_rows(int64_t M, int64_t want, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < want; ++b) {
    const int64_t lo = b * M / want, hi = (b + 1) * M / want;
    rows.push_back(lo + int64_t(rng() % uint64_t(hi - lo)));
  }
  return rows;
}

template <class T>
Global make_global(const Args& a, Problem p, int dev0) {
  Global g;
  g.checked = p.m;
  if (a.verify_rows > 0 && a.verify_rows < p.m) {
    const std::vector<int64_t> rows = sample_rows(p.m, a.verify_rows, a.seed);
    g.checked = int64_t(rows.size());
    g.rows = DevBuf(dev0, rows.size() * sizeof(int64_t));
    DISTGEMM_CUDA_CHECK(cudaMemcpy(g.rows.p, rows.data(), g.rows.bytes, cudaMemcpyHostToDevice));
  }
  g.A = DevBuf(dev0, size_t(p.l * p.m * p.k * 2));
  g.B = DevBuf(dev0, size_t(p.l * p.n * p.k * 2));
  random_fill<T>(g.A, a.seed * 10 + 1);
  random_fill<T>(g.B, a.seed * 10 + 2);
  if (a.beta != 0.0f) {
    g.C = DevBuf(dev0, size_t(p.l * p.m * p.n * 2));
    random_fill<T>(g.C, a.seed * 10 + 3);
  }
  if (a.bias) {
    g.bias = DevBuf(dev0, size_t(p.n * 2));
    random_fill<T>(g.bias, a.seed * 10 + 4);
  }
  g.acc = DevBuf(dev0, size_t(p.l * g.checked * p.n * 4));
  g.Dg = DevBuf(dev0, size_t(p.l * p.m * p.n * 2));
  g.err = DevBuf(dev0, 3 * sizeof(double));
  DISTGEMM_CUDA_CHECK(cudaSetDevice(dev0));
  dim3 grid(unsigned((p.n + 63) / 64), unsigned((g.checked + 63) / 64), unsigned(p.l));
  ref_gemm<T><<<grid, 256>>>((const T*)g.A.p, (const T*)g.B.p, (float*)g.acc.p,
                             (const int64_t*)g.rows.p, g.checked, p.m, p.n, p.k);
  check_launch("ref_gemm");
  DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

void scatter_inputs(const Global& g, Setup& s, Problem p, bool with_c, bool with_bias) {
  const auto& pt = s.plan.partition();
  const int tp = s.plan.tp;
  for (int d = 0; d < tp; ++d) {
    int64_t r0, c0, rows, cols;
    shard_window({p.m, p.k}, Mode::M, Mode::K, pt.a, tp, d, r0, c0, rows, cols);
    copy_window(s.A[d].p, g.A.p, {p.m, p.k}, r0, c0, rows, cols, p.l, true);
    shard_window({p.n, p.k}, Mode::N, Mode::K, pt.b, tp, d, r0, c0, rows, cols);
    copy_window(s.B[d].p, g.B.p, {p.n, p.k}, r0, c0, rows, cols, p.l, true);
    if (with_c) {
      shard_window({p.m, p.n}, Mode::M, Mode::N, pt.d, tp, d, r0, c0, rows, cols);
      copy_window(s.C[d].p, g.C.p, {p.m, p.n}, r0, c0, rows, cols, p.l, true);
    }
    if (with_bias) {
      shard_window({1, p.n}, Mode::None, Mode::N, pt.d, tp, d, r0, c0, rows, cols);
      copy_window(s.bias[d].p, g.bias.p, {1, p.n}, 0, c0, 1, cols, 1, true);
    }
  }
}

void poison_outputs(Setup& s) {
  for (auto& b : s.D) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(b.dev));
    DISTGEMM_CUDA_CHECK(cudaMemset(b.p, 0xFF, b.bytes));  // 0xFFFF: NaN in bf16 and fp16
    DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// Relative Frobenius error of every device's output against the reference (a replicated D is
// checked on each device); NaN when anything was left unwritten.
template <class T>
double verify(const Args& a, Global& g, Setup& s, Problem p) {
  const auto& pt = s.plan.partition();
  const int tp = s.plan.tp;
  double worst = 0.0;
  auto run_compare = [&]() {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(g.err.dev));
    DISTGEMM_CUDA_CHECK(cudaMemset(g.err.p, 0, 3 * sizeof(double)));
    compare<T><<<1024, 256>>>((const T*)g.Dg.p, (const float*)g.acc.p, (const T*)g.C.p,
                              (const T*)g.bias.p, a.alpha, a.beta, (const int64_t*)g.rows.p, p.l,
                              g.checked, p.m, p.n, (double*)g.err.p);
    check_launch("compare");
    if (g.checked < p.m) {
      count_nonfinite<T><<<1024, 256>>>((const T*)g.Dg.p, p.l * p.m * p.n, (double*)g.err.p);
      check_launch("count_nonfinite");
    }
    double h[3];
    DISTGEMM_CUDA_CHECK(cudaMemcpy(h, g.err.p, sizeof(h), cudaMemcpyDeviceToHost));
    if (h[2] > 0) return std::nan("");
    return std::sqrt(h[0] / std::max(h[1], 1e-30));
  };
  if (pt.d == Mode::None) {
    for (int d = 0; d < tp; ++d) {
      DISTGEMM_CUDA_CHECK(cudaMemcpy(g.Dg.p, s.D[d].p, g.Dg.bytes, cudaMemcpyDefault));
      double e = run_compare();
      if (std::isnan(e) || e > worst) worst = e;
      if (std::isnan(worst)) break;
    }
    return worst;
  }
  DISTGEMM_CUDA_CHECK(cudaSetDevice(g.Dg.dev));
  DISTGEMM_CUDA_CHECK(cudaMemset(g.Dg.p, 0xFF, g.Dg.bytes));
  for (int d = 0; d < tp; ++d) {
    int64_t r0, c0, rows, cols;
    shard_window({p.m, p.n}, Mode::M, Mode::N, pt.d, tp, d, r0, c0, rows, cols);
    copy_window(s.D[d].p, g.Dg.p, {p.m, p.n}, r0, c0, rows, cols, p.l, false);
  }
  return run_compare();
}

// ---------------------------------------------------------------------------------------------
// The steps of a measurement, shared by the single-case run and the sweep.

kernel::DType dtype_of(const Args& a) { return kernel::parse_dtype(a.dtype); }

bool passes(double rel_err) { return std::isfinite(rel_err) && rel_err < kTolerance; }

double tflops_per_gpu(Problem p, int tp, double ms) {
  return 2.0 * double(p.m) * double(p.n) * double(p.k) * double(p.l) / tp / (ms * 1e-3) / 1e12;
}

// Devices 0..tp-1 after printing what they are; tp <= 0: every visible GPU, at most kMaxTp.
std::vector<int> open_devices(int& tp) {
  int ndev = 0;
  DISTGEMM_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (tp <= 0) tp = std::min(ndev, kMaxTp);
  if (tp < 1 || tp > ndev)
    usage("--tp " + std::to_string(tp) + " needs that many GPUs; this process sees " +
          std::to_string(ndev));
  cudaDeviceProp prop;
  DISTGEMM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int drv = 0, rt = 0;
  DISTGEMM_CUDA_CHECK(cudaDriverGetVersion(&drv));
  DISTGEMM_CUDA_CHECK(cudaRuntimeGetVersion(&rt));
  std::printf("device: %d x %s (sm_%d%d, %d SMs), driver API %d, runtime %d\n", ndev, prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, drv, rt);
  if (prop.major != 9)
    std::printf("warning: the kernels are built for sm_90a; this GPU is sm_%d%d\n", prop.major,
                prop.minor);
  std::vector<int> devs;
  for (int d = 0; d < tp; ++d) devs.push_back(d);
  return devs;
}

// The problem one device computes alone: the sharded extent divided by TP (all-gather: the
// rotating operand gathered, the other sharded; reduce-scatter: K sharded).
Problem local_problem(const schedule::ScheduleDef& def, Problem p, int tp) {
  if (def.collective == schedule::Collective::AllGather) {
    if (def.partition.d == Mode::M)
      p.m /= tp;
    else
      p.n /= tp;
  } else {
    p.k /= tp;
  }
  return p;
}

// Random user tensors on every device of the setup (never zeros), complete before it returns:
// the graphs run on non-blocking streams, which do not wait for the fill on the legacy stream.
template <class T>
void fill_inputs(Setup& s, uint64_t seed) {
  for (size_t d = 0; d < s.devs.size(); ++d) {
    random_fill<T>(s.A[d], seed + 11 * d + 1);
    random_fill<T>(s.B[d], seed + 11 * d + 2);
    if (!s.C.empty()) random_fill<T>(s.C[d], seed + 11 * d + 3);
    if (!s.bias.empty()) random_fill<T>(s.bias[d], seed + 11 * d + 4);
  }
  for (int dev : s.devs) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(dev));
    DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

// The global inputs scattered into the setup, one warm launch, then the checked launch on
// NaN-poisoned outputs: its relative error against the reference.
template <class T>
double checked_launch(const Args& a, Global& g, Setup& s, Problem p) {
  scatter_inputs(g, s, p, a.beta != 0.0f, a.bias);
  launch_all(s);
  sync_and_check(s);
  poison_outputs(s);
  launch_all(s);
  sync_and_check(s);
  return verify<T>(a, g, s, p);
}

// The "own kernel floor": the same runtime and kernel on device `dev` alone, for the problem one
// device of the distributed GEMM computes (`local`, from local_problem: a TP=1, S=1 plan of the
// schedule).
template <class T>
double time_local(const Args& a, const schedule::ScheduleDef& def, Problem local, int dev) {
  auto ls = make_setup<T>(a, def, local, 1, 1, {dev}, dtype_of(a));
  fill_inputs<T>(*ls, a.seed + 100);
  return time_replays(*ls, a.warmup, a.iterations, a.warmup_ms);
}

// ---------------------------------------------------------------------------------------------
// Single case.

template <class T>
int run(Args a) {
  const schedule::ScheduleDef* def = schedules::find(a.schedule.c_str());
  if (!def) usage("unknown schedule " + a.schedule);
  const kernel::DType dt = dtype_of(a);
  const Problem prob{a.m, a.n, a.k, a.l};
  {
    const std::string why = schedule::validate(*def, prob, a.tp, a.steps);
    if (!why.empty()) {
      std::fprintf(stderr, "error: rejected: %s\n", why.c_str());
      return 2;
    }
  }
  const std::vector<int> devs = open_devices(a.tp);

  std::unique_ptr<Setup> s;
  try {
    s = make_setup<T>(a, *def, prob, a.tp, a.steps, devs, dt);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected before launch: %s\n", e.what());
    return 2;
  }
  const auto st = s->graphs[0]->stats();
  std::printf(
      "plan: %s tp=%d S=%d workspace %.1f MiB/device; graph dev0: %d GEMM, %d copy, %d "
      "signal nodes, %d wait kernels; pdl=%d partial_via=%s; %d of %d GEMMs with 128x128 "
      "tiles (resident CTAs: %d with 128x256 tiles, %d with 128x128)\n",
      a.schedule.c_str(), a.tp, a.steps, s->plan.extra_bytes(2) / 1048576.0, st.gemm_nodes,
      st.copy_nodes, st.signal_nodes, st.wait_kernels, st.pdl ? 1 : 0,
      schedule::partial_via_name(s->plan.partial_via), st.gemm_n128, st.gemm_nodes,
      kernel::gemm_resident_ctas(dt, 256, devs[0]), kernel::gemm_resident_ctas(dt, 128, devs[0]));
  std::fflush(stdout);

  // Missing device: launch every graph but one; the others must report the timeout and the
  // binary exit non-zero.
  if (a.missing >= 0) {
    if (a.missing >= a.tp) usage("--simulate-missing-device must be < --tp");
    for (int d = 0; d < a.tp; ++d) random_fill<T>(s->A[d], 5), random_fill<T>(s->B[d], 6);
    auto t0 = std::chrono::steady_clock::now();
    launch_all(*s, a.missing);
    try {
      sync_and_check(*s, a.missing);
    } catch (const std::runtime_error& e) {
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "error: %s\n", e.what());
      std::printf("RESULT schedule=%s missing_device=%d timeout_reported=1 seconds=%.2f\n",
                  a.schedule.c_str(), a.missing, secs);
      return 1;
    }
    std::printf("RESULT schedule=%s missing_device=%d timeout_reported=0\n", a.schedule.c_str(),
                a.missing);
    std::fprintf(stderr, "error: device %d was never launched but no timeout was reported\n",
                 a.missing);
    return 1;
  }

  double rel_err = 0.0, rel_err_update = -1.0, update_ms = -1.0, rebuild_ms = -1.0;
  bool ok = true;
  std::unique_ptr<Global> g;
  if (a.verify) {
    g = std::make_unique<Global>(make_global<T>(a, prob, devs[0]));
    rel_err = checked_launch<T>(a, *g, *s, prob);
    ok = ok && passes(rel_err);
  } else {
    fill_inputs<T>(*s, a.seed);
  }
  if (a.check_update) {
    // New A and D buffers (same data in A): the old A is poisoned with NaN and the new D too,
    // so a graph that still reads the old A or writes the old D fails verification.
    std::vector<DevBuf> A2, D2;
    for (int d = 0; d < a.tp; ++d) {
      A2.emplace_back(devs[d], s->A[d].bytes);
      D2.emplace_back(devs[d], s->D[d].bytes);
      DISTGEMM_CUDA_CHECK(cudaMemcpy(A2[d].p, s->A[d].p, s->A[d].bytes, cudaMemcpyDefault));
    }
    std::swap(s->A, A2);  // s->A, s->D: the new buffers; A2, D2: the old ones
    std::swap(s->D, D2);
    double up = 0, rb = 0;
    for (int d = 0; d < a.tp; ++d) {
      auto t0 = std::chrono::steady_clock::now();
      s->graphs[d]->update(s->user(d));
      up +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    for (int d = 0; d < a.tp; ++d) {
      DISTGEMM_CUDA_CHECK(cudaSetDevice(devs[d]));
      DISTGEMM_CUDA_CHECK(cudaMemset(A2[d].p, 0xFF, A2[d].bytes));  // the old A: NaN
    }
    poison_outputs(*s);
    launch_all(*s);
    sync_and_check(*s);
    if (a.verify) {
      rel_err_update = verify<T>(a, *g, *s, prob);
      ok = ok && passes(rel_err_update);
    }
    // The same retargeting by re-capture and re-instantiation, for the host-time comparison.
    for (int d = 0; d < a.tp; ++d) {
      auto t0 = std::chrono::steady_clock::now();
      s->graphs[d]->rebuild(s->user(d));
      rb +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    update_ms = up / a.tp;
    rebuild_ms = rb / a.tp;
    A2.clear();  // the old buffers; the graphs point to the new ones
    D2.clear();
  }

  const double ms = time_replays(*s, a.warmup, a.iterations, a.warmup_ms);
  const double tflops = tflops_per_gpu(prob, a.tp, ms);

  double local_ms = -1.0, eff = -1.0;
  if (a.local) {
    local_ms = time_local<T>(a, *def, local_problem(*def, prob, a.tp), devs[0]);
    eff = local_ms / ms;
  }

  double rel_err_replays = -1.0;
  if (a.replays > 0) {
    std::vector<double> before, after;
    for (int d : devs) before.push_back(device_used_mib(d));
    const double rss0 = host_rss_mib();
    auto t0 = std::chrono::steady_clock::now();
    for (long r = 0; r < a.replays; ++r) {
      launch_all(*s);
      if ((r + 1) % 1000 == 0) sync_and_check(*s);  // keep the queue bounded, fail early
    }
    sync_and_check(*s);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (a.verify) {
      poison_outputs(*s);
      launch_all(*s);
      sync_and_check(*s);
      rel_err_replays = verify<T>(a, *g, *s, prob);
      ok = ok && passes(rel_err_replays);
    }
    for (int d : devs) after.push_back(device_used_mib(d));
    const double rss1 = host_rss_mib();
    std::printf("replays: %ld in %.1f s; host RSS %.1f -> %.1f MiB;", a.replays, secs, rss0, rss1);
    for (size_t i = 0; i < devs.size(); ++i)
      std::printf(" dev%zu used %.1f -> %.1f MiB;", i, before[i], after[i]);
    std::printf(" rel_err after replays %.3e\n", rel_err_replays);
    double growth = rss1 - rss0;
    for (size_t i = 0; i < devs.size(); ++i) growth = std::max(growth, after[i] - before[i]);
    if (growth > 8.0) {
      std::fprintf(stderr, "error: memory grew by %.1f MiB over %ld replays\n", growth, a.replays);
      ok = false;
    }
  }

  std::printf(
      "RESULT schedule=%s tp=%d steps=%d m=%lld n=%lld k=%lld l=%lld dtype=%s beta=%g bias=%d "
      "rel_err=%.3e rel_err_update=%.3e rel_err_replays=%.3e verify=%s ms=%.4f "
      "tflops_per_gpu=%.1f local_ms=%.4f local_tflops=%.1f overlap_eff=%.4f update_ms=%.3f "
      "rebuild_ms=%.3f swizzle=%d raster=%d pdl=%d partial_via=%s tile_n=%s gemm_n128=%d "
      "verify_rows=%lld\n",
      a.schedule.c_str(), a.tp, a.steps, (long long)a.m, (long long)a.n, (long long)a.k,
      (long long)a.l, a.dtype.c_str(), a.beta, a.bias ? 1 : 0, rel_err, rel_err_update,
      rel_err_replays, a.verify ? (ok ? "PASS" : "FAIL") : "SKIP", ms, tflops, local_ms,
      local_ms > 0 ? tflops_per_gpu(prob, a.tp, local_ms) : -1.0, eff, update_ms, rebuild_ms,
      a.swizzle, a.raster, st.pdl ? 1 : 0, schedule::partial_via_name(s->plan.partial_via),
      a.tile_n ? std::to_string(a.tile_n).c_str() : "auto", st.gemm_n128,
      (long long)(g ? g->checked : 0));
  if (!ok)
    std::fprintf(stderr, "error: verification failed (relative error >= %.0e or NaN)\n",
                 kTolerance);
  return ok ? 0 : 1;
}

// ---------------------------------------------------------------------------------------------
// Sweep: the Llama-3 layer cases of llama_shapes.hpp.

struct SweepCase {
  llama::Case c;
  std::string name;
  const schedule::ScheduleDef* def = nullptr;
  Problem prob, local;
  std::string skip;  // why TP ranks cannot run the case at all; "" when they can
  // S = TP and S = 2*TP, each with "" or the plan's reason for rejecting it.
  std::vector<std::pair<int, std::string>> steps;
};

template <class V, class X>
bool wanted(const V& filter, const X& x) {
  return filter.empty() || std::find(filter.begin(), filter.end(), x) != filter.end();
}

// The sweep's cases for TP ranks, in run order, with skip reasons: host-only (the dry run).
std::vector<SweepCase> sweep_cases(const Args& a, int tp) {
  std::vector<SweepCase> out;
  for (const llama::Case& c : llama::cases(a.sweep == "quick")) {
    if (!wanted(a.models, std::string(c.model->name)) ||
        !wanted(a.layers, std::string(c.layer->name)) || !wanted(a.tokens, c.tokens))
      continue;
    SweepCase sc;
    sc.c = c;
    sc.name = c.name(tp);
    sc.def = &schedules::find_or_throw(c.layer->schedule);
    const llama::Gemm g = c.gemm();
    sc.prob = {g.m, g.n, g.k, 1};
    sc.skip = llama::tp_split_reason(c, tp);
    if (!sc.skip.empty()) {
      out.push_back(sc);
      continue;
    }
    sc.local = local_problem(*sc.def, sc.prob, tp);
    bool any = false;
    for (int s : {tp, 2 * tp}) {
      sc.steps.emplace_back(s, schedule::validate(*sc.def, sc.prob, tp, s));
      any = any || sc.steps.back().second.empty();
    }
    if (!any) sc.skip = "the plan rejects every S (" + sc.steps[0].second + ")";
    out.push_back(sc);
  }
  if (out.empty()) {
    std::string quick;
    for (const llama::Case& c : llama::cases(true))
      if (c.layer == &llama::kLayers[0])
        quick += " " + std::string(c.model->name) + "/M" + std::to_string(c.tokens);
    usage("--models/--tokens/--layers leave no case of the " + a.sweep +
          " sweep (the quick "
          "sweep has" +
          quick + ")");
  }
  return out;
}

std::string shape(Extent2 e) { return std::to_string(e.rows) + "x" + std::to_string(e.cols); }

// Lists the cases without calling into CUDA: name, global GEMM, schedule, per-device operands and
// local GEMM, the S values, and every skip or rejection with its reason.
int dry_run(const Args& a) {
  const std::vector<SweepCase> cases = sweep_cases(a, a.tp);
  int skipped = 0;
  for (const SweepCase& sc : cases) {
    const Problem& p = sc.prob;
    std::printf(
        "CASE %s model=%s layer=%s tokens=%lld m=%lld n=%lld k=%lld collective=%s "
        "schedule=%s",
        sc.name.c_str(), sc.c.model->name, sc.c.layer->name, (long long)sc.c.tokens, (long long)p.m,
        (long long)p.n, (long long)p.k, sc.c.layer->collective, sc.def->name);
    if (sc.local.m > 0) {
      const schedule::Partition& pt = sc.def->partition;
      std::printf(" a=%s b=%s d=%s local=%lldx%lldx%lld", shape(pt.local_a(p, a.tp)).c_str(),
                  shape(pt.local_b(p, a.tp)).c_str(), shape(pt.local_d(p, a.tp)).c_str(),
                  (long long)sc.local.m, (long long)sc.local.n, (long long)sc.local.k);
    }
    std::string run_steps;
    for (const auto& [s, why] : sc.steps)
      if (why.empty()) run_steps += (run_steps.empty() ? "" : ",") + std::to_string(s);
    std::printf(" steps=%s", run_steps.c_str());
    if (sc.skip.empty()) {
      std::printf(" status=run\n");
    } else {
      std::printf(" status=skipped reason: %s\n", sc.skip.c_str());
      ++skipped;
    }
    for (const auto& [s, why] : sc.steps)
      if (!why.empty()) std::printf("REJECT %s S=%d: %s\n", sc.name.c_str(), s, why.c_str());
  }
  std::printf(
      "dry run: %s sweep, TP=%d, %zu case(s) (%zu to run, %d skipped), S in {%d, %d}; "
      "nothing was launched\n",
      a.sweep.c_str(), a.tp, cases.size(), cases.size() - skipped, skipped, a.tp, 2 * a.tp);
  return 0;
}

struct StepResult {
  int steps = 0;
  std::string rejected;  // the plan's or the kernel's reason; "" when it ran
  double ms = -1.0, rel_err = std::nan("");
};

struct CaseResult {
  const SweepCase* sc = nullptr;
  std::vector<StepResult> runs;
  double local_ms = -1.0;
  int64_t rows_checked = 0;
  std::string failed;  // a run-time error of this case

  int best_steps() const {
    const StepResult* best = nullptr;
    for (const StepResult& r : runs)
      if (r.ms > 0 && (!best || r.ms < best->ms)) best = &r;
    return best ? best->steps : 0;
  }
  bool ok() const {
    if (!failed.empty()) return false;
    for (const StepResult& r : runs)
      if (r.rejected.empty() && !passes(r.rel_err)) return false;
    return true;
  }
};

// One case: the reference once, each S set up, checked and timed, then the local kernel. Each
// setup and the reference are freed before the next allocation (405B FC1 at 16384 tokens holds
// ~10 GiB on device 0 at its peak: global A, B and D plus the device's shards).
template <class T>
void run_case(const Args& a, const std::vector<int>& devs, CaseResult& r) {
  const SweepCase& sc = *r.sc;
  const int tp = int(devs.size());
  auto g = std::make_unique<Global>(make_global<T>(a, sc.prob, devs[0]));
  r.rows_checked = g->checked;
  for (const auto& [steps, why] : sc.steps) {
    r.runs.push_back({steps, why});
    StepResult& st = r.runs.back();
    if (!why.empty()) continue;
    std::unique_ptr<Setup> s;
    try {
      s = make_setup<T>(a, *sc.def, sc.prob, tp, steps, devs, dtype_of(a));
    } catch (const std::invalid_argument& e) {  // the kernel's constraints (alignment, TMA)
      st.rejected = e.what();
      continue;
    }
    st.rel_err = checked_launch<T>(a, *g, *s, sc.prob);
    st.ms = time_replays(*s, a.warmup, a.iterations, a.warmup_ms);
  }
  g.reset();
  r.local_ms = time_local<T>(a, *sc.def, sc.local, devs[0]);
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// One result row per (case, S); a skipped or failed case is one row with its reason.
struct Row {
  const CaseResult* cr;
  const StepResult* st;  // null: the case row of a skipped or failed case
  std::string status, reason;
};

std::vector<Row> rows_of(const std::vector<CaseResult>& results) {
  std::vector<Row> rows;
  for (const CaseResult& cr : results) {
    if (!cr.sc->skip.empty()) rows.push_back({&cr, nullptr, "skipped", cr.sc->skip});
    for (const StepResult& st : cr.runs) {
      if (!st.rejected.empty())
        rows.push_back({&cr, &st, "rejected", st.rejected});
      else if (st.ms > 0)
        rows.push_back({&cr, &st, passes(st.rel_err) ? "ok" : "wrong", ""});
    }
    if (!cr.failed.empty()) rows.push_back({&cr, nullptr, "failed", cr.failed});
  }
  return rows;
}

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_csv(const std::string& path, const std::vector<Row>& rows, int tp) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write --csv " + path);
  f << "case,model,layer,tokens,tp,m,n,k,schedule,steps,status,ms,tflops_per_gpu,local_ms,"
       "local_tflops_per_gpu,overlap_eff,best_steps,rel_err,rows_checked,reason\n";
  for (const Row& r : rows) {
    const SweepCase& sc = *r.cr->sc;
    const bool timed = r.st && r.st->ms > 0;
    const bool local = r.cr->local_ms > 0;
    f << sc.name << ',' << sc.c.model->name << ',' << sc.c.layer->name << ',' << sc.c.tokens << ','
      << tp << ',' << sc.prob.m << ',' << sc.prob.n << ',' << sc.prob.k << ',' << sc.def->name
      << ',' << (r.st ? std::to_string(r.st->steps) : "") << ',' << r.status << ','
      << (timed ? fmt("%.4f", r.st->ms) : "") << ','
      << (timed ? fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.st->ms)) : "") << ','
      << (local ? fmt("%.4f", r.cr->local_ms) : "") << ','
      << (local ? fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.cr->local_ms)) : "") << ','
      << (timed && local ? fmt("%.4f", r.cr->local_ms / r.st->ms) : "") << ','
      << (r.cr->best_steps() ? std::to_string(r.cr->best_steps()) : "") << ','
      << (timed ? fmt("%.3e", r.st->rel_err) : "") << ','
      << (timed ? std::to_string(r.cr->rows_checked) : "") << ',' << csv_field(r.reason) << '\n';
  }
}

void print_table(const std::vector<Row>& rows, int tp) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"case", "S", "ms", "TF/s/GPU", "local ms", "eff", "best S", "rel err", "check"});
  std::vector<std::string> notes;  // rows whose cells are one reason
  for (const Row& r : rows) {
    const SweepCase& sc = *r.cr->sc;
    if (!r.st || r.status == "rejected") {
      notes.push_back(sc.name + (r.st ? " S=" + std::to_string(r.st->steps) : "") + ": " +
                      r.status + ": " + r.reason);
      continue;
    }
    const bool local = r.cr->local_ms > 0;
    cells.push_back({sc.name, std::to_string(r.st->steps), fmt("%.3f", r.st->ms),
                     fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.st->ms)),
                     local ? fmt("%.3f", r.cr->local_ms) : "-",
                     local ? fmt("%.3f", r.cr->local_ms / r.st->ms) : "-",
                     std::to_string(r.cr->best_steps()), fmt("%.1e", r.st->rel_err),
                     r.status == "ok" ? "PASS" : "FAIL"});
  }
  std::vector<size_t> w(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  for (size_t j = 0; j < cells.size(); ++j) {
    std::string line;
    for (size_t i = 0; i < cells[j].size(); ++i)
      line += (i ? " | " : "") + cells[j][i] + std::string(w[i] - cells[j][i].size(), ' ');
    std::printf("%s\n", line.c_str());
    if (j == 0) {
      std::string rule;
      for (size_t i = 0; i < w.size(); ++i) rule += (i ? "-+-" : "") + std::string(w[i], '-');
      std::printf("%s\n", rule.c_str());
    }
  }
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
}

template <class T>
int run_sweep(Args a) {
  const std::vector<int> devs = open_devices(a.tp);
  const std::vector<SweepCase> cases = sweep_cases(a, a.tp);
  std::printf(
      "sweep: %s, TP=%d, %s, %zu cases, S in {%d, %d}; timing: >= %d ms warm-up, then %s "
      "replays, median; check: relative Frobenius error < %.0e against an fp32 reference "
      "on %s, every element of D checked for being written\n",
      a.sweep.c_str(), a.tp, a.dtype.c_str(), cases.size(), a.tp, 2 * a.tp, a.warmup_ms,
      a.iterations > 0 ? std::to_string(a.iterations).c_str() : "~150 ms (10..50) of", kTolerance,
      a.verify_rows > 0 ? (std::to_string(a.verify_rows) +
                           " rows of D (one random row in each of as many equal bands of "
                           "M, seed " +
                           std::to_string(a.seed) + ")")
                              .c_str()
                        : "every row of D");
  std::fflush(stdout);
  std::vector<CaseResult> results(cases.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult& r = results[i];
    r.sc = &cases[i];
    if (r.sc->skip.empty()) {
      try {
        run_case<T>(a, devs, r);
      } catch (const std::exception& e) {  // a timeout report or CUDA error: on to the next case
        r.failed = e.what();
      }
    }
    std::string line;
    if (!r.sc->skip.empty()) line = "skipped: " + r.sc->skip;
    for (const StepResult& st : r.runs) {
      line += (line.empty() ? "" : "; ") + std::string("S=") + std::to_string(st.steps) + " ";
      if (!st.rejected.empty())
        line += "rejected: " + st.rejected;
      else if (st.ms > 0)
        line += fmt("%.3f ms", st.ms) +
                fmt(" %.0f TF/s/GPU", tflops_per_gpu(r.sc->prob, a.tp, st.ms)) +
                fmt(" err %.1e ", st.rel_err) + (passes(st.rel_err) ? "PASS" : "FAIL");
    }
    if (r.local_ms > 0) line += fmt("; local %.3f ms", r.local_ms);
    if (!r.failed.empty()) line += "; FAILED: " + r.failed;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[%zu/%zu] %s: %s (%.1f s)\n", i + 1, cases.size(), r.sc->name.c_str(),
                 line.c_str(), secs);
  }
  const std::vector<Row> rows = rows_of(results);
  print_table(rows, a.tp);
  if (!a.csv.empty()) {
    write_csv(a.csv, rows, a.tp);
    std::printf("wrote %s\n", a.csv.c_str());
  }
  const bool ok =
      std::all_of(results.begin(), results.end(), [](const CaseResult& r) { return r.ok(); });
  std::printf("sweep done in %.1f s: %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              ok ? "every check passed" : "FAILED (see FAIL / failed rows)");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    if (a.dry_run) return dry_run(a);
    const bool bf16 = dtype_of(a) == kernel::DType::BF16;
    if (!a.sweep.empty()) return bf16 ? run_sweep<__nv_bfloat16>(a) : run_sweep<__half>(a);
    return bf16 ? run<__nv_bfloat16>(a) : run<__half>(a);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
