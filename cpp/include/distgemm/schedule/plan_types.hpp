// Plan's data: the ops of every device, the buffers they name, the workspace layout, and the
// validation of a (schedule, problem, TP, S) before a plan is built. Host-only.
//
//
// Per device there are two in-order streams:
//   gemms  — the S sub-GEMMs, in iteration order (the compute stream; one kernel each);
//   copies — copy-engine transfers (the copy stream; memcpy nodes, no SMs).
// Cross-device ordering only goes through flags. A flag is a uint32 in the destination
// device's symmetric workspace; "set" writes the launch generation into it, "wait" spins until
// it reaches the launch generation (wrap-safe compare). Each flag is set exactly once per launch,
// so nothing is ever reset. Every launch starts with an entry barrier across all devices: a
// device only writes a peer's workspace after that peer has finished the previous launch, so
// receive slots are never overwritten while a previous launch still reads them. Within a
// launch every slot is written at most once.
//
// Buffers: the user's A, B, C, D, bias of each device (local shapes from the Partition, dense
// row-major per batch), and `Slots`, the data part of the symmetric workspace. A BufRef names a
// buffer on some device plus an element offset, a row stride and a batch stride. A BufRef on
// another device than the one executing the op is a peer access (NVLink).
//
// FP8 row-wise scales (PlanOptions::row_scale_a / row_scale_b): D = sa[m] * sb[n] * sum_k A B.
// `ScaleA` / `ScaleB` are the user's float32 scale vectors of each device, one float per local
// row of A / B (sharded like those rows); `ScaleSlots` is the scale part of the symmetric
// workspace, right after the data slots: receive slot j of an all-gather plan has its rows'
// scales at floats [j * T, j * T + T) (T the longest tile). A reference to a scale buffer is a
// BufRef whose offset is a row index (floats), with ld = 1 and batch_stride = 0 (row scales
// need L = 1). Rows of a row-scaled operand never move without their scales: a copy that moves
// them moves their scales too (CopyOp::scale_src -> scale_dst, before the same signals), and a
// GEMM reads the scales of exactly its rows (GemmOp::scale_a / scale_b). Reduce-scatter and
// all-reduce plans move bf16 partials only; their GEMMs read the user's local scale vectors.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "distgemm/schedule/partition.hpp"
#include "distgemm/schedule/scheduler.hpp"

namespace distgemm::schedule {

enum class Buffer : uint8_t {
  A = 0,
  B = 1,
  C = 2,
  D = 3,
  Bias = 4,
  Slots = 5,
  ScaleA = 6,
  ScaleB = 7,
  ScaleSlots = 8
};

inline const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::A:
      return "A";
    case Buffer::B:
      return "B";
    case Buffer::C:
      return "C";
    case Buffer::D:
      return "D";
    case Buffer::Bias:
      return "bias";
    case Buffer::ScaleA:
      return "scale_a";
    case Buffer::ScaleB:
      return "scale_b";
    case Buffer::ScaleSlots:
      return "scale_slots";
    default:
      return "slots";
  }
}

struct BufRef {
  Buffer buffer = Buffer::A;
  int device = -1;           // -1: no operand
  int64_t offset = 0;        // elements (scale buffers: floats, a row index)
  int64_t ld = 0;            // elements between rows
  int64_t batch_stride = 0;  // elements between batches
  bool valid() const { return device >= 0; }
};

struct FlagRef {
  int device = 0;
  int flag = 0;
};

struct GemmOp {
  int iteration = 0;
  int tile = 0;                    // tile of the split mode
  int64_t m0 = 0, n0 = 0, k0 = 0;  // global coordinates of the sub-GEMM
  int64_t m = 0, n = 0, k = 0;     // extents; the batch count is the problem's L
  BufRef a, b, d;
  BufRef partial;  // epilogue source added with scale 1 (the rotating partial C); may be invalid
  BufRef user_c;   // the user's C, added with beta when the call passes beta != 0; may be invalid
  BufRef bias;     // bias slice for this tile's N range, used when the call passes a bias
  // Row scales of A's and B's rows (valid exactly when that operand is row-scaled): the float of
  // row r of this GEMM's A (B) sits at offset + r of ScaleA/ScaleSlots (ScaleB/ScaleSlots).
  BufRef scale_a, scale_b;
  std::vector<int> waits;        // flags on this device, waited for before the mainloop
  std::vector<FlagRef> signals;  // flags set after the GEMM has completed
};

struct CopyOp {
  int step = 0;  // iteration during which the copy is expected to run (display only)
  BufRef src, dst;
  int64_t rows = 0, cols = 0;  // per batch: `rows` rows of `cols` contiguous elements
  // Valid exactly when the copy moves rows of a row-scaled operand: `rows` floats from scale_src
  // to scale_dst move with the data, both before the signals.
  BufRef scale_src, scale_dst;
  int after_gemm = -1;     // index of a local GEMM that must complete first, -1 if none
  std::vector<int> waits;  // flags on this device, waited for before the copy
  std::vector<FlagRef> signals;
};

struct DeviceProgram {
  std::vector<GemmOp> gemms;
  std::vector<CopyOp> copies;
};

// Byte layout of one device's symmetric workspace (identical on every device).
struct WorkspaceLayout {
  int64_t slots_offset = 0, slots_bytes = 0;
  int64_t scale_slots_offset = 0, scale_slots_bytes = 0;  // float per row; 0 bytes: none
  int64_t flags_offset = 0, flags_bytes = 0;              // uint32 per flag, kMaxFlags of them
  int64_t barrier_offset = 0, barrier_bytes = 0;          // uint32 per device (entry barrier)
  int64_t epoch_offset = 0;                               // uint32 launch generation of this device
  int64_t total_bytes = 0;
};

inline constexpr int64_t round_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

inline constexpr int kMaxTp = 8;  // devices of one plan (the runtime's kernel::kMaxDevices)
// Extents of one problem (M, N, K, L): the GEMM kernels take int32 problem shapes.
inline constexpr int64_t kMaxExtent = 2147483647;
// Elements of one operand (A, B or D, times L): at 8 bytes each, the widest element a reference
// executor uses, its byte count fits int64.
inline constexpr int64_t kMaxOperandElems = int64_t(1) << 60;
// Pipeline steps of one plan. The bound makes the flags of every plan fit one fixed control
// region, so that plans of any shape share one workspace per communicator.
inline constexpr int kMaxSteps = 128;
// Flags of one plan (build_plan): S - S/TP for the all-gather and reduce-scatter schedules,
// 2(S - S/TP) for ar_tile_a (partials + finished tiles); all fewer than 2*S.
inline constexpr int kMaxFlags = 2 * kMaxSteps;
// Receive slots start at multiples of this many bytes, and so do the scale slots and the
// control region.
inline constexpr int64_t kSlotAlign = 256;
// A row scale: one float32.
inline constexpr int64_t kScaleBytes = 4;

// The control region of a workspace: flags, entry-barrier slots and the epoch word, the same for
// every plan, as the layout of a plan without slots (offsets from the end of the slots). Every
// plan places it right after its own slots, so a plan with fewer slot bytes than the workspace
// takes a base shifted by the difference and finds the control region on the same addresses as
// every other plan's.
inline constexpr WorkspaceLayout control_layout() {
  WorkspaceLayout c;
  c.flags_offset = 0;
  c.flags_bytes = round_up(int64_t(kMaxFlags) * 4, 128);
  c.barrier_offset = c.flags_offset + c.flags_bytes;
  c.barrier_bytes = round_up(int64_t(kMaxTp) * 4, 128);
  c.epoch_offset = c.barrier_offset + c.barrier_bytes;
  c.total_bytes = round_up(c.epoch_offset + 4, kSlotAlign);
  return c;
}

// How a reduce-scatter partial reaches the device that continues it (the ring of rs_tile_a,
// rs_tile_b and ar_tile_a; all-gather plans have no partials).
//   Epilogue:   the GEMM's epilogue stores the partial straight into the peer's receive slot
//               (a peer write over NVLink from the SMs) and a signal follows the GEMM. No extra
//               memory; the epilogue's stores cross NVLink, which lengthens GEMMs with short K.
//   CopyEngine: the epilogue stores it into a local staging slot; a memcpy node pushes the slot
//               into the peer's receive slot after the GEMM, then signals. The epilogue stays
//               local and the transfer runs on the copy engine, but it is on the consumer's
//               critical path unless S > TP gives it steps of slack; one staging slot per
//               non-final iteration doubles the partial slots (rs_tile_a/b: all the slots;
//               ar_tile_a: 1.5x, its all-gather slots stay).
enum class PartialVia : uint8_t { Epilogue = 0, CopyEngine = 1 };

inline const char* partial_via_name(PartialVia v) {
  return v == PartialVia::CopyEngine ? "copy" : "epilogue";
}

// The inverse of partial_via_name; throws std::invalid_argument naming the valid names.
inline PartialVia parse_partial_via(const std::string& name) {
  for (PartialVia v : {PartialVia::Epilogue, PartialVia::CopyEngine})
    if (name == partial_via_name(v)) return v;
  throw std::invalid_argument("partial_via='" + name + "' is not one of 'epilogue', 'copy'");
}

// parse_partial_via of an optional name (none: none), for the bindings' optional arguments.
inline std::optional<PartialVia> parse_optional_partial_via(
    const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  return parse_partial_via(*name);
}

struct PlanOptions {
  PartialVia partial_via = PartialVia::Epilogue;
  // FP8 row-wise scales of A (one float per row of A) and of B (per row of B); false: none, or
  // tensor-wise (a scalar the kernel reads, which needs nothing from the plan).
  bool row_scale_a = false, row_scale_b = false;
};

struct Plan {
  std::string schedule;
  ScheduleDef def;
  Problem problem;
  int tp = 1;
  int steps = 1;
  PartialVia partial_via = PartialVia::Epilogue;  // reduce-scatter plans only
  Buffer slot_operand = Buffer::A;                // the slots hold elements of this operand's dtype
  int64_t slot_elems = 0;                         // per device
  bool row_scale_a = false, row_scale_b = false;  // PlanOptions' row scales
  // Floats per device in the scale slots: nonzero only in an all-gather plan whose rotating
  // operand is row-scaled (its scales travel with its rows).
  int64_t scale_slot_rows = 0;
  int num_flags = 0;  // per device
  std::vector<DeviceProgram> devices;

  const Partition& partition() const { return def.partition; }

  // The slots, the scale slots, then the control region (control_layout()). Throws
  // std::logic_error for a plan with more flags than the control region holds (a Plan assembled
  // by hand).
  WorkspaceLayout layout(int slot_elem_bytes) const {
    if (num_flags > kMaxFlags)
      throw std::logic_error("internal: a plan with " + std::to_string(num_flags) +
                             " flags; the workspace's control region holds " +
                             std::to_string(kMaxFlags));
    WorkspaceLayout w = control_layout();
    w.slots_bytes = round_up(slot_elems * slot_elem_bytes, kSlotAlign);
    w.scale_slots_offset = w.slots_offset + w.slots_bytes;
    w.scale_slots_bytes = round_up(scale_slot_rows * kScaleBytes, kSlotAlign);
    const int64_t before_control = w.scale_slots_offset + w.scale_slots_bytes;
    for (int64_t* offset : {&w.flags_offset, &w.barrier_offset, &w.epoch_offset, &w.total_bytes})
      *offset += before_control;
    return w;
  }
  // Extra device memory per device beyond the user's tensors.
  int64_t extra_bytes(int slot_elem_bytes) const { return layout(slot_elem_bytes).total_bytes; }
};

// Bytes of one element of a plan's slots: the rotating operand's (all-gather plans) or the
// output's (the partials of reduce-scatter and all-reduce plans). They differ for fp8 (one-byte
// operands, bf16 output); every consumer sizes the layout with this.
inline int slot_elem_bytes(const Plan& p, int operand_bytes, int out_bytes) {
  return p.slot_operand == Buffer::A || p.slot_operand == Buffer::B ? operand_bytes : out_bytes;
}

// ---------------------------------------------------------------------------------------------
// Validation: every constraint in words, with the values.

// "" when every operand of the problem (extents 1..kMaxExtent) holds at most kMaxOperandElems
// elements; otherwise the first that does not, with the sizes.
inline std::string operand_size_problem(const Problem& p) {
  auto s = [](int64_t v) { return std::to_string(v); };
  const struct {
    const char* name;
    int64_t rows, cols;
  } operands[] = {{"A (M*K*L)", p.m, p.k}, {"B (N*K*L)", p.n, p.k}, {"D (M*N*L)", p.m, p.n}};
  for (const auto& o : operands)
    if (o.rows > kMaxOperandElems / (o.cols * p.l))  // cols * l < 2**62: no overflow
      return std::string(o.name) + " of M=" + s(p.m) + " N=" + s(p.n) + " K=" + s(p.k) +
             " L=" + s(p.l) + " is above 2**60 elements: its byte count overflows 64 bits";
  return "";
}

inline std::string validate(const ScheduleDef& def, const Problem& p, int tp, int steps,
                            const PlanOptions& options = {}) {
  auto s = [](int64_t v) { return std::to_string(v); };
  if (tp < 1 || tp > kMaxTp)
    return "TP=" + s(tp) + " is out of range: distgemm supports 1 <= TP <= " + s(kMaxTp);
  if (steps < tp || steps % tp != 0)
    return "S=" + s(steps) + " is not a positive multiple of TP=" + s(tp) + " (S = k*TP, k >= 1)";
  if (steps > kMaxSteps)
    return "S=" + s(steps) + " is out of range: distgemm supports S <= " + s(kMaxSteps) +
           " (every plan's flags fit the workspace's one control region)";
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.l < 1)
    return "problem sizes must be positive, got M=" + s(p.m) + " N=" + s(p.n) + " K=" + s(p.k) +
           " L=" + s(p.l);
  if (p.m > kMaxExtent || p.n > kMaxExtent || p.k > kMaxExtent || p.l > kMaxExtent)
    return "problem sizes must be at most 2**31-1 (the GEMMs take int32 extents), got M=" + s(p.m) +
           " N=" + s(p.n) + " K=" + s(p.k) + " L=" + s(p.l);
  if (std::string big = operand_size_problem(p); !big.empty()) return big;
  if ((options.row_scale_a || options.row_scale_b) && p.l != 1)
    return std::string("row-wise scales (") +
           (options.row_scale_a && options.row_scale_b ? "of A and B"
            : options.row_scale_a                      ? "of A"
                                                       : "of B") +
           ") need L=1, got L=" + s(p.l) +
           ": a scale vector covers one batch's rows; use tensor-wise scales for L > 1";
  const std::string who = std::string(def.name);
  auto extent = [&](Mode m) { return m == Mode::M ? p.m : m == Mode::N ? p.n : p.k; };
  // A sharded mode splits evenly over the devices (as torch's collectives require). The split
  // mode needs nothing more: its S tiles may be uneven, even empty (TileSplit).
  const Partition& pt = def.partition;
  for (auto [mode, what] : {std::pair{pt.a, "A"}, std::pair{pt.b, "B"}, std::pair{pt.d, "C/D"}}) {
    if (mode == Mode::None) continue;
    if (extent(mode) % tp != 0)
      return std::string(mode_name(mode)) + "=" + s(extent(mode)) +
             " is not divisible by TP=" + s(tp) + ": " + who + " shards " + what + " on " +
             mode_name(mode) + " (every device holds " + mode_name(mode) + "/TP of it)";
  }
  if (def.collective != Collective::AllGather) {
    DistributedTileScheduler sch(def, tp, steps);
    for (int d = 0; d < tp; ++d)
      for (int i = 0; i < steps; ++i)
        if (sch.source_device(d, i) == -2 || sch.destination_device(d, i) == -2)
          return "internal: schedule " + who + " does not pass the partial of device " + s(d) +
                 " iteration " + s(i) + " to any device (its tile map is not a ring)";
  }
  return "";
}

}  // namespace distgemm::schedule
