// distgemm_bench's failure checks of one case: a device that never launches (its peers must
// report a timeout, not hang) and many replays (no memory growth, the output still verifies).
#pragma once

#include "args.hpp"
#include "harness.hpp"

namespace distgemm::bench {

// Launches every graph but device a.missing's and prints the RESULT line. Returns the exit code:
// 1 in both outcomes (a reported timeout is the run-time error the check expects; none is a
// failure of the runtime).
int run_missing_device(const Args& a, Setup& s);

// a.replays launches, then host RSS and device memory against their values before, and with a
// reference (g not null) the output verified again into rel_err_replays. Prints the "replays:"
// line; false when memory grew or the output no longer verifies.
bool check_replays(const Args& a, Setup& s, Global* g, schedule::Problem prob,
                   double& rel_err_replays);

}  // namespace distgemm::bench
