// Host-only tests of the DistributedTileScheduler and the Plan builder, built with g++ alone
// (no CUDA): the tile maps cover every tile, partials land on their owner, plans are consistent
// and bad input is rejected with the constraint in words.
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
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
        std::vector<std::vector<int>> sets(tp, std::vector<int>(plan.num_flags, 0));
        for (const DeviceProgram& dp : plan.devices) {
          for (const GemmOp& g : dp.gemms)
            for (const FlagRef& f : g.signals) sets[f.device][f.flag]++;
          for (const CopyOp& c : dp.copies)
            for (const FlagRef& f : c.signals) sets[f.device][f.flag]++;
        }
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
  expect_error(ag_rotate_a, {8190, 64, 64, 1}, 2, 8, "M=8190 is not divisible by S=8");
  expect_error(ag_rotate_a, {64, 63, 64, 1}, 2, 2, "N=63 is not divisible by TP=2");
  expect_error(rs_tile_a, {64, 64, 63, 1}, 2, 2, "K=63 is not divisible by TP=2");
  expect_error(rs_tile_b, {64, 60, 64, 1}, 2, 8, "N=60 is not divisible by S=8");
  expect_error(ag_rotate_b, {64, 63, 64, 1}, 3, 3, "M=64 is not divisible by TP=3");
  expect_error(gemm_allreduce, {64, 64, 64, 1}, 9, 9, "TP=9 is out of range");
  expect_error(gemm_allreduce, {64, 64, 64, 1}, 0, 0, "TP=0 is out of range");
  expect_error(rs_tile_a, {64, 64, 64, 1}, 2, 3, "S=3 is not a positive multiple of TP=2");
  expect_error(rs_tile_a, {64, 64, 64, 0}, 2, 2, "problem sizes must be positive");
  CHECK(distgemm::schedules::find("nope") == nullptr, "unknown schedule found");
}

int main() {
  test_tile_maps();
  test_plans();
  test_bad_input();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}
