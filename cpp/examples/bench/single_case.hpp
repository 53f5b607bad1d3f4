// distgemm_bench's single case (everything but --sweep).
#pragma once

#include "args.hpp"

namespace distgemm::bench {

// Runs the case of `a` and prints its RESULT line. Exit code: 0 verified (and timed), 1
// verification failure or run-time error (a timeout report included), 2 a shape rejected
// before launch.
int run_single_case(Args a);

}  // namespace distgemm::bench
