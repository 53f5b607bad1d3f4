// Symmetric workspace of a Plan: one allocation of plan.layout(elem_bytes).total_bytes on every
// device (receive slots, flags, entry-barrier slots, epoch word), zero-initialised, so that a
// flag or slot has the same offset on every device.
//
// Extra device memory per device = Plan::extra_bytes(elem_bytes) (receive slots dominate):
//   ag_rotate_a / ag_rotate_b : (S - S/TP) slots of L*(M/S)*K resp. L*(N/S)*K elements
//                               = (TP-1)/TP of the gathered operand
//   rs_tile_a / rs_tile_b     : (S - S/TP) slots of one D tile = (S - S/TP) * L*M*N/S elements
//                               with partials by epilogue; 2(S - S/TP) with partials by copy
//                               engine (a local staging slot per non-final step)
//   ar_tile_a            : 2(S - S/TP) slots of one D tile (partials + the finished tiles
//                               pushed by their owners); 3(S - S/TP) with partials by copy engine
// plus the control region after the slots (schedule::control_layout(): kMaxFlags flags, kMaxTp
// barrier slots and the epoch word, 1280 bytes), the same for every plan.
//
// Single process: cudaMalloc on each device and peer access between every pair, so a base
// address is valid on every device (unified addressing). A multi-process runtime passes
// IPC-opened addresses to DeviceGraph instead; DeviceGraph only ever sees base addresses.
#pragma once

#include <cstdint>
#include <vector>

namespace distgemm::device {

// Enables peer access between every ordered pair of `devices`; throws (naming the pair and the
// remedy) when the hardware has no peer path.
void enable_peer_access(const std::vector<int>& devices);

class LocalSymmetricWorkspace {
 public:
  LocalSymmetricWorkspace(const std::vector<int>& cuda_devices, int64_t bytes);
  ~LocalSymmetricWorkspace();
  LocalSymmetricWorkspace(const LocalSymmetricWorkspace&) = delete;
  LocalSymmetricWorkspace& operator=(const LocalSymmetricWorkspace&) = delete;

  // Base of rank r's workspace; valid on every device of the set.
  void* base(int rank) const { return bases_.at(rank); }
  const std::vector<void*>& bases() const { return bases_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<int> devices_;
  std::vector<void*> bases_;
  int64_t bytes_ = 0;
};

}  // namespace distgemm::device
