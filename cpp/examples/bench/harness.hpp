// distgemm_bench's harness, shared by the single case and the sweep: device buffers, a plan's
// setup on TP GPUs (workspace, user tensors, graphs), the global inputs and their reference,
// launch, timing and verification.
//
// Problem (global): D[L, M, N] = alpha * A[L, M, K] @ B[L, N, K]^T + beta * C + bias[N]; each
// device gets its shards per the schedule's Partition. fp8: A and B e4m3 with float32 scales (one
// per tensor, or with --scales row one per row of A [M] and of B [N], sharded with their rows),
// alpha 1, D, C and bias bf16; the reference dequantizes (value x scale) and multiplies in fp32.
// Timing: per replay and device, CUDA events around the graph launch; a replay's time is the max
// over devices; reported: the median. TF/s per GPU = 2*M*N*K*L / TP / time. Local GEMM time: the
// same runtime and kernel on one GPU for the per-device problem (a TP=1, S=1 plan of the schedule
// with the sharded extent divided by TP); overlap efficiency = local time / distributed time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "args.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/device/workspace.hpp"
#include "distgemm/schedule/plan.hpp"

namespace distgemm::bench {

// Relative Frobenius error a run must stay below (bf16/fp16 out, fp32 accumulate; fp8: against the
// fp32 GEMM of the dequantized inputs).
inline constexpr double kTolerance = 1e-2;

// One device allocation, freed on that device.
struct DevBuf {
  void* p = nullptr;
  int dev = 0;
  size_t bytes = 0;
  DevBuf() = default;
  DevBuf(int d, size_t b);
  DevBuf(DevBuf&& o) noexcept;
  DevBuf& operator=(DevBuf&& o) noexcept;
  ~DevBuf();
};

// One distributed setup: a plan, its workspace, each device's user tensors and graph.
struct Setup {
  schedule::Plan plan;
  kernel::DType dtype = kernel::DType::BF16;
  std::vector<int> devs;
  std::unique_ptr<device::LocalSymmetricWorkspace> ws;
  std::vector<DevBuf> A, B, C, D, bias;
  // fp8 only: float32 scales of A and B, one value each or one per local row (plan.row_scale_a/b).
  std::vector<DevBuf> scale_a, scale_b;
  std::vector<std::unique_ptr<device::DeviceGraph>> graphs;
  std::vector<cudaStream_t> streams;

  ~Setup();
  device::UserBuffers user(int d) const;
};

// Global inputs on device 0, the fp32 reference accumulator of the checked rows, and the
// scratch of the comparison.
struct Global {
  DevBuf A, B, C, bias, acc, Dg;
  DevBuf scale_a, scale_b;  // fp8 only: [1] each, or [M] and [N] with --scales row
  DevBuf err;
  DevBuf rows;          // the checked rows (int64, ascending); empty: every row
  int64_t checked = 0;  // how many rows of each batch are compared (R)
};

bool passes(double rel_err);
double tflops_per_gpu(schedule::Problem p, int tp, double ms);

// Devices 0..tp-1 after printing what they are; tp <= 0: every visible GPU, at most
// schedule::kMaxTp. Too few GPUs: usage() (exit code 2).
std::vector<int> open_devices(int& tp);

// The problem one device computes alone: the sharded extent divided by TP (all-gather: the
// rotating operand gathered, the other sharded; reduce-scatter: K sharded).
schedule::Problem local_problem(const schedule::ScheduleDef& def, schedule::Problem p, int tp);

// The plan options of a run: the library's for (def, TP, S) with --partial-via and, with
// --scales row, row scales of A and B.
schedule::PlanOptions plan_options_of(const Args& a, const schedule::ScheduleDef& def, int tp,
                                      int steps);

// Plan, workspace, user tensors and one graph per device. A shape the kernel rejects throws
// std::invalid_argument before anything is launched.
std::unique_ptr<Setup> make_setup(const Args& a, const schedule::ScheduleDef& def,
                                  schedule::Problem prob, int tp, int steps,
                                  const std::vector<int>& devs);

// Random fill of one buffer (its whole size) with values of `dtype` (reference.hpp's fill_random).
void random_fill(kernel::DType dtype, const DevBuf& b, uint64_t seed);

void launch_all(Setup& s, int skip = -1);
// Synchronises every launched device, then raises the first timeout report, if any.
void sync_and_check(Setup& s, int skip = -1);
// Median over replays of the max over devices of the event-timed graph launch, in ms.
// iters <= 0: as many replays as fill llama::kSweepTiming.timed_ms, within its iteration bounds.
double time_replays(Setup& s, int warmup, int iters, int warmup_ms);

// The global inputs of `p` on dev0 and the reference of the checked rows (--verify-rows).
Global make_global(const Args& a, schedule::Problem p, int dev0);
// D of every device set to NaN (0xFFFF in bf16 and fp16), complete on return.
void poison_outputs(Setup& s);
// Relative Frobenius error of every device's output against the reference (a replicated D is
// checked on each device); NaN when anything was left unwritten.
double verify(const Args& a, Global& g, Setup& s, schedule::Problem p);
// Random user tensors (fp8: and scales) on every device of the setup, complete before it returns.
void fill_inputs(Setup& s, uint64_t seed);
// The global inputs scattered into the setup, one warm launch, then the checked launch on
// NaN-poisoned outputs: its relative error against the reference.
double checked_launch(const Args& a, Global& g, Setup& s, schedule::Problem p);
// The "own kernel floor": the same runtime and kernel on device `dev` alone, for the problem one
// device of the distributed GEMM computes (`local`, from local_problem: a TP=1, S=1 plan). It is
// timed before a case's plan timings and again after them (FloorWindows), and its ms() is the
// mean of the two, so
// that the clock's drift under the power cap over the case weighs on the floor as on the plans
// (a floor timed only after them runs on a hotter GPU and flatters the overlap).
struct FloorWindows {
  double before_ms = -1.0, after_ms = -1.0;  // -1 until timed
  double ms() const { return before_ms > 0 && after_ms > 0 ? 0.5 * (before_ms + after_ms) : -1.0; }
};
class LocalFloor {
 public:
  LocalFloor(const Args& a, const schedule::ScheduleDef& def, schedule::Problem local, int dev);
  void time_before();  // after warmup_ms of the floor's own replays
  void time_after();   // after rewarm_ms: the plans' timings kept the GPU under load
  const FloorWindows& windows() const { return windows_; }

 private:
  const Args& a_;
  std::unique_ptr<Setup> setup_;
  FloorWindows windows_;
};

}  // namespace distgemm::bench
