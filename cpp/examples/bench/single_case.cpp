// distgemm_bench's single case: one schedule on TP GPUs, verified against the reference, its
// graphs retargeted to new buffers (--check-update), timed between two timings of the local GEMM,
// and the RESULT line that tests/gpu/test_cpp_bench.py and `python -m distgemm` parse.
#include "single_case.hpp"

#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "all.hpp"
#include "distgemm/device/check.hpp"
#include "faults.hpp"
#include "graph_json.hpp"
#include "harness.hpp"

namespace distgemm::bench {

using schedule::Problem;

int run_single_case(Args a) {
  const schedule::ScheduleDef* def = schedules::find(a.schedule.c_str());
  if (!def) usage("unknown schedule " + a.schedule);
  const kernel::DType dt = dtype_of(a);
  const Problem prob{a.m, a.n, a.k, a.l};
  if (a.steps == 0) a.steps = schedule::default_steps(*def, a.tp, prob);  // what steps=None gives
  {
    const std::string why =
        schedule::validate(*def, prob, a.tp, a.steps, plan_options_of(a, *def, a.tp, a.steps));
    if (!why.empty()) {
      std::fprintf(stderr, "error: rejected: %s\n", why.c_str());
      return 2;
    }
  }
  const std::vector<int> devs = open_devices(a.tp);

  std::unique_ptr<Setup> s;
  try {
    s = make_setup(a, *def, prob, a.tp, a.steps, devs);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected before launch: %s\n", e.what());
    return 2;
  }
  const auto st = s->graphs[0]->stats();
  std::string kernels;  // the kernels the GEMMs choose from, with their resident CTAs
  if (dt == kernel::DType::E4M3) {
    const int config = kernel::e4m3_config(a.fast_accum);
    kernels = std::string("fp8 kernel ") + kernel::config_name(config) + " (" +
              std::to_string(kernel::gemm_config_resident_ctas(dt, config, devs[0])) +
              " resident CTAs), scales " + scales_name(a);
  } else {
    kernels = "resident CTAs: " + std::to_string(kernel::gemm_resident_ctas(dt, 256, devs[0])) +
              " with 128x256 tiles, " +
              std::to_string(kernel::gemm_resident_ctas(dt, 128, devs[0])) + " with 128x128";
  }
  std::printf(
      "plan: %s tp=%d S=%d workspace %.1f MiB/device; graph dev0: %d GEMM, %d copy, %d "
      "signal nodes, %d wait kernels; pdl=%d partial_via=%s; %d of %d GEMMs with 128x128 "
      "tiles (%s)\n",
      a.schedule.c_str(), a.tp, a.steps, s->ws->bytes() / 1048576.0, st.gemm_nodes, st.copy_nodes,
      st.signal_nodes, st.wait_kernels, st.pdl ? 1 : 0,
      schedule::partial_via_name(s->plan.partial_via), st.gemm_n128, st.gemm_nodes,
      kernels.c_str());
  std::fflush(stdout);
  if (!a.graph_json.empty()) write_graph_json(a.graph_json, *s);

  if (a.missing >= 0) {
    if (a.missing >= a.tp) usage("--simulate-missing-device must be < --tp");
    return run_missing_device(a, *s);
  }

  double rel_err = 0.0, rel_err_update = -1.0, update_ms = -1.0, rebuild_ms = -1.0;
  bool ok = true;
  std::unique_ptr<Global> g;
  if (a.verify) {
    g = std::make_unique<Global>(make_global(a, prob, devs[0]));
    rel_err = checked_launch(a, *g, *s, prob);
    ok = ok && passes(rel_err);
  } else {
    fill_inputs(*s, a.seed);
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
      rel_err_update = verify(a, *g, *s, prob);
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

  std::unique_ptr<LocalFloor> local_floor;
  if (a.local) {
    local_floor = std::make_unique<LocalFloor>(a, *def, local_problem(*def, prob, a.tp), devs[0]);
    local_floor->time_before();
  }
  const double ms = time_replays(*s, a.warmup, a.iterations, a.warmup_ms);
  const double tflops = tflops_per_gpu(prob, a.tp, ms);

  double local_ms = -1.0, eff = -1.0;
  if (local_floor) {
    local_floor->time_after();
    local_ms = local_floor->windows().ms();
    eff = local_ms / ms;
  }

  double rel_err_replays = -1.0;
  if (a.replays > 0) ok = check_replays(a, *s, g.get(), prob, rel_err_replays) && ok;

  std::printf(
      "RESULT schedule=%s tp=%d steps=%d m=%lld n=%lld k=%lld l=%lld dtype=%s scales=%s "
      "fast_accum=%d beta=%g bias=%d "
      "rel_err=%.3e rel_err_update=%.3e rel_err_replays=%.3e verify=%s ms=%.4f "
      "tflops_per_gpu=%.1f local_ms=%.4f local_tflops=%.1f overlap_eff=%.4f update_ms=%.3f "
      "rebuild_ms=%.3f swizzle=%d raster=%d pdl=%d partial_via=%s tile_n=%s gemm_n128=%d "
      "verify_rows=%lld local_before_ms=%.4f local_after_ms=%.4f\n",
      a.schedule.c_str(), a.tp, a.steps, (long long)a.m, (long long)a.n, (long long)a.k,
      (long long)a.l, a.dtype.c_str(), scales_name(a), a.fast_accum ? 1 : 0, a.beta, a.bias ? 1 : 0,
      rel_err, rel_err_update, rel_err_replays, a.verify ? (ok ? "PASS" : "FAIL") : "SKIP", ms,
      tflops, local_ms, local_ms > 0 ? tflops_per_gpu(prob, a.tp, local_ms) : -1.0, eff, update_ms,
      rebuild_ms, a.swizzle, a.raster, st.pdl ? 1 : 0,
      schedule::partial_via_name(s->plan.partial_via),
      a.tile_n ? std::to_string(a.tile_n).c_str() : "auto", st.gemm_n128,
      (long long)(g ? g->checked : 0), local_floor ? local_floor->windows().before_ms : -1.0,
      local_floor ? local_floor->windows().after_ms : -1.0);
  if (!ok)
    std::fprintf(stderr, "error: verification failed (relative error >= %.0e or NaN)\n",
                 kTolerance);
  return ok ? 0 : 1;
}

}  // namespace distgemm::bench
