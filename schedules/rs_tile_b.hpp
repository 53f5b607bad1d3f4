// rs_tile_b — GEMM + ReduceScatter along N, rotating C.
//
// Purpose: like rs_tile_a, but the output is scattered along N: D_d[M, N/TP]. Useful when the
// next layer wants D sharded on its K (= this N) without a transpose, and when M is small.
// Partition: A sharded on K (A_d[M, K/TP]); B sharded on K (B_d[N, K/TP]);
//            C/D sharded on N (D_d[M, N/TP]); bias is the device's N shard.
// Assumptions: N and K divisible by TP (tiles of N may be uneven when S does not divide N).
// Pitfalls: tiles are column blocks: every operand view is strided (ld = N or N/TP), the B
//           tile is the N/S rows of B_d. Same ring rules as rs_tile_a.
//
// Tile of N computed by device d at iteration i, TP=4, S=4 (k=1); '*' = final, on its owner:
//         i=0 i=1 i=2 i=3
//   dev0   1   2   3   0*
//   dev1   2   3   0   1*
//   dev2   3   0   1   2*
//   dev3   0   1   2   3*
// Formula: tile(d, i) = (k*d + i + k) mod S; the partial goes from d to d-1 (mod TP).
#pragma once
#include "distgemm/schedule/scheduler.hpp"

namespace distgemm::schedules {
using namespace distgemm::schedule;
inline constexpr ScheduleDef rs_tile_b{
    "rs_tile_b",
    "GEMM overlapped with reduce-scatter of D along N (rotating partial C)",
    Collective::ReduceScatter,
    Operand::C,
    Mode::N,
    Partition{Mode::K, Mode::K, Mode::N},
    AffineTileMap{1, 1, 1}};
}  // namespace distgemm::schedules
