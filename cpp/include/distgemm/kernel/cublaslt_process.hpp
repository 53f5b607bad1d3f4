// cuBLASLt's process-wide state, apart from the GEMM interface (gemm.hpp): the row-bucket switch
// and the host time its GEMMs cost.
//
// Whether cuBLASLt GEMMs share their row bucket's algorithm (gemm_cublaslt.cpp says how and
// why): off by default, so that the heuristic chooses for every row count. The Python layer sets
// it from DISTGEMM_CUBLASLT_ROW_BUCKETS before the process's first cuBLASLt GEMM. A shape's
// algorithm, once chosen, is kept.
#pragma once

#include <cstdint>

namespace distgemm::kernel {

void set_cublaslt_row_buckets(bool on);
bool cublaslt_row_buckets();

// Host nanoseconds this process has spent in cuBLASLt's work, summed per kind: the heuristic's
// queries, cublasLtMatmulAlgoCheck of a bucket's algorithm for a GEMM's own rows, preload
// graphs (capture and instantiation), and GEMM enqueues or captures (descriptors included; a
// preload's own enqueue counts in both).
// A first call's share of them says where a plan's first call spends its cuBLASLt time.
enum class CublasLtHostWork : int { kHeuristic = 0, kCheck, kPreload, kEnqueue, kCount };
int64_t cublaslt_host_ns(CublasLtHostWork work);

}  // namespace distgemm::kernel
