// Whether cuBLASLt GEMMs share their row bucket's algorithm (gemm_cublaslt.cpp says how and
// why): on by default. The Python layer sets it from DISTGEMM_CUBLASLT_ROW_BUCKETS before the
// process's first cuBLASLt GEMM; "off" asks the heuristic about every row count, which A/B
// measurements compare against. A shape's algorithm, once chosen, is kept.
#pragma once

namespace distgemm::kernel {

void set_cublaslt_row_buckets(bool on);
bool cublaslt_row_buckets();

}  // namespace distgemm::kernel
