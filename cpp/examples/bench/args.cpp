// distgemm_bench's command-line parser: every option into Args, the single-case and sweep rules
// checked, usage() on the first violation.
#include "args.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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
  std::fprintf(stderr,
               "error: %s\nusage: distgemm_bench --schedule NAME --tp T --steps S|auto --m M --n N "
               "--k K [--l L] [--dtype bf16|fp16|fp8] [--scales tensor|row] [--fast-accum] "
               "[--iterations I|auto] [--warmup W] "
               "[--warmup-ms T] [--alpha A] [--beta B] [--bias] [--timeout-s T] [--replays R] "
               "[--simulate-missing-device D] [--check-update] [--no-verify] [--no-local] "
               "[--seed X] [--swizzle 1|2|4|8] [--raster 0|1|2] [--pdl|--no-pdl] "
               "[--partial-via epilogue|copy] [--tile-n auto|128|256] [--verify-rows R] "
               "[--graph-json PATH]\n"
               "       distgemm_bench --sweep [quick|full] [--tp T] [--models 8B,70B,405B] "
               "[--tokens 1024,...,16384] [--layers QKV,O,FC1,FC2] [--csv PATH] [--dry-run] "
               "[--dtype bf16|fp16|fp8] [--scales tensor|row] [--fast-accum] [--iterations I|auto] "
               "[--warmup W] [--warmup-ms T>=200] "
               "[--timeout-s T] [--seed X] [--swizzle 1|2|4|8] [--raster 0|1|2] [--pdl|--no-pdl] "
               "[--partial-via epilogue|copy] [--tile-n auto|128|256] "
               "[--verify-rows R]\n",
               why.c_str());
  std::exit(2);
}

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
        a.tp = std::stoi(val());
      else if (k == "--steps") {
        const std::string v = val();
        a.steps = v == "auto" ? 0 : std::stoi(v);
        if (a.steps < 1 && v != "auto") usage("--steps must be >= 1 or auto");
      } else if (k == "--m")
        a.m = std::stoll(val());
      else if (k == "--n")
        a.n = std::stoll(val());
      else if (k == "--k")
        a.k = std::stoll(val());
      else if (k == "--l")
        a.l = std::stoll(val());
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
        a.iterations = v == "auto" ? 0 : std::stoi(v);
        if (a.iterations < 1 && v != "auto") usage("--iterations must be >= 1 or auto");
      } else if (k == "--warmup")
        a.warmup = std::stoi(val());
      else if (k == "--warmup-ms")
        a.warmup_ms = std::stoi(val());
      else if (k == "--alpha")
        a.alpha = std::stof(val());
      else if (k == "--beta")
        a.beta = std::stof(val());
      else if (k == "--bias")
        a.bias = true;
      else if (k == "--timeout-s")
        a.timeout_s = std::stod(val());
      else if (k == "--replays")
        a.replays = std::stol(val());
      else if (k == "--simulate-missing-device")
        a.missing = std::stoi(val());
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
        a.verify_rows = std::stoll(val());
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
        for (const std::string& t : split_list(val())) a.tokens.push_back(std::stoll(t));
      } else if (k == "--dry-run")
        a.dry_run = true;
      else
        usage("unknown argument " + k);
    } catch (const std::logic_error&) {
      usage("bad value for " + k);
    }
  }
  check_dtype(a, given);
  if (a.iterations < 0 || a.warmup < 0) usage("--iterations must be >= 1 and --warmup >= 0");
  if (a.verify_rows < 0) usage("--verify-rows must be >= 0 (0: every row)");
  if (!a.sweep.empty()) {
    finish_sweep_args(a, given);
  } else {
    for (const char* k : {"--csv", "--models", "--layers", "--tokens", "--dry-run"})
      if (given.count(k)) usage(std::string(k) + " needs --sweep");
  }
  return a;
}

}  // namespace distgemm::bench
