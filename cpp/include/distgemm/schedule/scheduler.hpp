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
// t / k: each device's shard is split into k consecutive chunks (TileSplit: where each tile
// starts and how long it is, also when S does not divide the split mode). Pure integer math,
// runtime TP and S, usable in host and device code.
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

// Where the S tiles of the split mode start: the extent is cut into TP shards, each shard into k
// chunks (tile t = shard t / k, chunk t % k), each cut into equal parts where they divide it
// into whole units (or below one unit, where the extent is no whole number of units).
// Where they do not, the parts are whole `unit`s (1 element along M; along N the 8 elements
// that make 16 bytes of a 2-byte dtype, so that every tile is a width the GEMM kernel's TMA
// takes), balanced to within one unit, the first ones longer, and the last part also takes what
// is left below one unit. A part is empty where its shard has fewer units than parts (M=1 at
// TP=2: tile 1); the plan builder then emits no op for it. Schedules that shard the split mode
// need TP to divide it (validate), so their shards are exactly the devices' shards.
struct TileSplit {
  int64_t extent = 0;
  int tp = 1;
  int k = 1;  // chunks per shard
  int64_t unit = 1;

  // Start of part j of `parts` equal-as-possible parts of [0, extent), as described above.
  DISTGEMM_HD static int64_t part_begin(int64_t extent, int parts, int j, int64_t unit) {
    if (j >= parts) return extent;
    // Equal parts where they divide the extent and are whole units, or are below one unit of an
    // extent that is no whole number of units (an abstract plan of tiny extents, which no GEMM
    // kernel takes). An extent of whole units cut into more parts than it has units gets whole
    // units and empty parts, never parts the kernel refuses (24 columns in 4: 8 + 8 + 8 + 0).
    const int64_t equal = extent / parts;
    if (extent % parts == 0 && (equal % unit == 0 || (equal < unit && extent % unit != 0)))
      return equal * j;
    const int64_t units = extent / unit, base = units / parts, longer = units % parts;
    return unit * (base * j + (j < longer ? j : longer));
  }
  // First element of tile t (t = S: the extent).
  DISTGEMM_HD int64_t begin(int t) const {
    const int shard = t / k;
    if (shard >= tp) return extent;
    const int64_t lo = part_begin(extent, tp, shard, 1), hi = part_begin(extent, tp, shard + 1, 1);
    return lo + part_begin(hi - lo, k, t % k, unit);
  }
  DISTGEMM_HD int64_t size(int t) const { return begin(t + 1) - begin(t); }
  // First element of tile t within its owner's shard.
  DISTGEMM_HD int64_t begin_in_shard(int t) const { return begin(t) - begin(t / k * k); }
  // The longest tile (a receive slot's extent along the split mode).
  DISTGEMM_HD int64_t max_size() const {
    int64_t m = 0;
    for (int t = 0; t < tp * k; ++t) m = size(t) > m ? size(t) : m;
    return m;
  }
};

// The unit of an uneven split of mode N (TileSplit::unit): 16 bytes of the 2-byte dtypes, the
// granularity of TMA rows (kernel/gemm_extents.hpp).
inline constexpr int64_t kSplitUnitN = 8;

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
