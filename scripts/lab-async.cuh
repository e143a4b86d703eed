// Asynchronous copies into shared memory for the labs (scripts/*-lab.cu,
// scripts/ring-step.cu): the mbarriers, bulk copies (cp.async.bulk) and
// mma.sync of smol's ring GEMV, from smol-cuda-rows.cuh. A warp that waits
// on a barrier's phase must be the only one taking its rounds: a parity
// wait cannot tell a phase from the one two rounds later.
#pragma once
#include "../smol-cuda-rows.cuh"

using smol::bulk_copy;
using smol::mbar_arrive;
using smol::mbar_arrive_warp;
using smol::mbar_expect;
using smol::mbar_init;
using smol::mbar_wait;
using smol::mma16816;
using smol::ring_b_frag;
using smol::ring_init;
using smol::ring_packed_at;
using smol::ring_row_sums;
using smol::ring_split_x;
using smol::smem_u32;
