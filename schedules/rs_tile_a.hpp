// rs_tile_a — GEMM + ReduceScatter along M, rotating C (row-parallel linear: attention O, FC2).
//
// Purpose: D_d = reduce_scatter_M(A_d @ B_d^T): every device holds a K shard; the partial sum of
// each M tile travels around the ring and is finished on its owner, with no collective after.
// Partition: A sharded on K (A_d[M, K/TP]); B sharded on K (B_d[N, K/TP]);
//            C/D sharded on M (D_d[M/TP, N]); bias is the full N vector.
// Assumptions: M and K divisible by TP (tiles of M may be uneven when S does not divide M).
// Pitfalls: a tile's first visit has no epilogue source; each later visit reads the partial
//           that the previous device wrote into this device's receive slot (the epilogue wrote
//           it across NVLink). Only the last visit (the owner) adds beta*C and bias.
//           The partial of (d, i) is consumed at i + k: S > TP gives the transfer k steps of slack.
//
// Tile of M computed by device d at iteration i, TP=4, S=4 (k=1); '*' = final, on its owner:
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
inline constexpr ScheduleDef rs_tile_a{
    "rs_tile_a",
    "GEMM overlapped with reduce-scatter of D along M (rotating partial C)",
    Collective::ReduceScatter,
    Operand::C,
    Mode::M,
    Partition{Mode::K, Mode::K, Mode::M},
    AffineTileMap{1, 1, 1}};
}  // namespace distgemm::schedules
