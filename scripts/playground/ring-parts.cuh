// Asynchronous copies into shared memory for the labs (scripts/*-lab.cu,
// scripts/ring-step.cu): 16-byte cp.async copies in commit groups, and the
// mbarriers, bulk copies (cp.async.bulk) and mma.sync of smol's ring GEMV,
// from smol-cuda-rows.cuh. A warp that waits on a barrier's phase must be
// the only one taking its rounds: a parity wait cannot tell a phase from
// the one two rounds later.
#pragma once
#include "../../smol-cuda-rows.cuh"

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

// One 16-byte copy from global to shared memory, a commit group of the
// copies issued since the last, and a wait until at most N groups are in
// flight (a lane's own copies: others' need a __syncwarp after).
__device__ __forceinline__ void cp16(void * s, const void * g) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(s)), "l"(g)
                 : "memory");
}
__device__ __forceinline__ void commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
