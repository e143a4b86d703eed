// Asynchronous copies into shared memory for the labs (scripts/*-lab.cu):
// mbarriers and bulk copies (cp.async.bulk) that complete on them. A warp
// that waits on a barrier's phase must be the only one taking its rounds:
// a parity wait cannot tell a phase from the one two rounds later.
#pragma once
#include <cstdint>

__device__ __forceinline__ uint32_t smem_addr(const void * p) {
    return uint32_t(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t * b, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(b)), "r"(count)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t * b, uint32_t parity) {
    asm volatile("{\n .reg .pred p;\n W_%=:\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra W_%=;\n}" ::"r"(smem_addr(b)),
                 "r"(parity)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t * b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(b)) : "memory");
}
// Arrives and adds `bytes` to what the barrier's phase waits for.
__device__ __forceinline__ void mbar_expect(uint64_t * b, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(b)),
                 "r"(bytes)
                 : "memory");
}
// `bytes` (a multiple of 16) from global src to shared dst, counted on bar.
__device__ __forceinline__ void bulk_copy(void * dst, const void * src, uint32_t bytes,
                                          uint64_t * bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], "
                 "%2, [%3];" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}
