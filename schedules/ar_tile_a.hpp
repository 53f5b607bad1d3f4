// ar_tile_a — GEMM + AllReduce as one plan: the rs_tile_a ring, then an all-gather of the
// finished D tiles (for decode-style layers whose next op wants the full D everywhere).
//
// Purpose: D = A_d @ B_d^T summed over devices, replicated on every device.
// Partition: A sharded on K (A_d[M, K/TP]); B sharded on K (B_d[N, K/TP]);
//            C/D replicated (D_d[M, N] on every device); bias is the full N vector.
// Assumptions: K divisible by TP; any M >= 1 (tiles of M are uneven when S does not divide M,
//              and empty when M < S: a decode step of one token at TP=2 runs one GEMM per device).
// Pitfalls: the owner's last visit writes the finished tile into its own D; its copy engine then
//           pushes the tile into a receive slot of every peer and sets that peer's flag; each
//           peer, after its last GEMM, waits for the flag and copies the slot into its D (local).
//           Only pushes cross NVLink: a memcpy that reads a peer's memory may run on the peer's
//           copy engine and couple the two devices' copy queues, which can deadlock them.
//           With S > TP the first finished chunks travel while the owner still computes the rest.
//
// Tile of M computed by device d at iteration i, TP=4, S=4 (k=1); '*' = final, on its owner:
//         i=0 i=1 i=2 i=3
//   dev0   1   2   3   0*
//   dev1   2   3   0   1*
//   dev2   3   0   1   2*
//   dev3   0   1   2   3*
// Formula: tile(d, i) = (k*d + i + k) mod S; then owner t/k pushes tile t to everyone.
#pragma once
#include "distgemm/schedule/scheduler.hpp"

namespace distgemm::schedules {
using namespace distgemm::schedule;
inline constexpr ScheduleDef ar_tile_a{
    "ar_tile_a",
    "GEMM overlapped with reduce-scatter of D, then all-gather of D (all-reduce)",
    Collective::AllReduce,
    Operand::C,
    Mode::M,
    Partition{Mode::K, Mode::K, Mode::None},
    AffineTileMap{1, 1, 1}};
}  // namespace distgemm::schedules
