// Plain data shared by the host and the leading-barrier device code: what a kernel waits for,
// where it reports a timeout. No CUDA headers, so host-only code (bindings) can include it.
#pragma once

#include <cstdint>

#include "distgemm/schedule/plan.hpp"

namespace distgemm::kernel {

// What a bounded wait was doing when it gave up (ErrorRecord::kind).
enum WaitKind : uint32_t {
  kWaitGemm = 0,          // a GEMM waiting for its plan flags
  kWaitCopy = 1,          // a copy-engine transfer waiting for its plan flags
  kWaitEntryBarrier = 2,  // the entry barrier waiting for a device's barrier slot
  kWaitFusedTile = 3,     // the fused GEMM + all-reduce waiting for a rank's tile
  kWaitAllReduce = 4,     // the one/two-shot all-reduce waiting for a rank's pushed slice
  kWaitFusedSum = 5,      // the fused two-shot tail waiting for a slice's owner's sum
};

// Written once per device, by the first wait that times out, into mapped host memory; the host
// reads it after synchronising. `valid` is stored last (after a system fence).
struct ErrorRecord {
  uint32_t valid;
  uint32_t kind;      // WaitKind
  int32_t device;     // plan rank that timed out
  int32_t iteration;  // GEMM iteration, copy index, or -1 for the entry barrier
  int32_t flag;       // flag index (entry barrier: the rank whose barrier slot stayed behind)
  uint32_t expected;  // generation waited for
  uint32_t observed;  // last value read
  uint32_t pad;
  uint64_t timeout_ns;
};

// Bound of every in-kernel wait unless the caller sets one (device::GraphOptions::timeout_s):
// far above any transfer's time, short enough that a missing peer is reported in seconds.
inline constexpr double kDefaultTimeoutS = 5.0;

inline constexpr int kMaxWaits = 4;  // the plans wait on at most one flag per op; headroom

// A kernel's leading barrier: wait until flags[flag_ids[j]] reaches *epoch for every j.
struct WaitSpec {
  const uint32_t* epoch = nullptr;  // this device's launch generation (workspace epoch word)
  uint32_t* abort = nullptr;        // this device's sticky abort word (device memory)
  ErrorRecord* record = nullptr;    // device address of the mapped host error record
  const uint32_t* flags = nullptr;  // this device's flag array
  int32_t flag_ids[kMaxWaits] = {0, 0, 0, 0};
  int32_t num_flags = 0;
  int32_t device = 0;
  int32_t iteration = 0;
  uint32_t kind = kWaitGemm;
  uint64_t timeout_ns = static_cast<uint64_t>(kDefaultTimeoutS * 1e9);
};

// Per-device arrays hold every TP a plan accepts.
inline constexpr int kMaxDevices = schedule::kMaxTp;

// The entry barrier of one launch on one device (see device/graph.hpp for why it exists).
struct EntryBarrierSpec {
  uint32_t* epoch = nullptr;
  uint32_t* abort = nullptr;
  ErrorRecord* record = nullptr;
  const uint32_t* local_barrier = nullptr;   // this device's barrier slots [tp]
  uint32_t* peer_barrier[kMaxDevices] = {};  // every rank's barrier slots, as seen from here
  int32_t tp = 1;
  int32_t device = 0;
  uint64_t timeout_ns = static_cast<uint64_t>(kDefaultTimeoutS * 1e9);
};

}  // namespace distgemm::kernel
