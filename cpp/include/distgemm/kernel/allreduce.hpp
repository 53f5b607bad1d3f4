// Host rules of distgemm's own one-shot and two-shot all-reduce of a bf16/fp16 vector over the
// ranks' symmetric buffers (the kernel: cpp/src/runtime/allreduce.cu): algorithms, buffer bytes,
// the control region's layout, the grid and the argument check. No CUDA in this header, so the
// bindings and the CPU tests use it without a GPU.
//
// Two ways to tell that pushed data has arrived:
//  - flag (one_shot, two_shot): a rank writes its data plainly (16-byte stores) into the peers'
//    receive buffers, then one thread per CTA fences (fence.acq_rel.sys) and sets the CTA's flag
//    on each destination to the launch generation; the reader waits on its own copy of the flag
//    (bounded, wrap-safe) and reads what arrived from its own memory.
//  - LL lines (one_shot_ll, two_shot_ll): a rank writes its data as 16-byte lines {data0, gen,
//    data1, gen} (8 bytes of data per line; kernel/ll_line.cuh), each thread its own lines, and
//    the reader polls each line in its own receive buffer until both generation words equal this
//    launch's generation (each 8-byte half lands whole: NCCL's LL protocol). No fence, no flag,
//    no CTA barrier before a push (two_shot_ll has one before it polls the chunk sums, so that a
//    timeout names the rank that did not push): the fixed cost of a phase is one NVLink store's
//    latency, at twice the bytes.
// Every rank sums in float32 over ranks 0..tp-1 in that order, so every rank gets the same bits.
//  - one_shot(_ll): CTA c owns slice c of the vector; it pushes its slice to every peer, then
//    sums slice c over every rank's copy (own from src) into out. (tp - 1) x the vector leaves
//    each rank (x 2 as lines); one step of latency.
//  - two_shot(_ll): the vector is cut into tp chunks (rank r owns chunk r;
//    allreduce_chunk_elems); CTA c owns slice c of every chunk. It pushes its slice of chunk r to
//    rank r (area 1), sums its slice of its own chunk over the ranks into out and pushes that sum
//    to every peer (area 2), then copies the peers' sums of their chunks from area 2 into out.
//    2 (tp - 1) / tp x the vector leaves each rank (x 2 as lines); two steps of latency.
//  - two_shot_pull: every rank's input lies in its receive buffer (one region, no parity; the
//    caller wrote it there, e.g. its GEMM's output). CTA c flags its arrival to the peers with no
//    fence (the input was written by earlier work on the stream, complete when the kernel
//    starts), waits for theirs, then reads slice c of its own chunk from every rank's buffer,
//    sums it into out and stores the sum over the peers' inputs of that slice (no rank but this
//    one reads them), fences and flags; once the peers' flags of slot c arrived, it copies their
//    sums of their chunks' slice c from its own buffer into out. (tp - 1) / tp of the vector is
//    read from the peers and as much written to them; one fence per CTA. Reuse without parity:
//    a rank finishes launch g only after every peer flagged that it stored its sums into this
//    rank's buffer, which each does after its reads of this rank's buffer; the next write of
//    that buffer (the caller's input of launch g + 1) follows this rank's launch g on its stream;
//    and a peer reads or writes it in launch g + 1 only after this rank's arrival flag of g + 1.
//    With shared outputs (AllReduceDesc::shared_out: every rank's out as seen from here, a
//    captured call's output the ranks exchanged through CUDA IPC), CTA c stores the sum straight
//    into every rank's out instead and nothing is copied out of the buffer (nor where out is
//    this rank's buffer itself: in place on the input, the sums already lie there). A peer writes
//    this rank's out of launch g only after this rank's arrival flag of g (all earlier work on this
//    rank's stream, the out's previous readers included, has finished) and flags it before this
//    rank's launch g ends, so no store lands outside launch g on this rank.
//
// Launch generations: one word per CTA slot at the start of this all-reduce's own control region
// (the fused kernels' scheme, fused_allreduce.hpp): a CTA reads its word + 1 at entry and writes
// it back at the end, and CTA 0 also advances the slots its grid leaves unused, so that every word
// holds the same generation between launches, whatever the grid and the algorithm (the four
// share the words: a launch of any of them advances them by one). Generations start at 1 (the
// words are zeroed at allocation). Nothing is reset between launches: flags carry the
// generation and waits compare with `reached`; lines carry it and waits compare with ==.
//
// Parity: the receive buffers alternate between two halves by generation parity (gen & 1),
// parity_bytes apart. A rank finishes launch g only after every peer has started launch g: with
// flags it waits for every peer's same-slot flag; one_shot_ll reads the whole vector from every
// peer; in two_shot_ll chunk 0 is never empty (numel >= 8), so some CTA of every rank waits for
// owner 0's sums of launch g, which owner 0 pushes only after the pieces of every rank's launch
// g arrived. A peer starts launch g + 1 only after its whole launch g (stream order): so a peer
// is at most one launch ahead, and its pushes of launch g + 1 land in the half that this rank no
// longer reads (launch g - 1's, finished before this rank pushed anything of launch g). This
// holds whatever the sizes and algorithms of consecutive launches, since each launch's buffers
// lie within one half.
// LL lines of the previous use of a half are told apart by their generation: a line of the half
// that launch g reads, not yet written by launch g, was written by an earlier launch of the same
// parity, so it carries g - 2, g - 4, ... (or 0: never written since the zeroed allocation), never
// g (the 32-bit generation repeats only after 2^32 launches, as the fused decode kernel's).
// Lines are told apart by generation alone, so the LL algorithms get receive buffers of their
// own (runtime/allreduce.py) in which nothing but lines is ever written: a flag algorithm's data
// in the same bytes could hold any value, this launch's generation included.
#pragma once

#include <cstdint>
#include <string>

#include "distgemm/kernel/gemm.hpp"  // DType, dtype_bytes
#include "distgemm/kernel/wait_spec.hpp"

namespace distgemm::kernel {

enum class AllReduceAlgorithm {
  OneShot = 0,
  TwoShot = 1,
  OneShotLL = 2,
  TwoShotLL = 3,
  TwoShotPull = 4
};

inline constexpr int kAllReduceAlgorithms = 5;
inline constexpr const char* kAllReduceAlgorithmNames[kAllReduceAlgorithms] = {
    "one_shot", "two_shot", "one_shot_ll", "two_shot_ll", "two_shot_pull"};

inline constexpr bool allreduce_two_shot(AllReduceAlgorithm a) {
  return a == AllReduceAlgorithm::TwoShot || a == AllReduceAlgorithm::TwoShotLL ||
         a == AllReduceAlgorithm::TwoShotPull;
}
// Whether `a` reads its peers' inputs where they lie, in their receive buffers (the caller
// writes its input into its own: runtime/allreduce.py's all_reduce_input), instead of taking
// `src` and pushing it.
inline constexpr bool allreduce_pull(AllReduceAlgorithm a) {
  return a == AllReduceAlgorithm::TwoShotPull;
}
// Whether `a` pushes LL lines (16 bytes carry 8 bytes of data) rather than data and a flag.
inline constexpr bool allreduce_lines(AllReduceAlgorithm a) {
  return a == AllReduceAlgorithm::OneShotLL || a == AllReduceAlgorithm::TwoShotLL;
}

// Threads per CTA: each moves 16-byte vectors (8 elements), or with LL 16-byte lines (4 elements).
inline constexpr int kAllReduceThreads = 512;
inline constexpr int kAllReduceVecElems = 8;
// An LL line's bytes, and the bytes of data it carries.
inline constexpr int kAllReduceLineBytes = 16;
inline constexpr int kAllReduceLineDataBytes = 8;
// Bytes a CTA pushes to one peer before the grid takes one more CTA: one_shot's slice of the
// vector, two_shot's slice of a chunk, as data (one 16-byte vector per thread) or as LL lines
// (one line per thread: half the data).
inline constexpr int64_t kAllReduceCtaBytes = int64_t(kAllReduceThreads) * 16;
// CTA slots of the control region: generation words and flags per source and phase.
inline constexpr int kAllReduceMaxCtas = 256;
// The control region: kAllReduceMaxCtas generation words, then flags
// [phase 2][source kMaxDevices][slot kAllReduceMaxCtas] (phase 0: a source's pushed data;
// phase 1: two_shot's pushed sums), 4 bytes each.
inline constexpr int64_t kAllReduceFlagsOffsetWords = kAllReduceMaxCtas;
inline constexpr int64_t allreduce_control_bytes() {
  return (kAllReduceFlagsOffsetWords + 2 * int64_t(kMaxDevices) * kAllReduceMaxCtas) * 4;
}
// Every flag's word index within a rank's control region.
inline constexpr int64_t allreduce_flag_word(int phase, int source, int slot) {
  return kAllReduceFlagsOffsetWords + (int64_t(phase) * kMaxDevices + source) * kAllReduceMaxCtas +
         slot;
}

// False for an unknown name.
inline bool parse_allreduce_algorithm(const std::string& name, AllReduceAlgorithm& out) {
  for (int i = 0; i < kAllReduceAlgorithms; ++i)
    if (name == kAllReduceAlgorithmNames[i]) {
      out = static_cast<AllReduceAlgorithm>(i);
      return true;
    }
  return false;
}

// two_shot's chunk: numel / tp rounded up to a multiple of 8 elements (16-byte vectors); chunk r
// is [r * chunk, min((r + 1) * chunk, numel)), the last ones shorter or empty.
inline int64_t allreduce_chunk_elems(int64_t numel, int tp) {
  const int64_t per = int64_t(tp) * kAllReduceVecElems;
  return (numel + per - 1) / per * kAllReduceVecElems;
}

// "" for an algorithm's name, else the reason.
inline std::string allreduce_algorithm_problem(const std::string& algorithm) {
  AllReduceAlgorithm a;
  if (parse_allreduce_algorithm(algorithm, a)) return "";
  std::string known;
  for (const char* name : kAllReduceAlgorithmNames)
    known += (known.empty() ? "" : ", ") + std::string(name);
  return "algorithm '" + algorithm + "' is not one of " + known;
}

// "" when the all-reduce runs these arguments, else the reason with the values.
inline std::string allreduce_problem(const std::string& algorithm, int64_t numel, int element_bytes,
                                     int tp) {
  const std::string unknown = allreduce_algorithm_problem(algorithm);
  if (!unknown.empty()) return unknown;
  if (element_bytes != 2)
    return "element_bytes=" + std::to_string(element_bytes) + " is not 2 (bf16 or fp16)";
  if (tp < 1 || tp > kMaxDevices)
    return "tp=" + std::to_string(tp) + " is not in 1.." + std::to_string(kMaxDevices);
  if (numel < kAllReduceVecElems || numel % kAllReduceVecElems != 0)
    return "numel=" + std::to_string(numel) + " must be a positive multiple of " +
           std::to_string(kAllReduceVecElems) + " (16-byte vectors)";
  return "";
}

// Bytes of one rank's receive buffers, both parities: one_shot [parity][source tp][numel];
// two_shot [parity][area 2][tp][chunk] (area 1: the sources' pieces of this rank's chunk, area 2:
// the owners' sums of their chunks); the LL algorithms the same as lines, twice the bytes;
// two_shot_pull [numel] (this rank's input, one region: no parity, see its kernel). Call after
// allreduce_problem passed.
inline int64_t allreduce_receive_bytes(const std::string& algorithm, int64_t numel,
                                       int element_bytes, int tp) {
  AllReduceAlgorithm a = AllReduceAlgorithm::OneShot;
  parse_allreduce_algorithm(algorithm, a);
  if (allreduce_pull(a)) return numel * element_bytes;
  const int64_t data = allreduce_two_shot(a)
                           ? 2 * int64_t(tp) * allreduce_chunk_elems(numel, tp) * element_bytes
                           : int64_t(tp) * numel * element_bytes;
  const int64_t per_parity =
      allreduce_lines(a) ? data / kAllReduceLineDataBytes * kAllReduceLineBytes : data;
  return 2 * per_parity;
}

// The grid: one CTA per kAllReduceCtaBytes that a CTA pushes to one peer, of its slice (one_shot:
// of the vector; two_shot: of a chunk) as data, or with LL as lines (twice the data: one line per
// thread, so that a small vector is polled by as many threads as it has lines), at least 1, at
// most `resident_ctas` (a CTA waits for the peers' CTAs of its index, so every CTA must be
// resident at once) and the kAllReduceMaxCtas slots. Every rank must use the same grid for the
// same numel (the caller passes the smallest resident count of the ranks).
inline int allreduce_ctas(const std::string& algorithm, int64_t numel, int element_bytes, int tp,
                          int resident_ctas) {
  AllReduceAlgorithm a = AllReduceAlgorithm::OneShot;
  parse_allreduce_algorithm(algorithm, a);
  const int64_t elems = allreduce_two_shot(a) ? allreduce_chunk_elems(numel, tp) : numel;
  int64_t bytes = elems * element_bytes;
  if (allreduce_lines(a)) bytes = bytes / kAllReduceLineDataBytes * kAllReduceLineBytes;
  int64_t ctas = (bytes + kAllReduceCtaBytes - 1) / kAllReduceCtaBytes;
  if (ctas > resident_ctas) ctas = resident_ctas;
  if (ctas > kAllReduceMaxCtas) ctas = kAllReduceMaxCtas;
  return ctas < 1 ? 1 : static_cast<int>(ctas);
}

// One launch on one rank. Pointers are device addresses as seen from this rank (peers' through
// CUDA IPC).
struct AllReduceDesc {
  DType dtype = DType::BF16;
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::OneShot;
  int64_t numel = 0;
  const void* src = nullptr;  // this rank's [numel], 16-byte aligned
  void* out = nullptr;        // [numel]: src itself (in place) or a tensor apart from it
  int tp = 1, rank = 0;
  int ctas = 1;  // allreduce_ctas
  // Every rank's receive buffers (allreduce_receive_bytes), parity 1 parity_bytes after parity 0:
  // at least half the receive bytes and a multiple of 16, the same on every rank.
  void* receive[kMaxDevices] = {};
  int64_t parity_bytes = 0;
  uint32_t* control[kMaxDevices] = {};  // every rank's all-reduce control region
  // two_shot_pull only: every rank's out as seen from this rank (shared_out[rank] == out), or
  // all null (each rank copies the peers' sums out of its receive buffer).
  void* shared_out[kMaxDevices] = {};
  uint32_t* abort = nullptr;      // this rank's sticky abort word
  ErrorRecord* record = nullptr;  // where a timeout is reported
  uint64_t timeout_ns = static_cast<uint64_t>(kDefaultTimeoutS * 1e9);
  // Launched by programmatic dependent launch: the grid is scheduled while the kernel before it
  // on the stream ends, and waits (griddepcontrol.wait, its first instruction) until that
  // kernel is complete and its memory visible. So nothing of the all-reduce, its generation
  // reads included, runs before the previous kernel's writes are seen: only the launch is
  // hidden. After torch.mm it is the slower launch (docs/tuning.md), so the runtime launches
  // plain (runtime/allreduce.py's CHAINED).
  bool chained = false;
};

// "" when the kernel can run `d` (sizes, grid, pointers and their alignment), else the reason.
std::string allreduce_can_implement(const AllReduceDesc& d);
// CTAs of the all-reduce kernel resident at once on `device`, at most one per SM and at most
// kAllReduceMaxCtas (allreduce_ctas' bound).
int allreduce_resident_ctas(int device);
// Records one launch on `stream` (capturable: no synchronisation, no allocation).
void allreduce_launch(const AllReduceDesc& d, int device, cudaStream_t stream);

}  // namespace distgemm::kernel
