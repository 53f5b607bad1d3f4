// One device's CUDA graph for a Plan: build once, replay, retarget with graph-exec updates.
//
// Timeline (TP=2, S=2, ag_rotate_a; the other schedules differ only in what the side chain
// carries):
//
//   dev0 SMs   | EB | GEMM0 (own A rows)   |w| GEMM1 (slot0: dev1's rows) |
//   dev0 side  |    | push A0 -> dev1.slot0 | sig dev1.f0 |
//   dev1 SMs   | EB | GEMM0 (own A rows)   |w| GEMM1 (slot0: dev0's rows) |
//   dev1 side  |    | push A1 -> dev0.slot0 | sig dev0.f0 |
//   legend: EB entry barrier kernel (1 block); w = the GEMM's leading barrier (in-kernel spin on
//           its flag, acquire.sys); side = the side chain: copy-engine memcpy nodes (no SMs);
//           sig = 4-byte memcpy of this device's epoch word into a peer's flag.
//   rs_tile_a, S=TP (partials by epilogue): the side chain is sig(after GEMM0), sig(after
//           GEMM1), ...: the GEMMs write the partials straight into the peer's slots (NVLink
//           stores from the epilogue).
//   rs_tile_a, S>=2TP (partials by copy engine, the default there): per non-final GEMM i,
//           [push staging slot i -> peer slot i, sig] after GEMM i; the push has k-1 steps of
//           slack before the peer's GEMM i+k needs it.
//   ar_tile_a: the ring as rs_tile_a (partial signals, or staging pushes), then per tile
//           this device finishes: [push tile -> peer.recv slot, sig peer] for every peer, in GEMM
//           order; after the last GEMM, per tile a peer finished: [wait kernel on its flag, local
//           copy recv slot -> own D]. Every transfer is a push; the only memcpy that reads
//           a receive slot reads this device's own.
//   ideal:    every transfer lands before the GEMM that needs it starts, so each leading barrier
//             costs one flag load and the device runs its GEMMs back to back: time = local GEMM
//             time + EB + the last step's tail (reduce-scatter: + the last partial's hop).
//   degraded: a transfer is late (small steps, NVLink shared with the peer's traffic): the
//             waiting GEMM holds the SMs while it spins. S > TP gives transfers more slack but
//             smaller GEMMs (wave quantization; docs/tuning.md).
//
// Nodes and why each edge exists:
//   EB -> everything      : nobody writes a peer's slots/flags before the peer has finished the
//                           previous launch (EB publishes "I started launch g" to all devices and
//                           waits until all devices did), and EB bumps the epoch that every wait
//                           and signal of this launch reads (so the graph needs no per-launch
//                           update).
//   GEMM i -> GEMM i+1    : the compute stream is in order (one GEMM fills the chip). With
//                           PDL (GraphOptions::pdl On, or Auto where pdl_by_default) the edge is
//                           programmatic (GEMM i+1 starts on SMs that GEMM i's finished CTAs
//                           free). Cross-device data is ordered by
//                           flags only, never by edges into the side chain: a GEMM never waits
//                           for a side-chain node.
//   GEMM i -> side chain  : a GEMM's signals, and a copy with after_gemm = i, wait for GEMM i.
//                           Signals are memcpy nodes (no SMs): a signalling kernel could be
//                           starved by a spinning GEMM that waits on what it signals.
//   ONE side chain        : all copy-engine nodes in one chain ordered by the GEMM each follows:
//                           a node only ever waits behind nodes that follow earlier GEMMs, so by
//                           induction over the steps no node waits (through the chain) for
//                           anything that depends on itself, whatever hardware queues the graph
//                           executor maps branches to.
//   last GEMM -> wait kernel -> copy : ar_tile_a's local copies of a finished tile that a
//                           peer pushed into this device's slot wait for its flag in a 1-block
//                           kernel placed after every signal of this device, so a spinning node
//                           never holds back something a peer needs.
//   no peer reads         : every memcpy node writes to a peer at most, never reads one. A memcpy
//                           whose source is a peer's memory may be executed by the peer's copy
//                           engine, queued with that peer's own transfers, which couples the two
//                           devices' copy queues and can deadlock them. The builder rejects a
//                           plan with a peer-read copy.
//   copy -> its signals   : the data lands before the flag that publishes it (same chain).
//   side chain -> end     : the graph ends after every copy and signal (join), so the next
//                           launch's EB really means "this device is done".
//
// Inside a caller's stream capture (torch.cuda.graph), capture_into() records the same node
// sequence (one definition, enqueue()) straight into the caller's graph: the GEMM chain on the
// caller's stream, the side chain on a private stream that joins the capture by waiting for EB
// and rejoins the caller's stream at the end. So in the caller's graph: caller's previous node
// -> EB -> ... -> join -> caller's next node, the same edges as above in between, and no
// cudaGraphLaunch (a child launch would bake in this object's executable at capture time and
// hide the nodes from the caller's graph). A replay needs no host work: EB advances the epoch on
// the device. Replays and eager launches that share a workspace must not overlap on one device
// (each EB assumes the previous launch there is complete): on one stream they interleave freely;
// across streams the caller orders them (python/distgemm LaunchOrder does it for eager calls).
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distgemm/kernel/gemm.hpp"
#include "distgemm/kernel/tile_choice.hpp"
#include "distgemm/kernel/wait_spec.hpp"
#include "distgemm/schedule/plan.hpp"

namespace distgemm::device {

using kernel::DType;

// This device's own tensors (local shapes from the Partition, dense row-major per batch).
// c and bias may be null when the call has beta = 0 / no bias. fp8 (E4M3) only: the float32
// scales of A and B, one value each, or one per local row where the plan has row scales
// (Plan::row_scale_a / row_scale_b).
struct UserBuffers {
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
};

struct EpilogueArgs {
  float alpha = 1.0f;
  float beta = 0.0f;  // beta * C is added at each tile's last visit when beta != 0
  bool bias = false;  // bias[n] is added at each tile's last visit
};

// Where the bounded waits of a graph report a timeout: a sticky abort word in device memory
// (the first wait that times out sets it; every later wait, and every entry barrier, reading it
// exits at once) and an error record in mapped host memory (the first cause). A DeviceGraph owns
// one, or shares one: graphs recorded into callers' captures of one workspace share theirs,
// because a replay runs no host code between ops and a missing peer must end the whole replay
// after one timeout, not after one timeout per op.
class ErrorSink {
 public:
  // Allocates and zeroes the abort word on `cuda_device` without any device-wide
  // synchronisation (safe while another stream of the device is being captured; see
  // RelaxedCaptureMode).
  explicit ErrorSink(int cuda_device);
  ~ErrorSink();
  ErrorSink(const ErrorSink&) = delete;
  ErrorSink& operator=(const ErrorSink&) = delete;

  uint32_t* abort() const { return abort_; }
  kernel::ErrorRecord* record_dev() const { return record_dev_; }
  // "" or the timeout report, e.g. "device 0, iteration 1: flag 0 did not reach generation 7
  // within 5 s (last value 6); ...". Read after the launches were synchronised.
  std::string error() const;
  int cuda_device() const { return cuda_device_; }

 private:
  int cuda_device_;
  uint32_t* abort_ = nullptr;                   // device memory
  kernel::ErrorRecord* record_host_ = nullptr;  // mapped host memory
  kernel::ErrorRecord* record_dev_ = nullptr;
};

// While alive, this thread may make the "potentially unsafe" CUDA calls of setup work
// (cudaMalloc, cudaHostAlloc, IPC handles, graph instantiation) even when a stream capture in
// global mode (torch.cuda.graph's default) is in progress: the thread's capture interaction mode
// is cudaStreamCaptureModeRelaxed, restored on destruction. Calls that conflict with a capture
// whatever the mode (synchronising the device, the legacy stream) stay forbidden: setup code
// synchronises private streams only.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode();
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

struct GraphOptions {
  double timeout_s = kernel::kDefaultTimeoutS;  // bound of every in-kernel wait
  // GEMM tile order (see kernel::GemmDesc): swizzle 1/2/4/8, raster 0 heuristic / 1 M / 2 N.
  int swizzle = kernel::kDefaultSwizzle;
  int raster = kernel::kDefaultRaster;
  // GEMM i+1 launched with programmatic dependent launch after GEMM i (tail filling: the next
  // step's tiles start on SMs freed by the last wave of the previous step). Safe because the
  // plan's GEMMs of one device share no data; signals and copies keep full edges.
  // Auto: pdl_by_default(plan).
  enum class Pdl : uint8_t { Auto, On, Off };
  Pdl pdl = Pdl::Auto;
  // GEMM output tile 128 x tile_n: 0 = per GEMM from its shape (kernel::choose_config), 128 or
  // 256 = that kernel for every GEMM (for comparisons).
  int tile_n = 0;
  // The caller's B is stored [k, n] (N contiguous: a transposed view of an nn.Linear weight)
  // instead of [n, k]; the plan still addresses B as [n, k], and each GEMM reads the same
  // elements through the N-contiguous kernel. Only for plans that read B from the caller's
  // tensor alone (no copy moves B): not ag_rotate_b.
  bool b_n_major = false;
  // fp8 only: CUTLASS's fast-accumulation kernel for every GEMM (kernel::GemmDesc::fast_accum).
  bool fast_accum = false;
  // Bytes addressable from each workspace base (the same on every rank). When set, the
  // constructor refuses a plan whose layout needs more: a workspace sized for another plan (e.g.
  // for epilogue partials, while this plan stages them for the copy engine) would otherwise be
  // written past its end. 0: not checked (the caller sized it from this very plan).
  int64_t workspace_bytes = 0;
  // Where the waits report a timeout; null: the graph allocates its own.
  std::shared_ptr<ErrorSink> errors;
  // false: no executable graph of its own (launch/update/rebuild refuse, topology is empty); it
  // only records its nodes into callers' captures (capture_into). Skips a private capture and an
  // instantiation that would never be launched.
  bool instantiate = true;
};

// The workspace layout of `plan` with inputs of `dtype`: its slots hold elements of the rotating
// operand or of the output (schedule::slot_elem_bytes), which differ at fp8.
inline schedule::WorkspaceLayout workspace_layout(const schedule::Plan& plan, DType dtype) {
  return plan.layout(
      schedule::slot_elem_bytes(plan, kernel::dtype_bytes(dtype), kernel::out_dtype_bytes(dtype)));
}

// GraphOptions::Pdl::Auto follows pdl_by_default (schedule/defaults.hpp, with the other defaults).
using schedule::pdl_by_default;

struct GraphStats {
  int gemm_nodes = 0, copy_nodes = 0, signal_nodes = 0, wait_kernels = 0;
  bool pdl = false;   // GEMM i+1 follows GEMM i by a programmatic edge
  int gemm_n128 = 0;  // GEMM nodes with 128x128 tiles, either cluster (the rest: 128x256, 256x128)
  int gemm_cublaslt = 0;  // GEMM nodes run by cuBLASLt (the machine's kernel table chose it)
};

// The captured graph of one device as plain data, for inspection (tests, distgemm_bench
// --graph-json). `kind` is read from the graph (cudaGraphNodeGetType); `role` and its fields are
// recorded during capture, naming what the plan asked that node to do.
struct GraphNode {
  std::string kind;  // "kernel", "memcpy", "memset", "event_record", "event_wait", "empty", ...
  std::string role;  // "barrier", "gemm", "wait", "copy", "signal"; "" for an untagged node
  int gemm = -1;     // gemm: its position in the chain; signal: the GEMM it publishes, or -1
  int copy = -1;     // copy, wait: the plan copy's index; signal: the copy it publishes, or -1
  int peer = -1;     // signal: the rank whose flag it sets
  int flag = -1;     // signal: that flag's index
  std::vector<int> waits;  // gemm, wait: the flags of this device it waits for
};

struct GraphEdge {
  int from = 0, to = 0;       // indices into GraphTopology::nodes
  bool programmatic = false;  // a programmatic (PDL) dependency
};

struct GraphTopology {
  std::vector<GraphNode> nodes;
  std::vector<GraphEdge> edges;
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
  // Record one launch's nodes for `user` into the capture in progress on `caller` (a stream of
  // this device, capturing): see "Inside a caller's stream capture" above. The caller's graph
  // then references this object's error sink and the workspace: both must outlive every replay.
  // Throws std::logic_error when `caller` is not capturing.
  void capture_into(cudaStream_t caller, const UserBuffers& user);
  // Enqueue one launch's nodes for `user` on `stream` (a stream of this device, not capturing)
  // as plain stream work, with no graph: a launch for pointers no graph is kept for costs no
  // re-capture and no graph-exec update. The same node sequence (enqueue()), the side chain on a
  // private stream of its own. Throws std::logic_error when `stream` is capturing.
  void enqueue_on(cudaStream_t stream, const UserBuffers& user);

  // After the launches were synchronised: "" or the timeout report of this device, e.g.
  // "device 0, iteration 1: flag 0 did not reach generation 7 within 5 s (last value 6)"
  // (from its error sink: shared sinks report every sharer's timeout).
  std::string error() const;
  // Throws std::runtime_error(error()) when there is one.
  void check() const;

  int cuda_device() const { return cuda_device_; }
  int rank() const { return rank_; }
  const GraphStats& stats() const { return stats_; }
  // The nodes and edges of the graph the current executable was instantiated from.
  GraphTopology topology() const;

 private:
  // The streams and events one recording of the node sequence uses: the GEMM chain's stream, the
  // side chain's stream, and the events that fork and join them.
  struct Lanes {
    cudaStream_t gemm = nullptr, copy = nullptr;
    cudaEvent_t barrier = nullptr, copy_end = nullptr;
    std::vector<cudaEvent_t> gemm_done;  // one per GEMM
  };
  // Makes what `lanes` lacks for this plan (streams, events, a GEMM-done event per GEMM);
  // keeps what it has.
  void create_lanes(Lanes& lanes, bool with_gemm_stream);
  static void destroy_lanes(Lanes& lanes);
  // The side chain's lanes of every graph's enqueue_on() on `cuda_device`, one set per device
  // for the process (never destroyed: streams may not outlive the CUDA runtime at exit), so that
  // a first call of a new plan makes no stream and no events; the caller holds
  // direct_lanes_mutex() while it uses them.
  static Lanes& direct_lanes(int cuda_device);
  // Enqueues one launch's nodes on lanes.gemm (and lanes.copy, joined back into lanes.gemm):
  // the one definition of the node sequence, recorded by capture() and capture_into() and
  // enqueued by enqueue_on(). With `tag`, records each node's role for topology().
  GraphStats enqueue(const UserBuffers& user, const Lanes& lanes, bool tag);
  // enqueue() on the caller's `stream` as the GEMM chain, the side chain on `lanes` (into_ or
  // direct_lanes(), made at first use under a relaxed capture mode): the shared part of
  // capture_into() and enqueue_on() once each has checked the stream's capture status.
  void enqueue_on_caller(cudaStream_t stream, const UserBuffers& user, Lanes& lanes);
  cudaGraph_t capture(const UserBuffers& user);
  void require_executable(const char* what) const;
  // Makes `graph` (the capture behind the current executable) the one topology() reads.
  void keep_graph(cudaGraph_t graph);
  // Bytes of one element of `b` (the operands, the output, a row scale).
  int64_t elem_bytes(schedule::Buffer b) const;
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
  // Each GEMM's kernel (GemmDesc::config, cublas_algo), resolved once when the graph is made
  // (kernel::resolve_kernel, cuBLASLt's kernels loaded then): every later capture and enqueue
  // runs the same kernels, as a graph-exec update needs, and does no choosing of its own.
  struct Kernel {
    int config = 0, cublas_algo = -1;
  };
  std::vector<Kernel> kernels_;

  // own_: the private captures (GEMM chain stream, side chain stream); into_: capture_into()
  // (side chain only: the GEMM chain runs on the caller's stream), made at its first use;
  // enqueue_on() uses the device's direct_lanes(). Apart, because the streams of a
  // capture_into() stay in the caller's capture until the caller ends it, while update() may
  // need a private capture and enqueue_on() plain stream work before that.
  Lanes own_, into_;
  std::shared_ptr<ErrorSink> errors_;
  cudaGraphExec_t exec_ = nullptr;
  cudaGraph_t graph_ = nullptr;  // the capture exec_ was made from (or last updated with)
  // Roles of the nodes, recorded by capture(): those of graph_, and of the capture in progress.
  std::vector<std::pair<cudaGraphNode_t, GraphNode>> roles_, captured_roles_;
};

}  // namespace distgemm::device
