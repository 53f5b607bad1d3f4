// distgemm_bench --sweep: the Llama-3 layer sweep from one process, and its dry run.
#pragma once

#include "args.hpp"

namespace distgemm::bench {

// Lists the cases of the sweep (--dry-run) without calling into CUDA; exit code 0.
int dry_run(const Args& a);

// Runs the sweep: a progress line per case on stderr, the table on stdout at the end, the same
// rows in --csv. Exit code 1 when any check fails or a case fails at run time.
int run_sweep(Args a);

}  // namespace distgemm::bench
