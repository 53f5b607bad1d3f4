// One device's CUDA graph for a Plan: build once, replay, retarget with graph-exec updates.
//
// Timeline (TP=2, S=2, ag_rotate_a; the other schedules differ only in what the branches carry):
//
//   dev0 SMs  | EB | GEMM0 (own A rows)  |w| GEMM1 (slot0: dev1's rows) |
//   dev0 CE   |    | push A0 -> dev1.slot0 | sig dev1.f0 |              (copy branch)
//   dev0 CE'  |    |                     sig... (signals of GEMMs; RS: after each GEMM)
//   dev1 SMs  | EB | GEMM0 (own A rows)  |w| GEMM1 (slot0: dev0's rows) |
//   dev1 CE   |    | push A1 -> dev0.slot0 | sig dev0.f0 |
//   legend: EB entry barrier kernel (1 block); w = the GEMM's leading barrier (in-kernel spin on
//           its flag, acquire.sys); CE = copy engine (memcpy nodes, no SMs); sig = 4-byte memcpy
//           of this device's epoch word into a peer's flag.
//   ideal:    the push finishes long before GEMM0 does, so GEMM1's wait costs one flag load and
//             the device runs GEMM0, GEMM1 back to back: time = local GEMM time + EB + tail.
//   degraded: the push is slower than GEMM0 (small k-extent per step, NVLink shared with the
//             peer's traffic): GEMM1 occupies the SMs while it spins; reduce-scatter adds the
//             partial's NVLink write to each step's epilogue. S > TP gives transfers more slack.
//
// Nodes and why each edge exists:
//   EB -> everything      : nobody writes a peer's slots/flags before the peer has finished the
//                           previous launch (EB publishes "I started launch g" to all devices and
//                           waits until all devices did), and EB bumps the epoch that every wait
//                           and signal of this launch reads (so the graph needs no per-launch
//                           update).
//   GEMM i -> GEMM i+1    : the compute stream is in order (one GEMM fills the chip; reduce-
//                           scatter step i+1 reuses nothing of step i, but the chain keeps the
//                           issue order the Plan assumed). Cross-device data is ordered by
//                           flags only, never by edges into the copy branch: a GEMM never waits
//                           for a node of the copy branch, so a copy can never be starved by a
//                           GEMM that waits for it.
//   GEMM i -> sig (CE')   : a GEMM's signals run on their own branch as memcpy nodes (no SMs), so
//                           the next GEMM does not wait for them, and a signal can never be
//                           starved of SMs by a spinning GEMM (the deadlock rule: no spinning or
//                           signalling kernel where a GEMM that waits on it could starve it).
//   GEMM j -> copy        : a copy with after_gemm = j (gemm_allreduce's local copy of a
//                           finished tile).
//   last GEMM, all GEMM signals -> wait-kernel -> copy : a copy with plan waits
//                           (gemm_allreduce's pulls of a peer's finished tile) gets a 1-block
//                           spinning kernel before it, and that kernel starts only after this
//                           device's last GEMM and after every GEMM signal has been sent. Measured: with
//                           the wait kernels free to start as soon as the previous copy was done
//                           (S=8, TP=2), both devices timed out (a GEMM waiting for a partial
//                           whose signal never came, and a pull waiting for that GEMM): a
//                           spinning node in a side branch can hold back unrelated work of the
//                           same device (the hardware queues are shared), so no spinning node
//                           may run while this device still owes its peers a signal. After the
//                           last GEMM's signals nothing of this device is owed to a peer, so a
//                           spinning wait kernel can hold back nothing a peer waits for.
//                           Cost: gemm_allreduce's pulls of peer tiles no longer overlap the
//                           device's own last GEMMs (its local copies still do).
//   copy -> its signals   : the data lands before the flag that publishes it (same branch).
//   all branches -> end   : the graph ends after every copy and signal (join), so the next
//                           launch's EB really means "this device is done".
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/wait_spec.hpp"
#include "distgemm/schedule/plan.hpp"

namespace distgemm::device {

using kernel::DType;

// This device's own tensors (local shapes from the Partition, dense row-major per batch).
// c and bias may be null when the call has beta = 0 / no bias.
struct UserBuffers {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
};

struct EpilogueArgs {
  float alpha = 1.0f;
  float beta = 0.0f;   // beta * C is added at each tile's last visit when beta != 0
  bool bias = false;   // bias[n] is added at each tile's last visit
};

struct GraphOptions {
  double timeout_s = 5.0;  // bound of every in-kernel wait
  // GEMM tile order (see kernel::GemmDesc): swizzle 1/2/4/8, raster 0 heuristic / 1 M / 2 N.
  int swizzle = 8;
  int raster = 0;
  // GEMM i+1 launched with programmatic dependent launch after GEMM i (tail filling: the next
  // step's tiles start on SMs freed by the last wave of the previous step). Safe because the
  // plan's GEMMs of one device share no data; signals and copies keep full edges.
  bool pdl = false;
};

struct GraphStats {
  int gemm_nodes = 0, copy_nodes = 0, signal_nodes = 0, wait_kernels = 0;
};

class DeviceGraph {
 public:
  // rank: this device's index in the plan; cuda_device: its CUDA ordinal in this process;
  // workspace_bases[r]: rank r's symmetric workspace as addressable from this device.
  // Validates every sub-GEMM (alignment, CUTLASS can_implement) before anything is launched:
  // throws std::invalid_argument with the reason.
  DeviceGraph(const schedule::Plan& plan, int rank, int cuda_device, DType dtype,
              const EpilogueArgs& epilogue, const std::vector<void*>& workspace_bases,
              const UserBuffers& user, const GraphOptions& options = {});
  ~DeviceGraph();
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;

  // New user pointers: re-capture with the same topology and cudaGraphExecUpdate.
  void update(const UserBuffers& user);
  // New user pointers by re-capture and re-instantiation (slower; kept for comparison).
  void rebuild(const UserBuffers& user);

  // Enqueue one launch on `stream` (a stream of this device).
  void launch(cudaStream_t stream);

  // After the launches were synchronised: "" or the timeout report of this device, e.g.
  // "device 0, iteration 1: flag 0 did not reach generation 7 within 5 s (last value 6)".
  std::string error() const;
  // Throws std::runtime_error(error()) when there is one.
  void check() const;

  int cuda_device() const { return cuda_device_; }
  int rank() const { return rank_; }
  const GraphStats& stats() const { return stats_; }

 private:
  cudaGraph_t capture(const UserBuffers& user);
  void* resolve(const schedule::BufRef& r, const UserBuffers& user, const char* what) const;
  kernel::GemmDesc gemm_desc(const schedule::GemmOp& op, const UserBuffers& user) const;
  void validate(const UserBuffers& user) const;

  schedule::Plan plan_;  // a copy: the graph may outlive the caller's plan
  schedule::WorkspaceLayout layout_;
  int rank_, cuda_device_;
  DType dtype_;
  EpilogueArgs epi_;
  std::vector<void*> bases_;
  GraphOptions opt_;
  GraphStats stats_;

  cudaStream_t s_gemm_ = nullptr, s_copy_ = nullptr, s_signal_ = nullptr;
  cudaEvent_t ev_barrier_ = nullptr, ev_copy_end_ = nullptr, ev_signal_end_ = nullptr;
  cudaEvent_t ev_gemm_signals_ = nullptr;  // every GEMM signal sent
  std::vector<cudaEvent_t> ev_gemm_;
  uint32_t* abort_ = nullptr;               // device memory
  kernel::ErrorRecord* record_host_ = nullptr;  // mapped host memory
  kernel::ErrorRecord* record_dev_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace distgemm::device
