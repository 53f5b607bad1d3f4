// Host-only tests of the DistributedTileScheduler and the Plan builder, built with g++ alone
// (no CUDA): the tile maps cover every tile, partials land on their owner, tile splits cover the
// split mode, plans are consistent (also with uneven and empty tiles) and bad input is rejected
// with the constraint in words.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "all.hpp"
#include "distgemm/schedule/plan.hpp"

using namespace distgemm::schedule;

static int g_pass = 0, g_fail = 0;
#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (cond) {                                                   \
      ++g_pass;                                                   \
    } else {                                                      \
      ++g_fail;                                                   \
      std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::printf(__VA_ARGS__);                                   \
      std::printf("\n");                                          \
    }                                                             \
  } while (0)

static void test_tile_maps() {
  for (const ScheduleDef* def : distgemm::schedules::kAll) {
    for (int tp = 1; tp <= kMaxTp; ++tp) {
      for (int kc = 1; kc <= 4; ++kc) {
        const int S = tp * kc;
        DistributedTileScheduler sch(*def, tp, S);
        for (int d = 0; d < tp; ++d) {
          // Every device visits every tile exactly once over the S iterations.
          std::set<int> seen;
          for (int i = 0; i < S; ++i) seen.insert(sch.tile(d, i));
          CHECK(int(seen.size()) == S, "%s TP=%d S=%d dev %d visits %zu distinct tiles", def->name,
                tp, S, d, seen.size());
        }
        for (int i = 0; i < S; ++i) {
          // At each iteration the devices work on distinct tiles (no two write one partial).
          std::set<int> at_i;
          for (int d = 0; d < tp; ++d) at_i.insert(sch.tile(d, i));
          CHECK(int(at_i.size()) == tp, "%s TP=%d S=%d iteration %d: tiles collide", def->name, tp,
                S, i);
        }
        if (def->collective == Collective::AllGather) {
          for (int d = 0; d < tp; ++d)
            for (int i = 0; i < kc; ++i)
              CHECK(sch.source_device(d, i) == d, "%s TP=%d S=%d: dev %d starts on a peer's data",
                    def->name, tp, S, d);
          continue;
        }
        for (int d = 0; d < tp; ++d) {
          for (int i = 0; i < S; ++i) {
            const int t = sch.tile(d, i);
            if (sch.is_final(i)) {
              CHECK(sch.owner(t) == d, "%s TP=%d S=%d: final tile %d of dev %d belongs to %d",
                    def->name, tp, S, t, d, sch.owner(t));
            } else {
              const int e = sch.destination_device(d, i);
              CHECK(e >= 0 && sch.tile(e, i + kc) == t,
                    "%s TP=%d S=%d: partial of dev %d iteration %d lost", def->name, tp, S, d, i);
              CHECK(e >= 0 && sch.source_device(e, i + kc) == d,
                    "%s TP=%d S=%d: source/destination disagree", def->name, tp, S);
            }
            if (i < kc)
              CHECK(sch.source_device(d, i) == -1, "%s: first visit has a partial", def->name);
          }
        }
      }
    }
  }
}

// sets[d][f]: how many ops of the plan set flag f of device d.
static std::vector<std::vector<int>> signal_counts(const Plan& plan) {
  std::vector<std::vector<int>> sets(plan.tp, std::vector<int>(plan.num_flags, 0));
  for (const DeviceProgram& dp : plan.devices) {
    for (const GemmOp& g : dp.gemms)
      for (const FlagRef& f : g.signals) sets[f.device][f.flag]++;
    for (const CopyOp& c : dp.copies)
      for (const FlagRef& f : c.signals) sets[f.device][f.flag]++;
  }
  return sets;
}

static void test_plans() {
  for (const ScheduleDef* def : distgemm::schedules::kAll) {
    for (int tp = 1; tp <= kMaxTp; ++tp) {
      for (int kc : {1, 2, 4}) {
        const int S = tp * kc;
        Problem p{int64_t(S) * tp * 8, int64_t(S) * tp * 8, int64_t(tp) * 16, 2};
        Plan plan = build_plan(*def, p, tp, S);
        CHECK(int(plan.devices.size()) == tp, "%s: %zu device programs", def->name,
              plan.devices.size());
        // Every waited flag is set exactly once by some op of the plan.
        const std::vector<std::vector<int>> sets = signal_counts(plan);
        for (int d = 0; d < tp; ++d) {
          const DeviceProgram& dp = plan.devices[d];
          CHECK(int(dp.gemms.size()) == S, "%s: dev %d has %zu GEMMs, want S=%d", def->name, d,
                dp.gemms.size(), S);
          int64_t flops = 0;
          for (const GemmOp& g : dp.gemms) {
            flops += g.m * g.n * g.k;
            for (int f : g.waits)
              CHECK(sets[d][f] == 1, "%s TP=%d S=%d: flag %d on dev %d set %d times", def->name, tp,
                    S, f, d, sets[d][f]);
            // User buffers are only referenced on their own device.
            for (const BufRef* r : {&g.a, &g.b, &g.d, &g.partial, &g.user_c, &g.bias})
              if (r->valid() && r->buffer != Buffer::Slots)
                CHECK(r->device == d, "%s: GEMM on dev %d touches user %s of dev %d", def->name, d,
                      buffer_name(r->buffer), r->device);
          }
          // Work is balanced: each device does 1/TP of the GEMM.
          CHECK(flops == p.m * p.n * p.k / tp, "%s TP=%d: dev %d does %lld MNK, want %lld",
                def->name, tp, d, (long long)flops, (long long)(p.m * p.n * p.k / tp));
        }
        CHECK(plan.extra_bytes(2) >= plan.slot_elems * 2, "%s: workspace smaller than its slots",
              def->name);
      }
    }
  }
}

// TileSplit cuts [0, extent) into S contiguous tiles: the devices' shards exactly where TP divides
// the extent, equal tiles where S divides it, otherwise tiles of whole units within one unit of
// each other (the last tile of a shard also taking the remainder below one unit).
static void test_tile_split() {
  // A few units in more parts: whole units and an empty part, never parts below a unit (the GEMM
  // kernel takes N in 16-byte units): 24 columns per shard in 4 tiles are 8 + 8 + 8 + 0.
  for (int tp : {1, 2}) {
    const TileSplit few{24 * tp, tp, 4, kSplitUnitN};
    for (int t = 0; t < 4 * tp; ++t)
      CHECK(few.size(t) == (t % 4 == 3 ? 0 : 8), "TP=%d: 24 columns per shard, tile %d of %lld", tp,
            t, (long long)few.size(t));
  }
  for (int64_t unit : {int64_t(1), kSplitUnitN}) {
    for (int tp = 1; tp <= kMaxTp; ++tp) {
      for (int kc = 1; kc <= 4; ++kc) {
        const int S = tp * kc;
        for (int64_t extent = 1; extent <= 5 * S * unit + 3; ++extent) {
          const TileSplit sp{extent, tp, kc, unit};
          CHECK(sp.begin(0) == 0 && sp.begin(S) == extent, "TP=%d S=%d E=%lld: ends %lld, %lld", tp,
                S, (long long)extent, (long long)sp.begin(0), (long long)sp.begin(S));
          int64_t longest = 0;
          for (int t = 0; t < S; ++t) {
            CHECK(sp.size(t) >= 0, "TP=%d S=%d E=%lld: tile %d has size %lld", tp, S,
                  (long long)extent, t, (long long)sp.size(t));
            CHECK(sp.begin_in_shard(t) == sp.begin(t) - sp.begin(t / kc * kc), "begin_in_shard");
            longest = std::max(longest, sp.size(t));
          }
          CHECK(sp.max_size() == longest, "max_size %lld, longest %lld", (long long)sp.max_size(),
                (long long)longest);
          if (extent % tp == 0)
            for (int d = 0; d <= tp; ++d)
              CHECK(sp.begin(d * kc) == extent / tp * d,
                    "TP=%d S=%d E=%lld: shard %d starts at %lld", tp, S, (long long)extent, d,
                    (long long)sp.begin(d * kc));
          if (extent % S == 0 &&
              ((extent / S) % unit == 0 || (extent / S < unit && (extent / tp) % unit != 0))) {
            for (int t = 0; t < S; ++t)
              CHECK(sp.begin(t) == extent / S * t, "TP=%d S=%d E=%lld: even tile %d at %lld", tp, S,
                    (long long)extent, t, (long long)sp.begin(t));
            continue;
          }
          // Uneven (or even tiles that are not whole units): within a shard, every tile but the
          // last is a whole number of units, and no
          // two tiles of a shard differ by more than a unit (besides the remainder).
          for (int d = 0; d < tp; ++d) {
            const int64_t shard = sp.begin((d + 1) * kc) - sp.begin(d * kc);
            if (shard % kc == 0 &&
                ((shard / kc) % unit == 0 || (shard / kc < unit && shard % unit != 0)))
              continue;
            int64_t lo = shard, hi = 0;
            for (int c = 0; c < kc; ++c) {
              const int t = d * kc + c;
              const int64_t whole = sp.size(t) - (c == kc - 1 ? shard % unit : 0);
              CHECK(whole % unit == 0, "TP=%d S=%d E=%lld unit %lld: tile %d of size %lld", tp, S,
                    (long long)extent, (long long)unit, t, (long long)sp.size(t));
              lo = std::min(lo, whole);
              hi = std::max(hi, whole);
            }
            CHECK(hi - lo <= unit, "TP=%d S=%d E=%lld: shard %d tiles range %lld..%lld", tp, S,
                  (long long)extent, d, (long long)lo, (long long)hi);
          }
        }
      }
    }
  }
}

// Plans with uneven and empty tiles: no op of zero extent, every waited flag set exactly once and
// every set flag waited for (nothing waits for a flag nobody sets, no signal is wasted), each
// copy follows a GEMM its device has, the work splits evenly over the devices and each device's
// D is produced exactly once in area.
static void check_uneven_plan(const ScheduleDef& def, const Plan& plan) {
  const int tp = plan.tp, S = plan.steps;
  const Problem& p = plan.problem;
  const char* name = def.name;
  const long long m = p.m, n = p.n;
  const std::vector<std::vector<int>> sets = signal_counts(plan);
  std::vector<std::vector<int>> waits(tp, std::vector<int>(plan.num_flags, 0));
  for (int d = 0; d < tp; ++d) {
    const DeviceProgram& dp = plan.devices[d];
    CHECK(!dp.gemms.empty() && int(dp.gemms.size()) <= S,
          "%s TP=%d S=%d M=%lld: dev %d has %zu GEMMs", name, tp, S, m, d, dp.gemms.size());
    int64_t flops = 0, produced = 0;
    int last_iteration = -1;
    for (const GemmOp& g : dp.gemms) {
      CHECK(g.m > 0 && g.n > 0 && g.k > 0, "%s TP=%d S=%d M=%lld N=%lld: dev %d GEMM %dx%dx%d",
            name, tp, S, m, n, d, int(g.m), int(g.n), int(g.k));
      CHECK(g.iteration > last_iteration, "%s: GEMMs out of iteration order", name);
      last_iteration = g.iteration;
      flops += g.m * g.n * g.k;
      if (g.d.buffer == Buffer::D) produced += g.m * g.n;
      for (int f : g.waits) waits[d][f]++;
    }
    for (const CopyOp& c : dp.copies) {
      CHECK(c.rows > 0 && c.cols > 0, "%s TP=%d S=%d M=%lld: dev %d copy of %lldx%lld", name, tp, S,
            m, d, (long long)c.rows, (long long)c.cols);
      CHECK(c.after_gemm < int(dp.gemms.size()), "%s: copy after GEMM %d of %zu", name,
            c.after_gemm, dp.gemms.size());
      if (c.dst.buffer == Buffer::D) produced += c.rows * c.cols;
      for (int f : c.waits) waits[d][f]++;
    }
    const int64_t total = p.m * p.n * p.k / tp;
    CHECK(flops == total, "%s TP=%d S=%d M=%lld N=%lld: dev %d does %lld MNK, want %lld", name, tp,
          S, m, n, d, (long long)flops, (long long)total);
    const Extent2 ld = def.partition.local_d(p, tp);
    CHECK(produced == ld.rows * ld.cols,
          "%s TP=%d S=%d M=%lld N=%lld: dev %d produces %lld of D's %lld", name, tp, S, m, n, d,
          (long long)produced, (long long)(ld.rows * ld.cols));
  }
  for (int d = 0; d < tp; ++d)
    for (int f = 0; f < plan.num_flags; ++f) {
      CHECK(waits[d][f] == 0 || sets[d][f] == 1,
            "%s TP=%d S=%d M=%lld N=%lld: dev %d waits for flag %d, set %d times", name, tp, S, m,
            n, d, f, sets[d][f]);
      CHECK(sets[d][f] == 0 || waits[d][f] == 1,
            "%s TP=%d S=%d M=%lld N=%lld: flag %d of dev %d set, waited %d times", name, tp, S, m,
            n, f, d, waits[d][f]);
    }
}

static void test_uneven_plans() {
  for (const ScheduleDef* def : distgemm::schedules::kAll) {
    const bool along_m = def->split == Mode::M;
    // The split mode's divisor: TP where a partition shards it, else none.
    const Partition& pt = def->partition;
    const bool sharded = pt.a == def->split || pt.b == def->split || pt.d == def->split;
    for (int tp = 1; tp <= kMaxTp; ++tp) {
      for (int kc : {1, 2, 3}) {
        const int S = tp * kc;
        for (int units = 1; units <= 3 * S + 2; ++units) {
          // Along M any row count (times TP where M is sharded); along N units of 8 columns per
          // device, with 3 columns below a unit more at odd counts.
          const int64_t e = along_m ? units * (sharded ? tp : 1)
                                    : (units * kSplitUnitN + (units % 2 ? 3 : 0)) * tp;
          Problem p{along_m ? e : int64_t(tp) * 3, along_m ? int64_t(tp) * 8 : e, int64_t(tp) * 16,
                    2};
          for (PartialVia via : {PartialVia::Epilogue, PartialVia::CopyEngine}) {
            PlanOptions o;
            o.partial_via = via;
            check_uneven_plan(*def, build_plan(*def, p, tp, S, o));
          }
        }
      }
    }
  }
}

static void expect_error(const ScheduleDef& def, Problem p, int tp, int S, const char* needle) {
  try {
    build_plan(def, p, tp, S);
    CHECK(false, "%s TP=%d S=%d M=%lld accepted, want an error containing '%s'", def.name, tp, S,
          (long long)p.m, needle);
  } catch (const std::invalid_argument& e) {
    CHECK(std::strstr(e.what(), needle) != nullptr, "message '%s' lacks '%s'", e.what(), needle);
  }
}

static void test_bad_input() {
  using namespace distgemm::schedules;
  expect_error(ag_rotate_a, {8191, 64, 64, 1}, 2, 8,
               "M=8191 is not divisible by TP=2: ag_rotate_a shards A on M");
  expect_error(rs_tile_a, {9, 64, 64, 1}, 4, 4,
               "M=9 is not divisible by TP=4: rs_tile_a shards C/D on M");
  expect_error(ag_rotate_a, {64, 63, 64, 1}, 2, 2, "N=63 is not divisible by TP=2");
  expect_error(rs_tile_a, {64, 64, 63, 1}, 2, 2, "K=63 is not divisible by TP=2");
  expect_error(rs_tile_b, {64, 62, 64, 1}, 4, 8, "N=62 is not divisible by TP=4");
  expect_error(ag_rotate_b, {64, 63, 64, 1}, 3, 3, "M=64 is not divisible by TP=3");
  expect_error(ar_tile_a, {64, 64, 64, 1}, 9, 9, "TP=9 is out of range");
  expect_error(ar_tile_a, {64, 64, 64, 1}, 0, 0, "TP=0 is out of range");
  expect_error(rs_tile_a, {64, 64, 64, 1}, 2, 3, "S=3 is not a positive multiple of TP=2");
  expect_error(rs_tile_a, {64, 64, 64, 0}, 2, 2, "problem sizes must be positive");
  CHECK(distgemm::schedules::find("nope") == nullptr, "unknown schedule found");
  for (const ScheduleDef* def : kAll)
    for (int mask = 1; mask < 4; ++mask) {
      PlanOptions o;
      o.row_scale_a = mask & 1;
      o.row_scale_b = mask & 2;
      const std::string want = std::string("row-wise scales (") +
                               (mask == 3   ? "of A and B"
                                : mask == 1 ? "of A"
                                            : "of B") +
                               ") need L=1, got L=2";
      try {
        build_plan(*def, {64, 64, 64, 2}, 2, 2, o);
        CHECK(false, "%s: row scales with L=2 accepted", def->name);
      } catch (const std::invalid_argument& e) {
        CHECK(std::strstr(e.what(), want.c_str()) != nullptr, "message '%s' lacks '%s'", e.what(),
              want.c_str());
      }
    }
}

// Uneven splits that used to be refused build now; ar_tile_a takes any M.
static void test_accepted_uneven() {
  using namespace distgemm::schedules;
  for (int tp = 1; tp <= kMaxTp; ++tp)
    for (int64_t m = 1; m <= 64; ++m)
      CHECK(validate(ar_tile_a, {m, 64, int64_t(tp) * 8, 1}, tp, tp).empty(),
            "ar_tile_a TP=%d M=%lld refused", tp, (long long)m);
  CHECK(validate(ag_rotate_a, {8190, 64, 64, 1}, 2, 8).empty(), "M=8190 at TP=2 S=8 refused");
  CHECK(validate(rs_tile_b, {64, 60, 64, 1}, 2, 8).empty(), "N=60 at TP=2 S=8 refused");
  // M=1 at TP=2: tile 1 is empty, so each device runs one GEMM, on row 0.
  const Plan one = build_plan(ar_tile_a, {1, 64, 64, 1}, 2, 2);
  for (const DeviceProgram& dp : one.devices)
    CHECK(dp.gemms.size() == 1 && dp.gemms[0].m0 == 0 && dp.gemms[0].m == 1,
          "M=1: %zu GEMMs, first of %lld rows", dp.gemms.size(), (long long)dp.gemms[0].m);
}

// Equal ops but for the row-scale references: row scales add no op, wait or signal, and move
// nothing of a plan without them.
static bool same_ref(const BufRef& x, const BufRef& y) {
  return x.buffer == y.buffer && x.device == y.device && x.offset == y.offset && x.ld == y.ld &&
         x.batch_stride == y.batch_stride;
}
static bool same_flags(const std::vector<FlagRef>& x, const std::vector<FlagRef>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].device != y[i].device || x[i].flag != y[i].flag) return false;
  return true;
}
static bool same_ops_but_scales(const Plan& x, const Plan& y) {
  if (x.slot_elems != y.slot_elems || x.num_flags != y.num_flags || x.tp != y.tp) return false;
  for (int d = 0; d < x.tp; ++d) {
    const DeviceProgram &px = x.devices[d], &py = y.devices[d];
    if (px.gemms.size() != py.gemms.size() || px.copies.size() != py.copies.size()) return false;
    for (size_t j = 0; j < px.gemms.size(); ++j) {
      const GemmOp &g = px.gemms[j], &h = py.gemms[j];
      if (g.iteration != h.iteration || g.tile != h.tile || g.m0 != h.m0 || g.n0 != h.n0 ||
          g.k0 != h.k0 || g.m != h.m || g.n != h.n || g.k != h.k || !same_ref(g.a, h.a) ||
          !same_ref(g.b, h.b) || !same_ref(g.d, h.d) || !same_ref(g.partial, h.partial) ||
          !same_ref(g.user_c, h.user_c) || !same_ref(g.bias, h.bias) || g.waits != h.waits ||
          !same_flags(g.signals, h.signals))
        return false;
    }
    for (size_t j = 0; j < px.copies.size(); ++j) {
      const CopyOp &c = px.copies[j], &e = py.copies[j];
      if (c.step != e.step || !same_ref(c.src, e.src) || !same_ref(c.dst, e.dst) ||
          c.rows != e.rows || c.cols != e.cols || c.after_gemm != e.after_gemm ||
          c.waits != e.waits || !same_flags(c.signals, e.signals))
        return false;
    }
  }
  return true;
}

// The global row (of A for ScaleA, of B for ScaleB) that a user scale reference starts at.
static int64_t global_scale_row(const Plan& plan, const BufRef& r) {
  const Partition& pt = plan.partition();
  if (r.buffer == Buffer::ScaleA)
    return r.offset + (pt.a == Mode::M ? r.device * pt.local_a(plan.problem, plan.tp).rows : 0);
  return r.offset + (pt.b == Mode::N ? r.device * pt.local_b(plan.problem, plan.tp).rows : 0);
}

// One plan's row scales: every GEMM of a row-scaled operand reads the scales of exactly its rows
// on its own device, from the user's vector or from the scale slot that a copy filled with the
// same rows' scales before setting a flag the GEMM waits for; every copy of a row-scaled operand's
// rows carries their scales from the rows' source to the slot's scale rows; nothing else has
// scale references; the layout places the scale slots between the data slots and the control
// region.
static void check_row_scales(const ScheduleDef& def, const Plan& plan, bool sa, bool sb) {
  const int tp = plan.tp, S = plan.steps, kc = S / tp;
  const char* name = def.name;
  const bool ag = def.collective == Collective::AllGather;
  const bool rot_scaled = ag && (def.rotating == Operand::A ? sa : sb);
  CHECK(plan.row_scale_a == sa && plan.row_scale_b == sb, "%s: plan row scales %d %d, want %d %d",
        name, plan.row_scale_a, plan.row_scale_b, sa, sb);
  const bool along_m = def.split == Mode::M;
  TileSplit split{along_m ? plan.problem.m : plan.problem.n, tp, kc, along_m ? 1 : kSplitUnitN};
  const int64_t T = split.max_size();
  const int64_t want_rows = rot_scaled ? int64_t(S - kc) * T : 0;
  CHECK(plan.scale_slot_rows == want_rows,
        "%s TP=%d S=%d a=%d b=%d: %lld scale slot rows, want %lld", name, tp, S, sa, sb,
        (long long)plan.scale_slot_rows, (long long)want_rows);
  const WorkspaceLayout w = plan.layout(1), c = control_layout();
  CHECK(w.scale_slots_offset == w.slots_offset + w.slots_bytes &&
            w.scale_slots_offset % kSlotAlign == 0 &&
            w.scale_slots_bytes == round_up(want_rows * kScaleBytes, kSlotAlign) &&
            w.flags_offset == w.scale_slots_offset + w.scale_slots_bytes + c.flags_offset &&
            w.total_bytes == w.scale_slots_offset + w.scale_slots_bytes + c.total_bytes,
        "%s TP=%d S=%d: layout slots %lld+%lld, scale slots %lld+%lld, flags at %lld, total %lld",
        name, tp, S, (long long)w.slots_offset, (long long)w.slots_bytes,
        (long long)w.scale_slots_offset, (long long)w.scale_slots_bytes, (long long)w.flags_offset,
        (long long)w.total_bytes);
  for (int d = 0; d < tp; ++d) {
    const DeviceProgram& dp = plan.devices[d];
    for (const GemmOp& g : dp.gemms) {
      for (const auto& [scaled, ref, data, row0, rows, user] :
           {std::tuple{sa, g.scale_a, g.a, g.m0, g.m, Buffer::ScaleA},
            std::tuple{sb, g.scale_b, g.b, g.n0, g.n, Buffer::ScaleB}}) {
        CHECK(ref.valid() == scaled,
              "%s TP=%d S=%d: GEMM iteration %d has a scale ref: %d, want %d", name, tp, S,
              g.iteration, ref.valid(), scaled);
        if (!ref.valid()) continue;
        CHECK(ref.device == d && ref.ld == 1 && ref.batch_stride == 0,
              "%s: scale ref of dev %d on dev %d with ld %lld", name, d, ref.device,
              (long long)ref.ld);
        const bool from_slot = data.buffer == Buffer::Slots;
        CHECK(ref.buffer == (from_slot ? Buffer::ScaleSlots : user),
              "%s TP=%d S=%d: GEMM reads %s rows with scales from %s", name, tp, S,
              buffer_name(data.buffer), buffer_name(ref.buffer));
        if (!from_slot) {
          CHECK(global_scale_row(plan, ref) == row0,
                "%s TP=%d S=%d dev %d: GEMM of rows %lld.. "
                "reads scales from row %lld",
                name, tp, S, d, (long long)row0, (long long)global_scale_row(plan, ref));
          continue;
        }
        // From a scale slot: the copy that fills it moved the scales of these very rows.
        CHECK(ref.offset % T == 0 && ref.offset + rows <= plan.scale_slot_rows,
              "%s: scale slot rows [%lld, +%lld) of %lld", name, (long long)ref.offset,
              (long long)rows, (long long)plan.scale_slot_rows);
        int fillers = 0;
        for (const DeviceProgram& src : plan.devices)
          for (const CopyOp& cp : src.copies) {
            if (!cp.scale_dst.valid() || cp.scale_dst.device != d ||
                cp.scale_dst.offset != ref.offset)
              continue;
            ++fillers;
            CHECK(cp.rows == rows && global_scale_row(plan, cp.scale_src) == row0 &&
                      cp.signals.size() == 1 && g.waits.size() == 1 &&
                      cp.signals[0].flag == g.waits[0],
                  "%s TP=%d S=%d dev %d: scale slot at %lld filled with %lld rows from row %lld, "
                  "GEMM needs %lld from %lld",
                  name, tp, S, d, (long long)ref.offset, (long long)cp.rows,
                  (long long)global_scale_row(plan, cp.scale_src), (long long)rows,
                  (long long)row0);
          }
        CHECK(fillers == 1, "%s TP=%d S=%d dev %d: scale slot at %lld filled by %d copies", name,
              tp, S, d, (long long)ref.offset, fillers);
      }
    }
    for (const CopyOp& cp : dp.copies) {
      CHECK(cp.scale_src.valid() == rot_scaled && cp.scale_dst.valid() == rot_scaled,
            "%s TP=%d S=%d a=%d b=%d: copy has scale refs %d/%d", name, tp, S, sa, sb,
            cp.scale_src.valid(), cp.scale_dst.valid());
      if (!rot_scaled) continue;
      // Data slot j pairs with scale slot j, and the scales come from the rows' own device.
      CHECK(cp.scale_src.device == cp.src.device && cp.scale_dst.device == cp.dst.device &&
                cp.scale_dst.buffer == Buffer::ScaleSlots &&
                cp.scale_dst.offset / T == cp.dst.offset / (cp.dst.batch_stride * plan.problem.l) &&
                cp.scale_src.offset == cp.src.offset / cp.src.ld,
            "%s TP=%d S=%d: copy of rows at %lld into slot offset %lld carries scales %lld -> %lld",
            name, tp, S, (long long)cp.src.offset, (long long)cp.dst.offset,
            (long long)cp.scale_src.offset, (long long)cp.scale_dst.offset);
    }
  }
}

// The one rule that gives every scale reference from its data reference, for the references no
// built-in schedule makes yet: a relay (slot to a peer's slot) relays scales slot to slot, and a
// reference into the middle of a slot or of the user's rows keeps its row.
static void test_scale_ref_rule() {
  const int64_t K = 64, T = 8, stride = T * K;  // one slot: T rows of K
  for (int j = 0; j < 4; ++j)
    for (int64_t r = 0; r < T; ++r) {
      const BufRef slot = detail::ref(Buffer::Slots, 3, j * stride + r * K, K, stride);
      const BufRef s = detail::scale_ref_of(slot, stride, T);
      CHECK(s.buffer == Buffer::ScaleSlots && s.device == 3 && s.offset == j * T + r && s.ld == 1 &&
                s.batch_stride == 0,
            "slot %d row %lld: scale at %s+%lld of dev %d", j, (long long)r, buffer_name(s.buffer),
            (long long)s.offset, s.device);
    }
  for (Buffer b : {Buffer::A, Buffer::B}) {
    const BufRef s = detail::scale_ref_of(detail::ref(b, 1, 5 * K, K, 40 * K), stride, T);
    CHECK(s.buffer == (b == Buffer::A ? Buffer::ScaleA : Buffer::ScaleB) && s.offset == 5 &&
              s.device == 1,
          "user %s row 5: scale at %s+%lld", buffer_name(b), buffer_name(s.buffer),
          (long long)s.offset);
  }
}

static void test_row_scales() {
  for (const ScheduleDef* def : distgemm::schedules::kAll) {
    const bool along_m = def->split == Mode::M;
    for (int tp = 1; tp <= kMaxTp; ++tp) {
      for (int kc : {1, 2}) {
        const int S = tp * kc;
        // Even tiles, then uneven ones (a split mode of 3 units per device at S = 2*TP).
        for (int64_t units : {int64_t(2) * S, int64_t(3)}) {
          const int64_t e = along_m ? units * tp : (units * kSplitUnitN + (units % 2 ? 3 : 0)) * tp;
          Problem p{along_m ? e : int64_t(tp) * 4, along_m ? int64_t(tp) * 8 : e, int64_t(tp) * 16,
                    1};
          if (!validate(*def, p, tp, S).empty()) continue;
          for (PartialVia via : {PartialVia::Epilogue, PartialVia::CopyEngine}) {
            PlanOptions o;
            o.partial_via = via;
            const Plan plain = build_plan(*def, p, tp, S, o);
            for (int mask = 0; mask < 4; ++mask) {
              o.row_scale_a = mask & 1;
              o.row_scale_b = mask & 2;
              const Plan plan = build_plan(*def, p, tp, S, o);
              check_row_scales(*def, plan, o.row_scale_a, o.row_scale_b);
              CHECK(same_ops_but_scales(plan, plain), "%s TP=%d S=%d scales %d: ops differ",
                    def->name, tp, S, mask);
            }
          }
        }
      }
    }
  }
}

int main() {
  test_tile_maps();
  test_plans();
  test_tile_split();
  test_uneven_plans();
  test_accepted_uneven();
  test_bad_input();
  test_scale_ref_rule();
  test_row_scales();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
