// distgemm_bench's command-line parser: every option into Args, the single-case and sweep rules
// checked, usage() on the first violation.
#include "args.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "all.hpp"
#include "distgemm/kernel/tile_choice.hpp"
#include "llama_shapes.hpp"

namespace distgemm::bench {

namespace {

// The least warm-up (ms) of a sweep: an idle GPU needs a few hundred ms of load to reach its
// steady clock.
constexpr int kMinSweepWarmupMs = 200;

std::vector<std::string> split_list(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Option k's value v as an integer in lo..hi; usage() names the value and the range otherwise.
int64_t int_arg(const std::string& k, const std::string& v, int64_t lo, int64_t hi,
                const char* why = "") {
  std::size_t used = 0;
  long long x = 0;
  bool in_range = true;
  try {
    x = std::stoll(v, &used);
  } catch (const std::out_of_range&) {
    in_range = false;
    used = v.size();
  } catch (const std::invalid_argument&) {
    used = 0;
  }
  if (v.empty() || used != v.size()) usage(k + " takes an integer, got '" + v + "'");
  if (!in_range || x < lo || x > hi)
    usage(k + " " + v + " is not in " + std::to_string(lo) + ".." + std::to_string(hi) + why);
  return x;
}

// Option k's value v as a finite number (above 0 with positive).
double float_arg(const std::string& k, const std::string& v, bool positive = false) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  if (v.empty() || used != v.size() || !std::isfinite(x))
    usage(k + " takes a finite number, got '" + v + "'");
  if (positive && !(x > 0)) usage(k + " " + v + " is not above 0");
  return x;
}

// A problem extent: CUTLASS takes int32 problem shapes.
int64_t extent_arg(const std::string& k, const std::string& v) {
  return int_arg(k, v, 1, schedule::kMaxExtent, " (2**31-1: the GEMMs take int32 extents)");
}

// Each operand of the single case holds at most 2**60 elements (schedule::operand_size_problem).
void check_operand_sizes(const Args& a) {
  const std::string why = schedule::operand_size_problem({a.m, a.n, a.k, a.l});
  if (!why.empty()) usage(why + " (--m --n --k --l)");
}

// Sweep mode: the filters are names of llama_shapes.hpp; single-case options do not apply.
void finish_sweep_args(Args& a, const std::set<std::string>& given) {
  if (a.sweep != "quick" && a.sweep != "full") usage("--sweep takes quick or full, got " + a.sweep);
  for (const char* k : {"--schedule", "--steps", "--m", "--n", "--k", "--l", "--alpha", "--beta",
                        "--bias", "--replays", "--simulate-missing-device", "--check-update",
                        "--no-verify", "--no-local", "--graph-json"})
    if (given.count(k))
      usage(std::string(k) +
            " does not apply to --sweep (each case's shape, schedule and S come "
            "from the sweep; every case is verified and compared with its local "
            "GEMM)");
  try {
    for (const std::string& m : a.models) (void)llama::find_model(m);
    for (const std::string& l : a.layers) (void)llama::find_layer(l);
  } catch (const std::invalid_argument& e) {
    usage(e.what());
  }
  for (int64_t t : a.tokens)
    if (std::find(std::begin(llama::kTokens), std::end(llama::kTokens), t) ==
        std::end(llama::kTokens)) {
      std::string valid;
      for (int64_t v : llama::kTokens) valid += (valid.empty() ? "" : ", ") + std::to_string(v);
      usage("--tokens " + std::to_string(t) + " is not a sweep size; valid tokens: " + valid);
    }
  if (!given.count("--tp")) {
    if (a.dry_run) usage("--dry-run needs --tp: it lists the cases without asking CUDA for GPUs");
    a.tp = 0;  // every visible GPU, at most schedule::kMaxTp: resolved when they are counted
  } else if (a.tp < 1 || a.tp > schedule::kMaxTp) {
    usage("--tp must be 1.." + std::to_string(schedule::kMaxTp));
  }
  if (!given.count("--warmup-ms")) a.warmup_ms = llama::kSweepTiming.warmup_ms;
  if (a.warmup_ms < kMinSweepWarmupMs)
    usage("--warmup-ms " + std::to_string(a.warmup_ms) + " is below " +
          std::to_string(kMinSweepWarmupMs) +
          " in --sweep mode: an idle "
          "GPU needs a few hundred ms of load to reach its steady clock");
  if (!given.count("--iterations")) a.iterations = 0;
  if (!given.count("--warmup")) a.warmup = 2;  // the time-based warm-up does the real work
  if (!given.count("--verify-rows")) a.verify_rows = 256;
}

// --dtype is one of kDTypes; the fp8 options go with fp8 only, and the options the fp8 kernels do
// not have are refused with the reason.
void check_dtype(const Args& a, const std::set<std::string>& given) {
  std::string names;
  bool known = false;
  for (const DTypeName& d : kDTypes) {
    names += (names.empty() ? "" : ", ") + std::string(d.name);
    known = known || a.dtype == d.name;
  }
  if (!known) usage("--dtype takes one of " + names + ", got " + a.dtype);
  if (dtype_of(a) != kernel::DType::E4M3) {
    for (const char* k : {"--scales", "--fast-accum"})
      if (given.count(k))
        usage(std::string(k) + " needs --dtype fp8, got --dtype " + a.dtype +
              ": it sets the fp8 scales or kernel");
    return;
  }
  if (a.alpha != 1.0f) {
    std::ostringstream alpha;
    alpha << a.alpha;
    usage("--alpha " + alpha.str() +
          " with --dtype fp8: the fp8 kernels scale by the operands' scales only (alpha is folded "
          "into them); leave --alpha 1");
  }
  if (a.tile_n != 0)
    usage("--tile-n " + std::to_string(a.tile_n) +
          " with --dtype fp8: the fp8 kernel follows --fast-accum (128x192 accurate, 128x256 "
          "fast accumulation); leave --tile-n auto");
}

}  // namespace

kernel::DType dtype_of(const Args& a) {
  for (const DTypeName& d : kDTypes)
    if (a.dtype == d.name) return d.dtype;
  throw std::logic_error("internal: --dtype " + a.dtype + " was not checked by parse()");
}

const char* scales_name(const Args& a) {
  if (dtype_of(a) != kernel::DType::E4M3) return "none";
  return a.row_scales ? "row" : "tensor";
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "error: %s (see distgemm_bench --help)\n", why.c_str());
  std::exit(2);
}

namespace {

// --help: every option with its default, on stdout.
[[noreturn]] void help() {
  const Args d;
  std::string names;
  for (const schedule::ScheduleDef* def : schedules::kAll)
    names += (names.empty() ? "" : ", ") + std::string(def->name);
  std::printf(
      "distgemm_bench: one distributed GEMM on TP GPUs of this process, verified against a "
      "single-GPU\nreference and timed; or (--sweep) the Llama-3 layer sweep of "
      "benchmarks/sweep/llama_sweep.py.\n\n"
      "usage: distgemm_bench [--schedule NAME] [--tp T] [--steps S|auto] [--m M] [--n N] [--k K] "
      "[options]\n"
      "       distgemm_bench --sweep [quick|full] [--tp T] [--models ...] [--tokens ...] "
      "[--layers ...] [options]\n\n"
      "single case:\n"
      "  --schedule NAME     one of %s (default %s)\n"
      "  --tp T              GPUs, 1..%d (default %d; a sweep: every visible GPU)\n"
      "  --steps S|auto      S, a multiple of TP, at most %d (default auto: the library's rule)\n"
      "  --m M --n N --k K   the GEMM D[M,N] = A[M,K] B[N,K]^T, each 1..2**31-1 "
      "(default %lld %lld %lld)\n"
      "  --l L               batch count (default %lld)\n"
      "  --alpha A --beta B  D = alpha A B^T + beta C (default 1, 0)\n"
      "  --bias              add a bias row to D\n"
      "  --replays R         replay the graphs R times and check host and device memory for "
      "leaks\n"
      "  --simulate-missing-device D  never launch device D's graph: the others must time out "
      "with a report\n"
      "  --check-update      retarget the graphs to new buffers and verify again\n"
      "  --no-verify         skip the comparison with the reference GEMM\n"
      "  --no-local          skip the local GEMM the overlap efficiency compares with\n"
      "  --graph-json PATH   write every device's captured graph as JSON\n"
      "both modes:\n"
      "  --dtype bf16|fp16|fp8  operand type (default %s); fp8: e4m3 A and B, bf16 D, C, bias\n"
      "  --scales tensor|row    fp8 scales: one per operand (default) or one per row of A and "
      "B\n"
      "  --fast-accum        fp8: the fast-accumulation kernel\n"
      "  --iterations I|auto timed launches (default %d; auto: 1 s windows)\n"
      "  --warmup W          untimed launches first (default %d)\n"
      "  --warmup-ms T       ms of load before timing (default %d; a sweep: at least 200)\n"
      "  --timeout-s T       seconds a device waits for a peer before it reports (default %g)\n"
      "  --seed X            seed of the random inputs (default %llu)\n"
      "  --swizzle 1|2|4|8 --raster 0|1|2  GEMM tile order (default %d, %d)\n"
      "  --pdl | --no-pdl    programmatic dependent launch between GEMM steps (default: where "
      "it pays)\n"
      "  --partial-via epilogue|copy  how reduce-scatter partials travel (default: the "
      "library's)\n"
      "  --tile-n auto|128|256  GEMM output tile width (default auto: per GEMM)\n"
      "  --verify-rows R     rows of D compared with the reference (default 0: all; a sweep: "
      "256)\n"
      "sweep:\n"
      "  --sweep [quick|full]  the Llama-3 sweep (default full)\n"
      "  --models 8B,70B,405B  --tokens 1024,...,16384  --layers QKV,O,FC1,FC2  filters\n"
      "  --csv PATH          also write the rows as CSV\n"
      "  --dry-run           list the cases without a GPU (needs --tp)\n"
      "Exit code: 0 verified, 1 a failed check or runtime error, 2 bad arguments, a shape "
      "rejected\nbefore launch, or no CUDA GPU visible.\n",
      names.c_str(), d.schedule.c_str(), schedule::kMaxTp, d.tp, schedule::kMaxSteps,
      static_cast<long long>(d.m), static_cast<long long>(d.n), static_cast<long long>(d.k),
      static_cast<long long>(d.l), d.dtype.c_str(), d.iterations, d.warmup, d.warmup_ms,
      d.timeout_s, static_cast<unsigned long long>(d.seed), d.swizzle, d.raster);
  std::exit(0);
}

}  // namespace

Args parse(int argc, char** argv) {
  Args a;
  std::set<std::string> given;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    given.insert(k);
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(k + " needs a value");
      return argv[++i];
    };
    try {
      if (k == "--schedule")
        a.schedule = val();
      else if (k == "--tp")
        a.tp = int(int_arg(k, val(), 1, schedule::kMaxTp));
      else if (k == "--steps") {
        const std::string v = val();
        a.steps = v == "auto" ? 0 : int(int_arg(k, v, 1, schedule::kMaxSteps));
      } else if (k == "--m")
        a.m = extent_arg(k, val());
      else if (k == "--n")
        a.n = extent_arg(k, val());
      else if (k == "--k")
        a.k = extent_arg(k, val());
      else if (k == "--l")
        a.l = extent_arg(k, val());
      else if (k == "--dtype")
        a.dtype = val();
      else if (k == "--scales") {
        const std::string v = val();
        if (v != "tensor" && v != "row") usage("--scales takes tensor or row, got " + v);
        a.row_scales = v == "row";
      } else if (k == "--fast-accum")
        a.fast_accum = true;
      else if (k == "--iterations") {
        const std::string v = val();
        a.iterations = v == "auto" ? 0 : int(int_arg(k, v, 1, INT32_MAX));
      } else if (k == "--warmup")
        a.warmup = int(int_arg(k, val(), 0, INT32_MAX));
      else if (k == "--warmup-ms")
        a.warmup_ms = int(int_arg(k, val(), 0, INT32_MAX));
      else if (k == "--alpha")
        a.alpha = float(float_arg(k, val()));
      else if (k == "--beta")
        a.beta = float(float_arg(k, val()));
      else if (k == "--bias")
        a.bias = true;
      else if (k == "--timeout-s")
        a.timeout_s = float_arg(k, val(), true);
      else if (k == "--replays")
        a.replays = long(int_arg(k, val(), 0, INT32_MAX));
      else if (k == "--simulate-missing-device")
        a.missing = int(int_arg(k, val(), 0, schedule::kMaxTp - 1));
      else if (k == "--check-update")
        a.check_update = true;
      else if (k == "--no-verify")
        a.verify = false;
      else if (k == "--no-local")
        a.local = false;
      else if (k == "--seed")
        a.seed = std::stoull(val());
      else if (k == "--swizzle")
        a.swizzle = std::stoi(val());
      else if (k == "--raster")
        a.raster = std::stoi(val());
      else if (k == "--pdl")
        a.pdl = device::GraphOptions::Pdl::On;
      else if (k == "--no-pdl")
        a.pdl = device::GraphOptions::Pdl::Off;
      else if (k == "--partial-via") {
        const std::string v = val();
        try {
          a.partial_via = schedule::parse_partial_via(v);
        } catch (const std::invalid_argument&) {
          usage("--partial-via takes epilogue or copy, got " + v);
        }
      } else if (k == "--tile-n") {
        const std::string v = val();
        a.tile_n = v == "auto" ? 0 : std::stoi(v);
        if (!kernel::tile_n_problem(a.tile_n).empty())
          usage("--tile-n takes auto, 128 or 256, got " + v);
      } else if (k == "--verify-rows")
        a.verify_rows = int_arg(k, val(), 0, INT64_MAX);
      else if (k == "--sweep") {
        // The kind is optional: `--sweep` alone is the full sweep.
        a.sweep = (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) ? val() : "full";
      } else if (k == "--graph-json")
        a.graph_json = val();
      else if (k == "--csv")
        a.csv = val();
      else if (k == "--models")
        a.models = split_list(val());
      else if (k == "--layers")
        a.layers = split_list(val());
      else if (k == "--tokens") {
        for (const std::string& t : split_list(val())) a.tokens.push_back(extent_arg(k, t));
      } else if (k == "--dry-run")
        a.dry_run = true;
      else if (k == "--help" || k == "-h")
        help();
      else
        usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k + ": '" + argv[i] + "'");
    }
  }
  check_dtype(a, given);
  if (!a.sweep.empty()) {
    finish_sweep_args(a, given);
  } else {
    check_operand_sizes(a);
    for (const char* k : {"--csv", "--models", "--layers", "--tokens", "--dry-run"})
      if (given.count(k)) usage(std::string(k) + " needs --sweep");
  }
  return a;
}

}  // namespace distgemm::bench
