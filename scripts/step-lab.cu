// The GEMVs of one decode step (SmolLM2-1.7B's 97 or 135M's 121: q/k/v
// with the norm folded, output with the residual, gate/up with SwiGLU, down
// with the residual, then the head; f16 random weights) in ONE persistent
// kernel: a block an SM, a producer that streams the block's share of every
// matrix, op after op, into a ring of shared-memory slots (bulk copies,
// cp.async.bulk, issued by 1 or 4 lanes; or a warp's 16-byte cp.async), and
// consumer warps that wait for the op's input at a grid barrier, then take
// the ring's slots as they land. The question it asks: since weights never
// depend on the activations, can a producer that runs ahead across op
// boundaries keep the memory pipe full while the consumers wait, so that a
// step costs its bytes rather than a launch's ramp and drain a matrix? For
// comparison, the same GEMVs one launch an op (bulk_gemv): a block asks for
// all its rows' bytes with one bulk copy before anything else, launched
// early or not. BENCHMARKS.md ("a persistent decode step, in a lab") has
// the answers.
//
// Each variant is checked against one plain kernel an op (max error of the
// logits and of the residual stream), then timed replayed from a CUDA graph
// against the floor of the bytes at 4.2 TB/s. Timing-only variants leave
// out parts of the work: the arithmetic, the grid barrier, both, or
// everything but the slots' copies and their release ("slots alone"); their
// results are wrong by design.
//
//   nvcc -O3 -std=c++20 -arch=sm_90 -o step-lab scripts/step-lab.cu
//   ./step-lab
#include "gemv-lab.cuh"  // CK, Op, and the headers
#include "lab-async.cuh" // mbarriers and bulk copies

constexpr int max_k = 8192;

// Consumer warps only (the producer never joins).
template <int NC> __device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;" ::"n"(NC * 32) : "memory");
}

// a += the four f16 weights at wr + k times x; au likewise with ur's when
// the op is SwiGLU's (up).
__device__ __forceinline__ void dot4(const __half * wr, const __half * ur, int k, float4 x, bool up,
                                     float & a, float & au) {
    const uint2 raw = *reinterpret_cast<const uint2 *>(wr + k);
    const __half2 * h = reinterpret_cast<const __half2 *>(&raw);
    float2 f0 = __half22float2(h[0]), f1 = __half22float2(h[1]);
    a += f0.x * x.x + f0.y * x.y + f1.x * x.z + f1.y * x.w;
    if (up) {
        const uint2 ru = *reinterpret_cast<const uint2 *>(ur + k);
        const __half2 * hu = reinterpret_cast<const __half2 *>(&ru);
        f0 = __half22float2(hu[0]), f1 = __half22float2(hu[1]);
        au += f0.x * x.x + f0.y * x.y + f1.x * x.z + f1.y * x.w;
    }
}

// The rows [lo, hi) of an op that block b of nb takes.
__host__ __device__ inline void share(const Op & o, int b, int nb, int & lo, int & hi) {
    lo = int((long long)o.rows * b / nb);
    hi = int((long long)o.rows * (b + 1) / nb);
}
// What one slot holds of an op: `rows` whole rows (gate's, then up's), or
// when a row is larger than a slot, a piece of one row (pieces a row).
struct Unit {
    int rows, pieces;
};
__host__ __device__ inline Unit unit_of(const Op & o, int slot_bytes) {
    const int row = o.K * 2 * (o.wu ? 2 : 1);
    if (row <= slot_bytes) return {slot_bytes / row, 1};
    int pieces = 1;
    while (row / pieces > slot_bytes || o.K % pieces) ++pieces;
    return {1, pieces};
}
// The slots an op takes in block b, the rows of its slot j and where they begin.
__host__ __device__ inline int slots_of(const Op & o, Unit u, int lo, int hi) {
    return u.pieces > 1 ? (hi - lo) * u.pieces : (hi - lo + u.rows - 1) / u.rows;
}
// Block b's part of an op: its rows, what a slot holds, how many slots.
struct Part {
    int lo, hi;
    Unit u;
    int n_sl;
};
__device__ inline Part part_of(const Op & o, int b, int nb, int slot_bytes) {
    Part pt;
    share(o, b, nb, pt.lo, pt.hi);
    pt.u = unit_of(o, slot_bytes);
    pt.n_sl = slots_of(o, pt.u, pt.lo, pt.hi);
    return pt;
}

constexpr int x_regs = 16;      // float4s of x a lane keeps: rows of up to 2048
constexpr int max_parts = 1024; // a block's (row, piece) sums an op, gate's and up's

enum : int { cp_bulk = 0, cp_lanes = 1 };

// flags: 1 skip the arithmetic, 2 skip the grid barrier (timings only).
// CP: the producer's copies, one thread's bulk copies or a warp's 16-byte
// cp.async with an arrive on completion.
template <int NC, int CP>
__global__ void __launch_bounds__((NC + 1) * 32, 1)
    step_kernel(const Op * ops, int n_ops, int slot_bytes, int n_slots, unsigned * grid_bar,
                int flags, int np) {
    extern __shared__ __align__(128) uint8_t sm[];
    uint8_t * ring = sm;
    float * xs = reinterpret_cast<float *>(ring + size_t(slot_bytes) * n_slots);
    float * parts = xs + max_k; // [max_parts][2]
    uint64_t * full = reinterpret_cast<uint64_t *>(parts + 2 * max_parts);
    uint64_t * empty = full + n_slots;
    __shared__ float red[NC];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int nb = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < n_slots; ++s) {
            mbar_init(full + s, CP == cp_bulk ? 1 : 32);
            mbar_init(empty + s, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    if (warp == NC) { // the producer
        if (CP == cp_bulk && lane >= np) return;
        int it = 0;
        for (int oi = 0; oi < n_ops; ++oi) {
            const Op o = ops[oi];
            const auto [lo, hi, u, n_sl] = part_of(o, b, nb, slot_bytes);
            for (int j = 0; j < n_sl; ++j, ++it) {
                if (CP == cp_bulk && it % np != lane) continue;
                const int s = it % n_slots, round = it / n_slots;
                if (round > 0) mbar_wait(empty + s, (round - 1) & 1);
                // The bytes: rows r0.. (n of them), or piece pc of row r0.
                const int r0 = u.pieces > 1 ? lo + j / u.pieces : lo + j * u.rows;
                const int n = u.pieces > 1 ? 1 : min(u.rows, hi - r0);
                const size_t off =
                    size_t(r0) * o.K + (u.pieces > 1 ? (j % u.pieces) * (o.K / u.pieces) : 0);
                const uint32_t bytes =
                    u.pieces > 1 ? uint32_t(o.K / u.pieces * 2) : uint32_t(n * o.K * 2);
                uint8_t * dst = ring + size_t(s) * slot_bytes;
                if constexpr (CP == cp_bulk) {
                    mbar_expect(full + s, o.wu ? 2 * bytes : bytes);
                    bulk_copy(dst, o.w + off, bytes, full + s);
                    if (o.wu) bulk_copy(dst + bytes, o.wu + off, bytes, full + s);
                } else {
                    const uint8_t * src = reinterpret_cast<const uint8_t *>(o.w + off);
                    for (uint32_t at = lane * 16; at < bytes; at += 512)
                        asm volatile(
                            "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(dst + at)),
                            "l"(src + at)
                            : "memory");
                    if (o.wu) {
                        const uint8_t * su = reinterpret_cast<const uint8_t *>(o.wu + off);
                        for (uint32_t at = lane * 16; at < bytes; at += 512)
                            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                                             smem_u32(dst + bytes + at)),
                                         "l"(su + at)
                                         : "memory");
                    }
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                                     smem_u32(full + s))
                                 : "memory");
                }
            }
        }
        return;
    }

    // The consumers: warp w takes the ring's slots w, w + NC, ... (NC divides
    // the slots, so each slot's rounds are one warp's, in order: a parity
    // wait is only sound one phase ahead).
    int it0 = 0;
    unsigned target = 0;
    for (int oi = 0; oi < n_ops; ++oi) {
        const Op o = ops[oi];
        const auto [lo, hi, u, n_sl] = part_of(o, b, nb, slot_bytes);
        if (flags & 4) { // the slots alone: no input, no syncs
            for (int j = 0; j < n_sl; ++j) {
                const int it = it0 + j, s = it % n_slots;
                if (s % NC != warp) continue;
                mbar_wait(full + s, (it / n_slots) & 1);
                mbar_arrive_warp(empty + s);
            }
            it0 += n_sl;
            continue;
        }
        // The input, through L2 (another block wrote it), and its sum of squares.
        float ss = 0.0f;
        for (int i = threadIdx.x * 4; i < o.K; i += NC * 32 * 4) {
            float4 v = __ldcg(reinterpret_cast<const float4 *>(o.x + i));
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            if (o.nw) {
                const float4 n = *reinterpret_cast<const float4 *>(o.nw + i);
                v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
            }
            *reinterpret_cast<float4 *>(xs + i) = v;
        }
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        consumers_sync<NC>();
        const bool in_regs = u.pieces == 1 && o.K <= 128 * x_regs;
        float4 xv[x_regs];
        if (in_regs) {
#pragma unroll
            for (int i = 0; i < x_regs; ++i) {
                const int k = 128 * i + 4 * lane;
                xv[i] =
                    k < o.K ? *reinterpret_cast<const float4 *>(xs + k) : make_float4(0, 0, 0, 0);
            }
        }
        for (int j = 0; j < n_sl; ++j) {
            const int it = it0 + j, s = it % n_slots, round = it / n_slots;
            if (s % NC != warp) continue; // a slot's rounds, one warp's, in order
            mbar_wait(full + s, round & 1);
            const int r0 = u.pieces > 1 ? lo + j / u.pieces : lo + j * u.rows;
            const int n = u.pieces > 1 ? 1 : min(u.rows, hi - r0);
            const int kn = o.K / u.pieces, k0 = u.pieces > 1 ? (j % u.pieces) * kn : 0;
            const __half * wt = reinterpret_cast<const __half *>(ring + size_t(s) * slot_bytes);
            const __half * wut = wt + size_t(n) * kn;
            if (!(flags & 1)) {
                // Lane l takes elements 128 i + 4 l .. + 3 of the row: 8-byte
                // weight reads and 16-byte x reads, each warp-wide read one
                // contiguous run (no bank conflicts). x comes from registers
                // when the whole row fits them.
                for (int row = 0; row < n; ++row) {
                    const __half * wr = wt + size_t(row) * kn;
                    const __half * ur = wut + size_t(row) * kn;
                    float a = 0.0f, au = 0.0f;
                    auto step4 = [&](int k, float4 x) { dot4(wr, ur, k, x, o.wu, a, au); };
                    if (in_regs) {
#pragma unroll
                        for (int i = 0; i < x_regs; ++i) {
                            const int k = 128 * i + 4 * lane;
                            if (k < kn) step4(k, xv[i]);
                        }
                    } else {
#pragma unroll 4
                        for (int k = 4 * lane; k < kn; k += 128)
                            step4(k, *reinterpret_cast<const float4 *>(xs + k0 + k));
                    }
                    a = warp_sum(a);
                    au = warp_sum(au);
                    if (lane == 0) {
                        const int at = u.pieces > 1 ? j : (r0 - lo + row);
                        parts[2 * at] = a;
                        parts[2 * at + 1] = au;
                    }
                }
            }
            mbar_arrive_warp(empty + s); // the slot is read
        }
        it0 += n_sl;
        consumers_sync<NC>();
        if (!(flags & 1)) {
            for (int row = threadIdx.x; row < hi - lo; row += NC * 32) {
                float a = 0.0f, au = 0.0f;
                for (int pc = 0; pc < u.pieces; ++pc) {
                    a += parts[2 * (row * u.pieces + pc)];
                    au += parts[2 * (row * u.pieces + pc) + 1];
                }
                if (o.nw) {
                    float t = 0.0f;
                    for (int w = 0; w < NC; ++w) t += red[w];
                    const float scale = rsqrtf(t / o.K + 1e-5f);
                    a *= scale;
                    au *= scale;
                }
                if (o.wu) a = a / (1.0f + __expf(-a)) * au;
                if (o.res) a += __ldcg(o.res + lo + row);
                __stcg(o.y + lo + row, a);
            }
        }
        // Every block's rows of y are written before any block reads them.
        target += nb;
        consumers_sync<NC>();
        if (!(flags & 2) && threadIdx.x == 0) {
            __threadfence();
            atomicAdd(grid_bar, 1u);
            unsigned seen;
            do {
                asm volatile("ld.acquire.gpu.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(grid_bar)
                             : "memory");
            } while (seen < target);
        }
        consumers_sync<NC>();
    }
}

// One launch an op, for comparison: a block takes `rb` rows and, as its first
// act, asks for all their bytes with one bulk copy (two for SwiGLU) into
// shared memory; launched early (programmatic dependent launch, PDL), it
// does so before it waits for the kernel before it. Then each warp takes
// (row, 2048-wide segment) items: x's segment in registers (16 floats a
// lane), the row from shared memory, the segments summed in order.
template <bool PDL> __global__ void __launch_bounds__(128) bulk_gemv(const Op o, int rb) {
    constexpr int NW = 4;
    extern __shared__ __align__(128) uint8_t wsm[];
    __shared__ uint64_t bar;
    __shared__ float part[2][64], ssp[NW];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blockIdx.x * rb, n = min(rb, o.rows - r0);
    const uint32_t bytes = uint32_t(n) * o.K * 2;
    if (threadIdx.x == 0) {
        mbar_init(&bar, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        mbar_expect(&bar, o.wu ? 2 * bytes : bytes);
        bulk_copy(wsm, o.w + size_t(r0) * o.K, bytes, &bar);
        if (o.wu) bulk_copy(wsm + bytes, o.wu + size_t(r0) * o.K, bytes, &bar);
    }
    if (PDL) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    }
    __syncthreads(); // the barrier's init is seen before anyone waits on it
    const int segs = (o.K + 2047) / 2048, seg = warp % segs, k0 = seg * 2048;
    const int kn = min(2048, o.K - k0);
    float4 xv[16];
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int k = 128 * i + 4 * lane;
        float4 v = make_float4(0, 0, 0, 0);
        if (k < kn) {
            v = __ldcg(reinterpret_cast<const float4 *>(o.x + k0 + k));
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            if (o.nw) {
                const float4 w = *reinterpret_cast<const float4 *>(o.nw + k0 + k);
                v = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
            }
        }
        xv[i] = v;
    }
    ss = warp_sum(ss);
    if (lane == 0 && warp < segs) ssp[warp] = ss;
    mbar_wait(&bar, 0);
    const __half * wt = reinterpret_cast<const __half *>(wsm);
    const __half * ut = wt + size_t(n) * o.K;
    for (int item = warp; item < n * segs; item += NW) {
        const int row = item / segs; // item % segs == seg: NW is a multiple of segs
        const __half * wr = wt + size_t(row) * o.K + k0;
        const __half * ur = ut + size_t(row) * o.K + k0;
        float a = 0.0f, au = 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int k = 128 * i + 4 * lane;
            if (k < kn) dot4(wr, ur, k, xv[i], o.wu, a, au);
        }
        a = warp_sum(a);
        au = warp_sum(au);
        if (lane == 0) {
            part[0][item] = a;
            part[1][item] = au;
        }
    }
    __syncthreads();
    if (int(threadIdx.x) < n) {
        const int row = threadIdx.x;
        float a = 0.0f, au = 0.0f, t = 0.0f;
        for (int sg = 0; sg < segs; ++sg) {
            a += part[0][row * segs + sg];
            au += part[1][row * segs + sg];
            t += ssp[sg];
        }
        if (o.nw) {
            const float scale = rsqrtf(t / o.K + 1e-5f);
            a *= scale;
            au *= scale;
        }
        if (o.wu) a = a / (1.0f + __expf(-a)) * au;
        if (o.res) a += o.res[r0 + row];
        o.y[r0 + row] = a;
    }
}

// Rows a block of bulk_gemv takes: at most `target` bytes of weights, and
// at least `waves` blocks an SM where the matrix has the rows.
inline int bulk_rows(const Op & o, int n_sm, int target, int waves) {
    const int row = o.K * 2 * (o.wu ? 2 : 1);
    int rb = std::max(1, target / row);
    rb = std::min(rb, std::max(1, o.rows / (n_sm * waves)));
    return std::min(rb, 64 / ((o.K + 2047) / 2048));
}

// The reference: a block a row, one launch an op.
__global__ void ref_kernel(const Op o) {
    __shared__ float red[256];
    const int r = blockIdx.x;
    float ss = 0.0f, a = 0.0f, au = 0.0f;
    for (int k = threadIdx.x; k < o.K; k += 256) {
        const float x = o.x[k], xn = o.nw ? x * o.nw[k] : x;
        ss += x * x;
        a += __half2float(o.w[size_t(r) * o.K + k]) * xn;
        if (o.wu) au += __half2float(o.wu[size_t(r) * o.K + k]) * xn;
    }
    auto sum = [&](float v) {
        red[threadIdx.x] = v;
        __syncthreads();
        for (int s = 128; s > 0; s >>= 1) {
            if (int(threadIdx.x) < s) red[threadIdx.x] += red[threadIdx.x + s];
            __syncthreads();
        }
        const float t = red[0];
        __syncthreads();
        return t;
    };
    ss = sum(ss);
    a = sum(a);
    au = sum(au);
    if (threadIdx.x == 0) {
        const float scale = o.nw ? rsqrtf(ss / o.K + 1e-5f) : 1.0f;
        a *= scale;
        if (o.wu) a = a / (1.0f + expf(-a)) * (au * scale);
        if (o.res) a += o.res[r];
        o.y[r] = a;
    }
}

struct Model {
    const char * name;
    int L, D, Q, F, V; // layers, width, q/k/v rows, feed-forward, vocabulary
};

int main(int argc, char ** argv) {
    int n_sm = 0;
    CK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
    const Model models[] = {{"1.7B", 24, 2048, 3 * 2048, 8192, 49152},
                            {"135M", 30, 576, 960, 1536, 49152}};
    for (const Model & md : models) {
        const size_t qkv = size_t(md.Q) * md.D, o = size_t(md.D) * md.D,
                     gu = size_t(2 * md.F) * md.D, dn = size_t(md.D) * md.F;
        const size_t layer = qkv + o + gu + dn, total = layer * md.L + size_t(md.V) * md.D;
        __half * W;
        CK(cudaMalloc(&W, total * 2));
        fill_weights(W, total, 5);
        // Buffers: x0 (the step's input), x (the residual stream), q, g,
        // logits, the norms' weights.
        float *x0, *x, *q, *g, *logits, *nw;
        CK(cudaMalloc(&x0, md.D * 4));
        CK(cudaMalloc(&x, md.D * 4));
        CK(cudaMalloc(&q, md.Q * 4));
        CK(cudaMalloc(&g, md.F * 4));
        CK(cudaMalloc(&logits, md.V * 4));
        CK(cudaMalloc(&nw, md.F * 4));
        {
            std::vector<float> h(md.F);
            std::mt19937 rng(std::random_device{}());
            std::normal_distribution<float> d(0, 1);
            for (auto & v : h) v = d(rng);
            CK(cudaMemcpy(x0, h.data(), md.D * 4, cudaMemcpyHostToDevice));
            for (auto & v : h) v = 1 + 0.1f * d(rng);
            CK(cudaMemcpy(nw, h.data(), md.F * 4, cudaMemcpyHostToDevice));
        }
        std::vector<Op> ops;
        for (int l = 0; l < md.L; ++l) {
            const __half * base = W + layer * l;
            ops.push_back({base, nullptr, x, nw, nullptr, q, md.Q, md.D});
            ops.push_back({base + qkv, nullptr, q, nullptr, x, x, md.D, md.D});
            ops.push_back({base + qkv + o, base + qkv + o + gu / 2, x, nw, nullptr, g, md.F, md.D});
            ops.push_back({base + qkv + o + gu, nullptr, g, nullptr, x, x, md.D, md.F});
        }
        ops.push_back({W + layer * md.L, nullptr, x, nw, nullptr, logits, md.V, md.D});
        Op * d_ops;
        CK(cudaMalloc(&d_ops, ops.size() * sizeof(Op)));
        CK(cudaMemcpy(d_ops, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
        unsigned * bar;
        CK(cudaMalloc(&bar, 4));
        const double floor_us = total * 2 / 4.2e6;
        printf("%s: %zu ops, weights %.1f MB, floor at 4.2 TB/s %.1f us, %d SMs\n", md.name,
               ops.size(), total * 2 / 1e6, floor_us, n_sm);

        cudaStream_t s;
        CK(cudaStreamCreate(&s));
        // The reference, one launch an op.
        std::vector<float> want(md.V), want_x(md.D);
        CK(cudaMemcpyAsync(x, x0, md.D * 4, cudaMemcpyDeviceToDevice, s));
        for (const Op & op : ops) ref_kernel<<<op.rows, 256, 0, s>>>(op);
        CK(cudaMemcpyAsync(want.data(), logits, md.V * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaMemcpyAsync(want_x.data(), x, md.D * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        // Plain launches of the reference, as a rough ceiling of one kernel an op.
        printf("  reference, a block a row, one launch an op: %.1f us a step\n",
               replay_us(
                   s,
                   [&] {
                       CK(cudaMemcpyAsync(x, x0, md.D * 4, cudaMemcpyDeviceToDevice, s));
                       for (const Op & op : ops) ref_kernel<<<op.rows, 256, 0, s>>>(op);
                   },
                   20, 1, 3));

        // Checks a step against the reference, then times it replayed from a
        // graph (best of three runs of 50).
        auto measure = [&](const std::string & label, auto step) {
            // Zeros where the step's output goes: one that leaves out the
            // arithmetic shows an error as large as the output.
            CK(cudaMemsetAsync(logits, 0, md.V * 4, s));
            step();
            std::vector<float> got(md.V), got_x(md.D);
            CK(cudaMemcpyAsync(got.data(), logits, md.V * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaMemcpyAsync(got_x.data(), x, md.D * 4, cudaMemcpyDeviceToHost, s));
            CK(cudaStreamSynchronize(s));
            double err = 0, mag = 0, err_x = 0, mag_x = 0;
            for (int i = 0; i < md.V; ++i) {
                err = std::max(err, double(std::fabs(got[i] - want[i])));
                mag = std::max(mag, double(std::fabs(want[i])));
            }
            for (int i = 0; i < md.D; ++i) {
                err_x = std::max(err_x, double(std::fabs(got_x[i] - want_x[i])));
                mag_x = std::max(mag_x, double(std::fabs(want_x[i])));
            }
            const float best = replay_us(s, step, 50, 3, 3);
            printf("  %-72s %7.1f us a step, %3.0f%% of floor; max error %.2e of %.2e (logits), "
                   "%.2e of %.2e (stream)\n",
                   label.c_str(), best, 100 * floor_us / best, err, mag, err_x, mag_x);
            fflush(stdout);
        };

        // One launch an op, bulk copies first.
        for (int pdl : {0, 1})
            for (int target : {16384, 32768})
                for (int waves : {1, 2}) {
                    auto kernel = pdl ? bulk_gemv<true> : bulk_gemv<false>;
                    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            96 * 1024));
                    auto step = [&] {
                        CK(cudaMemcpyAsync(x, x0, md.D * 4, cudaMemcpyDeviceToDevice, s));
                        for (const Op & op : ops) {
                            const int rb = bulk_rows(op, n_sm, target, waves);
                            launch(kernel, dim3((op.rows + rb - 1) / rb), dim3(128),
                                   size_t(rb) * op.K * 2 * (op.wu ? 2 : 1), s, pdl != 0, op, rb);
                        }
                    };
                    char label[128];
                    snprintf(label, sizeof label,
                             "one launch an op, bulk copies of up to %d KiB, %d+ blocks an SM%s",
                             target / 1024, waves, pdl ? ", launched early" : "");
                    measure(label, step);
                }

        struct Variant {
            int nc, cp, slot_kib, slots, flags, np;
        };
        const Variant vars[] = {
            {8, cp_bulk, 16, 8, 7, 1}, {8, cp_bulk, 16, 8, 7, 4}, {4, cp_bulk, 32, 4, 7, 1},
            {8, cp_bulk, 8, 16, 7, 1}, {8, cp_bulk, 4, 40, 7, 4}, {8, cp_lanes, 8, 16, 7, 1},
            {8, cp_bulk, 16, 8, 3, 1}, {8, cp_bulk, 16, 8, 1, 1}, {8, cp_bulk, 16, 8, 2, 1},
            {8, cp_bulk, 16, 8, 0, 1}, {4, cp_bulk, 32, 4, 0, 1}, {8, cp_bulk, 8, 16, 0, 1}};
        for (const Variant & v : vars) {
            const int slot_bytes = v.slot_kib * 1024;
            const size_t smem =
                size_t(slot_bytes) * v.slots + max_k * 4 + 2 * max_parts * 4 + 2 * v.slots * 8;
            bool fits = smem <= 227 * 1024 && v.slots % v.nc == 0 && v.slots % v.np == 0;
            for (const Op & op : ops) {
                int lo, hi;
                share(op, 0, n_sm, lo, hi);
                const Unit u = unit_of(op, slot_bytes);
                fits =
                    fits && (hi - lo + 1) * u.pieces <= max_parts &&
                    (u.pieces == 1 || (op.K / u.pieces) % 256 == 0 || (op.K / u.pieces) % 8 == 0);
            }
            if (!fits) continue;
            auto kernel = v.cp == cp_bulk ? (v.nc == 4   ? step_kernel<4, cp_bulk>
                                             : v.nc == 8 ? step_kernel<8, cp_bulk>
                                                         : step_kernel<10, cp_bulk>)
                                          : (v.nc == 4   ? step_kernel<4, cp_lanes>
                                             : v.nc == 8 ? step_kernel<8, cp_lanes>
                                                         : step_kernel<10, cp_lanes>);
            CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(smem)));
            auto step = [&] {
                CK(cudaMemcpyAsync(x, x0, md.D * 4, cudaMemcpyDeviceToDevice, s));
                CK(cudaMemsetAsync(bar, 0, 4, s));
                kernel<<<n_sm, (v.nc + 1) * 32, smem, s>>>(d_ops, int(ops.size()), slot_bytes,
                                                           v.slots, bar, v.flags, v.np);
                CK(cudaGetLastError());
            };
            char label[128];
            snprintf(label, sizeof label,
                     "persistent, %2d consumer warps, %s x%d, %2d slots of %2d KiB%s", v.nc,
                     v.cp == cp_bulk ? "bulk copies" : "warp cp.async", v.np, v.slots, v.slot_kib,
                     v.flags == 1   ? " (no arithmetic)"
                     : v.flags == 2 ? " (no grid barrier)"
                     : v.flags == 3 ? " (copies alone)"
                     : v.flags == 7 ? " (slots alone)"
                                    : "");
            measure(label, step);
        }
        CK(cudaFree(W));
        CK(cudaFree(d_ops));
    }
}
