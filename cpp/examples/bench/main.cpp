// distgemm_bench: runs one schedule on TP GPUs of this process, verifies it against a
// single-GPU reference GEMM of the full problem and times it; with --sweep, the Llama-3
// tensor-parallel layer sweep of benchmarks/sweep/llama_sweep.py from one process, on the same
// shapes (both from python/distgemm/data/llama3.json), so single-process numbers sit beside the
// torchrun ones.
//
//   distgemm_bench --schedule ag_rotate_a --tp 2 --steps 2 --m 8192 --n 57344 --k 8192
//                  --l 1 --dtype bf16|fp16|fp8 [--scales tensor|row] [--fast-accum]
//                  --iterations 50 --warmup 10 [--beta 0.5] [--bias]
//                  [--timeout-s 5] [--replays 10000] [--simulate-missing-device D]
//                  [--check-update] [--no-verify] [--no-local] [--warmup-ms 1000]
//                  [--swizzle 8] [--raster 0] [--pdl|--no-pdl] [--partial-via epilogue|copy]
//                  [--tile-n auto|128|256] [--verify-rows R] [--graph-json PATH]
//   distgemm_bench --sweep [quick|full] [--tp T] [--models 8B,70B] [--tokens 4096,8192]
//                  [--layers QKV,O] [--csv PATH] [--dry-run] [--verify-rows 256]
//                  [--warmup-ms 300] [--iterations auto] [--dtype bf16|fp16|fp8]
//                  [--scales tensor|row] [--fast-accum] [--pdl|--no-pdl] ...
// --dtype fp8: e4m3 A and B, quantized from seeded uniform data with one float32 scale per
// operand (--scales tensor, the default) or per row of A and of B (--scales row); bf16 D, C and
// bias; the reference is the fp32 GEMM of the dequantized inputs. --fast-accum: the fp8
// fast-accumulation kernel. Refused at fp8: --alpha other than 1 (fold it into the scales) and
// --tile-n (the fp8 kernel follows --fast-accum).
// --pdl/--no-pdl: programmatic dependent launch between the GEMM steps (default: where it pays,
// device::pdl_by_default); --partial-via: how reduce-scatter partials reach the next device
// (default: schedule::default_plan_options); --tile-n: the GEMM output tile 128 x 128 or
// 128 x 256 for every GEMM (default auto: per GEMM, kernel::choose_config); --graph-json: every
// device's captured graph as JSON (graph_json.cpp).
//
// Single case (single_case.cpp): prints one line `RESULT key=value ...`. Exit code: 0 verified
// (and timed), 1 verification failure or runtime error (a timeout report included), 2 bad
// arguments or a shape rejected before launch.
// Sweep (sweep.cpp): a table on stdout, the same rows in --csv; exit code 1 when any check fails
// or a case fails at run time, 2 for bad arguments. --dry-run lists the cases, their per-device
// shapes and skip reasons without calling into CUDA (it needs --tp: it does not count the GPUs).
// TP defaults to every visible GPU (at most schedule::kMaxTp). On a machine without a CUDA GPU
// it says so (exit code 2) rather than naming the first CUDA call that failed. --help lists every
// option.
#include <cuda_runtime.h>

#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>

#include "args.hpp"
#include "single_case.hpp"
#include "sweep.hpp"

namespace {

// Why this process sees no CUDA GPU ("" when it sees one).
std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err);
  return n > 0 ? "" : "cudaGetDeviceCount: 0 devices";
}

}  // namespace

int main(int argc, char** argv) {
  using namespace distgemm::bench;
  const Args a = parse(argc, argv);
  try {
    if (a.dry_run) return dry_run(a);
    if (!a.sweep.empty()) return run_sweep(a);
    return run_single_case(a);
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "error: rejected: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // The arguments and the plan are checked before any GPU is asked for; a CUDA failure on a
    // machine without a GPU is that.
    if (const std::string why = no_gpu_reason(); !why.empty()) {
      std::fprintf(stderr,
                   "error: no CUDA GPU visible (%s): distgemm_bench runs on Hopper GPUs; "
                   "--sweep quick --tp 2 --dry-run lists the sweep without one\n",
                   why.c_str());
      return 2;
    }
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
