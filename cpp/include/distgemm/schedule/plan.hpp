// Plan: the one description of a distributed GEMM that the simulator, the CPU reference
// executor and the CUDA graph builder all consume; this header is the whole host-only API:
// the types (plan_types.hpp), build_plan (plan_builder.hpp) and the defaults (defaults.hpp).
#pragma once

#include "distgemm/schedule/defaults.hpp"
#include "distgemm/schedule/plan_builder.hpp"
#include "distgemm/schedule/plan_types.hpp"

namespace distgemm::schedule {

// The plan with the library's default options.
inline Plan build_plan(const ScheduleDef& def, const Problem& problem, int tp, int steps) {
  return build_plan(def, problem, tp, steps, default_plan_options(def, tp, steps));
}

}  // namespace distgemm::schedule
