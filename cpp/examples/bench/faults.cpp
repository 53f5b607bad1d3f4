// distgemm_bench's fault injection (a device never launched) and leak check (many replays).
#include "faults.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "distgemm/device/check.hpp"

namespace distgemm::bench {

namespace {

// Memory growth over the replays that counts as a leak: above the allocator's and the driver's
// own noise, far below a leaked buffer per launch.
constexpr double kMaxGrowthMiB = 8.0;

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

}  // namespace

int run_missing_device(const Args& a, Setup& s) {
  fill_inputs(s, a.seed);
  auto t0 = std::chrono::steady_clock::now();
  launch_all(s, a.missing);
  try {
    sync_and_check(s, a.missing);
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

bool check_replays(const Args& a, Setup& s, Global* g, schedule::Problem prob,
                   double& rel_err_replays) {
  bool ok = true;
  const std::vector<int>& devs = s.devs;
  std::vector<double> before, after;
  for (int d : devs) before.push_back(device_used_mib(d));
  const double rss0 = host_rss_mib();
  auto t0 = std::chrono::steady_clock::now();
  for (long r = 0; r < a.replays; ++r) {
    launch_all(s);
    if ((r + 1) % 1000 == 0) sync_and_check(s);  // keep the queue bounded, fail early
  }
  sync_and_check(s);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g) {
    poison_outputs(s);
    launch_all(s);
    sync_and_check(s);
    rel_err_replays = verify(a, *g, s, prob);
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
  if (growth > kMaxGrowthMiB) {
    std::fprintf(stderr, "error: memory grew by %.1f MiB over %ld replays\n", growth, a.replays);
    ok = false;
  }
  return ok;
}

}  // namespace distgemm::bench
