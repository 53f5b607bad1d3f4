// Graph builder: turns one device's DeviceProgram of a Plan into a CUDA graph by stream capture
// over two streams (GEMM chain, side chain of copy-engine nodes); see device/graph.hpp for the
// timeline and the reason for each edge.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "distgemm/device/check.hpp"
#include "distgemm/device/graph.hpp"
#include "distgemm/kernel/allreduce.hpp"     // kAllReduceMaxCtas (the error record of its waits)
#include "distgemm/kernel/kernel_table.hpp"  // kernel_table_all_plans
#include "distgemm/kernel/tile_choice.hpp"

namespace distgemm::device {

using schedule::Buffer;
using schedule::BufRef;

namespace {

char* byte_ptr(void* p) { return static_cast<char*>(p); }

uint64_t timeout_ns(double s) {
  if (!(s > 0.0) || s > 3600.0)
    throw std::invalid_argument("timeout_s=" + std::to_string(s) +
                                " is out of range: use 0 < timeout_s <= 3600");
  return static_cast<uint64_t>(s * 1e9);
}

// The node the last call captured on `stream`: the stream's one capture dependency right after
// that call (null when it has several).
cudaGraphNode_t last_captured_node(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edge_data = nullptr;  // asked for: a lossy query would be an error
  size_t num_deps = 0;
#if CUDART_VERSION >= 13000
  DISTGEMM_CUDA_CHECK(
      cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &deps, &edge_data, &num_deps));
#else
  DISTGEMM_CUDA_CHECK(
      cudaStreamGetCaptureInfo_v3(stream, &status, nullptr, nullptr, &deps, &edge_data, &num_deps));
#endif
  return num_deps == 1 ? deps[0] : nullptr;
}

}  // namespace

DeviceGraph::DeviceGraph(const schedule::Plan& plan, int rank, int cuda_device, DType dtype,
                         const EpilogueArgs& epilogue, const std::vector<void*>& workspace_bases,
                         const UserBuffers& user, const GraphOptions& options)
    : plan_(plan),
      layout_(workspace_layout(plan, dtype)),
      rank_(rank),
      cuda_device_(cuda_device),
      dtype_(dtype),
      epi_(epilogue),
      bases_(workspace_bases),
      opt_(options) {
  if (rank < 0 || rank >= plan.tp)
    throw std::invalid_argument("rank " + std::to_string(rank) +
                                " is outside the plan's TP=" + std::to_string(plan.tp));
  if (static_cast<int>(bases_.size()) != plan.tp)
    throw std::invalid_argument("workspace_bases has " + std::to_string(bases_.size()) +
                                " entries; the plan has TP=" + std::to_string(plan.tp) +
                                ": pass every rank's workspace base as seen from this device");
  if (plan.tp > kernel::kMaxDevices)  // a Plan assembled by hand, not by build_plan
    throw std::invalid_argument("TP=" + std::to_string(plan.tp) + " exceeds " +
                                std::to_string(kernel::kMaxDevices));
  for (int r = 0; r < plan.tp; ++r)
    if (!bases_[r])
      throw std::invalid_argument("workspace base of rank " + std::to_string(r) + " is null");
  if (opt_.workspace_bytes > 0 && layout_.total_bytes > opt_.workspace_bytes)
    throw std::invalid_argument(
        plan_.schedule + " (TP=" + std::to_string(plan_.tp) + ", S=" + std::to_string(plan_.steps) +
        ", partials by " + schedule::partial_via_name(plan_.partial_via) +
        ") needs a workspace of " + std::to_string(layout_.total_bytes) +
        " bytes per rank (slots " + std::to_string(layout_.slots_bytes) + ", flags " +
        std::to_string(layout_.flags_bytes) + ", barrier " + std::to_string(layout_.barrier_bytes) +
        "); the workspace has " + std::to_string(opt_.workspace_bytes) +
        ": size it from this plan's own layout (same partial_via)");
  (void)timeout_ns(opt_.timeout_s);
  validate(user);  // before any CUDA work: a rejected shape never reaches a launch

  // The setup calls run in the relaxed capture mode and synchronise nothing but a private
  // stream, so that a graph can be made while the caller's stream is being captured (the
  // first call of a new shape inside torch.cuda.graph). The private capture itself does not
  // need it (launches only).
  {
    RelaxedCaptureMode relaxed;
    DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
    kernel::gemm_prepare(dtype_, cuda_device_);
    // cuBLASLt's kernels load here, before anything of this plan is enqueued
    // (kernel::cublaslt_preload says why: a lazy load after a spinning GEMM of the plan would
    // wait for it forever).
    const bool table = plan_.tp == 1 || kernel::kernel_table_all_plans();  // GemmDesc says why
    for (const auto& op : plan_.devices[rank_].gemms) {
      kernel::GemmDesc desc = gemm_desc(op, user);
      desc.kernel_table = table;
      kernel::resolve_kernel(desc, cuda_device_);
      if (desc.cublas_algo >= 0) kernel::cublaslt_preload(desc, cuda_device_);
      kernels_.push_back({desc.config, desc.cublas_algo});
    }
    errors_ = opt_.errors ? opt_.errors : std::make_shared<ErrorSink>(cuda_device_);
    if (errors_->cuda_device() != cuda_device_)
      throw std::invalid_argument("GraphOptions::errors lives on CUDA device " +
                                  std::to_string(errors_->cuda_device()) + ", the graph on " +
                                  std::to_string(cuda_device_));
    if (!opt_.instantiate) return;  // capture_into() only
    create_lanes(own_, true);
  }

  cudaGraph_t g = capture(user);
  cudaError_t instantiated;
  {
    RelaxedCaptureMode relaxed;
    instantiated = cudaGraphInstantiate(&exec_, g, 0);
  }
  if (instantiated != cudaSuccess) cudaGraphDestroy(g);
  DISTGEMM_CUDA_CHECK(instantiated);
  keep_graph(g);
}

DeviceGraph::~DeviceGraph() {
  // Destructor: best effort, nothing to report to.
  cudaSetDevice(cuda_device_);
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  destroy_lanes(own_);
  destroy_lanes(into_);
}

void DeviceGraph::create_lanes(Lanes& lanes, bool with_gemm_stream) {
  if (with_gemm_stream && !lanes.gemm)
    DISTGEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&lanes.gemm, cudaStreamNonBlocking));
  if (!lanes.copy)
    DISTGEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&lanes.copy, cudaStreamNonBlocking));
  if (!lanes.barrier)
    DISTGEMM_CUDA_CHECK(cudaEventCreateWithFlags(&lanes.barrier, cudaEventDisableTiming));
  if (!lanes.copy_end)
    DISTGEMM_CUDA_CHECK(cudaEventCreateWithFlags(&lanes.copy_end, cudaEventDisableTiming));
  while (lanes.gemm_done.size() < plan_.devices[rank_].gemms.size()) {
    cudaEvent_t e = nullptr;
    DISTGEMM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    lanes.gemm_done.push_back(e);
  }
}

namespace {
std::mutex& direct_lanes_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

DeviceGraph::Lanes& DeviceGraph::direct_lanes(int cuda_device) {
  static auto* by_device = new std::map<int, Lanes>();  // kept to the end of the process
  return (*by_device)[cuda_device];
}

void DeviceGraph::destroy_lanes(Lanes& lanes) {
  for (auto e : lanes.gemm_done)
    if (e) cudaEventDestroy(e);
  lanes.gemm_done.clear();
  if (lanes.barrier) cudaEventDestroy(lanes.barrier);
  if (lanes.copy_end) cudaEventDestroy(lanes.copy_end);
  if (lanes.gemm) cudaStreamDestroy(lanes.gemm);
  if (lanes.copy) cudaStreamDestroy(lanes.copy);
  lanes = Lanes{};
}

int64_t DeviceGraph::elem_bytes(Buffer b) const {
  switch (b) {
    case Buffer::A:
    case Buffer::B:
      return kernel::dtype_bytes(dtype_);
    case Buffer::Slots:
      return schedule::slot_elem_bytes(plan_, kernel::dtype_bytes(dtype_),
                                       kernel::out_dtype_bytes(dtype_));
    case Buffer::ScaleA:
    case Buffer::ScaleB:
    case Buffer::ScaleSlots:
      return schedule::kScaleBytes;
    default:  // C, D, bias
      return kernel::out_dtype_bytes(dtype_);
  }
}

void* DeviceGraph::resolve(const BufRef& r, const UserBuffers& user, const char* what) const {
  const int64_t eb = elem_bytes(r.buffer);
  if (r.buffer == Buffer::Slots || r.buffer == Buffer::ScaleSlots) {
    if (r.device < 0 || r.device >= plan_.tp)
      throw std::logic_error(std::string("internal: ") + what + " names the slots of device " +
                             std::to_string(r.device));
    const int64_t region =
        r.buffer == Buffer::Slots ? layout_.slots_offset : layout_.scale_slots_offset;
    return byte_ptr(bases_[r.device]) + region + r.offset * eb;
  }
  // The plan never addresses a peer's user tensors (only peers' slots and flags): that is what
  // lets a multi-process runtime exchange only workspace handles.
  if (r.device != rank_)
    throw std::logic_error(std::string("internal: plan op ") + what + " on device " +
                           std::to_string(rank_) + " reads user buffer " +
                           schedule::buffer_name(r.buffer) + " of device " +
                           std::to_string(r.device));
  const void* base = nullptr;
  switch (r.buffer) {
    case Buffer::A:
      base = user.a;
      break;
    case Buffer::B:
      base = user.b;
      break;
    case Buffer::C:
      base = user.c;
      break;
    case Buffer::D:
      base = user.d;
      break;
    case Buffer::Bias:
      base = user.bias;
      break;
    case Buffer::ScaleA:
      base = user.scale_a;
      break;
    case Buffer::ScaleB:
      base = user.scale_b;
      break;
    default:
      break;
  }
  if (!base)
    throw std::invalid_argument(std::string("UserBuffers.") + schedule::buffer_name(r.buffer) +
                                " of device " + std::to_string(rank_) +
                                " is null but the plan uses it (" + what + ")");
  return byte_ptr(const_cast<void*>(base)) + r.offset * eb;
}

kernel::GemmDesc DeviceGraph::gemm_desc(const schedule::GemmOp& op, const UserBuffers& user) const {
  kernel::GemmDesc g;
  g.dtype = dtype_;
  g.m = op.m;
  g.n = op.n;
  g.k = op.k;
  g.l = plan_.problem.l;
  g.a = resolve(op.a, user, "GEMM A");
  g.lda = op.a.ld;
  g.batch_a = op.a.batch_stride;
  g.b = resolve(op.b, user, "GEMM B");
  g.ldb = op.b.ld;
  g.batch_b = op.b.batch_stride;
  if (opt_.b_n_major) {
    // Element (n, k) of the local B [rows = n, cols = k] sits at k * rows + n when stored
    // N-contiguous: the sub-GEMM's corner (n0, k0) moves there and the row stride becomes n's.
    const schedule::Extent2 lb = plan_.def.partition.local_b(plan_.problem, plan_.tp);
    const int64_t n0 = op.b.offset / lb.cols, k0 = op.b.offset % lb.cols;
    g.b = byte_ptr(const_cast<void*>(user.b)) + (k0 * lb.rows + n0) * elem_bytes(Buffer::B);
    g.ldb = lb.rows;
    g.b_n_major = true;
  }
  g.d = resolve(op.d, user, "GEMM D");
  g.ldd = op.d.ld;
  g.batch_d = op.d.batch_stride;
  if (op.partial.valid()) {
    g.partial = resolve(op.partial, user, "GEMM partial");
    g.ld_partial = op.partial.ld;
    g.batch_partial = op.partial.batch_stride;
  }
  if (epi_.beta != 0.0f && op.user_c.valid()) {
    g.user_c = resolve(op.user_c, user, "GEMM C");
    g.ldc = op.user_c.ld;
    g.batch_c = op.user_c.batch_stride;
  }
  if (epi_.bias && op.bias.valid()) g.bias = resolve(op.bias, user, "GEMM bias");
  if (dtype_ == DType::E4M3) {
    // Row scales: the plan's refs to this GEMM's rows; tensor-wise: the user's one value.
    g.scale_a_rows = op.scale_a.valid();
    g.scale_a = static_cast<const float*>(g.scale_a_rows ? resolve(op.scale_a, user, "GEMM scale_a")
                                                         : user.scale_a);
    g.scale_b_rows = op.scale_b.valid();
    g.scale_b = static_cast<const float*>(g.scale_b_rows ? resolve(op.scale_b, user, "GEMM scale_b")
                                                         : user.scale_b);
    g.fast_accum = opt_.fast_accum;
  }
  g.alpha = epi_.alpha;
  g.beta = epi_.beta;
  g.swizzle = opt_.swizzle;
  g.raster = opt_.raster;
  g.tile_n = opt_.tile_n;
  return g;
}

void DeviceGraph::validate(const UserBuffers& user) const {
  const auto& prog = plan_.devices[rank_];
  if (opt_.b_n_major) {
    const schedule::Extent2 lb = plan_.def.partition.local_b(plan_.problem, plan_.tp);
    bool b_moves = false;
    for (const auto& op : prog.gemms)
      b_moves |= op.b.buffer != Buffer::B || op.b.ld != lb.cols || op.b.offset >= lb.rows * lb.cols;
    for (const auto& cp : prog.copies) b_moves |= cp.src.buffer == Buffer::B;
    if (b_moves)
      throw std::invalid_argument(
          plan_.schedule +
          " moves B between ranks: an N-contiguous B (a transposed weight view) is read in place "
          "only by plans that keep B on its rank (ag_rotate_a, rs_tile_a, rs_tile_b, "
          "ar_tile_a); pass the weight K-contiguous ([n, k], .contiguous())");
  }
  for (const auto& op : prog.gemms) {
    if (static_cast<int>(op.waits.size()) > kernel::kMaxWaits)
      throw std::logic_error("internal: GEMM waits on more than kMaxWaits flags");
    const std::string why = kernel::gemm_can_implement(gemm_desc(op, user));
    if (!why.empty())
      throw std::invalid_argument(
          plan_.schedule + " on device " + std::to_string(rank_) + ", iteration " +
          std::to_string(op.iteration) + " (sub-GEMM m=" + std::to_string(op.m) +
          " n=" + std::to_string(op.n) + " k=" + std::to_string(op.k) + "): " + why);
  }
  for (const auto& cp : prog.copies) {
    // See graph.hpp, "no peer reads": a memcpy reading a peer may run on the peer's copy engine.
    if (cp.src.device != rank_)
      throw std::logic_error("internal: plan " + plan_.schedule + " has a copy on device " +
                             std::to_string(rank_) + " that reads device " +
                             std::to_string(cp.src.device) +
                             "'s memory; plans must push (write to peers), never pull");
    (void)resolve(cp.src, user, "copy source");
    (void)resolve(cp.dst, user, "copy destination");
    if (cp.scale_src.valid()) {
      (void)resolve(cp.scale_src, user, "copy scale source");
      (void)resolve(cp.scale_dst, user, "copy scale destination");
    }
    if (elem_bytes(cp.src.buffer) != elem_bytes(cp.dst.buffer))
      throw std::logic_error(
          "internal: a copy from " + std::string(schedule::buffer_name(cp.src.buffer)) + " to " +
          schedule::buffer_name(cp.dst.buffer) + " between elements of different sizes");
    if (static_cast<int>(cp.waits.size()) > kernel::kMaxWaits)
      throw std::logic_error("internal: copy waits on more than kMaxWaits flags");
  }
}

GraphStats DeviceGraph::enqueue(const UserBuffers& user, const Lanes& lanes, bool tag_roles) {
  const auto& prog = plan_.devices[rank_];
  char* ws = byte_ptr(bases_[rank_]);
  uint32_t* epoch = reinterpret_cast<uint32_t*>(ws + layout_.epoch_offset);
  const uint32_t* flags = reinterpret_cast<const uint32_t*>(ws + layout_.flags_offset);
  const uint64_t tmo = timeout_ns(opt_.timeout_s);
  auto flag_of = [&](const schedule::FlagRef& f) {
    return byte_ptr(bases_[f.device]) + layout_.flags_offset + int64_t(f.flag) * 4;
  };
  auto wait_spec = [&](const std::vector<int>& ids, int iteration, uint32_t kind) {
    kernel::WaitSpec w;
    w.epoch = epoch;
    w.abort = errors_->abort();
    w.record = errors_->record_dev();
    w.flags = flags;
    w.num_flags = static_cast<int>(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) w.flag_ids[j] = ids[j];
    w.device = rank_;
    w.iteration = iteration;
    w.kind = kind;
    w.timeout_ns = tmo;
    return w;
  };

  // Records what the node the last call captured on `stream` does, for topology().
  auto tag = [&](cudaStream_t stream, GraphNode role) {
    if (!tag_roles) return;
    if (cudaGraphNode_t node = last_captured_node(stream))
      captured_roles_.emplace_back(node, std::move(role));
  };
  auto role = [](const char* name, int gemm, int copy, const std::vector<int>& waits = {}) {
    GraphNode n;
    n.role = name;
    n.gemm = gemm;
    n.copy = copy;
    n.waits = waits;
    return n;
  };

  GraphStats st;
  kernel::EntryBarrierSpec eb_spec;
  eb_spec.epoch = epoch;
  eb_spec.abort = errors_->abort();
  eb_spec.record = errors_->record_dev();
  eb_spec.local_barrier = reinterpret_cast<const uint32_t*>(ws + layout_.barrier_offset);
  for (int r = 0; r < plan_.tp; ++r)
    eb_spec.peer_barrier[r] =
        reinterpret_cast<uint32_t*>(byte_ptr(bases_[r]) + layout_.barrier_offset);
  eb_spec.tp = plan_.tp;
  eb_spec.device = rank_;
  eb_spec.timeout_ns = tmo;
  kernel::entry_barrier_launch(eb_spec, lanes.gemm);
  tag(lanes.gemm, role("barrier", -1, -1));
  DISTGEMM_CUDA_CHECK(cudaEventRecord(lanes.barrier, lanes.gemm));
  DISTGEMM_CUDA_CHECK(cudaStreamWaitEvent(lanes.copy, lanes.barrier, 0));

  // Side chain: every copy-engine node (GEMM signals, plan copies with their signals) and the
  // copies' wait kernels in ONE in-order chain, merged by the GEMM each one follows (see the
  // header for the deadlock this prevents). Key: the GEMM index an op waits for; -1: none
  // (all-gather pushes, first); S: after the last GEMM (copies with flag waits).
  struct SideOp {
    int key;
    int copy;  // -1: the signals of GEMM `key`
  };
  const int S = static_cast<int>(prog.gemms.size());
  std::vector<SideOp> side;
  for (int i = 0; i < S; ++i)
    if (!prog.gemms[i].signals.empty()) side.push_back({i, -1});
  for (int c = 0; c < static_cast<int>(prog.copies.size()); ++c) {
    const auto& cp = prog.copies[c];
    if (cp.after_gemm >= S) throw std::logic_error("internal: copy after a GEMM the plan lacks");
    const int key = schedule::side_chain_key(cp, S);  // the plan's copies come in this order
    side.push_back({key, c});
  }
  // Stable: within a key, GEMM signals (pushed first) before copies, copies in plan order.
  std::stable_sort(side.begin(), side.end(),
                   [](const SideOp& x, const SideOp& y) { return x.key < y.key; });
  // gemm: the GEMM whose result the signal publishes, or -1; copy: likewise the copy.
  auto signal = [&](const schedule::FlagRef& f, int gemm, int copy) {
    DISTGEMM_CUDA_CHECK(cudaMemcpyAsync(flag_of(f), epoch, 4, cudaMemcpyDefault, lanes.copy));
    GraphNode n = role("signal", gemm, copy);
    n.peer = f.device;
    n.flag = f.flag;
    tag(lanes.copy, std::move(n));
    ++st.signal_nodes;
  };
  int waited = -1;  // the chain is in order: waiting for the latest GEMM so far is enough
  auto enqueue_side = [&](const SideOp& so) {
    const int target = std::min(so.key, S - 1);
    if (target > waited) {
      DISTGEMM_CUDA_CHECK(cudaStreamWaitEvent(lanes.copy, lanes.gemm_done[target], 0));
      waited = target;
    }
    if (so.copy < 0) {
      for (const auto& f : prog.gemms[so.key].signals) signal(f, so.key, -1);
      return;
    }
    const auto& cp = prog.copies[so.copy];
    if (!cp.waits.empty()) {
      kernel::copy_wait_launch(wait_spec(cp.waits, so.copy, kernel::kWaitCopy), lanes.copy);
      tag(lanes.copy, role("wait", -1, so.copy, cp.waits));
      ++st.wait_kernels;
    }
    char* src = byte_ptr(resolve(cp.src, user, "copy source"));
    char* dst = byte_ptr(resolve(cp.dst, user, "copy destination"));
    const int64_t eb = elem_bytes(cp.src.buffer);
    // Row scales move with their rows, before the copy's signals (row scales need L = 1).
    if (cp.scale_src.valid()) {
      DISTGEMM_CUDA_CHECK(cudaMemcpyAsync(resolve(cp.scale_dst, user, "copy scale destination"),
                                          resolve(cp.scale_src, user, "copy scale source"),
                                          static_cast<size_t>(cp.rows * schedule::kScaleBytes),
                                          cudaMemcpyDefault, lanes.copy));
      tag(lanes.copy, role("copy", -1, so.copy));
      ++st.copy_nodes;
    }
    // 1-D memcpy nodes wherever the data is contiguous (all current plans): a graph-exec update
    // may retarget only 1-D memcpy nodes, so user-pointer updates stay updates.
    const bool rows_dense = cp.src.ld == cp.cols && cp.dst.ld == cp.cols;
    const bool all_dense =
        rows_dense && (plan_.problem.l == 1 || (cp.src.batch_stride == cp.rows * cp.cols &&
                                                cp.dst.batch_stride == cp.rows * cp.cols));
    if (all_dense) {
      DISTGEMM_CUDA_CHECK(
          cudaMemcpyAsync(dst, src, static_cast<size_t>(plan_.problem.l * cp.rows * cp.cols * eb),
                          cudaMemcpyDefault, lanes.copy));
      tag(lanes.copy, role("copy", -1, so.copy));
      ++st.copy_nodes;
    } else {
      for (int64_t l = 0; l < plan_.problem.l; ++l) {
        char* d = dst + l * cp.dst.batch_stride * eb;
        const char* sp = src + l * cp.src.batch_stride * eb;
        if (rows_dense)
          DISTGEMM_CUDA_CHECK(cudaMemcpyAsync(d, sp, static_cast<size_t>(cp.rows * cp.cols * eb),
                                              cudaMemcpyDefault, lanes.copy));
        else
          DISTGEMM_CUDA_CHECK(cudaMemcpy2DAsync(
              d, static_cast<size_t>(cp.dst.ld * eb), sp, static_cast<size_t>(cp.src.ld * eb),
              static_cast<size_t>(cp.cols * eb), static_cast<size_t>(cp.rows), cudaMemcpyDefault,
              lanes.copy));
        tag(lanes.copy, role("copy", -1, so.copy));
        ++st.copy_nodes;
      }
    }
    for (const auto& f : cp.signals) signal(f, -1, so.copy);
  };
  // Each side op is enqueued right after the GEMM it follows (the same chain and graph as
  // enqueueing them all after the last GEMM), so that in a direct launch a host thread held up
  // while enqueueing a later GEMM (a lazy kernel load, which waits for the device to go idle)
  // has already enqueued the copies and signals that the peers' spinning GEMMs wait for: their
  // waits then end, the device goes idle and the load proceeds. Enqueued after the last GEMM
  // instead, the peers' flags waited for this host, which waited for their devices. It needs
  // every flag a GEMM waits for to be signalled after an earlier GEMM of its producer, which
  // every schedule's plans have (tests/test_enqueue_order.py).
  size_t next_side = 0;
  auto side_through = [&](int gemm) {
    while (next_side < side.size() && std::min(side[next_side].key, S - 1) <= gemm)
      enqueue_side(side[next_side++]);
  };

  // Compute chain.
  const bool use_pdl = opt_.pdl == GraphOptions::Pdl::On ||
                       (opt_.pdl == GraphOptions::Pdl::Auto && pdl_by_default(plan_));
  st.pdl = use_pdl && prog.gemms.size() > 1;
  side_through(-1);  // all-gather pushes: after the entry barrier only
  for (size_t i = 0; i < prog.gemms.size(); ++i) {
    const auto& op = prog.gemms[i];
    kernel::GemmDesc desc = gemm_desc(op, user);
    desc.pdl = use_pdl && i > 0;  // GEMM 0 follows the entry barrier: a full edge
    desc.config = kernels_[i].config;
    desc.cublas_algo = kernels_[i].cublas_algo;
    if (desc.cublas_algo >= 0) {
      ++st.gemm_cublaslt;
    } else {
      const kernel::ConfigShape* shape = kernel::config_shape(desc.config);
      if (shape->tile_m == 128 && shape->tile_n == 128) ++st.gemm_n128;
    }
    kernel::gemm_launch(desc, wait_spec(op.waits, op.iteration, kernel::kWaitGemm), cuda_device_,
                        lanes.gemm);
    tag(lanes.gemm, role("gemm", static_cast<int>(i), -1, op.waits));
    ++st.gemm_nodes;
    DISTGEMM_CUDA_CHECK(cudaEventRecord(lanes.gemm_done[i], lanes.gemm));
    side_through(static_cast<int>(i));
  }
  if (next_side != side.size()) throw std::logic_error("internal: a side op after no GEMM");

  // Join: the launch ends after the side chain too.
  DISTGEMM_CUDA_CHECK(cudaEventRecord(lanes.copy_end, lanes.copy));
  DISTGEMM_CUDA_CHECK(cudaStreamWaitEvent(lanes.gemm, lanes.copy_end, 0));
  return st;
}

cudaGraph_t DeviceGraph::capture(const UserBuffers& user) {
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
  captured_roles_.clear();
  DISTGEMM_CUDA_CHECK(cudaStreamBeginCapture(own_.gemm, cudaStreamCaptureModeThreadLocal));
  GraphStats st;
  try {
    st = enqueue(user, own_, true);
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(own_.gemm, &broken);  // leave the stream usable; the error is rethrown
    if (broken) cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  DISTGEMM_CUDA_CHECK(cudaStreamEndCapture(own_.gemm, &graph));
  stats_ = st;
  return graph;
}

void DeviceGraph::capture_into(cudaStream_t caller, const UserBuffers& user) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DISTGEMM_CUDA_CHECK(cudaStreamIsCapturing(caller, &status));
  if (status != cudaStreamCaptureStatusActive)
    throw std::logic_error(
        std::string("DeviceGraph::capture_into: the caller's stream is ") +
        (status == cudaStreamCaptureStatusNone ? "not capturing" : "in an invalidated capture") +
        "; use launch() outside a capture");
  enqueue_on_caller(caller, user, into_);
}

void DeviceGraph::enqueue_on(cudaStream_t stream, const UserBuffers& user) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  DISTGEMM_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  if (status != cudaStreamCaptureStatusNone)
    throw std::logic_error(
        "DeviceGraph::enqueue_on: the stream is capturing; use capture_into() inside a capture");
  // Every graph of this device enqueues its side chain on the device's one set of lanes: the
  // launches are ordered anyway (LaunchOrder), and events are re-recorded at each use (a wait
  // already enqueued keeps the record it saw).
  std::lock_guard<std::mutex> hold(direct_lanes_mutex());
  enqueue_on_caller(stream, user, direct_lanes(cuda_device_));
}

void DeviceGraph::enqueue_on_caller(cudaStream_t stream, const UserBuffers& user, Lanes& lanes) {
  validate(user);
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
  if (!lanes.copy || lanes.gemm_done.size() < plan_.devices[rank_].gemms.size()) {
    RelaxedCaptureMode relaxed;  // creating streams and events while the caller may capture
    create_lanes(lanes, false);
  }
  Lanes on_caller = lanes;
  on_caller.gemm = stream;
  // Inside a capture, an error leaves the caller's capture as it is (possibly invalidated by the
  // failed call): the caller's cudaStreamEndCapture reports it; there is nothing of ours to
  // unwind.
  stats_ = enqueue(user, on_caller, false);
}

void DeviceGraph::require_executable(const char* what) const {
  if (!exec_)
    throw std::logic_error(std::string("DeviceGraph::") + what +
                           ": this graph was built with GraphOptions::instantiate = false and "
                           "only records into callers' captures (capture_into)");
}

void DeviceGraph::update(const UserBuffers& user) {
  require_executable("update");
  validate(user);
  cudaGraph_t g = capture(user);
  cudaGraphExecUpdateResultInfo info{};
  const cudaError_t updated = cudaGraphExecUpdate(exec_, g, &info);
  if (updated != cudaSuccess) cudaGraphDestroy(g);  // exec_ and graph_ stay as they were
  if (updated == cudaErrorGraphExecUpdateFailure) {
    (void)cudaGetLastError();
    throw std::runtime_error("cudaGraphExecUpdate refused the new graph (result " +
                             std::to_string(static_cast<int>(info.result)) +
                             "): the new buffers must live on the same devices as the old "
                             "ones, and strided (2-D) copies cannot be retargeted; use "
                             "rebuild() for those");
  }
  DISTGEMM_CUDA_CHECK(updated);
  keep_graph(g);
}

void DeviceGraph::rebuild(const UserBuffers& user) {
  require_executable("rebuild");
  validate(user);
  cudaGraph_t g = capture(user);
  cudaGraphExec_t fresh = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&fresh, g, 0);
  if (instantiated != cudaSuccess) cudaGraphDestroy(g);  // exec_ and graph_ stay as they were
  DISTGEMM_CUDA_CHECK(instantiated);
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
  DISTGEMM_CUDA_CHECK(cudaGraphExecDestroy(exec_));
  exec_ = fresh;
  keep_graph(g);
}

void DeviceGraph::keep_graph(cudaGraph_t graph) {
  if (graph_) cudaGraphDestroy(graph_);
  graph_ = graph;
  roles_ = std::move(captured_roles_);
  captured_roles_.clear();
}

void DeviceGraph::launch(cudaStream_t stream) {
  require_executable("launch");
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
  DISTGEMM_CUDA_CHECK(cudaGraphLaunch(exec_, stream));
}

ErrorSink::ErrorSink(int cuda_device) : cuda_device_(cuda_device) {
  RelaxedCaptureMode relaxed;
  DISTGEMM_CUDA_CHECK(cudaSetDevice(cuda_device_));
  // Zeroed on a private stream and synchronised there: a device-wide synchronisation (or the
  // legacy stream) would conflict with a capture in progress on another stream of the device.
  cudaStream_t zeroing = nullptr;
  DISTGEMM_CUDA_CHECK(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking));
  cudaError_t e = cudaMalloc(&abort_, 256);
  if (e == cudaSuccess) e = cudaMemsetAsync(abort_, 0, 256, zeroing);
  if (e == cudaSuccess) e = cudaStreamSynchronize(zeroing);
  cudaStreamDestroy(zeroing);
  if (e == cudaSuccess)
    e = cudaHostAlloc(reinterpret_cast<void**>(&record_host_), sizeof(kernel::ErrorRecord),
                      cudaHostAllocMapped);
  if (e == cudaSuccess) {
    *record_host_ = kernel::ErrorRecord{};
    e = cudaHostGetDevicePointer(reinterpret_cast<void**>(&record_dev_), record_host_, 0);
  }
  if (e != cudaSuccess) {
    if (abort_) cudaFree(abort_);
    if (record_host_) cudaFreeHost(record_host_);
    DISTGEMM_CUDA_CHECK(e);
  }
}

ErrorSink::~ErrorSink() {
  // Destructor: best effort, nothing to report to.
  cudaSetDevice(cuda_device_);
  if (abort_) cudaFree(abort_);
  if (record_host_) cudaFreeHost(record_host_);
}

std::string ErrorSink::error() const {
  volatile kernel::ErrorRecord* r = record_host_;
  if (r->valid == 0u) return "";
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%g", static_cast<double>(r->timeout_ns) * 1e-9);
  std::string what;
  const std::string dev = "device " + std::to_string(r->device);
  if (r->kind == kernel::kWaitEntryBarrier) {
    what = dev + ", entry barrier: barrier slot of device " + std::to_string(r->flag) +
           " did not reach generation " + std::to_string(r->expected) + " within " + secs +
           " s (last value " + std::to_string(r->observed) + "; device " + std::to_string(r->flag) +
           " did not start this launch)";
  } else if (r->kind == kernel::kWaitFusedTile) {
    what = dev + ", fused GEMM + all-reduce, tile " + std::to_string(r->iteration) +
           ": the partial of rank " + std::to_string(r->flag) + " did not reach generation " +
           std::to_string(r->expected) + " within " + secs + " s (last value " +
           std::to_string(r->observed) + "; rank " + std::to_string(r->flag) +
           " did not run this launch)";
  } else if (r->kind == kernel::kWaitFusedSum) {
    what = dev + ", fused GEMM + all-reduce, tile " + std::to_string(r->iteration) +
           " (two-shot): the sum of its owner rank " + std::to_string(r->flag) +
           " did not reach generation " + std::to_string(r->expected) + " within " + secs +
           " s (last value " + std::to_string(r->observed) + "; every partial had arrived: rank " +
           std::to_string(r->flag) + " did not finish this tile of this launch)";
  } else if (r->kind == kernel::kWaitAllReduce) {
    // iteration: phase * kAllReduceMaxCtas + CTA slot (kernel/allreduce.hpp).
    const int phase = r->iteration / kernel::kAllReduceMaxCtas;
    what = dev + ", all-reduce, CTA slot " +
           std::to_string(r->iteration % kernel::kAllReduceMaxCtas) +
           (phase == 0 ? ": the data" : ": the chunk sum") + " of rank " + std::to_string(r->flag) +
           " did not reach generation " + std::to_string(r->expected) + " within " + secs +
           " s (last value " + std::to_string(r->observed) + "; rank " + std::to_string(r->flag) +
           " did not run this launch)";
  } else {
    what = dev + (r->kind == kernel::kWaitCopy ? ", copy " : ", iteration ") +
           std::to_string(r->iteration) + ": flag " + std::to_string(r->flag) +
           " did not reach generation " + std::to_string(r->expected) + " within " + secs +
           " s (last value " + std::to_string(r->observed) + ")";
  }
  return what +
         "; the device is aborted: later launches of its graph (and of every graph sharing "
         "its error sink) exit at once, build a new runtime after fixing the peer";
}

std::string DeviceGraph::error() const { return errors_->error(); }

RelaxedCaptureMode::RelaxedCaptureMode() {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  DISTGEMM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  previous_ = mode;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  cudaStreamCaptureMode mode = previous_;
  cudaThreadExchangeStreamCaptureMode(&mode);  // destructor: nothing to report to
}

void DeviceGraph::check() const {
  const std::string e = error();
  if (!e.empty()) throw std::runtime_error(e);
}

}  // namespace distgemm::device
