// distgemm_bench: runs one schedule on TP GPUs of this process, verifies it against a
// single-GPU reference GEMM of the full problem and times it.
//
//   distgemm_bench --schedule ag_rotate_a --tp 2 --steps 2 --m 8192 --n 57344 --k 8192 \
//                  --l 1 --dtype bf16 --iterations 50 --warmup 10 [--beta 0.5] [--bias]
//                  [--timeout-s 5] [--replays 10000] [--simulate-missing-device D]
//                  [--check-update] [--no-verify] [--no-local] [--warmup-ms 1000]
//                  [--swizzle 8] [--raster 0] [--pdl]
//
// Prints one line `RESULT key=value ...` (parsed by tests/gpu/test_cpp_bench.py). Exit code:
// 0 verified (and timed), 1 verification failure or runtime error (a timeout report included),
// 2 bad arguments or a shape rejected before launch.
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
#include <stdexcept>
#include <string>
#include <vector>

#include "all.hpp"
#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/device/workspace.hpp"
#include "distgemm/schedule/plan.hpp"

using namespace distgemm;
using schedule::Extent2;
using schedule::Mode;
using schedule::Plan;
using schedule::Problem;

namespace {

struct Args {
  std::string schedule = "ag_rotate_a";
  int tp = 2, steps = 2;
  int64_t m = 8192, n = 8192, k = 8192, l = 1;
  std::string dtype = "bf16";
  int iterations = 50, warmup = 10, warmup_ms = 1000;
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  double timeout_s = 5.0;
  long replays = 0;
  int missing = -1;
  bool check_update = false, verify = true, local = true;
  int swizzle = device::GraphOptions{}.swizzle, raster = device::GraphOptions{}.raster;
  bool pdl = false;
  uint64_t seed = 1234;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "error: %s\nusage: distgemm_bench --schedule NAME --tp T --steps S --m M --n N "
               "--k K [--l L] [--dtype bf16|fp16] [--iterations I] [--warmup W] [--warmup-ms T] "
               "[--alpha A] "
               "[--beta B] [--bias] [--timeout-s T] [--replays R] [--simulate-missing-device D] "
               "[--check-update] [--no-verify] [--no-local] [--seed X] [--swizzle 1|2|4|8] "
               "[--raster 0|1|2] [--pdl]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--schedule") a.schedule = val();
      else if (k == "--tp") a.tp = std::stoi(val());
      else if (k == "--steps") a.steps = std::stoi(val());
      else if (k == "--m") a.m = std::stoll(val());
      else if (k == "--n") a.n = std::stoll(val());
      else if (k == "--k") a.k = std::stoll(val());
      else if (k == "--l") a.l = std::stoll(val());
      else if (k == "--dtype") a.dtype = val();
      else if (k == "--iterations") a.iterations = std::stoi(val());
      else if (k == "--warmup") a.warmup = std::stoi(val());
      else if (k == "--warmup-ms") a.warmup_ms = std::stoi(val());
      else if (k == "--alpha") a.alpha = std::stof(val());
      else if (k == "--beta") a.beta = std::stof(val());
      else if (k == "--bias") a.bias = true;
      else if (k == "--timeout-s") a.timeout_s = std::stod(val());
      else if (k == "--replays") a.replays = std::stol(val());
      else if (k == "--simulate-missing-device") a.missing = std::stoi(val());
      else if (k == "--check-update") a.check_update = true;
      else if (k == "--no-verify") a.verify = false;
      else if (k == "--no-local") a.local = false;
      else if (k == "--seed") a.seed = std::stoull(val());
      else if (k == "--swizzle") a.swizzle = std::stoi(val());
      else if (k == "--raster") a.raster = std::stoi(val());
      else if (k == "--pdl") a.pdl = true;
      else usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  if (a.dtype != "bf16" && a.dtype != "fp16") usage("--dtype must be bf16 or fp16");
  if (a.iterations < 1 || a.warmup < 0) usage("--iterations must be >= 1 and --warmup >= 0");
  return a;
}

// ---------------------------------------------------------------------------------------------
// Device helpers: random fill, reference GEMM, comparison.

__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }
template <class T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_f(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_f(float v) { return __float2half(v); }

__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
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

// Reference: Dref[l, m, n] = sum_k A[l, m, k] * B[l, n, k] in fp32, a plain shared-memory tiled
// SIMT kernel (deliberately unrelated to the CUTLASS path it checks). 64x64 tile, 4x4 per thread.
template <class T>
__global__ void __launch_bounds__(256) ref_gemm(const T* A, const T* B, float* D, int64_t M,
                                                int64_t N, int64_t K) {
  __shared__ float As[16][64 + 1];
  __shared__ float Bs[16][64 + 1];
  const int64_t l = blockIdx.z;
  A += l * M * K;
  B += l * N * K;
  D += l * M * N;
  const int64_t m0 = int64_t(blockIdx.y) * 64, n0 = int64_t(blockIdx.x) * 64;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    for (int i = threadIdx.x; i < 16 * 64; i += 256) {
      const int kk = i % 16, r = i / 16;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + kk;
      As[kk][r] = (gm < M && gk < K) ? to_f(A[gm * K + gk]) : 0.0f;
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
      if (gm < M && gn < N) D[gm * N + gn] = acc[i][j];
    }
}

// err[0] += sum (out - ref)^2, err[1] += sum ref^2, err[2] += #non-finite outputs, where
// ref = alpha * acc + beta * C + bias.
template <class T>
__global__ void compare(const T* out, const float* acc, const T* C, const T* bias, float alpha,
                        float beta, int64_t total, int64_t N, double* err) {
  double e = 0.0, r = 0.0, bad = 0.0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    float ref = alpha * acc[i];
    if (C) ref += beta * to_f(C[i]);
    if (bias) ref += to_f(bias[i % N]);
    const float o = to_f(out[i]);
    if (!isfinite(o)) bad += 1.0;
    else e += double(o - ref) * double(o - ref);
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
    std::swap(p, o.p); std::swap(dev, o.dev); std::swap(bytes, o.bytes);
    return *this;
  }
  ~DevBuf() {
    if (p) { cudaSetDevice(dev); cudaFree(p); }
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
      DISTGEMM_CUDA_CHECK(cudaMemcpy2D(lp, cols * eb, gp, g.cols * eb, cols * eb, rows,
                                       cudaMemcpyDefault));
    else
      DISTGEMM_CUDA_CHECK(cudaMemcpy2D(gp, g.cols * eb, lp, cols * eb, cols * eb, rows,
                                       cudaMemcpyDefault));
  }
}

// The window of device d's shard of a [rows, cols] operand whose rows are mode `rm` and columns
// mode `cm`, sharded on `sh`.
void shard_window(Extent2 g, Mode rm, Mode cm, Mode sh, int tp, int d, int64_t& r0, int64_t& c0,
                  int64_t& rows, int64_t& cols) {
  r0 = 0; c0 = 0; rows = g.rows; cols = g.cols;
  if (sh != Mode::None && sh == rm) { rows = g.rows / tp; r0 = d * rows; }
  if (sh != Mode::None && sh == cm) { cols = g.cols / tp; c0 = d * cols; }
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
  s->plan = schedule::build_plan(def, prob, tp, steps);
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
  for (int d = 0; d < tp; ++d) {
    // Rejects misaligned shapes here, before anything is launched.
    s->graphs.push_back(std::make_unique<device::DeviceGraph>(
        s->plan, d, devs[d], dt, epi, s->ws->bases(), s->user(d), opt));
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
double time_replays(Setup& s, int warmup, int iters, int warmup_ms) {
  const int tp = int(s.graphs.size());
  for (int i = 0; i < warmup; ++i) launch_all(s);
  sync_and_check(s);
  // Then at least warmup_ms of replays: an idle GPU sits at a low clock and needs a few hundred
  // ms of load to reach its steady boost clock; a short warm-up made the same kernel vary +-5%.
  for (auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(warmup_ms);) {
    for (int i = 0; i < 10; ++i) launch_all(s);
    sync_and_check(s);
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

// Global inputs on device 0, the fp32 reference accumulator, and the scatter into a setup.
struct Global {
  DevBuf A, B, C, bias, acc, Dg;
  DevBuf err;
};

template <class T>
Global make_global(const Args& a, Problem p, int dev0) {
  Global g;
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
  g.acc = DevBuf(dev0, size_t(p.l * p.m * p.n * 4));
  g.Dg = DevBuf(dev0, size_t(p.l * p.m * p.n * 2));
  g.err = DevBuf(dev0, 3 * sizeof(double));
  DISTGEMM_CUDA_CHECK(cudaSetDevice(dev0));
  dim3 grid(unsigned((p.n + 63) / 64), unsigned((p.m + 63) / 64), unsigned(p.l));
  ref_gemm<T><<<grid, 256>>>((const T*)g.A.p, (const T*)g.B.p, (float*)g.acc.p, p.m, p.n, p.k);
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
                              (const T*)g.bias.p, a.alpha, a.beta, p.l * p.m * p.n, p.n,
                              (double*)g.err.p);
    check_launch("compare");
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

template <class T>
int run(const Args& a) {
  const schedule::ScheduleDef* def = schedules::find(a.schedule.c_str());
  if (!def) usage("unknown schedule " + a.schedule);
  const kernel::DType dt = a.dtype == "bf16" ? kernel::DType::BF16 : kernel::DType::FP16;
  int ndev = 0;
  DISTGEMM_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (a.tp > ndev) usage("--tp " + std::to_string(a.tp) + " needs that many GPUs; this process sees " + std::to_string(ndev));
  std::vector<int> devs;
  for (int d = 0; d < a.tp; ++d) devs.push_back(d);
  const Problem prob{a.m, a.n, a.k, a.l};
  {
    const std::string why = schedule::validate(*def, prob, a.tp, a.steps);
    if (!why.empty()) {
      std::fprintf(stderr, "error: rejected: %s\n", why.c_str());
      return 2;
    }
  }

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

  std::unique_ptr<Setup> s;
  try {
    s = make_setup<T>(a, *def, prob, a.tp, a.steps, devs, dt);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected before launch: %s\n", e.what());
    return 2;
  }
  const auto st = s->graphs[0]->stats();
  std::printf("plan: %s tp=%d S=%d workspace %.1f MiB/device; graph dev0: %d GEMM, %d copy, %d "
              "signal nodes, %d wait kernels\n",
              a.schedule.c_str(), a.tp, a.steps, s->plan.extra_bytes(2) / 1048576.0,
              st.gemm_nodes, st.copy_nodes, st.signal_nodes, st.wait_kernels);
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
    scatter_inputs(*g, *s, prob, a.beta != 0.0f, a.bias);
    launch_all(*s);  // warm (first launch), then a checked one on poisoned outputs
    sync_and_check(*s);
    poison_outputs(*s);
    launch_all(*s);
    sync_and_check(*s);
    rel_err = verify<T>(a, *g, *s, prob);
    ok = ok && std::isfinite(rel_err) && rel_err < 1e-2;
  } else {
    for (int d = 0; d < a.tp; ++d) {
      random_fill<T>(s->A[d], a.seed + 11 * d + 1);
      random_fill<T>(s->B[d], a.seed + 11 * d + 2);
      if (!s->C.empty()) random_fill<T>(s->C[d], a.seed + 11 * d + 3);
      if (!s->bias.empty()) random_fill<T>(s->bias[d], a.seed + 11 * d + 4);
    }
    for (int d = 0; d < a.tp; ++d) {
      DISTGEMM_CUDA_CHECK(cudaSetDevice(devs[d]));
      DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
    }
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
      up += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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
      ok = ok && std::isfinite(rel_err_update) && rel_err_update < 1e-2;
    }
    // The same retargeting by re-capture and re-instantiation, for the host-time comparison.
    for (int d = 0; d < a.tp; ++d) {
      auto t0 = std::chrono::steady_clock::now();
      s->graphs[d]->rebuild(s->user(d));
      rb += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    update_ms = up / a.tp;
    rebuild_ms = rb / a.tp;
    A2.clear();  // the old buffers; the graphs point to the new ones
    D2.clear();
  }

  const double ms = time_replays(*s, a.warmup, a.iterations, a.warmup_ms);
  const double flop = 2.0 * double(a.m) * double(a.n) * double(a.k) * double(a.l);
  const double tflops = flop / a.tp / (ms * 1e-3) / 1e12;

  double local_ms = -1.0, eff = -1.0;
  if (a.local) {
    Problem lp = prob;
    const auto& pt = def->partition;
    if (def->collective == schedule::Collective::AllGather) {
      if (pt.d == Mode::M) lp.m /= a.tp; else lp.n /= a.tp;
    } else {
      lp.k /= a.tp;
    }
    Args la = a;
    auto ls = make_setup<T>(la, *def, lp, 1, 1, {devs[0]}, dt);
    random_fill<T>(ls->A[0], a.seed + 101);
    random_fill<T>(ls->B[0], a.seed + 102);
    if (!ls->C.empty()) random_fill<T>(ls->C[0], a.seed + 103);
    if (!ls->bias.empty()) random_fill<T>(ls->bias[0], a.seed + 104);
    local_ms = time_replays(*ls, a.warmup, a.iterations, a.warmup_ms);
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
      ok = ok && std::isfinite(rel_err_replays) && rel_err_replays < 1e-2;
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
      "rebuild_ms=%.3f swizzle=%d raster=%d pdl=%d\n",
      a.schedule.c_str(), a.tp, a.steps, (long long)a.m, (long long)a.n, (long long)a.k,
      (long long)a.l, a.dtype.c_str(), a.beta, a.bias ? 1 : 0, rel_err, rel_err_update,
      rel_err_replays, a.verify ? (ok ? "PASS" : "FAIL") : "SKIP", ms, tflops, local_ms,
      local_ms > 0 ? flop / a.tp / (local_ms * 1e-3) / 1e12 : -1.0, eff, update_ms, rebuild_ms,
      a.swizzle, a.raster, a.pdl ? 1 : 0);
  if (!ok) std::fprintf(stderr, "error: verification failed (relative error >= 1e-2 or NaN)\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  try {
    return a.dtype == "bf16" ? run<__nv_bfloat16>(a) : run<__half>(a);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
