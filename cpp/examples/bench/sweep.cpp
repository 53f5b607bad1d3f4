// distgemm_bench --sweep: the Llama-3 tensor-parallel layer cases of llama_shapes.hpp (the shapes
// benchmarks/sweep/llama_sweep.py runs under torchrun), each verified and timed beside its local
// kernel, reported as a table and a CSV; --dry-run lists the cases without CUDA.
//
// Per case, with the layer's default schedule (QKV, FC1: ag_rotate_a; O, FC2: rs_tile_a) and for
// S = TP and S = 2*TP: the distributed GEMM, verified and timed; once per case the same kernel
// alone on device 0 for the per-device problem (the "own kernel floor"). An S the plan rejects is
// skipped with the plan's reason, a case the TP ranks cannot split with that reason.
//   Timing: the Python sweep's protocol (llama::kSweepTiming): sustained replays before each
// timing (--warmup-ms), then timed replays within the protocol's bounds (--iterations auto).
//   Verification: the reference is a plain SIMT kernel, tens of times slower than the GEMM under
// test (the 405B FC1 at 16384 tokens is 57 PFLOP: tens of minutes), so by default it is computed
// for 256 rows of D only: one random row in each of 256 equal bands of M, so every step tile and
// every device's shard has rows in the sample (--verify-rows R; 0 = every row). Every element of
// D is still checked for having been written: outputs are NaN-poisoned before the checked launch
// and the whole D is scanned for non-finite values.
#include "sweep.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "all.hpp"
#include "harness.hpp"
#include "llama_shapes.hpp"

namespace distgemm::bench {

using schedule::Extent2;
using schedule::Problem;

namespace {

struct SweepCase {
  llama::Case c;
  std::string name;
  const schedule::ScheduleDef* def = nullptr;
  Problem prob, local;
  std::string skip;  // why TP ranks cannot run the case at all; "" when they can
  // S = TP and S = 2*TP, each with "" or the plan's reason for rejecting it.
  std::vector<std::pair<int, std::string>> steps;
};

template <class V, class X>
bool wanted(const V& filter, const X& x) {
  return filter.empty() || std::find(filter.begin(), filter.end(), x) != filter.end();
}

// The sweep's cases for TP ranks, in run order, with skip reasons: host-only (the dry run).
std::vector<SweepCase> sweep_cases(const Args& a, int tp) {
  std::vector<SweepCase> out;
  for (const llama::Case& c : llama::cases(a.sweep == "quick")) {
    if (!wanted(a.models, std::string(c.model->name)) ||
        !wanted(a.layers, std::string(c.layer->name)) || !wanted(a.tokens, c.tokens))
      continue;
    SweepCase sc;
    sc.c = c;
    sc.name = c.name(tp);
    sc.def = &schedules::find_or_throw(c.layer->schedule);
    const llama::Gemm g = c.gemm();
    sc.prob = {g.m, g.n, g.k, 1};
    sc.skip = llama::tp_split_reason(c, tp);
    if (!sc.skip.empty()) {
      out.push_back(sc);
      continue;
    }
    sc.local = local_problem(*sc.def, sc.prob, tp);
    bool any = false;
    for (int s : {tp, 2 * tp}) {
      sc.steps.emplace_back(s, schedule::validate(*sc.def, sc.prob, tp, s));
      any = any || sc.steps.back().second.empty();
    }
    if (!any) sc.skip = "the plan rejects every S (" + sc.steps[0].second + ")";
    out.push_back(sc);
  }
  if (out.empty()) {
    std::string quick;
    for (const llama::Case& c : llama::cases(true))
      if (c.layer == &llama::kLayers[0])
        quick += " " + std::string(c.model->name) + "/M" + std::to_string(c.tokens);
    usage("--models/--tokens/--layers leave no case of the " + a.sweep +
          " sweep (the quick "
          "sweep has" +
          quick + ")");
  }
  return out;
}

std::string shape(Extent2 e) { return std::to_string(e.rows) + "x" + std::to_string(e.cols); }

}  // namespace

// Lists the cases without calling into CUDA: name, global GEMM, schedule, per-device operands and
// local GEMM, the S values, and every skip or rejection with its reason.
int dry_run(const Args& a) {
  const std::vector<SweepCase> cases = sweep_cases(a, a.tp);
  int skipped = 0;
  for (const SweepCase& sc : cases) {
    const Problem& p = sc.prob;
    std::printf(
        "CASE %s model=%s layer=%s tokens=%lld m=%lld n=%lld k=%lld collective=%s "
        "schedule=%s",
        sc.name.c_str(), sc.c.model->name, sc.c.layer->name, (long long)sc.c.tokens, (long long)p.m,
        (long long)p.n, (long long)p.k, sc.c.layer->collective, sc.def->name);
    if (sc.local.m > 0) {
      const schedule::Partition& pt = sc.def->partition;
      std::printf(" a=%s b=%s d=%s local=%lldx%lldx%lld", shape(pt.local_a(p, a.tp)).c_str(),
                  shape(pt.local_b(p, a.tp)).c_str(), shape(pt.local_d(p, a.tp)).c_str(),
                  (long long)sc.local.m, (long long)sc.local.n, (long long)sc.local.k);
    }
    std::string run_steps;
    for (const auto& [s, why] : sc.steps)
      if (why.empty()) run_steps += (run_steps.empty() ? "" : ",") + std::to_string(s);
    std::printf(" steps=%s", run_steps.c_str());
    if (sc.skip.empty()) {
      std::printf(" status=run\n");
    } else {
      std::printf(" status=skipped reason: %s\n", sc.skip.c_str());
      ++skipped;
    }
    for (const auto& [s, why] : sc.steps)
      if (!why.empty()) std::printf("REJECT %s S=%d: %s\n", sc.name.c_str(), s, why.c_str());
  }
  std::printf(
      "dry run: %s sweep, TP=%d, %zu case(s) (%zu to run, %d skipped), S in {%d, %d}; "
      "nothing was launched\n",
      a.sweep.c_str(), a.tp, cases.size(), cases.size() - skipped, skipped, a.tp, 2 * a.tp);
  return 0;
}

namespace {

struct StepResult {
  int steps = 0;
  std::string rejected;  // the plan's or the kernel's reason; "" when it ran
  double ms = -1.0, rel_err = std::nan("");
};

struct CaseResult {
  const SweepCase* sc = nullptr;
  std::vector<StepResult> runs;
  FloorWindows local_floor;  // the local kernel's two windows (LocalFloor); .ms(): their mean
  int64_t rows_checked = 0;
  std::string failed;  // a run-time error of this case

  int best_steps() const {
    const StepResult* best = nullptr;
    for (const StepResult& r : runs)
      if (r.ms > 0 && (!best || r.ms < best->ms)) best = &r;
    return best ? best->steps : 0;
  }
  bool ok() const {
    if (!failed.empty()) return false;
    for (const StepResult& r : runs)
      if (r.rejected.empty() && !passes(r.rel_err)) return false;
    return true;
  }
};

// One case: the local kernel set up and timed, the reference once, each S set up, checked and
// timed, then the local kernel timed again. Each plan's setup and the reference are freed before
// the next allocation (405B FC1 at 16384 tokens holds ~14 GiB on device 0 at its peak: global A, B
// and D, the device's shards and the local GEMM's operands).
void run_case(const Args& a, const std::vector<int>& devs, CaseResult& r) {
  const SweepCase& sc = *r.sc;
  const int tp = int(devs.size());
  LocalFloor local_floor(a, *sc.def, sc.local, devs[0]);
  local_floor.time_before();
  auto g = std::make_unique<Global>(make_global(a, sc.prob, devs[0]));
  r.rows_checked = g->checked;
  for (const auto& [steps, why] : sc.steps) {
    r.runs.push_back({steps, why});
    StepResult& st = r.runs.back();
    if (!why.empty()) continue;
    std::unique_ptr<Setup> s;
    try {
      s = make_setup(a, *sc.def, sc.prob, tp, steps, devs);
    } catch (const std::invalid_argument& e) {  // the kernel's constraints (alignment, TMA)
      st.rejected = e.what();
      continue;
    }
    st.rel_err = checked_launch(a, *g, *s, sc.prob);
    st.ms = time_replays(*s, a.warmup, a.iterations, a.warmup_ms);
  }
  g.reset();
  local_floor.time_after();
  r.local_floor = local_floor.windows();
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// One result row per (case, S); a skipped or failed case is one row with its reason.
struct Row {
  const CaseResult* cr;
  const StepResult* st;  // null: the case row of a skipped or failed case
  std::string status, reason;
};

std::vector<Row> rows_of(const std::vector<CaseResult>& results) {
  std::vector<Row> rows;
  for (const CaseResult& cr : results) {
    if (!cr.sc->skip.empty()) rows.push_back({&cr, nullptr, "skipped", cr.sc->skip});
    for (const StepResult& st : cr.runs) {
      if (!st.rejected.empty())
        rows.push_back({&cr, &st, "rejected", st.rejected});
      else if (st.ms > 0)
        rows.push_back({&cr, &st, passes(st.rel_err) ? "ok" : "wrong", ""});
    }
    if (!cr.failed.empty()) rows.push_back({&cr, nullptr, "failed", cr.failed});
  }
  return rows;
}

std::string csv_field(const std::string& v) {
  if (v.find_first_of(",\"\n") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

void write_csv(const std::string& path, const std::vector<Row>& rows, const Args& a) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write --csv " + path);
  f << "case,model,layer,tokens,tp,dtype,scales,fast_accum,m,n,k,schedule,steps,status,ms,"
       "tflops_per_gpu,local_ms,local_tflops_per_gpu,overlap_eff,best_steps,rel_err,rows_checked,"
       "reason,local_before_ms,local_after_ms\n";
  const int tp = a.tp;
  for (const Row& r : rows) {
    const SweepCase& sc = *r.cr->sc;
    const bool timed = r.st && r.st->ms > 0;
    const bool local = r.cr->local_floor.ms() > 0;
    f << sc.name << ',' << sc.c.model->name << ',' << sc.c.layer->name << ',' << sc.c.tokens << ','
      << tp << ',' << a.dtype << ',' << scales_name(a) << ',' << (a.fast_accum ? 1 : 0) << ','
      << sc.prob.m << ',' << sc.prob.n << ',' << sc.prob.k << ',' << sc.def->name << ','
      << (r.st ? std::to_string(r.st->steps) : "") << ',' << r.status << ','
      << (timed ? fmt("%.4f", r.st->ms) : "") << ','
      << (timed ? fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.st->ms)) : "") << ','
      << (local ? fmt("%.4f", r.cr->local_floor.ms()) : "") << ','
      << (local ? fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.cr->local_floor.ms())) : "") << ','
      << (timed && local ? fmt("%.4f", r.cr->local_floor.ms() / r.st->ms) : "") << ','
      << (r.cr->best_steps() ? std::to_string(r.cr->best_steps()) : "") << ','
      << (timed ? fmt("%.3e", r.st->rel_err) : "") << ','
      << (timed ? std::to_string(r.cr->rows_checked) : "") << ',' << csv_field(r.reason) << ','
      << (local ? fmt("%.4f", r.cr->local_floor.before_ms) : "") << ','
      << (local ? fmt("%.4f", r.cr->local_floor.after_ms) : "") << '\n';
  }
}

void print_table(const std::vector<Row>& rows, int tp) {
  std::vector<std::vector<std::string>> cells;
  cells.push_back({"case", "S", "ms", "TF/s/GPU", "local ms", "eff", "best S", "rel err", "check"});
  std::vector<std::string> notes;  // rows whose cells are one reason
  for (const Row& r : rows) {
    const SweepCase& sc = *r.cr->sc;
    if (!r.st || r.status == "rejected") {
      notes.push_back(sc.name + (r.st ? " S=" + std::to_string(r.st->steps) : "") + ": " +
                      r.status + ": " + r.reason);
      continue;
    }
    const bool local = r.cr->local_floor.ms() > 0;
    cells.push_back({sc.name, std::to_string(r.st->steps), fmt("%.3f", r.st->ms),
                     fmt("%.1f", tflops_per_gpu(sc.prob, tp, r.st->ms)),
                     local ? fmt("%.3f", r.cr->local_floor.ms()) : "-",
                     local ? fmt("%.3f", r.cr->local_floor.ms() / r.st->ms) : "-",
                     std::to_string(r.cr->best_steps()), fmt("%.1e", r.st->rel_err),
                     r.status == "ok" ? "PASS" : "FAIL"});
  }
  std::vector<size_t> w(cells[0].size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) w[i] = std::max(w[i], row[i].size());
  for (size_t j = 0; j < cells.size(); ++j) {
    std::string line;
    for (size_t i = 0; i < cells[j].size(); ++i)
      line += (i ? " | " : "") + cells[j][i] + std::string(w[i] - cells[j][i].size(), ' ');
    std::printf("%s\n", line.c_str());
    if (j == 0) {
      std::string rule;
      for (size_t i = 0; i < w.size(); ++i) rule += (i ? "-+-" : "") + std::string(w[i], '-');
      std::printf("%s\n", rule.c_str());
    }
  }
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
}

}  // namespace

int run_sweep(Args a) {
  const std::vector<int> devs = open_devices(a.tp);
  const std::vector<SweepCase> cases = sweep_cases(a, a.tp);
  const llama::SweepTiming& timing = llama::kSweepTiming;
  const std::string replays = a.iterations > 0 ? std::to_string(a.iterations)
                                               : "~" + std::to_string(timing.timed_ms) + " ms (" +
                                                     std::to_string(timing.min_iterations) + ".." +
                                                     std::to_string(timing.max_iterations) + ") of";
  std::string dtype_desc = a.dtype;
  if (dtype_of(a) == kernel::DType::E4M3)
    dtype_desc += std::string(" (") + scales_name(a) + " scales" +
                  (a.fast_accum ? ", fast accumulation)" : ")");
  std::printf(
      "sweep: %s, TP=%d, %s, %zu cases, S in {%d, %d}; timing: >= %d ms warm-up, then %s "
      "replays, median; check: relative Frobenius error < %.0e against an fp32 reference "
      "on %s, every element of D checked for being written\n",
      a.sweep.c_str(), a.tp, dtype_desc.c_str(), cases.size(), a.tp, 2 * a.tp, a.warmup_ms,
      replays.c_str(), kTolerance,
      a.verify_rows > 0 ? (std::to_string(a.verify_rows) +
                           " rows of D (one random row in each of as many equal bands of "
                           "M, seed " +
                           std::to_string(a.seed) + ")")
                              .c_str()
                        : "every row of D");
  std::fflush(stdout);
  std::vector<CaseResult> results(cases.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < cases.size(); ++i) {
    CaseResult& r = results[i];
    r.sc = &cases[i];
    if (r.sc->skip.empty()) {
      try {
        run_case(a, devs, r);
      } catch (const std::exception& e) {  // a timeout report or CUDA error: on to the next case
        r.failed = e.what();
      }
    }
    std::string line;
    if (!r.sc->skip.empty()) line = "skipped: " + r.sc->skip;
    for (const StepResult& st : r.runs) {
      line += (line.empty() ? "" : "; ") + std::string("S=") + std::to_string(st.steps) + " ";
      if (!st.rejected.empty())
        line += "rejected: " + st.rejected;
      else if (st.ms > 0)
        line += fmt("%.3f ms", st.ms) +
                fmt(" %.0f TF/s/GPU", tflops_per_gpu(r.sc->prob, a.tp, st.ms)) +
                fmt(" err %.1e ", st.rel_err) + (passes(st.rel_err) ? "PASS" : "FAIL");
    }
    if (r.local_floor.ms() > 0) line += fmt("; local %.3f ms", r.local_floor.ms());
    if (!r.failed.empty()) line += "; FAILED: " + r.failed;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "[%zu/%zu] %s: %s (%.1f s)\n", i + 1, cases.size(), r.sc->name.c_str(),
                 line.c_str(), secs);
  }
  const std::vector<Row> rows = rows_of(results);
  print_table(rows, a.tp);
  if (!a.csv.empty()) {
    write_csv(a.csv, rows, a);
    std::printf("wrote %s\n", a.csv.c_str());
  }
  const bool ok =
      std::all_of(results.begin(), results.end(), [](const CaseResult& r) { return r.ok(); });
  std::printf("sweep done in %.1f s: %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
              ok ? "every check passed" : "FAILED (see FAIL / failed rows)");
  return ok ? 0 : 1;
}

}  // namespace distgemm::bench
