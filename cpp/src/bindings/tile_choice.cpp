// distgemm._core's host-only GEMM configuration model (kernel/tile_choice.hpp): the tile width
// choice of the plan simulator (choose_tile_n) and the per-GEMM configuration choice of the
// runtime (choose_config), so that Python and the tests see the same rule without a GPU.
#include "distgemm/kernel/tile_choice.hpp"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <iterator>
#include <string>
#include <vector>

#include "distgemm/kernel/gemm.hpp"  // parse_dtype
#include "distgemm/kernel/kernel_table.hpp"
#include "distgemm/kernel/tile_walk.hpp"
#include "kernel_table_rows.hpp"

namespace py = pybind11;
namespace k = distgemm::kernel;

namespace {

// The configuration numbers of the dtype ("bf16"/"fp16"/"e4m3", torch's names too) and B layout:
// the model's candidates for 16-bit types; e4m3's two kernels (accurate, fast accumulation),
// which fast_accum chooses between.
std::vector<int> candidates_of(const std::string& dtype, bool b_n_major, bool stream_k) {
  if (dtype == "e4m3" || dtype == "float8_e4m3fn") {
    if (b_n_major) throw py::value_error("fp8 (e4m3) has no kernel for an N-contiguous B");
    return {k::e4m3_config(false), k::e4m3_config(true)};
  }
  bool bf16 = true;
  if (dtype == "fp16" || dtype == "float16")
    bf16 = false;
  else if (dtype != "bf16" && dtype != "bfloat16")
    throw py::value_error("dtype '" + dtype + "' is not supported: use bf16, fp16 or e4m3");
  return k::available_configs(bf16, b_n_major, stream_k);
}

py::dict choose_config(int64_t m, int64_t n, int64_t l, const std::string& dtype, bool b_n_major,
                       const py::object& slots, int swizzle, bool stream_k) {
  if (m < 1 || n < 1 || l < 1 || swizzle < 1)
    throw py::value_error("choose_config needs m, n, l and swizzle >= 1, got m=" +
                          std::to_string(m) + " n=" + std::to_string(n) +
                          " l=" + std::to_string(l) + " swizzle=" + std::to_string(swizzle));
  if (dtype == "e4m3" || dtype == "float8_e4m3fn")
    throw py::value_error(
        "choose_config compares the 16-bit configurations; an fp8 (e4m3) GEMM runs the kernel "
        "its fast_accum names (e4m3_128x192, or e4m3_128x256fa with fast accumulation)");
  const std::vector<int> candidates = candidates_of(dtype, b_n_major, stream_k);
  std::vector<int> per;
  for (int c : candidates) {
    const std::string name = k::config_name(c);
    int v = 0;
    if (py::isinstance<py::dict>(slots)) {
      const py::dict d = slots.cast<py::dict>();
      if (!d.contains(name))
        throw py::value_error("choose_config: slots has no entry for config " + name);
      v = d[py::str(name)].cast<int>();
    } else {
      v = slots.cast<int>();
    }
    if (v < 1)
      throw py::value_error("choose_config: slots of config " + name + " is " + std::to_string(v) +
                            ", must be >= 1");
    per.push_back(v);
  }
  py::dict out;
  out["config"] = k::config_name(k::choose_config(m, n, l, candidates, per, swizzle));
  py::list names;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const std::string name = k::config_name(candidates[i]);
    names.append(name);
    const auto e = k::estimate_config(*k::config_shape(candidates[i]), m, n, l, per[i], swizzle);
    out[py::str(name)] =
        py::dict(py::arg("tiles") = e.tiles, py::arg("waves") = e.waves, py::arg("cost") = e.cost);
  }
  out["candidates"] = names;
  return out;
}

}  // namespace

void register_tile_choice(py::module_& m) {
  m.def(
      "choose_tile_n",
      [](int64_t m_, int64_t n, int64_t l, int slots_n256, int slots_n128) {
        if (m_ < 1 || n < 1 || l < 1 || slots_n256 < 1 || slots_n128 < 1)
          throw py::value_error(
              "choose_tile_n needs m, n, l and both slot counts >= 1, got m=" + std::to_string(m_) +
              " n=" + std::to_string(n) + " l=" + std::to_string(l) + " slots_n256=" +
              std::to_string(slots_n256) + " slots_n128=" + std::to_string(slots_n128));
        py::dict d;
        d["tile_n"] = k::choose_tile_n(m_, n, l, slots_n256, slots_n128);
        for (int t : {256, 128}) {
          const auto e = k::estimate_tiles(m_, n, l, t, t == 256 ? slots_n256 : slots_n128);
          d[py::str("n" + std::to_string(t))] = py::dict(
              py::arg("tiles") = e.tiles, py::arg("waves") = e.waves, py::arg("cost") = e.cost);
        }
        return d;
      },
      py::arg("m"), py::arg("n"), py::arg("l") = 1, py::arg("slots_n256") = k::kH200ResidentCtas,
      py::arg("slots_n128") = k::kH200ResidentCtas,
      "The GEMM kernel's output tile width (128 or 256) for an m x n (x l) GEMM, given each "
      "kernel's resident CTAs: {'tile_n', 'n256': {'tiles', 'waves', 'cost'}, 'n128': {...}} "
      "(kernel/tile_choice.hpp; the runtime passes the device's real slot counts).");
  m.attr("TILE128_RELATIVE_COST") = k::kTile128RelativeCost;
  m.attr("TILE128_MIN_GAIN") = k::kTile128MinGain;
  m.def("choose_config", &choose_config, py::arg("m"), py::arg("n"), py::arg("l") = 1,
        py::arg("dtype") = "bf16", py::arg("b_n_major") = false,
        py::arg("slots") = k::kH200ResidentCtas, py::arg("swizzle") = k::kDefaultSwizzle,
        py::arg("stream_k") = false,
        "The GEMM kernel configuration the runtime's model picks for an m x n (x l) GEMM of "
        "`dtype` (kernel/tile_choice.hpp): {'config': name, 'candidates': [names], name: "
        "{'tiles', 'waves', 'cost'} per candidate}. `slots`: resident CTAs, one int for every "
        "configuration or {name: int} (the runtime passes the device's real counts). "
        "`stream_k`: the stream-K configurations are candidates too (the GEMM has a workspace).");
  m.def(
      "gemm_config_names",
      [](const std::string& dtype, bool b_n_major, bool stream_k) {
        std::vector<std::string> out;
        for (int c : candidates_of(dtype, b_n_major, stream_k)) out.push_back(k::config_name(c));
        return out;
      },
      py::arg("dtype") = "bf16", py::arg("b_n_major") = false, py::arg("stream_k") = false,
      "The GEMM kernel configurations of `dtype` (and B layout), the default first: the names "
      "gemm(config=...) takes besides 'auto' (the stream-K ones, which need a workspace, with "
      "`stream_k`).");
  m.def(
      "kernel_table_row",
      [](const std::vector<py::dict>& rows, const std::string& dtype, int64_t m_, int64_t n,
         int64_t k_, int64_t l, bool b_n_major, bool scale_a_rows, bool scale_b_rows,
         bool fast_accum) -> py::object {
        std::vector<k::KernelTableRow> table;
        for (const auto& r : rows) table.push_back(distgemm::bindings::table_row_of(r, false));
        const k::KernelTableRow* hit =
            k::table_row(table, static_cast<int>(k::parse_dtype(dtype)), m_, n, k_, l, b_n_major,
                         k::fp8_kind_of(scale_a_rows, scale_b_rows, fast_accum));
        if (!hit) return py::none();
        return py::int_(hit - table.data());
      },
      py::arg("rows"), py::arg("dtype"), py::arg("m"), py::arg("n"), py::arg("k"), py::arg("l") = 1,
      py::arg("b_n_major") = false, py::kw_only(), py::arg("scale_a_rows") = false,
      py::arg("scale_b_rows") = false, py::arg("fast_accum") = false,
      "The index of the row of a kernel table (rows {'dtype', 'm', 'n', 'k', ...}) that "
      "chooses the kernel of this GEMM, or None (kernel/kernel_table.hpp's table_row: same "
      "dtype, N and K, for e4m3 the same scale kinds and accumulation, the nearest M within "
      "kTableMaxMRatio, ties to the larger M; never for batches or an N-contiguous B). "
      "Host-only.");
  m.attr("KERNEL_TABLE_MAX_M_RATIO") = k::kTableMaxMRatio;
  m.def(
      "gemm_config_table",
      [] {
        py::dict out;
        for (const auto& c : k::kConfigs)
          out[py::str(c.name)] = py::dict(
              py::arg("id") = static_cast<int>(c.id), py::arg("tile_m") = c.tile_m,
              py::arg("tile_n") = c.tile_n, py::arg("cluster_m") = c.cluster_m,
              py::arg("cluster_n") = c.cluster_n, py::arg("relative_cost") = c.relative_cost,
              py::arg("bf16_only") = c.bf16_only, py::arg("stream_k") = c.stream_k,
              py::arg("e4m3") = c.e4m3, py::arg("fast_accum") = c.fast_accum,
              py::arg("min_gain") = c.min_gain);
        return out;
      },
      "{name: {'id', 'tile_m', 'tile_n', 'cluster_m', 'cluster_n', 'relative_cost', "
      "'bf16_only', 'stream_k', 'e4m3', 'fast_accum', 'min_gain'}} of every GEMM kernel "
      "configuration (kernel/tile_choice.hpp's kConfigs).");
  m.def(
      "choose_raster",
      [](const std::string& config, int64_t m_, int64_t n, int64_t k_, int slots, int swizzle) {
        if (m_ < 1 || n < 1 || k_ < 1 || slots < 1 || swizzle < 1)
          throw py::value_error(
              "choose_raster needs m, n, k, slots and swizzle >= 1, got m=" + std::to_string(m_) +
              " n=" + std::to_string(n) + " k=" + std::to_string(k_) +
              " slots=" + std::to_string(slots) + " swizzle=" + std::to_string(swizzle));
        const int c = k::parse_config(config);
        if (c <= 0)
          throw py::value_error("choose_raster: config '" + config +
                                "' names no kernel; one of gemm_config_table()");
        const k::ConfigShape& s = *k::config_shape(c);
        py::dict d;
        d["raster"] = k::choose_raster(c, m_, n, k_, slots, swizzle);
        d["rows_along_m"] = k::wave_operand_rows(s, m_, n, slots, swizzle, 1);
        d["rows_along_n"] = k::wave_operand_rows(s, m_, n, slots, swizzle, 2);
        d["dram_rows_along_m"] = k::band_operand_rows(s, m_, n, k_, swizzle, 1);
        d["dram_rows_along_n"] = k::band_operand_rows(s, m_, n, k_, swizzle, 2);
        return d;
      },
      py::arg("config"), py::arg("m"), py::arg("n"), py::arg("k"),
      py::arg("slots") = k::kH200ResidentCtas, py::arg("swizzle") = k::kDefaultSwizzle,
      "The tile order an m x n x k GEMM on configuration `config` runs with when the caller sets "
      "none (gemm(raster=0)), given the configuration's resident CTAs: {'raster': 1 along M, 2 "
      "along N or 0 CUTLASS's heuristic, 'rows_along_m', 'rows_along_n': the operand rows a wave "
      "reads per k-step in each order, 'dram_rows_along_m', 'dram_rows_along_n': the rows of K "
      "the whole GEMM reads from DRAM in each order} (kernel/tile_choice.hpp's choose_raster).");
  m.def(
      "walk_clusters",
      [](int64_t minor, int64_t major, int64_t group) {
        if (minor < 1 || major < 1 || group < 1 || minor * major > (int64_t(1) << 24))
          throw py::value_error(
              "walk_clusters needs minor, major and group >= 1 and minor x major <= 2^24, got "
              "minor=" +
              std::to_string(minor) + " major=" + std::to_string(major) +
              " group=" + std::to_string(group));
        const k::TileWalk w{uint32_t(minor), uint32_t(major), uint32_t(group)};
        py::list out;
        for (int64_t i = 0; i < minor * major; ++i) {
          const k::WalkCoord c = k::walk_cluster(uint32_t(i), w);
          out.append(py::make_tuple(c.minor, c.major));
        }
        return out;
      },
      py::arg("minor"), py::arg("major"), py::arg("group"),
      "The cluster (minor, major) that each visit of the data-parallel kernels' tile order runs, "
      "for a grid of minor x major clusters swizzled in groups of `group` (kernel/tile_walk.hpp, "
      "the function the device scheduler calls).");
  m.def(
      "decomposition_problem",
      [](const std::string& config, const std::string& decomposition, int splits) {
        const int c = k::parse_config(config);
        if (c < 0)
          throw py::value_error("decomposition_problem: config '" + config + "' is unknown");
        const int d = k::parse_decomposition(decomposition);
        if (d < 0) return k::unknown_decomposition(decomposition);
        return k::decomposition_problem(d, splits, k::config_is_stream_k(c), config.c_str());
      },
      py::arg("config"), py::arg("decomposition"), py::arg("splits") = 1,
      "'' when gemm(config=, decomposition=, splits=) suits the configuration (the GEMM kernel's "
      "check, host-only), else why.");
  m.attr("DECOMPOSITIONS") = std::vector<std::string>(std::begin(k::kDecompositionNames),
                                                      std::end(k::kDecompositionNames));
  m.attr("RASTER_MIN_GAIN") = k::kRasterMinGain;
  m.attr("L2_RESIDENT_OPERAND_BYTES") = k::kL2ResidentOperandBytes;
  m.attr("STREAM_K_FIXUP_WAVES") = k::kStreamKFixupWaves;
  m.attr("DEFAULT_SWIZZLE") = k::kDefaultSwizzle;
  m.attr("H200_RESIDENT_CTAS") = k::kH200ResidentCtas;
}
