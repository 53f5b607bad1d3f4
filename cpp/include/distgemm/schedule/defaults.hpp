// The library's defaults, each in one place: S for steps=None (default_steps, default_plan), how
// reduce-scatter partials travel (default_plan_options) and whether GEMMs chain by programmatic
// dependent launch (pdl_by_default). Host-only. How each was measured: docs/tuning.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "distgemm/kernel/gemm_extents.hpp"
#include "distgemm/schedule/plan_builder.hpp"
#include "distgemm/schedule/plan_types.hpp"

namespace distgemm::schedule {

// Partials by copy engine where S >= 2*TP gives each push a step of slack; by the epilogue at
// S = TP, where a push would sit on the consumer's critical path.
inline PlanOptions default_plan_options(const ScheduleDef& def, int tp, int steps) {
  PlanOptions o;
  if (def.collective != Collective::AllGather && steps >= 2 * tp)
    o.partial_via = PartialVia::CopyEngine;
  return o;
}

// The defaults with the partial transport a caller chose (none: the default's). The one rule
// for the bindings, the Python runtime's graphs and distgemm_bench.
inline PlanOptions plan_options(const ScheduleDef& def, int tp, int steps,
                                std::optional<PartialVia> partial_via) {
  PlanOptions o = default_plan_options(def, tp, steps);
  if (partial_via) o.partial_via = *partial_via;
  return o;
}

// GEMM i+1 follows GEMM i by programmatic dependent launch where the step's tail has work to
// fill without an NVLink-bound epilogue beside it: all-gather plans and partials by copy engine.
inline bool pdl_by_default(Collective collective, PartialVia partial_via) {
  return collective == Collective::AllGather || partial_via == PartialVia::CopyEngine;
}
inline bool pdl_by_default(const Plan& plan) {
  return pdl_by_default(plan.def.collective, plan.partial_via);
}

// '' when the GEMM kernel's extent rule (kernel/gemm_extents.hpp) admits every sub-GEMM of
// `device` (-1: of every device), else the first reason.
inline std::string plan_extent_problem(const Plan& plan, int device, int elem_bytes = 2) {
  for (int d = 0; d < plan.tp; ++d) {
    if (device >= 0 && d != device) continue;
    for (const GemmOp& g : plan.devices[d].gemms) {
      std::string why = kernel::gemm_extent_problem(g.m, g.n, g.k, 1, elem_bytes);
      if (!why.empty()) return why;
    }
  }
  return "";
}

// Reduce-scatter plans take S = 2*TP from this many tokens (M) on: with fewer, the extra step
// costs more than its slack hides.
inline constexpr int64_t kRsTwoStepsMinTokens = 4096;
// ... and with at most this much K per rank: with a longer K the epilogue's peer writes are a
// small part of the mainloop, so S = TP loses little to them and saves a step.
inline constexpr int64_t kRsTwoStepsMaxKPerRank = 8192;

// The default options of (def, TP, S) with the row scales of `scales` (fp8).
inline PlanOptions with_scales(const ScheduleDef& def, int tp, int steps,
                               const PlanOptions& scales) {
  PlanOptions o = default_plan_options(def, tp, steps);
  o.row_scale_a = scales.row_scale_a;
  o.row_scale_b = scales.row_scale_b;
  return o;
}

// The plan steps=None takes where it is S = 2*TP: reduce-scatter plans (rs_tile_a, rs_tile_b)
// with at least kRsTwoStepsMinTokens tokens and at most kRsTwoStepsMaxKPerRank of K per rank
// (partials staged for the copy engine with a step of slack), where S = 2*TP cuts the split mode
// into equal tiles, of whole 8-column units along N (the shapes the rule was measured on) and the
// plan and the kernel's extent rule accept it; nullopt where the rule keeps S = TP. S = TP is valid
// for every problem validate accepts: its tiles are the devices' shards, or for ar_tile_a a
// split of any M (empty tiles below TP tokens, which cost nothing; fewer steps are not possible, S
// is a multiple of TP). Shapes only, so every rank agrees.
// `scales`: the row scales the plan carries (PlanOptions::row_scale_a / row_scale_b).
inline std::optional<Plan> two_step_default_plan(const ScheduleDef& def, int tp,
                                                 const Problem& problem,
                                                 const PlanOptions& scales = {}) {
  if (def.collective != Collective::ReduceScatter || tp < 2) return std::nullopt;
  const int steps = 2 * tp;
  const int64_t split_extent = def.split == Mode::M ? problem.m : problem.n;
  if (problem.m < kRsTwoStepsMinTokens || problem.n < 1 || problem.k < 1 ||
      def.partition.local_a(problem, tp).cols > kRsTwoStepsMaxKPerRank ||
      split_extent % steps != 0 ||
      (def.split == Mode::N && (split_extent / steps) % kSplitUnitN != 0) ||
      !validate(def, problem, tp, steps).empty())
    return std::nullopt;
  Plan plan = build_plan(def, problem, tp, steps, with_scales(def, tp, steps, scales));
  if (!plan_extent_problem(plan, -1).empty()) return std::nullopt;
  return plan;
}

// S for steps=None: 2*TP where two_step_default_plan takes it, else TP.
inline int default_steps(const ScheduleDef& def, int tp, const Problem& problem) {
  return two_step_default_plan(def, tp, problem) ? 2 * tp : tp;
}

// The plan of steps=None, built once: the S = 2*TP plan of the rule, else the S = TP plan
// (build_plan's std::invalid_argument where the problem does not split into TP steps).
inline Plan default_plan(const ScheduleDef& def, int tp, const Problem& problem,
                         const PlanOptions& scales = {}) {
  if (std::optional<Plan> plan = two_step_default_plan(def, tp, problem, scales))
    return std::move(*plan);
  return build_plan(def, problem, tp, tp, with_scales(def, tp, tp, scales));
}

}  // namespace distgemm::schedule
