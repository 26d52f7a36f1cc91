// The attention half of a decode layer for one sequence, in one kernel: (residual add +) RMSNorm,
// q/k/v projection + bias, rotary, the cache write of the new K/V, paged attention over the
// whole context and the combine of its spans. On the fused Triton path that is three kernels
// (q/k/v, attention, combine), each a boundary plus a round trip to memory for its input.
//
// One thread-block cluster per KV head, CLUSTER blocks each. A block owns a slice of its head
// group's q/k/v column pairs (rows held in registers, requested before the wait for the previous
// kernel) and a span of the context (its first cached K/V tiles requested before the wait too).
// The blocks hand the rotated q and the new K/V to each other through distributed shared memory
// and meet at cluster barriers, which the hardware keeps (no atomics in global memory); each
// block then attends over its span, and after one more barrier combines a share of the group's
// output from every block's partial result, read from their shared memory.
//
// Numerics follow the fused Triton path (kernels/fused_linear.py, paged_attention.py): float32
// sums; the residual stream, norm output, projections, rotary and attention output rounded to
// bf16 where that path stores them; softmax probabilities rounded to bf16 for the value product.
// Every reduction has a fixed order, so the output does not depend on timing.
//
// Macros from the host: HIDDEN, HEADS, KV_HEADS, HEAD_DIM (64), KV_BLOCK, HAS_BIAS, HAS_RESIDUAL,
// ROPE_BF16, PROFILE (1: thread 0 of each block stamps ten points into `profile`), THREADS, CLUSTER (blocks a cluster; the launch sets the same cluster size), A_ROWS (q/k/v rows
// a warp holds at most). Compiled with NVRTC after cuda_common.cuh.

#define WARPS (THREADS / 32)
#define GROUP (HEADS / KV_HEADS)
#define HALF (HEAD_DIM / 2)
#define UNITS ((GROUP + 2) * HALF)  // (lo, lo + HALF) column pairs of a head group: its q heads, its k head, its v head
#define GQ (GROUP * HEAD_DIM)      // the group's q (and attention output) values
#define KC_H (HIDDEN / 128)        // 4-element chunks a lane takes of a HIDDEN-wide row
#define NORM_ITEMS ((HIDDEN + THREADS - 1) / THREADS)
#define NEG_INF (-__int_as_float(0x7f800000))

#if ROPE_BF16  // the rotary tables' dtype: the model's (bf16) or float32
typedef bf16 rope_t;
__device__ __forceinline__ float rope_value(bf16 v) { return bf(v); }
#else
typedef float rope_t;
__device__ __forceinline__ float rope_value(float v) { return rbf(v); }  // rounded to bf16, as the Triton path rounds the table's values
#endif

struct Params {
    const bf16* x;                  // [HIDDEN]: the previous block's output (or the embedding)
    const bf16* residual;           // [HIDDEN] (HAS_RESIDUAL)
    bf16* residual_out;             // [HIDDEN]: x + residual (HAS_RESIDUAL)
    const bf16* norm;               // [HIDDEN]
    const bf16* qkv;                // [(HEADS + 2 KV_HEADS) HEAD_DIM, HIDDEN]: q heads, k heads, v heads
    const bf16* qkv_bias;           // (HAS_BIAS)
    const rope_t* cos_table;        // [positions, HEAD_DIM]
    const rope_t* sin_table;
    const long long* positions;     // [1]
    const long long* slots;         // [1]: where this step's K/V go
    bf16* k_cache;                  // [slots, KV_HEADS, HEAD_DIM]
    bf16* v_cache;
    const long long* block_table;   // the sequence's row
    const long long* context_lens;  // [1]: tokens in the cache after this step's
    bf16* out;                      // [HEADS * HEAD_DIM]
    float eps;
    float scale;
    unsigned long long* profile;    // with PROFILE: [blocks, STAMPS] global-timer ns at points of the kernel
};

#if PROFILE
#define STAMP(i)                                                                                   \
    do {                                                                                           \
        if (threadIdx.x == 0) {                                                                    \
            unsigned long long t;                                                                  \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                                  \
            p.profile[blockIdx.x * 10 + (i)] = t;                                                  \
        }                                                                                          \
    } while (0)
#else
#define STAMP(i) do { } while (0)
#endif

// ---- the cluster: rank, barriers, other blocks' shared memory -------------------------------

__device__ __forceinline__ int cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
}

// arrive releases this thread's writes (shared memory of any block, global memory); wait acquires
// every thread's of the cluster. All threads of every block take part (the .aligned forms).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// the address of `local` (this block's shared memory) in block `rank` of the cluster
__device__ __forceinline__ unsigned in_block(const void* local, int rank) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(local)), "r"(rank));
    return a;
}

__device__ __forceinline__ void st_cluster(unsigned addr, float v) { asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(addr), "f"(v) : "memory"); }

__device__ __forceinline__ float ld_cluster(unsigned addr) {
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
    return v;
}

__device__ __forceinline__ unsigned pack_bf2(float lo, float hi) { return (unsigned)to_bf(lo) | ((unsigned)to_bf(hi) << 16); }

// ---- the head group's columns ---------------------------------------------------------------

// the q/k/v weight row of pair `unit` of head group g (hi: its second column, HALF on)
__device__ __forceinline__ int group_row(int g, int unit, bool hi) {
    const int h = unit / HALF;
    const int head = h < GROUP ? g * GROUP + h : (h == GROUP ? HEADS + g : HEADS + KV_HEADS + g);
    return head * HEAD_DIM + unit % HALF + (hi ? HALF : 0);
}

// the cache slot of token t (0 past `limit`)
__device__ __forceinline__ long long token_slot(const Params& p, int t, int limit) {
    return t < limit ? p.block_table[t / KV_BLOCK] * KV_BLOCK + t % KV_BLOCK : 0;
}

// K and V of tokens [base, base + 16) (those before `limit`) of KV head g: lanes i and i + 16
// take the two halves of token i's key row, every lane two dims of each token's value row; tslot
// is the slot of the lane's token (token_slot of base + lane % 16)
__device__ __forceinline__ void load_kv_tile(const Params& p, int g, int base, int limit, long long tslot, uint4 (&kr)[HEAD_DIM / 16],
                                             unsigned (&vr)[16]) {
    const int lane = threadIdx.x & 31, half = lane >> 4;
    const bool valid = base + (lane & 15) < limit;
    const bf16* krow = p.k_cache + (tslot * KV_HEADS + g) * HEAD_DIM + half * HALF;
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 16; ++i) kr[i] = valid ? *(const uint4*)(krow + 8 * i) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const long long s = __shfl_sync(0xffffffffu, tslot, i);
        vr[i] = base + i < limit ? *(const unsigned*)(p.v_cache + (s * KV_HEADS + g) * HEAD_DIM + 2 * lane) : 0u;
    }
}

// the newest token's K/V (in shared memory, from the blocks that projected them) into a tile
// whose token `newest - base` it is
__device__ __forceinline__ void patch_newest(int index, const float* newk, const float* newv, uint4 (&kr)[HEAD_DIM / 16], unsigned (&vr)[16]) {
    const int lane = threadIdx.x & 31, half = lane >> 4;
    if ((lane & 15) == index) {
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 16; ++i) {
            const float* k = newk + half * HALF + 8 * i;
            kr[i] = make_uint4(pack_bf2(k[0], k[1]), pack_bf2(k[2], k[3]), pack_bf2(k[4], k[5]), pack_bf2(k[6], k[7]));
        }
    }
#pragma unroll
    for (int i = 0; i < 16; ++i)
        if (i == index) vr[i] = pack_bf2(newv[2 * lane], newv[2 * lane + 1]);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) cluster_attention(const Params p) {
    __shared__ __align__(16) float xs[HIDDEN];       // the normed input
    __shared__ float red[WARPS + A_ROWS * WARPS];    // the norm's warp sums, then the block's q/k/v dot products
    __shared__ __align__(16) float qs[GQ];           // the group's rotated q (bf16 values), written by the cluster
    __shared__ float newk[HEAD_DIM], newv[HEAD_DIM]; // the new token's K/V, written by the cluster (in the block attending to it)
    __shared__ float merge_m[WARPS * GROUP], merge_l[WARPS * GROUP];
    __shared__ float merge_acc[WARPS * GROUP * HEAD_DIM];
    __shared__ float part_m[GROUP], part_l[GROUP];   // this block's partial result over its span, read by the cluster
    __shared__ float part_acc[GQ];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rank = cluster_rank(), g = blockIdx.x / CLUSTER;
    STAMP(0);
    cluster_arrive_relaxed();  // waited for before the first write into another block: all have started
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the next kernel may launch and request its weight

    // ---- before the wait: nothing below is the previous kernel's output
    const int u0 = rank * UNITS / CLUSTER, nu = (rank + 1) * UNITS / CLUSTER - u0;  // this block's column pairs
    uint2 wq[A_ROWS][KC_H];  // row warp + k * WARPS of the block's 2 * nu (lo columns, then hi)
#pragma unroll
    for (int k = 0; k < A_ROWS; ++k) {
        const int r = warp + k * WARPS;
        if (r < 2 * nu) {
            const bf16* row = p.qkv + (long long)group_row(g, u0 + (r < nu ? r : r - nu), r >= nu) * HIDDEN;
#pragma unroll
            for (int c = 0; c < KC_H; ++c) wq[k][c] = *(const uint2*)(row + (c * 32 + lane) * 4);
        }
    }
    float nw[NORM_ITEMS];
#pragma unroll
    for (int j = 0; j < NORM_ITEMS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        nw[j] = i < HIDDEN ? bf(p.norm[i]) : 0.f;
    }
    const long long position = p.positions[0], slot = p.slots[0];
    const int context = (int)p.context_lens[0], newest = context - 1;
    float bias_lo = 0.f, bias_hi = 0.f, rot_cos = 1.f, rot_sin = 0.f;
    if (threadIdx.x < nu) {
        const int unit = u0 + threadIdx.x;
#if HAS_BIAS
        bias_lo = bf(p.qkv_bias[group_row(g, unit, false)]);
        bias_hi = bf(p.qkv_bias[group_row(g, unit, true)]);
#endif
        if (unit < (GROUP + 1) * HALF) {  // q and k pairs are rotated
            rot_cos = rope_value(p.cos_table[position * HEAD_DIM + unit % HALF]);
            rot_sin = rope_value(p.sin_table[position * HEAD_DIM + unit % HALF]);
        }
    }
    // attention: the context in CLUSTER spans of a multiple of 16 tokens, span `rank` here; a warp
    // takes 16 tokens at a time. The first tile's cached K/V are loaded now (the newest token's
    // are projected in this kernel: patched in from shared memory below)
    const int span = ((context + CLUSTER - 1) / CLUSTER + 15) & ~15;
    const int t0 = rank * span, t1 = min(t0 + span, context);
    const int first = t0 + warp * 16;
    const int rank_newest = newest / span;
    uint4 kr[HEAD_DIM / 16];
    unsigned vr[16];
    if (first < t1) load_kv_tile(p, g, first, min(t1, newest), token_slot(p, first + (lane & 15), min(t1, newest)), kr, vr);

    STAMP(1);
    asm volatile("griddepcontrol.wait;" ::: "memory");  // x and the residual come from the previous kernel
    STAMP(2);

    // ---- (residual add +) RMSNorm: every block the whole row; each writes its share of the residual stream
    {
        float v[NORM_ITEMS];
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) {
            const int i = threadIdx.x + j * THREADS;
            float s = i < HIDDEN ? bf(p.x[i]) : 0.f;
#if HAS_RESIDUAL
            if (i < HIDDEN) s = rbf(s + bf(p.residual[i]));
#endif
            v[j] = s;
        }
#if HAS_RESIDUAL
        const int b = blockIdx.x, nb = gridDim.x;
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) {
            const int i = threadIdx.x + j * THREADS;
            if (i < HIDDEN && i * nb / HIDDEN == b) p.residual_out[i] = to_bf(v[j]);
        }
#endif
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) ss = fmaf(v[j], v[j], ss);
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        __syncthreads();
        float total = 0.f;
        for (int w = 0; w < WARPS; ++w) total += red[w];
        const float inv = 1.0f / sqrtf(total / HIDDEN + p.eps);
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) {
            const int i = threadIdx.x + j * THREADS;
            if (i < HIDDEN) xs[i] = rbf(v[j] * inv * nw[j]);
        }
        __syncthreads();
    }

    STAMP(3);
    // ---- q/k/v: a row a warp at a time, from registers
    float* dots = red + WARPS;
#pragma unroll
    for (int k = 0; k < A_ROWS; ++k) {
        const int r = warp + k * WARPS;
        if (r < 2 * nu) {
            const float4* x4 = (const float4*)xs;
            float d = 0.f;
#pragma unroll
            for (int c = 0; c < KC_H; ++c) d = dot4(wq[k][c], x4[c * 32 + lane], d);
            d = warp_sum(d);
            if (lane == 0) dots[r] = d;
        }
    }
    __syncthreads();
    STAMP(4);
    cluster_wait();  // every block of the cluster has started: its shared memory may be written
    if (threadIdx.x < nu) {
        const int unit = u0 + threadIdx.x, h = unit / HALF, j = unit % HALF;
        float lo = rbf(dots[threadIdx.x] + bias_lo), hi = rbf(dots[nu + threadIdx.x] + bias_hi);
        if (h <= GROUP) {
            const float l2 = lo * rot_cos - hi * rot_sin, h2 = hi * rot_cos + lo * rot_sin;
            lo = rbf(l2);
            hi = rbf(h2);
        }
        if (h < GROUP) {  // q: into every block of the cluster
            for (int r = 0; r < CLUSTER; ++r) {
                st_cluster(in_block(qs + h * HEAD_DIM + j, r), lo);
                st_cluster(in_block(qs + h * HEAD_DIM + j + HALF, r), hi);
            }
        } else {  // k or v: into the cache, and to the block attending to the newest token
            const bool is_k = h == GROUP;
            bf16* dst = (is_k ? p.k_cache : p.v_cache) + (slot * KV_HEADS + g) * HEAD_DIM + j;
            dst[0] = to_bf(lo);
            dst[HALF] = to_bf(hi);
            float* mine = is_k ? newk : newv;
            st_cluster(in_block(mine + j, rank_newest), lo);
            st_cluster(in_block(mine + j + HALF, rank_newest), hi);
        }
    }
    cluster_arrive();
    cluster_wait();  // q and the new K/V are in
    STAMP(5);

    // ---- attention over this block's span: a warp's running max, sum and output per q head
    {
        float m[GROUP], l[GROUP], acc0[GROUP], acc1[GROUP];
#pragma unroll
        for (int h = 0; h < GROUP; ++h) {
            m[h] = NEG_INF;
            l[h] = 0.f;
            acc0[h] = 0.f;
            acc1[h] = 0.f;
        }
        const int half = lane >> 4;
        for (int base = first; base < t1; base += WARPS * 16) {
            const bool valid = base + (lane & 15) < t1;
            if (base != first) load_kv_tile(p, g, base, min(t1, newest), token_slot(p, base + (lane & 15), min(t1, newest)), kr, vr);
            if (newest >= base && newest < base + 16) patch_newest(newest - base, newk, newv, kr, vr);
            float sc[GROUP];
#pragma unroll
            for (int h = 0; h < GROUP; ++h) sc[h] = 0.f;
#pragma unroll
            for (int i = 0; i < HEAD_DIM / 16; ++i) {
                const float k0 = bf_lo(kr[i].x), k1 = bf_hi(kr[i].x), k2 = bf_lo(kr[i].y), k3 = bf_hi(kr[i].y);
                const float k4 = bf_lo(kr[i].z), k5 = bf_hi(kr[i].z), k6 = bf_lo(kr[i].w), k7 = bf_hi(kr[i].w);
                const float* qh = qs + half * HALF + 8 * i;
#pragma unroll
                for (int h = 0; h < GROUP; ++h) {
                    const float4 qa = *(const float4*)(qh + h * HEAD_DIM);
                    const float4 qb = *(const float4*)(qh + h * HEAD_DIM + 4);
                    float s = sc[h];
                    s = fmaf(qa.x, k0, s); s = fmaf(qa.y, k1, s); s = fmaf(qa.z, k2, s); s = fmaf(qa.w, k3, s);
                    s = fmaf(qb.x, k4, s); s = fmaf(qb.y, k5, s); s = fmaf(qb.z, k6, s); s = fmaf(qb.w, k7, s);
                    sc[h] = s;
                }
            }
#pragma unroll
            for (int h = 0; h < GROUP; ++h) {
                const float full = sc[h] + __shfl_xor_sync(0xffffffffu, sc[h], 16);  // both halves of the key row
                const float s = valid ? full * p.scale : NEG_INF;
                const float new_m = fmaxf(m[h], warp_max(s));
                const float correction = __expf(m[h] - new_m);
                const float pr = valid ? __expf(s - new_m) : 0.f;
                l[h] = l[h] * correction + warp_sum(half ? 0.f : pr);  // each token once
                acc0[h] *= correction;
                acc1[h] *= correction;
                m[h] = new_m;
                sc[h] = rbf(pr);
            }
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const float v0 = bf_lo(vr[i]), v1 = bf_hi(vr[i]);
#pragma unroll
                for (int h = 0; h < GROUP; ++h) {
                    const float pi = __shfl_sync(0xffffffffu, sc[h], i);
                    acc0[h] = fmaf(pi, v0, acc0[h]);
                    acc1[h] = fmaf(pi, v1, acc1[h]);
                }
            }
        }
#pragma unroll
        for (int h = 0; h < GROUP; ++h) {
            if (lane == 0) {
                merge_m[warp * GROUP + h] = m[h];
                merge_l[warp * GROUP + h] = l[h];
            }
            merge_acc[(warp * GROUP + h) * HEAD_DIM + 2 * lane] = acc0[h];
            merge_acc[(warp * GROUP + h) * HEAD_DIM + 2 * lane + 1] = acc1[h];
        }
    }
    __syncthreads();
    // the warps' results merged into the block's (a warp without tokens has max -inf and adds nothing)
    for (int i = threadIdx.x; i < GQ; i += THREADS) {
        const int h = i / HEAD_DIM, d = i % HEAD_DIM;
        float mx = NEG_INF;
        for (int w = 0; w < WARPS; ++w) mx = fmaxf(mx, merge_m[w * GROUP + h]);
        float a = 0.f, sum = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float mw = merge_m[w * GROUP + h];
            const float f = mw == NEG_INF ? 0.f : __expf(mw - mx);
            a = fmaf(f, merge_acc[(w * GROUP + h) * HEAD_DIM + d], a);
            sum = fmaf(f, merge_l[w * GROUP + h], sum);
        }
        part_acc[i] = a;
        if (d == 0) {
            part_m[h] = mx;
            part_l[h] = sum;
        }
    }
    STAMP(6);
    cluster_arrive();
    cluster_wait();  // every block's partial result is in
    STAMP(7);

    // ---- combine: this block's share of the group's output, from the cluster's partial results
    for (int i = rank * GQ / CLUSTER + threadIdx.x; i < (rank + 1) * GQ / CLUSTER; i += THREADS) {
        const int h = i / HEAD_DIM;
        float ms[CLUSTER], ls[CLUSTER], as[CLUSTER];
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) {
            ms[r] = ld_cluster(in_block(part_m + h, r));
            ls[r] = ld_cluster(in_block(part_l + h, r));
            as[r] = ld_cluster(in_block(part_acc + i, r));
        }
        float mx = NEG_INF;
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) mx = fmaxf(mx, ms[r]);
        float a = 0.f, sum = 0.f;
#pragma unroll
        for (int r = 0; r < CLUSTER; ++r) {
            const float f = ms[r] == NEG_INF ? 0.f : __expf(ms[r] - mx);
            a = fmaf(f, as[r], a);
            sum = fmaf(f, ls[r], sum);
        }
        p.out[g * GQ + i] = to_bf(a / sum);
    }
    STAMP(8);
    cluster_arrive();
    cluster_wait();  // no block leaves while the others read its shared memory
    STAMP(9);
}
