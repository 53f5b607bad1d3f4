// distgemm_bench's harness: device buffers, a plan's setup on TP GPUs, the global inputs and
// their reference, launch, timing and verification (declared in harness.hpp).
#include "harness.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "all.hpp"
#include "distgemm/device/check.hpp"
#include "llama_shapes.hpp"
#include "reference.hpp"

namespace distgemm::bench {

using schedule::Extent2;
using schedule::Mode;
using schedule::Problem;

DevBuf::DevBuf(int d, size_t b) : dev(d), bytes(b) {
  DISTGEMM_CUDA_CHECK(cudaSetDevice(d));
  DISTGEMM_CUDA_CHECK(cudaMalloc(&p, b > 0 ? b : 16));
}
DevBuf::DevBuf(DevBuf&& o) noexcept : p(o.p), dev(o.dev), bytes(o.bytes) { o.p = nullptr; }
DevBuf& DevBuf::operator=(DevBuf&& o) noexcept {
  std::swap(p, o.p);
  std::swap(dev, o.dev);
  std::swap(bytes, o.bytes);
  return *this;
}
DevBuf::~DevBuf() {
  if (p) {  // a destructor: best effort, nothing to report to
    cudaSetDevice(dev);
    cudaFree(p);
  }
}

void random_fill(kernel::DType dtype, const DevBuf& b, uint64_t seed) {
  DISTGEMM_CUDA_CHECK(cudaSetDevice(b.dev));
  fill_random(dtype, b.p, int64_t(b.bytes / kernel::dtype_bytes(dtype)), seed);
}

namespace {

// Copies the (row0, col0, rows, cols) window of a dense [L, g.rows, g.cols] tensor of `eb`-byte
// elements between a global tensor and a local dense [L, rows, cols] one.
void copy_window(void* local, const void* global, Extent2 g, int64_t row0, int64_t col0,
                 int64_t rows, int64_t cols, int64_t L, int64_t eb, bool to_local) {
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

void scatter_inputs(const Global& g, Setup& s, Problem p, bool with_c, bool with_bias) {
  const auto& pt = s.plan.partition();
  const int tp = s.plan.tp;
  const int64_t eb = kernel::dtype_bytes(s.dtype), ob = kernel::out_dtype_bytes(s.dtype);
  const int64_t fb = schedule::kScaleBytes;
  for (int d = 0; d < tp; ++d) {
    int64_t r0, c0, rows, cols;
    shard_window({p.m, p.k}, Mode::M, Mode::K, pt.a, tp, d, r0, c0, rows, cols);
    copy_window(s.A[d].p, g.A.p, {p.m, p.k}, r0, c0, rows, cols, p.l, eb, true);
    // A row scale goes with its row of A; a tensor-wise scale to every device.
    if (!s.scale_a.empty())
      copy_window(s.scale_a[d].p, g.scale_a.p, {p.m, 1}, s.plan.row_scale_a ? r0 : 0, 0,
                  s.plan.row_scale_a ? rows : 1, 1, 1, fb, true);
    shard_window({p.n, p.k}, Mode::N, Mode::K, pt.b, tp, d, r0, c0, rows, cols);
    copy_window(s.B[d].p, g.B.p, {p.n, p.k}, r0, c0, rows, cols, p.l, eb, true);
    if (!s.scale_b.empty())
      copy_window(s.scale_b[d].p, g.scale_b.p, {p.n, 1}, s.plan.row_scale_b ? r0 : 0, 0,
                  s.plan.row_scale_b ? rows : 1, 1, 1, fb, true);
    if (with_c) {
      shard_window({p.m, p.n}, Mode::M, Mode::N, pt.d, tp, d, r0, c0, rows, cols);
      copy_window(s.C[d].p, g.C.p, {p.m, p.n}, r0, c0, rows, cols, p.l, ob, true);
    }
    if (with_bias) {
      shard_window({1, p.n}, Mode::None, Mode::N, pt.d, tp, d, r0, c0, rows, cols);
      copy_window(s.bias[d].p, g.bias.p, {1, p.n}, 0, c0, 1, cols, 1, ob, true);
    }
  }
}

}  // namespace

Setup::~Setup() {
  graphs.clear();
  for (size_t i = 0; i < streams.size(); ++i) {  // a destructor: best effort
    cudaSetDevice(devs[i]);
    cudaStreamDestroy(streams[i]);
  }
}

device::UserBuffers Setup::user(int d) const {
  auto scale = [d](const std::vector<DevBuf>& v) {
    return v.empty() ? nullptr : static_cast<const float*>(v[d].p);
  };
  return {A[d].p,
          B[d].p,
          C.empty() ? nullptr : C[d].p,
          D[d].p,
          bias.empty() ? nullptr : bias[d].p,
          scale(scale_a),
          scale(scale_b)};
}

bool passes(double rel_err) { return std::isfinite(rel_err) && rel_err < kTolerance; }

double tflops_per_gpu(Problem p, int tp, double ms) {
  return 2.0 * double(p.m) * double(p.n) * double(p.k) * double(p.l) / tp / (ms * 1e-3) / 1e12;
}

std::vector<int> open_devices(int& tp) {
  int ndev = 0;
  DISTGEMM_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  if (tp <= 0) tp = std::min(ndev, schedule::kMaxTp);
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

schedule::PlanOptions plan_options_of(const Args& a, const schedule::ScheduleDef& def, int tp,
                                      int steps) {
  schedule::PlanOptions o = schedule::plan_options(def, tp, steps, a.partial_via);
  o.row_scale_a = o.row_scale_b = a.row_scales;  // parse() allows --scales row at fp8 only
  return o;
}

std::unique_ptr<Setup> make_setup(const Args& a, const schedule::ScheduleDef& def, Problem prob,
                                  int tp, int steps, const std::vector<int>& devs) {
  const kernel::DType dt = dtype_of(a);
  const int64_t eb = kernel::dtype_bytes(dt), ob = kernel::out_dtype_bytes(dt);
  auto s = std::make_unique<Setup>();
  s->plan = schedule::build_plan(def, prob, tp, steps, plan_options_of(a, def, tp, steps));
  s->dtype = dt;
  s->devs = devs;
  const auto& pt = s->plan.partition();
  const Extent2 la = pt.local_a(prob, tp), lb = pt.local_b(prob, tp), ld = pt.local_d(prob, tp);
  for (int d = 0; d < tp; ++d) {
    s->A.emplace_back(devs[d], size_t(prob.l * la.rows * la.cols * eb));
    s->B.emplace_back(devs[d], size_t(prob.l * lb.rows * lb.cols * eb));
    s->D.emplace_back(devs[d], size_t(prob.l * ld.rows * ld.cols * ob));
    if (a.beta != 0.0f) s->C.emplace_back(devs[d], size_t(prob.l * ld.rows * ld.cols * ob));
    if (a.bias) s->bias.emplace_back(devs[d], size_t(pt.local_bias(prob, tp) * ob));
    if (dt == kernel::DType::E4M3) {
      const int64_t fb = schedule::kScaleBytes;
      s->scale_a.emplace_back(devs[d], size_t((s->plan.row_scale_a ? la.rows : 1) * fb));
      s->scale_b.emplace_back(devs[d], size_t((s->plan.row_scale_b ? lb.rows : 1) * fb));
    }
  }
  s->ws = std::make_unique<device::LocalSymmetricWorkspace>(
      devs, device::workspace_layout(s->plan, dt).total_bytes);
  device::EpilogueArgs epi{a.alpha, a.beta, a.bias};
  device::GraphOptions opt;
  opt.timeout_s = a.timeout_s;
  opt.swizzle = a.swizzle;
  opt.raster = a.raster;
  opt.pdl = a.pdl;
  opt.tile_n = a.tile_n;
  opt.fast_accum = a.fast_accum;
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

void launch_all(Setup& s, int skip) {
  for (size_t d = 0; d < s.graphs.size(); ++d)
    if (int(d) != skip) s.graphs[d]->launch(s.streams[d]);
}

// Synchronises every launched device, then raises the first timeout report, if any.
void sync_and_check(Setup& s, int skip) {
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

double time_replays(Setup& s, int warmup, int iters, int warmup_ms) {
  using clock = std::chrono::steady_clock;
  const int tp = int(s.graphs.size());
  for (int i = 0; i < warmup; ++i) launch_all(s);
  sync_and_check(s);
  // Then at least warmup_ms of replays: an idle GPU sits at a low clock and needs a few hundred
  // ms of load to reach its steady boost clock; timed before then, a kernel runs several percent
  // faster or slower from one run to the next.
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

Global make_global(const Args& a, Problem p, int dev0) {
  const kernel::DType dt = dtype_of(a), out_dt = kernel::out_dtype(dt);
  const int64_t eb = kernel::dtype_bytes(dt), ob = kernel::dtype_bytes(out_dt);
  Global g;
  g.checked = p.m;
  if (a.verify_rows > 0 && a.verify_rows < p.m) {
    const std::vector<int64_t> rows = sample_rows(p.m, a.verify_rows, a.seed);
    g.checked = int64_t(rows.size());
    g.rows = DevBuf(dev0, rows.size() * sizeof(int64_t));
    DISTGEMM_CUDA_CHECK(cudaMemcpy(g.rows.p, rows.data(), g.rows.bytes, cudaMemcpyHostToDevice));
  }
  g.A = DevBuf(dev0, size_t(p.l * p.m * p.k * eb));
  g.B = DevBuf(dev0, size_t(p.l * p.n * p.k * eb));
  random_fill(dt, g.A, a.seed * 10 + 1);
  random_fill(dt, g.B, a.seed * 10 + 2);
  if (a.beta != 0.0f) {
    g.C = DevBuf(dev0, size_t(p.l * p.m * p.n * ob));
    random_fill(out_dt, g.C, a.seed * 10 + 3);
  }
  if (a.bias) {
    g.bias = DevBuf(dev0, size_t(p.n * ob));
    random_fill(out_dt, g.bias, a.seed * 10 + 4);
  }
  RefScales scales;
  if (dt == kernel::DType::E4M3) {
    g.scale_a = DevBuf(dev0, size_t((a.row_scales ? p.m : 1) * schedule::kScaleBytes));
    g.scale_b = DevBuf(dev0, size_t((a.row_scales ? p.n : 1) * schedule::kScaleBytes));
    DISTGEMM_CUDA_CHECK(cudaSetDevice(dev0));
    fill_scales(static_cast<float*>(g.scale_a.p), int64_t(g.scale_a.bytes / 4), a.seed * 10 + 5);
    fill_scales(static_cast<float*>(g.scale_b.p), int64_t(g.scale_b.bytes / 4), a.seed * 10 + 6);
    scales = {static_cast<const float*>(g.scale_a.p), a.row_scales,
              static_cast<const float*>(g.scale_b.p), a.row_scales};
  }
  g.acc = DevBuf(dev0, size_t(p.l * g.checked * p.n * 4));
  g.Dg = DevBuf(dev0, size_t(p.l * p.m * p.n * ob));
  g.err = DevBuf(dev0, 3 * sizeof(double));
  DISTGEMM_CUDA_CHECK(cudaSetDevice(dev0));
  reference_gemm(dt, g.A.p, g.B.p, scales, static_cast<float*>(g.acc.p),
                 static_cast<const int64_t*>(g.rows.p), g.checked, p.m, p.n, p.k, p.l);
  DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

void poison_outputs(Setup& s) {
  for (auto& b : s.D) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(b.dev));
    DISTGEMM_CUDA_CHECK(cudaMemset(b.p, 0xFF, b.bytes));  // 0xFFFF: NaN in bf16 and fp16
    DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

double verify(const Args& a, Global& g, Setup& s, Problem p) {
  const kernel::DType dt = dtype_of(a);
  const auto& pt = s.plan.partition();
  const int tp = s.plan.tp;
  double worst = 0.0;
  auto run_compare = [&]() {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(g.err.dev));
    DISTGEMM_CUDA_CHECK(cudaMemset(g.err.p, 0, 3 * sizeof(double)));
    double* err = static_cast<double*>(g.err.p);
    compare_to_reference(dt, g.Dg.p, static_cast<const float*>(g.acc.p), g.C.p, g.bias.p, a.alpha,
                         a.beta, static_cast<const int64_t*>(g.rows.p), p.l, g.checked, p.m, p.n,
                         err);
    if (g.checked < p.m) count_nonfinite(dt, g.Dg.p, p.l * p.m * p.n, err);
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
    copy_window(s.D[d].p, g.Dg.p, {p.m, p.n}, r0, c0, rows, cols, p.l,
                kernel::out_dtype_bytes(s.dtype), false);
  }
  return run_compare();
}

void fill_inputs(Setup& s, uint64_t seed) {
  const kernel::DType out_dt = kernel::out_dtype(s.dtype);
  // A tensor-wise scale is one value on every device; row scales differ per row.
  auto fill_scale = [&](const std::vector<DevBuf>& v, size_t d, bool rows, uint64_t salt) {
    if (v.empty()) return;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(v[d].dev));
    fill_scales(static_cast<float*>(v[d].p), int64_t(v[d].bytes / schedule::kScaleBytes),
                seed + (rows ? 11 * d : 0) + salt);
  };
  for (size_t d = 0; d < s.devs.size(); ++d) {
    random_fill(s.dtype, s.A[d], seed + 11 * d + 1);
    random_fill(s.dtype, s.B[d], seed + 11 * d + 2);
    if (!s.C.empty()) random_fill(out_dt, s.C[d], seed + 11 * d + 3);
    if (!s.bias.empty()) random_fill(out_dt, s.bias[d], seed + 11 * d + 4);
    fill_scale(s.scale_a, d, s.plan.row_scale_a, 5);
    fill_scale(s.scale_b, d, s.plan.row_scale_b, 6);
  }
  // The graphs run on non-blocking streams, which do not wait for the fill on the legacy stream.
  for (int dev : s.devs) {
    DISTGEMM_CUDA_CHECK(cudaSetDevice(dev));
    DISTGEMM_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

double checked_launch(const Args& a, Global& g, Setup& s, Problem p) {
  scatter_inputs(g, s, p, a.beta != 0.0f, a.bias);
  launch_all(s);
  sync_and_check(s);
  poison_outputs(s);
  launch_all(s);
  sync_and_check(s);
  return verify(a, g, s, p);
}

LocalFloor::LocalFloor(const Args& a, const schedule::ScheduleDef& def, Problem local, int dev)
    : a_(a), setup_(make_setup(a, def, local, 1, 1, {dev})) {
  fill_inputs(*setup_, a.seed + 100);
}

void LocalFloor::time_before() {
  windows_.before_ms = time_replays(*setup_, a_.warmup, a_.iterations, a_.warmup_ms);
}

void LocalFloor::time_after() {
  windows_.after_ms = time_replays(*setup_, a_.warmup, a_.iterations,
                                   std::min(a_.warmup_ms, llama::kSweepTiming.rewarm_ms));
}

}  // namespace distgemm::bench
