// ag_rotate_a — AllGather + GEMM, the rotating operand is A (column-parallel linear: QKV, FC1).
//
// Purpose: D = allgather_M(A) @ B_d^T without waiting for the all-gather. Each device starts on
// its own rows of A while the copy engine pushes its shard to every peer.
// Partition: A sharded on M (A_d[M/TP, K]); B sharded on N (B_d[N/TP, K], never moves);
//            C/D sharded on N (D_d[M, N/TP]); bias is the device's N shard.
// Assumptions: M and N divisible by TP (tiles of M may be uneven when S does not divide M).
// Pitfalls: the first k iterations read the device's own rows (no wait); tile t arrives from its
//           owner t / k. Receive slots hold (TP-1)/TP of A: nothing is reused within a launch,
//           and the entry barrier keeps a peer from overwriting a slot of the previous launch.
//
// Tile of M computed by device d at iteration i, TP=4, S=4 (k=1):
//         i=0 i=1 i=2 i=3
//   dev0   0   1   2   3
//   dev1   1   2   3   0
//   dev2   2   3   0   1
//   dev3   3   0   1   2
// Formula: tile(d, i) = (k*d + i) mod S;  A rows of tile t come from device t / k.
#pragma once
#include "distgemm/schedule/scheduler.hpp"

namespace distgemm::schedules {
using namespace distgemm::schedule;
inline constexpr ScheduleDef ag_rotate_a{
    "ag_rotate_a",
    "all-gather of A (sharded on M) overlapped with GEMM; D sharded on N",
    Collective::AllGather,
    Operand::A,
    Mode::M,
    Partition{Mode::M, Mode::N, Mode::N},
    AffineTileMap{1, 1, 0}};
}  // namespace distgemm::schedules
