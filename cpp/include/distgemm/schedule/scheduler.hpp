// DistributedTileScheduler: for device d and iteration i, which tile of the split mode the
// sub-GEMM covers, whose data the rotating operand comes from, and (reduce-scatter) where the
// partial result goes next.
//
// A schedule is a handful of integers (ScheduleDef): the collective, the rotating operand, the
// mode split into S tiles, the Partition, and one affine map
//
//     tile(d, i) = (a * k * d + b * i + c * k) mod S,      S = k * TP,  k >= 1
//
// (a and c are in units of k so that one definition serves every S). Tile t belongs to device
// t / k: each device's shard is split into k consecutive chunks. Pure integer math, runtime TP
// and S, usable in host and device code.
#pragma once

#include "distgemm/schedule/partition.hpp"

namespace distgemm::schedule {

enum class Collective : uint8_t {
  AllGather = 0,      // rotating input shard; each GEMM writes a final output tile
  ReduceScatter = 1,  // rotating partial C; the last partial lands on the tile's owner
  AllReduce = 2,      // reduce-scatter ring, then all-gather of the finished D tiles
};

enum class Operand : uint8_t { A = 0, B = 1, C = 2 };

inline const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllGather:
      return "all_gather";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    default:
      return "all_reduce";
  }
}
inline const char* operand_name(Operand o) {
  switch (o) {
    case Operand::A:
      return "A";
    case Operand::B:
      return "B";
    default:
      return "C";
  }
}

struct AffineTileMap {
  int a = 0;  // coefficient of the device index, in units of k
  int b = 0;  // coefficient of the iteration
  int c = 0;  // constant, in units of k
};

struct ScheduleDef {
  const char* name = "";
  const char* summary = "";
  Collective collective = Collective::AllGather;
  Operand rotating = Operand::A;
  Mode split = Mode::M;  // the mode cut into S tiles (M or N)
  Partition partition;
  AffineTileMap tile;
};

class DistributedTileScheduler {
 public:
  DISTGEMM_HD DistributedTileScheduler(const ScheduleDef& def, int tp, int steps)
      : def_(def), tp_(tp), steps_(steps), k_(tp > 0 ? steps / tp : 0) {}

  DISTGEMM_HD int tp() const { return tp_; }
  DISTGEMM_HD int steps() const { return steps_; }
  DISTGEMM_HD int chunks_per_shard() const { return k_; }
  DISTGEMM_HD const ScheduleDef& def() const { return def_; }

  // Tile of the split mode that device d computes at iteration i.
  DISTGEMM_HD int tile(int d, int i) const {
    const AffineTileMap& t = def_.tile;
    long v =
        static_cast<long>(t.a) * k_ * d + static_cast<long>(t.b) * i + static_cast<long>(t.c) * k_;
    long r = v % steps_;
    return static_cast<int>(r < 0 ? r + steps_ : r);
  }
  // Device that owns tile t of the split mode (its shard holds chunk t % k).
  DISTGEMM_HD int owner(int t) const { return t / k_; }
  DISTGEMM_HD int chunk(int t) const { return t % k_; }

  // All-gather: the device whose shard the rotating operand comes from at (d, i).
  // Reduce-scatter: the device whose partial is the epilogue source at (d, i), -1 if none
  // (the first visit of a tile has no partial yet).
  DISTGEMM_HD int source_device(int d, int i) const {
    if (def_.collective == Collective::AllGather) return owner(tile(d, i));
    if (i < k_) return -1;
    int t = tile(d, i);
    for (int p = 0; p < tp_; ++p)
      if (tile(p, i - k_) == t) return p;
    return -2;  // the map does not pass partials: rejected by the plan builder
  }

  // Reduce-scatter: the device that continues the partial of (d, i) at iteration i + k, or d
  // itself at the tile's last visit (i >= S - k: the result is final). All-gather: d.
  DISTGEMM_HD int destination_device(int d, int i) const {
    if (def_.collective == Collective::AllGather) return d;
    if (i >= steps_ - k_) return d;
    int t = tile(d, i);
    for (int p = 0; p < tp_; ++p)
      if (tile(p, i + k_) == t) return p;
    return -2;
  }

  DISTGEMM_HD bool is_final(int i) const {
    return def_.collective == Collective::AllGather || i >= steps_ - k_;
  }

 private:
  ScheduleDef def_;
  int tp_;
  int steps_;
  int k_;
};

}  // namespace distgemm::schedule
