// ag_rotate_b — AllGather + GEMM, the rotating operand is B (weights gathered: FSDP-style
// sequence parallel, where activations stay put and weight shards travel).
//
// Purpose: D_d = A_d @ allgather_N(B)^T with the weight all-gather hidden behind the GEMM.
// Partition: A sharded on M (A_d[M/TP, K], never moves); B sharded on N (B_d[N/TP, K], rotates);
//            C/D sharded on M (D_d[M/TP, N]); bias is the full N vector.
// Assumptions: M and N divisible by TP (tiles of N may be uneven when S does not divide N).
// Pitfalls: same slot and barrier rules as ag_rotate_a; the tile walks N, so the bias and C
//           offsets move with the tile while A stays the device's own.
//
// Tile of N computed by device d at iteration i, TP=4, S=4 (k=1):
//         i=0 i=1 i=2 i=3
//   dev0   0   1   2   3
//   dev1   1   2   3   0
//   dev2   2   3   0   1
//   dev3   3   0   1   2
// Formula: tile(d, i) = (k*d + i) mod S;  B rows of tile t come from device t / k.
#pragma once
#include "distgemm/schedule/scheduler.hpp"

namespace distgemm::schedules {
using namespace distgemm::schedule;
inline constexpr ScheduleDef ag_rotate_b{
    "ag_rotate_b",
    "all-gather of B (sharded on N) overlapped with GEMM; D sharded on M",
    Collective::AllGather,
    Operand::B,
    Mode::N,
    Partition{Mode::M, Mode::N, Mode::M},
    AffineTileMap{1, 1, 0}};
}  // namespace distgemm::schedules
