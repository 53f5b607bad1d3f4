// Which GEMM kernel configuration (output tile and cluster, see kernel/gemm_sm90.cuh) runs one
// GEMM. Host-only and pure, so that the choice is testable without a GPU and the same on every
// rank.
//
// Why several tiles: the persistent kernel runs its output tiles in waves of one tile per
// resident CTA. A GEMM with few tiles leaves SMs idle for its whole duration: a 512x4096 step (one
// of two steps of Llama-8B's O projection at 1024 tokens, TP=2) has 64 tiles of 128x256 for an
// H200's 132 SMs, so each step takes as long as the undivided GEMM. Halving the tile doubles the
// tiles; each one costs about half. Where the 128x256 grid is full, the larger tile wins: it
// reads less operand data per flop.
//
// Why clusters matter: the persistent schedulers round the tile grid up to a multiple of the
// cluster shape in each mode (CUTLASS's stream-K one to swizzle x cluster) and run the padding
// tiles through the full mainloop. With cluster 2x1 a GEMM with one 128-row M tile (decode) runs
// two, so the cluster-1x1 and cluster-1x2 configurations exist for grids the 2x1 padding would
// double.
//
// The model: time ~ waves x cost of one tile, waves = ceil(padded tiles / resident CTAs), the
// cost of each configuration's tile relative to a 128x256 cluster-2x1 one in kConfigs. The default
// 128x256 runs unless another configuration is rated at least its min_gain cheaper: inside a
// plan, programmatic dependent launch lets the next step's GEMM fill the last wave's idle SMs,
// which the model does not see, so a small modelled gain from a smaller tile is not a real one. The
// constants are provisional until calibrated by benchmarks/kernel/kernel_vs_cublas.py; their
// derivation is in docs/tuning.md. choose_tile_n is the two-tile model without padding that the
// plan simulator and the path model annotate with.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace distgemm::kernel {

// The cost of a 128x128 output tile relative to a 128x256 one, same K (time ratio x waves ratio
// of single-GPU GEMMs; docs/tuning.md).
inline constexpr double kTile128RelativeCost = 0.56;
// 128x128 only where the model rates it at least this much cheaper (see above).
inline constexpr double kTile128MinGain = 0.10;

// The margin of a configuration that is cheaper per flop (not by filling a wave): the spread of
// repeated steady-state timings of one kernel (docs/tuning.md).
inline constexpr double kLargeTileMinGain = 0.03;

// 0: chosen per GEMM by choose_tile_n; 128 or 256: that kernel for every GEMM.
inline std::string tile_n_problem(int tile_n) {
  if (tile_n == 0 || tile_n == 128 || tile_n == 256) return "";
  return "tile_n=" + std::to_string(tile_n) + " is not 0 (auto), 128 or 256";
}

struct TileEstimate {
  int64_t tiles = 0;  // output tiles of the GEMM (all batches)
  int64_t waves = 0;  // ceil(tiles / resident CTAs)
  double cost = 0;    // waves x relative cost of one tile (128x256 = 1)
};

inline TileEstimate estimate_tiles(int64_t m, int64_t n, int64_t l, int tile_n, int slots) {
  TileEstimate e;
  const int64_t s = slots > 0 ? slots : 1;
  e.tiles = ((m + 127) / 128) * ((n + tile_n - 1) / tile_n) * (l > 0 ? l : 1);
  e.waves = (e.tiles + s - 1) / s;
  e.cost = double(e.waves) * (tile_n == 128 ? kTile128RelativeCost : 1.0);
  return e;
}

// The tile width for an m x n (x l batches) GEMM given each kernel's resident CTAs on the device
// (persistent grid size): 128 where that kernel's estimate is below (1 - kTile128MinGain) of
// the 128x256 one, else 256.
inline int choose_tile_n(int64_t m, int64_t n, int64_t l, int slots_n256, int slots_n128) {
  const TileEstimate wide = estimate_tiles(m, n, l, 256, slots_n256);
  const TileEstimate narrow = estimate_tiles(m, n, l, 128, slots_n128);
  return narrow.cost < (1.0 - kTile128MinGain) * wide.cost ? 128 : 256;
}

// The persistent tile scheduler's order unless a caller sets one (GemmDesc::swizzle, raster):
// groups of 8 tiles along the raster whose wave reads the fewest operand rows (choose_raster),
// the fastest order on the Llama per-device shapes (docs/tuning.md). A larger group keeps more of A
// and B in L2 between neighbouring tiles.
inline constexpr int kDefaultSwizzle = 8;
// Resident CTAs of one GEMM kernel on an H200 (132 SMs, one CTA each): the model's slots where no
// device is asked (the simulator, the path model, host-only callers); the runtime passes the
// device's own counts.
inline constexpr int kH200ResidentCtas = 132;
inline constexpr int kDefaultRaster = 0;

// One kernel configuration: output tile tile_m x tile_n x 64, cooperative TMA warp-specialized,
// cluster cluster_m x cluster_n. Values are the GemmDesc::config numbers (0 = auto).
enum class GemmConfig : int {
  Auto = 0,
  T128x256 = 1,
  T128x128 = 2,
  T128x128C1 = 3,
  T256x192 = 4,
  T128x256SK = 5,
  E4M3x128x192 = 6,
  E4M3x128x256FA = 7,
  T128x128SK = 8
};

// How a stream-K configuration divides its work along K (GemmDesc::decomposition; CUTLASS's
// DecompositionMode): Auto is stream_k_decomposition's rule; Heuristic is CUTLASS's (whole tiles
// where the last wave is more than half full, stream-K or split-K below); DataParallel whole
// tiles; SplitK every tile in GemmDesc::splits equal K ranges; StreamK the tiles of the last
// partial wave (and of one more whole wave) spread along K over every CTA, whatever the fill.
enum class Decomposition : int {
  Auto = 0,
  Heuristic = 1,
  DataParallel = 2,
  SplitK = 3,
  StreamK = 4
};
inline constexpr const char* kDecompositionNames[] = {"auto", "heuristic", "data_parallel",
                                                      "split_k", "stream_k"};
inline constexpr int kDecompositionCount =
    sizeof(kDecompositionNames) / sizeof(kDecompositionNames[0]);

// The Decomposition number of `name`; -1 when unknown.
inline int parse_decomposition(const std::string& name) {
  for (int i = 0; i < kDecompositionCount; ++i)
    if (name == kDecompositionNames[i]) return i;
  return -1;
}

inline std::string decomposition_list() {
  std::string out;
  for (const char* n : kDecompositionNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// Why `name` (parse_decomposition gave -1) names no decomposition.
inline std::string unknown_decomposition(const std::string& name) {
  return "decomposition '" + name + "' is not one of " + decomposition_list();
}

struct ConfigShape {
  GemmConfig id;
  const char* name;
  int tile_m, tile_n, cluster_m, cluster_n;
  double relative_cost;  // one tile's time relative to a 128x256 cluster-2x1 tile, same K
  bool bf16_only;        // instantiated for bf16 only (fp16 has the first two)
  // Stream-K (CUTLASS's hybrid: whole waves data-parallel, the rest split along K among every
  // CTA and reduced through a workspace): the grid's last wave no longer idles SMs. It needs a
  // workspace that serves one GEMM at a time (GemmDesc::workspace), so the model considers it
  // only for a caller that gives one.
  bool stream_k = false;
  // An fp8 kernel (e4m3 inputs, bf16 output, tile K 128): chosen by GemmDesc::fast_accum, not by
  // the model, which compares the 16-bit configurations. The accurate one promotes wgmma's
  // accumulator into a second fp32 one every 4 k-blocks, so both live in registers: 128x192
  // fits them (each consumer warpgroup 2 x 96), 128x256 does not. The fast-accumulation one keeps a
  // single accumulator: 128x256.
  bool e4m3 = false;
  bool fast_accum = false;
  // Chosen over the default only where rated at least this much cheaper. A smaller tile's gain
  // is the idle SMs of a partial last wave, which inside a plan the next step's GEMM fills
  // anyway (programmatic dependent launch): kTile128MinGain. A larger tile's gain is per flop,
  // which no neighbour takes away: kLargeTileMinGain.
  double min_gain = kTile128MinGain;
};

// Every configuration, the default first (ties go to the earlier entry). The relative costs come
// from single-GPU GEMMs, each derived in docs/tuning.md: 128x128 measured; cluster 1x1 that plus
// the B tile it no longer multicasts; 256x192 fitted on full grids (1.5x the flops of 128x256 in
// fewer operand bytes per flop); 128x128 stream-K from its lag behind 128x256 stream-K.
inline constexpr ConfigShape kConfigs[] = {
    {GemmConfig::T128x256, "128x256", 128, 256, 2, 1, 1.0, false},
    {GemmConfig::T128x128, "128x128", 128, 128, 2, 1, kTile128RelativeCost, false},
    {GemmConfig::T128x128C1, "128x128c1", 128, 128, 1, 1, 0.60, true},
    {GemmConfig::T256x192, "256x192", 256, 192, 1, 2, 1.40, true, false, false, false,
     kLargeTileMinGain},
    {GemmConfig::T128x256SK, "128x256sk", 128, 256, 2, 1, 1.0, true, true},
    {GemmConfig::T128x128SK, "128x128sk", 128, 128, 2, 1, 0.58, true, true},
    {GemmConfig::E4M3x128x192, "e4m3_128x192", 128, 192, 2, 1, 1.0, false, false, true, false},
    {GemmConfig::E4M3x128x256FA, "e4m3_128x256fa", 128, 256, 2, 1, 1.0, false, false, true, true},
};
// What stream-K adds to a GEMM whose tiles do not fill whole waves, in waves of the
// configuration's tiles: the partial accumulators each split writes to and reads from the
// workspace, the wait of a tile's last split for the earlier ones, and the lower clock of every
// SM busy under the power cap (fitted to single-GPU runs, docs/tuning.md). Below half a wave a
// tile is split over several CTAs and the waits add up: there the model keeps the data-parallel
// configurations.
inline constexpr double kStreamKFixupWaves = 0.30;
inline constexpr int kConfigCount = sizeof(kConfigs) / sizeof(kConfigs[0]);

// The decomposition a stream-K configuration runs for GemmDesc::decomposition `decomposition`:
// the one asked for, or for Auto stream-K, which estimate_config prices. CUTLASS's heuristic
// runs whole tiles where the last wave is more than half full, and so does not take the gain the
// model expects from a stream-K configuration on a grid of 0.5-0.9 waves (docs/tuning.md).
inline Decomposition stream_k_decomposition(int decomposition) {
  return decomposition == static_cast<int>(Decomposition::Auto)
             ? Decomposition::StreamK
             : static_cast<Decomposition>(decomposition);
}

// "" when GemmDesc::decomposition and splits suit a configuration (stream_k: a stream-K one),
// else why, with the values.
inline std::string decomposition_problem(int decomposition, int splits, bool stream_k,
                                         const char* config) {
  if (decomposition < 0 || decomposition >= kDecompositionCount)
    return "decomposition=" + std::to_string(decomposition) + " is not one of 0.." +
           std::to_string(kDecompositionCount - 1) + " (" + decomposition_list() + ")";
  const bool split_k = decomposition == static_cast<int>(Decomposition::SplitK);
  if (splits < 1 || (splits > 1 && !split_k) || (split_k && splits < 2))
    return "splits=" + std::to_string(splits) + " with decomposition " +
           kDecompositionNames[decomposition] +
           ": split_k takes splits >= 2, every other decomposition splits=1";
  if (!stream_k && (decomposition != 0 || splits != 1))
    return std::string("decomposition ") + kDecompositionNames[decomposition] +
           " (splits=" + std::to_string(splits) + ") is for the stream-K configurations; config " +
           config + " runs whole tiles: leave decomposition auto and splits 1";
  return "";
}

// The shape of configuration `c` (1..kConfigCount), or nullptr.
inline const ConfigShape* config_shape(int c) {
  for (const auto& s : kConfigs)
    if (static_cast<int>(s.id) == c) return &s;
  return nullptr;
}

// "auto" for 0, the configuration's name, or "" for an unknown number.
inline std::string config_name(int c) {
  if (c == 0) return "auto";
  const ConfigShape* s = config_shape(c);
  return s ? s->name : "";
}

inline std::string config_list() {
  std::string out = "0 (auto)";
  for (const auto& s : kConfigs)
    out += std::string(", ") + std::to_string(static_cast<int>(s.id)) + " (" + s.name + ")";
  return out;
}

// The configuration number of `name` ("auto" = 0); -1 when unknown.
inline int parse_config(const std::string& name) {
  if (name == "auto") return 0;
  for (const auto& s : kConfigs)
    if (name == s.name) return static_cast<int>(s.id);
  return -1;
}

// Whether configuration `c` has a kernel for the 16-bit dtype (bf16 = true) and B layout.
inline bool config_available(int c, bool bf16, bool b_n_major) {
  const ConfigShape* s = config_shape(c);
  if (!s || s->e4m3 || (s->bf16_only && !bf16)) return false;
  return !b_n_major || s->id == GemmConfig::T128x256;  // the one N-contiguous-B kernel
}

inline bool config_is_stream_k(int c) {
  const ConfigShape* s = config_shape(c);
  return s && s->stream_k;
}

// The configurations with a kernel for the dtype and B layout, in kConfigs order; the stream-K
// ones only with `stream_k` (a caller that provides their workspace).
inline std::vector<int> available_configs(bool bf16, bool b_n_major, bool stream_k = false) {
  std::vector<int> out;
  for (const auto& s : kConfigs)
    if (config_available(static_cast<int>(s.id), bf16, b_n_major) && (stream_k || !s.stream_k))
      out.push_back(static_cast<int>(s.id));
  return out;
}

inline bool config_is_e4m3(int c) {
  const ConfigShape* s = config_shape(c);
  return s && s->e4m3;
}

// The fp8 configuration of a GEMM (e4m3 inputs, K-contiguous B): fast accumulation or not.
inline int e4m3_config(bool fast_accum) {
  return static_cast<int>(fast_accum ? GemmConfig::E4M3x128x256FA : GemmConfig::E4M3x128x192);
}

// The configuration a tile_n request names: 128 -> 128x128, 256 -> 128x256 (both cluster 2x1).
inline int config_of_tile_n(int tile_n) {
  return static_cast<int>(tile_n == 128 ? GemmConfig::T128x128 : GemmConfig::T128x256);
}

// The largest swizzle <= `swizzle` that divides the tile grid (tm x tn tiles) in units of the
// cluster. CUTLASS's stream-K scheduler rounds each mode up to a multiple of swizzle x cluster,
// and padding tiles cost whole mainloops (swizzle 8 on 8 M tiles would pad them to 16), so its
// kernel runs with this one. The data-parallel kernels walk any grid unpadded (tile_walk.hpp) and
// run the swizzle asked for.
inline int effective_swizzle(int64_t tm, int64_t tn, int cluster_m, int cluster_n, int swizzle) {
  int sw = swizzle > 0 ? swizzle : 1;
  while (sw > 1 && (tm % (int64_t(sw) * cluster_m) != 0 || tn % (int64_t(sw) * cluster_n) != 0))
    sw /= 2;
  return sw;
}

// The swizzle a configuration's scheduler runs for a request of `swizzle` on tm x tn tiles: as
// asked for by the data-parallel walk, lowered (effective_swizzle) for CUTLASS's stream-K one.
inline int scheduler_swizzle(bool stream_k, int64_t tm, int64_t tn, int cluster_m, int cluster_n,
                             int swizzle) {
  return stream_k ? effective_swizzle(tm, tn, cluster_m, cluster_n, swizzle) : swizzle;
}

// The operand rows one wave of the persistent grid reads per k-step with raster `raster` (1 along
// M, 2 along N): the A rows plus the B rows (output columns) of the tiles it runs at once. A wave
// is the grid's first `slots` CTAs, i.e. the first visits of the tile order: tile_walk.hpp's for
// the data-parallel kernels, CUTLASS's padded one (groups of the effective swizzle, cluster i in
// minor group i / (sw x major), major (i / sw) % major) for stream-K. Each operand row a wave
// reads comes from DRAM or L2 once and serves every tile of the wave that shares it, so fewer
// rows mean more reuse.
inline int64_t wave_operand_rows(const ConfigShape& c, int64_t m, int64_t n, int slots, int swizzle,
                                 int raster) {
  const int64_t tm = (m + c.tile_m - 1) / c.tile_m, tn = (n + c.tile_n - 1) / c.tile_n;
  const bool along_n = raster == 2;
  // Modes in clusters (each is padded to whole clusters).
  const int64_t cm_all = (tm + c.cluster_m - 1) / c.cluster_m;
  const int64_t cn_all = (tn + c.cluster_n - 1) / c.cluster_n;
  const int64_t minor_all = along_n ? cm_all : cn_all, major_all = along_n ? cn_all : cm_all;
  const int64_t wave = std::max<int64_t>(1, slots / (c.cluster_m * c.cluster_n));
  int64_t minor = 0, major = 0;
  const int64_t sw = scheduler_swizzle(c.stream_k, tm, tn, c.cluster_m, c.cluster_n, swizzle);
  if (c.stream_k) {
    const int64_t full_groups = wave / (sw * major_all), rest = wave % (sw * major_all);
    major = full_groups > 0 ? major_all : (rest + sw - 1) / sw;
    minor = std::min(minor_all, full_groups * sw + std::min(sw, rest));
  } else {
    // Groups of `sw` minor clusters (the last one narrower), each visited minor-first.
    const int64_t group = sw > 0 ? sw : 1;
    int64_t left = std::min(wave, minor_all * major_all);
    for (int64_t first = 0; left > 0 && first < minor_all;) {
      const int64_t width = std::min(group, minor_all - first);
      const int64_t take = std::min(left, width * major_all);
      minor += std::min(take, width);
      major = std::max(major, (take + width - 1) / width);
      left -= take;
      first += width;
    }
  }
  const int64_t tiles_m = (along_n ? minor : major) * c.cluster_m;
  const int64_t tiles_n = (along_n ? major : minor) * c.cluster_n;
  return std::min(tiles_m, tm) * c.tile_m + std::min(tiles_n, tn) * c.tile_n;
}

// An operand up to this size stays in L2 (50 MB on an H100 or H200) once read, beside the other
// operand's stream and the output tiles: it is read from DRAM once in either order.
inline constexpr int64_t kL2ResidentOperandBytes = int64_t(16) << 20;

// The operand rows a whole m x n x k GEMM reads from DRAM with raster `raster`, in rows of K. A
// group of `swizzle` minor clusters passes along the whole major mode, so its slice of the minor
// operand (A for raster 2, B for raster 1) is read once and stays in L2 over the pass, while the
// major operand is read again for every group, unless it fits in L2 (kL2ResidentOperandBytes).
// Raster 2: m + n x ceil(M tiles / (swizzle x cluster_m)); raster 1 the same with the modes
// swapped.
inline int64_t band_operand_rows(const ConfigShape& c, int64_t m, int64_t n, int64_t k, int swizzle,
                                 int raster) {
  const int64_t tm = (m + c.tile_m - 1) / c.tile_m, tn = (n + c.tile_n - 1) / c.tile_n;
  const int64_t sw = scheduler_swizzle(c.stream_k, tm, tn, c.cluster_m, c.cluster_n, swizzle);
  const int64_t row_bytes = k * (c.e4m3 ? 1 : 2);
  const auto passes = [&](int64_t rows, int64_t tiles, int64_t group_tiles) -> int64_t {
    return rows * row_bytes <= kL2ResidentOperandBytes ? 1
                                                       : (tiles + group_tiles - 1) / group_tiles;
  };
  if (raster == 2) return m + n * passes(n, tm, sw * c.cluster_m);
  return n + m * passes(m, tn, sw * c.cluster_n);
}

// The raster of GemmDesc::raster 0 for configuration `c` on an m x n x k GEMM with `slots`
// resident CTAs: the one whose wave reads kRasterMinGain fewer operand rows
// (wave_operand_rows); else the one whose groups read kRasterMinGain fewer rows from DRAM over
// the whole GEMM (band_operand_rows); else CUTLASS's heuristic (0: along M where the grid has more
// N tiles than M tiles). Where a small swizzle (a caller's) spreads a wave, the first decides;
// with the default swizzle 8 the two orders' waves read about as many rows, and the second
// decides (docs/tuning.md has the measurements).
inline constexpr double kRasterMinGain = 0.10;
inline int choose_raster(int c, int64_t m, int64_t n, int64_t k, int slots, int swizzle) {
  const ConfigShape* s = config_shape(c);
  if (s == nullptr) return 0;
  const auto pick = [](double along_m, double along_n) {
    if (along_m < (1.0 - kRasterMinGain) * along_n) return 1;
    if (along_n < (1.0 - kRasterMinGain) * along_m) return 2;
    return 0;
  };
  const int by_wave = pick(double(wave_operand_rows(*s, m, n, slots, swizzle, 1)),
                           double(wave_operand_rows(*s, m, n, slots, swizzle, 2)));
  if (by_wave != 0) return by_wave;
  return pick(double(band_operand_rows(*s, m, n, k, swizzle, 1)),
              double(band_operand_rows(*s, m, n, k, swizzle, 2)));
}

struct ConfigEstimate {
  int64_t tiles = 0;  // output tiles the scheduler runs, padding included (all batches)
  int64_t waves = 0;  // ceil(tiles / resident CTAs)
  double cost = 0;    // waves x the configuration's relative tile cost
};

inline int64_t round_up(int64_t v, int64_t unit) { return (v + unit - 1) / unit * unit; }

inline ConfigEstimate estimate_config(const ConfigShape& c, int64_t m, int64_t n, int64_t l,
                                      int slots, int swizzle) {
  const int64_t tm = (m + c.tile_m - 1) / c.tile_m;
  const int64_t tn = (n + c.tile_n - 1) / c.tile_n;
  // The data-parallel walk pads only to whole clusters; CUTLASS's stream-K scheduler pads to
  // swizzle x cluster (with the swizzle lowered until that adds nothing).
  const int sw = c.stream_k ? effective_swizzle(tm, tn, c.cluster_m, c.cluster_n, swizzle) : 1;
  ConfigEstimate e;
  e.tiles = round_up(tm, int64_t(sw) * c.cluster_m) * round_up(tn, int64_t(sw) * c.cluster_n) *
            (l > 0 ? l : 1);
  const int64_t s = slots > 0 ? slots : 1;
  e.waves = (e.tiles + s - 1) / s;
  e.cost = double(e.waves) * c.relative_cost;
  // Stream-K spreads a partial last wave's work over every CTA, at the price of its fixup; with
  // less than half a wave it is not a candidate (infinite cost).
  if (c.stream_k && e.tiles % s != 0)
    e.cost = 2 * e.tiles < s ? std::numeric_limits<double>::infinity()
                             : (double(e.tiles) / double(s) + kStreamKFixupWaves) * c.relative_cost;
  return e;
}

// The configuration for an m x n (x l batches) GEMM among `candidates` (kConfigs numbers, the
// default first), given each candidate's resident CTAs (`slots`, same order) and the swizzle
// the launch asks for: the cheapest estimate among those below (1 - their min_gain) of the first
// candidate's; else the first.
inline int choose_config(int64_t m, int64_t n, int64_t l, const std::vector<int>& candidates,
                         const std::vector<int>& slots, int swizzle) {
  if (candidates.empty()) return 0;
  double first = 0, best_cost = 0;
  int best = candidates[0];
  for (size_t i = 0; i < candidates.size(); ++i) {
    const ConfigShape* c = config_shape(candidates[i]);
    if (!c) continue;
    const double cost = estimate_config(*c, m, n, l, i < slots.size() ? slots[i] : 1, swizzle).cost;
    if (i == 0) {
      first = best_cost = cost;
    } else if (cost < best_cost && cost < (1.0 - c->min_gain) * first) {
      best_cost = cost;
      best = candidates[i];
    }
  }
  return best;
}

}  // namespace distgemm::kernel
