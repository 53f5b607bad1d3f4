// build_plan: fills a Plan's device programs for one schedule, TP and S (all-gather and
// reduce-scatter / all-reduce builders, and the side-chain order every consumer follows).
// Host-only.
//
// Uneven tiles (TileSplit, when S does not divide the split mode): every op of a tile takes that
// tile's extent, and receive slots are sized for the longest tile (a shorter one uses the slot's
// first rows, or columns along N). An empty tile has no ops at all: no GEMM, no copy, no signal
// and no wait, on any device, so nothing waits for a flag that nobody sets; its slot and flag
// stay unused. A device's GEMMs are then fewer than S: GemmOp::iteration keeps the step, and
// CopyOp::after_gemm is a position in DeviceProgram::gemms.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "distgemm/schedule/plan_types.hpp"

namespace distgemm::schedule {

namespace detail {

// The split of def.split into the plan's S tiles.
inline TileSplit tile_split(const Plan& plan) {
  const bool along_m = plan.def.split == Mode::M;
  TileSplit sp;
  sp.extent = along_m ? plan.problem.m : plan.problem.n;
  sp.tp = plan.tp;
  sp.k = plan.steps / plan.tp;
  sp.unit = along_m ? 1 : kSplitUnitN;
  return sp;
}

inline BufRef ref(Buffer b, int dev, int64_t off, int64_t ld, int64_t bs) {
  BufRef r;
  r.buffer = b;
  r.device = dev;
  r.offset = off;
  r.ld = ld;
  r.batch_stride = bs;
  return r;
}

// The row scales of the rows a reference to A or B starts at (row scales need L = 1): rows of the
// user's A (B) have theirs at the same row of ScaleA (ScaleB); row r of receive slot j at float
// j * slot_rows + r of the scale slots. Every scale reference of a plan comes from its data
// reference by this one rule, so scales follow their rows wherever rows go (slot to slot too).
inline BufRef scale_ref_of(const BufRef& data, int64_t slot_stride, int64_t slot_rows) {
  int64_t row = data.offset / data.ld;
  Buffer buffer = data.buffer == Buffer::A ? Buffer::ScaleA : Buffer::ScaleB;
  if (data.buffer == Buffer::Slots) {
    row = data.offset / slot_stride * slot_rows + data.offset % slot_stride / data.ld;
    buffer = Buffer::ScaleSlots;
  }
  return ref(buffer, data.device, row, 1, 0);
}

// All-gather: each GEMM writes a final tile; the rotating operand's foreign chunks are pushed by
// their owner's copy engine into the consumer's slots, one slot per foreign tile. A row-scaled
// rotating operand's copies carry the rows' scales into the scale slots (slot j: T floats).
inline void build_all_gather(Plan& plan, const DistributedTileScheduler& sch) {
  const ScheduleDef& def = plan.def;
  const Problem& p = plan.problem;
  const int tp = plan.tp, S = plan.steps, kc = sch.chunks_per_shard();
  const bool rot_a = def.rotating == Operand::A;
  const int64_t K = p.k, L = p.l;
  // Tiles along the split mode (the longest sizes the slots) and the local shapes.
  const TileSplit split = tile_split(plan);
  const int64_t T = split.max_size();
  const Extent2 la = def.partition.local_a(p, tp), lb = def.partition.local_b(p, tp),
                ld = def.partition.local_d(p, tp);
  const int64_t slot_stride = L * T * K;  // one slot: [L][T][K]

  plan.slot_operand = rot_a ? Buffer::A : Buffer::B;
  plan.slot_elems = int64_t(S - kc) * slot_stride;
  plan.num_flags = S - kc;
  const bool scale_rot = rot_a ? plan.row_scale_a : plan.row_scale_b;
  plan.scale_slot_rows = scale_rot ? int64_t(S - kc) * T : 0;
  auto scales = [&](const BufRef& data, bool scaled) {
    return scaled ? scale_ref_of(data, slot_stride, T) : BufRef{};
  };

  // slot_of[d][t]: the receive slot on device d that holds foreign tile t, in order of use.
  std::vector<std::vector<int>> slot_of(tp, std::vector<int>(S, -1));
  std::vector<std::vector<int>> need_iter(tp, std::vector<int>(S, -1));
  for (int d = 0; d < tp; ++d) {
    int next = 0;
    for (int i = 0; i < S; ++i) {
      int t = sch.tile(d, i);
      need_iter[d][t] = i;
      if (sch.owner(t) != d) slot_of[d][t] = next++;
    }
  }

  for (int d = 0; d < tp; ++d) {
    DeviceProgram& prog = plan.devices[d];
    for (int i = 0; i < S; ++i) {
      const int t = sch.tile(d, i), owner = sch.owner(t);
      const int64_t t0 = split.begin(t), tn = split.size(t);
      if (tn == 0) continue;
      GemmOp g;
      g.iteration = i;
      g.tile = t;
      g.k0 = 0;
      g.k = K;
      BufRef rot = owner == d ? ref(rot_a ? Buffer::A : Buffer::B, d, split.begin_in_shard(t) * K,
                                    K, (rot_a ? la : lb).rows * K)
                              : ref(Buffer::Slots, d, slot_of[d][t] * slot_stride, K, T * K);
      if (owner != d) g.waits.push_back(slot_of[d][t]);
      if (rot_a) {
        // D_d[M, N/TP]: rows of tile t, all local columns.
        g.m0 = t0;
        g.m = tn;
        g.n0 = int64_t(d) * ld.cols;
        g.n = ld.cols;
        g.a = rot;
        g.b = ref(Buffer::B, d, 0, K, lb.rows * K);
        g.d = ref(Buffer::D, d, t0 * ld.cols, ld.cols, ld.rows * ld.cols);
        g.bias = ref(Buffer::Bias, d, 0, 0, 0);
      } else {
        // D_d[M/TP, N]: local rows, the N columns of tile t.
        g.m0 = int64_t(d) * la.rows;
        g.m = la.rows;
        g.n0 = t0;
        g.n = tn;
        g.a = ref(Buffer::A, d, 0, K, la.rows * K);
        g.b = rot;
        g.d = ref(Buffer::D, d, t0, ld.cols, ld.rows * ld.cols);
        g.bias = ref(Buffer::Bias, d, t0, 0, 0);
      }
      g.user_c = g.d;
      g.user_c.buffer = Buffer::C;
      g.scale_a = scales(g.a, plan.row_scale_a);
      g.scale_b = scales(g.b, plan.row_scale_b);
      prog.gemms.push_back(g);
    }
  }

  // Pushes: owner p copies each of its chunks into every consumer's slot, earliest need first.
  for (int p_ = 0; p_ < tp; ++p_) {
    struct Push {
      int need, dist, dev, t;
    };
    std::vector<Push> pushes;
    for (int d = 0; d < tp; ++d) {
      if (d == p_) continue;
      for (int c = 0; c < kc; ++c) {
        int t = p_ * kc + c;
        if (split.size(t) > 0) pushes.push_back({need_iter[d][t], (d - p_ + tp) % tp, d, t});
      }
    }
    std::sort(pushes.begin(), pushes.end(), [](const Push& x, const Push& y) {
      return x.need != y.need ? x.need < y.need : x.dist < y.dist;
    });
    const int64_t shard_rows = (rot_a ? la : lb).rows;
    int queued = 0;
    for (const Push& u : pushes) {
      CopyOp cp;
      // The copy engine starts at once and works through its queue back to back: show each copy
      // at its queue position, but never later than the step before its consumer.
      cp.step = std::min(queued++, std::max(0, u.need - 1));
      cp.src =
          ref(rot_a ? Buffer::A : Buffer::B, p_, split.begin_in_shard(u.t) * K, K, shard_rows * K);
      cp.dst = ref(Buffer::Slots, u.dev, slot_of[u.dev][u.t] * slot_stride, K, T * K);
      cp.rows = split.size(u.t);
      cp.cols = K;
      cp.scale_src = scales(cp.src, scale_rot);
      cp.scale_dst = scales(cp.dst, scale_rot);
      cp.signals.push_back({u.dev, slot_of[u.dev][u.t]});
      plan.devices[p_].copies.push_back(cp);
    }
  }
}

// Reduce-scatter (and the ring of all-reduce): the partial of tile t visits every device. With
// PartialVia::Epilogue the epilogue of (d, i) writes it straight into the receive slot of the
// device that continues it at i + k (a peer write over NVLink), then sets that device's flag;
// with PartialVia::CopyEngine it writes local staging slot i, and a copy after GEMM i pushes it
// there and sets the flag. Slot j on every device receives the partial consumed at iteration
// j + k; flag j guards it. A and B are sharded on K and never move: a GEMM of a row-scaled
// operand reads its rows' scales from the user's local scale vector.
inline void build_reduce_scatter(Plan& plan, const DistributedTileScheduler& sch) {
  const ScheduleDef& def = plan.def;
  const Problem& p = plan.problem;
  const int tp = plan.tp, S = plan.steps, kc = sch.chunks_per_shard();
  const bool split_m = def.split == Mode::M;
  const bool all_reduce = def.collective == Collective::AllReduce;
  const int64_t L = p.l, N = p.n, M = p.m;
  const Extent2 la = def.partition.local_a(p, tp), ld = def.partition.local_d(p, tp);
  const int64_t Kl = la.cols;
  const TileSplit split = tile_split(plan);
  const int64_t T = split.max_size();
  // One slot: a tile of D, [L][T][N] (split M) or [L][M][T] (split N), T the longest tile.
  const int64_t tile_rows = split_m ? T : M, tile_cols = split_m ? N : T;
  const int64_t slot_stride = L * tile_rows * tile_cols;
  const int partial_slots = S - kc;
  const bool via_copy = plan.partial_via == PartialVia::CopyEngine;
  // All-reduce: after the partial slots, one receive slot per foreign finished tile (S - k), each
  // guarded by its own flag. Partials by copy engine: then one local staging slot per non-final
  // iteration (no flag: the copy follows its GEMM on the same device).
  const int recv_slots = partial_slots + (all_reduce ? S - kc : 0);
  plan.slot_operand = Buffer::D;
  plan.slot_elems = int64_t(recv_slots + (via_copy ? partial_slots : 0)) * slot_stride;
  plan.num_flags = recv_slots;
  auto slot_ref = [&](int dev, int slot) {
    return ref(Buffer::Slots, dev, slot * slot_stride, tile_cols, tile_rows * tile_cols);
  };
  // All-reduce: receive slot (and flag) of foreign finished tile t on device e, in tile order.
  std::vector<std::vector<int>> recv_of(tp, std::vector<int>(S, -1));
  if (all_reduce)
    for (int e = 0; e < tp; ++e) {
      int next = partial_slots;
      for (int t = 0; t < S; ++t)
        if (sch.owner(t) != e) recv_of[e][t] = next++;
    }

  // final_gemm[d][t]: position in device d's GEMMs of its last visit of tile t (-1: none).
  std::vector<std::vector<int>> final_gemm(tp, std::vector<int>(S, -1));
  for (int d = 0; d < tp; ++d) {
    DeviceProgram& prog = plan.devices[d];
    for (int i = 0; i < S; ++i) {
      const int t = sch.tile(d, i);
      const int64_t t0 = split.begin(t), tn = split.size(t);
      if (tn == 0) continue;  // every visit of an empty tile is empty: its partials never travel
      const int64_t rows = split_m ? tn : M, cols = split_m ? N : tn;
      GemmOp g;
      g.iteration = i;
      g.tile = t;
      g.k0 = int64_t(d) * Kl;
      g.k = Kl;
      if (split_m) {
        g.m0 = t0;
        g.m = tn;
        g.n0 = 0;
        g.n = N;
        g.a = ref(Buffer::A, d, t0 * Kl, Kl, M * Kl);
        g.b = ref(Buffer::B, d, 0, Kl, N * Kl);
      } else {
        g.m0 = 0;
        g.m = M;
        g.n0 = t0;
        g.n = tn;
        g.a = ref(Buffer::A, d, 0, Kl, M * Kl);
        g.b = ref(Buffer::B, d, t0 * Kl, Kl, N * Kl);
      }
      // A and B are the user's here (never slots): their scales are the user's, row for row.
      if (plan.row_scale_a) g.scale_a = scale_ref_of(g.a, slot_stride, tile_rows);
      if (plan.row_scale_b) g.scale_b = scale_ref_of(g.b, slot_stride, tile_rows);
      if (i >= kc) {
        g.partial = slot_ref(d, i - kc);
        g.waits.push_back(i - kc);
      }
      if (!sch.is_final(i)) {
        const int e = sch.destination_device(d, i);
        if (!via_copy) {
          g.d = slot_ref(e, i);  // consumed by e at iteration i + k, slot (i + k) - k
          g.signals.push_back({e, i});
        } else {
          // Staging slot i (after the receive slots), pushed into e's slot i once GEMM i is done.
          g.d = slot_ref(d, recv_slots + i);
          CopyOp cp;
          cp.step = i;
          cp.src = g.d;
          cp.dst = slot_ref(e, i);
          cp.rows = rows;  // per batch; a full slot is dense, so one 1-D memcpy moves all L
          cp.cols = cols;
          cp.after_gemm = static_cast<int>(prog.gemms.size());
          cp.signals.push_back({e, i});
          prog.copies.push_back(cp);
        }
      } else {
        const int64_t c0 = split.begin_in_shard(t);
        final_gemm[d][t] = static_cast<int>(prog.gemms.size());
        if (all_reduce) {
          // The owner finishes tile t straight into its own D (D is replicated); the copy
          // engine then pushes it to every peer.
          g.d = ref(Buffer::D, d, t0 * N, N, M * N);
          g.user_c = ref(Buffer::C, d, t0 * N, N, M * N);
          g.bias = ref(Buffer::Bias, d, 0, 0, 0);
        } else if (split_m) {
          g.d = ref(Buffer::D, d, c0 * N, N, ld.rows * N);
          g.user_c = g.d;
          g.user_c.buffer = Buffer::C;
          g.bias = ref(Buffer::Bias, d, 0, 0, 0);
        } else {
          g.d = ref(Buffer::D, d, c0, ld.cols, M * ld.cols);
          g.user_c = g.d;
          g.user_c.buffer = Buffer::C;
          g.bias = ref(Buffer::Bias, d, c0, 0, 0);
        }
      }
      prog.gemms.push_back(g);
    }
  }

  if (!all_reduce) return;
  // All-gather of finished tiles, by pushes only: the owner's copy engine writes each finished
  // tile into every peer's receive slot (a peer write, as in the all-gather schedules) and sets
  // the peer's flag; the peer, after its last GEMM, waits for the flag and copies the slot into
  // its own D (a local copy). No memcpy ever reads a peer's memory: a peer read may be executed
  // by the peer's copy engine, queued behind (or ahead of) that peer's own transfers, which
  // couples the two devices' copy queues and can deadlock them (docs/tuning.md).
  for (int e = 0; e < tp; ++e) {
    struct Item {
      int ready;  // the finishing GEMM's iteration
      bool take_in;
      int dist, t;
    };  // take_in: a peer's tile, else a push
    std::vector<Item> items;
    for (int t = 0; t < S; ++t) {
      const int owner = sch.owner(t), fin = final_gemm[owner][t];
      if (fin < 0) continue;  // an empty tile: nothing to gather
      const int ready = plan.devices[owner].gemms[fin].iteration;
      if (owner == e) {
        for (int p_ = 1; p_ < tp; ++p_) items.push_back({ready, false, p_, t});
      } else {
        items.push_back({ready, true, (owner - e + tp) % tp, t});
      }
    }
    // In finishing order. The copies that take in a peer's tile wait for its flag, so
    // side_chain_key (build_plan) puts them after every push: each device pushes before it
    // waits, and no device waits for a push queued behind its own wait.
    std::sort(items.begin(), items.end(), [](const Item& x, const Item& y) {
      if (x.ready != y.ready) return x.ready < y.ready;
      if (x.t != y.t) return x.t < y.t;
      return x.dist < y.dist;
    });
    for (const Item& u : items) {
      CopyOp cp;
      cp.step = u.ready;
      cp.rows = split.size(u.t);
      cp.cols = N;
      const int64_t t0 = split.begin(u.t);
      if (!u.take_in) {
        const int peer = (e + u.dist) % tp;
        cp.src = ref(Buffer::D, e, t0 * N, N, M * N);
        cp.dst = slot_ref(peer, recv_of[peer][u.t]);
        cp.after_gemm = final_gemm[e][u.t];
        cp.signals.push_back({peer, recv_of[peer][u.t]});
      } else {
        cp.src = slot_ref(e, recv_of[e][u.t]);
        cp.dst = ref(Buffer::D, e, t0 * N, N, M * N);
        cp.waits.push_back(recv_of[e][u.t]);
      }
      plan.devices[e].copies.push_back(cp);
    }
  }
}

}  // namespace detail

// Where a copy sits in its device's side chain (device/graph.hpp): after GEMM `after_gemm`;
// -1 (first) for a copy that follows no GEMM (all-gather pushes); `steps` (after the last GEMM)
// for a copy that waits for a flag (ar_tile_a's local copies of the tiles peers pushed).
// build_plan emits every device's copies sorted by this key (stable), so the order that the
// checker, the simulator and the reference executor follow is the order the graph runs.
inline int side_chain_key(const CopyOp& cp, int steps) {
  return !cp.waits.empty() ? steps : cp.after_gemm;
}

// Build the plan of `def` for `tp` devices and `steps` iterations. Throws std::invalid_argument
// naming the violated constraint.
inline Plan build_plan(const ScheduleDef& def, const Problem& problem, int tp, int steps,
                       const PlanOptions& options) {
  std::string err = validate(def, problem, tp, steps, options);
  if (!err.empty()) throw std::invalid_argument(err);
  Plan plan;
  plan.schedule = def.name;
  plan.def = def;
  plan.problem = problem;
  plan.tp = tp;
  plan.steps = steps;
  plan.partial_via =
      def.collective == Collective::AllGather ? PartialVia::Epilogue : options.partial_via;
  plan.row_scale_a = options.row_scale_a;
  plan.row_scale_b = options.row_scale_b;
  plan.devices.resize(tp);
  DistributedTileScheduler sch(def, tp, steps);
  if (def.collective == Collective::AllGather)
    detail::build_all_gather(plan, sch);
  else
    detail::build_reduce_scatter(plan, sch);
  for (DeviceProgram& prog : plan.devices)
    std::stable_sort(prog.copies.begin(), prog.copies.end(),
                     [steps](const CopyOp& x, const CopyOp& y) {
                       return side_chain_key(x, steps) < side_chain_key(y, steps);
                     });
  return plan;
}

}  // namespace distgemm::schedule
