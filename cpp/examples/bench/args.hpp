// distgemm_bench's command line: the options, their defaults, and the parser (exit code 2 with
// the usage message on a bad argument).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "distgemm/device/graph.hpp"
#include "distgemm/schedule/plan.hpp"

namespace distgemm::bench {

struct Args {
  std::string schedule = "ag_rotate_a";
  int tp = 2, steps = 0;  // steps 0 (--steps auto, the default): schedule::default_steps
  int64_t m = 8192, n = 8192, k = 8192, l = 1;
  std::string dtype = "bf16";  // a name of kDTypes
  // fp8 only: --scales row (one scale per row of A and per row of B) or tensor (one per operand,
  // the default); --fast-accum: the fast-accumulation kernel (GraphOptions::fast_accum).
  bool row_scales = false;
  bool fast_accum = false;
  int iterations = 50, warmup = 10, warmup_ms = 1000;  // iterations 0: time-based ("auto")
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  double timeout_s = device::GraphOptions{}.timeout_s;
  long replays = 0;
  int missing = -1;
  bool check_update = false, verify = true, local = true;
  int swizzle = device::GraphOptions{}.swizzle, raster = device::GraphOptions{}.raster;
  device::GraphOptions::Pdl pdl = device::GraphOptions::Pdl::Auto;  // --pdl / --no-pdl
  std::optional<schedule::PartialVia> partial_via;  // --partial-via; none: the library default
  int tile_n = device::GraphOptions{}.tile_n;       // --tile-n auto|128|256 (0: auto)
  uint64_t seed = 1234;
  int64_t verify_rows = 0;  // rows of D checked against the reference; 0: all
  std::string graph_json;   // --graph-json: every device's captured graph, written here
  // Sweep mode (sweep non-empty: "quick" or "full").
  std::string sweep, csv;
  std::vector<std::string> models, layers;
  std::vector<int64_t> tokens;
  bool dry_run = false;
};

// --dtype's names, one per kernel dtype, no aliases. fp8: e4m3 A and B, bf16 D, C and bias.
struct DTypeName {
  const char* name;
  kernel::DType dtype;
};
inline constexpr DTypeName kDTypes[] = {
    {"bf16", kernel::DType::BF16}, {"fp16", kernel::DType::FP16}, {"fp8", kernel::DType::E4M3}};

// The kernel dtype of --dtype (parse() has checked the name).
kernel::DType dtype_of(const Args& a);
// The scale kind a RESULT line and the sweep's CSV report: "tensor" or "row" at fp8, else "none".
const char* scales_name(const Args& a);

// Prints "error: <why>" and the usage to stderr and exits with code 2.
[[noreturn]] void usage(const std::string& why);

// The options of argv, checked; calls usage() on the first bad one.
Args parse(int argc, char** argv);

}  // namespace distgemm::bench
