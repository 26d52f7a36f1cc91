// One batch-1 decode forward of a Qwen2-style dense decoder (bf16) in one persistent kernel.
//
// One block per multiprocessor runs every layer; grid-wide barriers separate the five phases of
// a layer (q/k/v + rotary + cache write; attention partials; combine + o_proj; norm + gate/up +
// SiLU gate; down_proj). Each block owns a fixed slice of every weight, so its weight stream does
// not depend on the data: the gate/up and down_proj slices (the MLP's weight, most of a layer's
// bytes) are copied into shared memory by the bulk-copy engine four phases before they are used;
// the q/k/v and o_proj slices and the attention blocks' cached K/V are asked of L2 a phase or two
// ahead (prefetch: no register holds them while they come) and loaded when their phase starts.
// The barriers' latency is then what a layer costs, not the weight reads behind each boundary.
//
// Numerics follow the fused Triton path (kernels/fused_linear.py, paged_attention.py): float32
// accumulation; the residual stream, norm outputs, projections, rotary, attention output and the
// SiLU gate rounded to bf16 where that path stores them. Every reduction has a fixed order, so
// a step's output does not depend on timing.
//
// Shape constants come from the host as macros: HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS,
// KV_BLOCK, HAS_BIAS, THREADS, ATT_WARPS, MAX_SPLITS, A_ROWS (q/k/v rows a warp takes at most),
// X_BYTES, Y_BYTES, PROFILE (1: block 0 records when phases end and points inside them, every
// block when it arrives at each barrier), PHASES_PER_LAYER and MARKS_PER_LAYER (the profile's
// layout).
// Compiled with NVRTC after cuda_common.cuh (bf16 values as 16-bit integers, bulk copies).

#define WARPS (THREADS / 32)
#define ISSUER (THREADS - 32)  // the thread that hands the bulk copies to the copy engine
#define GROUP (HEADS / KV_HEADS)
#define HALF (HEAD_DIM / 2)
#define QKV_UNITS ((HEADS + 2 * KV_HEADS) * HALF)  // (lo, lo + HALF) column pairs of q/k/v
#define Q_SIZE (HEADS * HEAD_DIM)
#define KC_H (HIDDEN / 128)  // 4-element chunks a lane takes of a HIDDEN-wide row
#define KC_Q (Q_SIZE / 128)
#define KC_I (INTER / 256)   // 8-element chunks a lane takes of an INTER-wide row
#define Q_ITEMS ((Q_SIZE + THREADS - 1) / THREADS)
#define NORM_ITEMS ((HIDDEN + THREADS - 1) / THREADS)
#define ACT_ITEMS ((INTER / 8 + THREADS - 1) / THREADS)  // 8-element chunks of the activation a thread copies in phase E
#define QS_ITEMS ((GROUP * HEAD_DIM + THREADS - 1) / THREADS)
#define RED_FLOATS ((A_ROWS * WARPS + 3) / 4 * 4)  // the norm's warp sums, then phase A's rows
#define NEG_INF (-__int_as_float(0x7f800000))

struct LayerWeights {
    const bf16* input_norm;
    const bf16* qkv;
    const bf16* qkv_bias;
    const bf16* o;
    const bf16* post_norm;
    const bf16* gate_up;
    const bf16* down;
};

struct Params {
    const LayerWeights* layers;
    const bf16* final_norm;
    const bf16* embeds;              // [HIDDEN]: the token's embedding
    bf16* out;                       // [HIDDEN]: final-normed hidden state
    bf16* k_cache;                   // layer 0's [slots, KV_HEADS, HEAD_DIM]
    bf16* v_cache;
    long long cache_layer_stride;    // elements from one layer's cache to the next
    const long long* block_table;    // the sequence's row
    const long long* context_lens;   // [1]: tokens in the cache after this step's
    const long long* positions;      // [1]
    const long long* slots;          // [1]: where this step's K/V go
    const float* cos_table;          // [positions, HEAD_DIM]
    const float* sin_table;
    float* resid;                    // [HIDDEN]: residual stream (bf16 values)
    float* q;                        // [Q_SIZE]: rotated q (bf16 values)
    float* part_ml;                  // [KV_HEADS * MAX_SPLITS, GROUP, 2]: split max and sum
    float* part_acc;                 // [KV_HEADS * MAX_SPLITS, GROUP, HEAD_DIM]
    bf16* act;                       // [INTER]: silu(gate) * up
    unsigned* barrier;               // [1]: the grid barrier's counter
    float eps;
    float scale;
    int tokens_per_item;             // fewest tokens an attention block takes (a multiple of 16)
    unsigned long long* profile;     // with PROFILE (ns): [LAYERS, PHASES_PER_LAYER] phase ends, [LAYERS, MARKS_PER_LAYER] marks, [LAYERS, PHASES_PER_LAYER, blocks] arrivals
};

// ---- profiling (PROFILE 1): the GPU's global timer, on block 0's thread 0 (or each block's) ----

#if PROFILE
#define PROFILE_BY(block, index)                                                                   \
    do {                                                                                           \
        if (blockIdx.x == (block) && threadIdx.x == 0) {                                           \
            unsigned long long t;                                                                  \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));                                  \
            p.profile[index] = t;                                                                  \
        }                                                                                          \
    } while (0)
#else
#define PROFILE_BY(block, index) do { } while (0)
#endif
#define PROFILE_AT(index) PROFILE_BY(0, index)
#define PHASE_END(layer, phase) PROFILE_AT((layer) * PHASES_PER_LAYER + (phase))
// points inside phases, stored after the phase ends: [LAYERS * PHASES_PER_LAYER + layer * MARKS_PER_LAYER + mark]
#define PHASE_MARK(layer, mark) PROFILE_AT(LAYERS * PHASES_PER_LAYER + (layer) * MARKS_PER_LAYER + (mark))
// this block's arrival at the barrier that ends a phase, after the marks
#define BARRIER_ARRIVAL(layer, phase) \
    PROFILE_BY(blockIdx.x, LAYERS * (PHASES_PER_LAYER + MARKS_PER_LAYER) + ((layer) * PHASES_PER_LAYER + (phase)) * gridDim.x + blockIdx.x)

// ---- grid barrier --------------------------------------------------------------------------

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Every block's thread 0 adds 1 to the counter, block 0's adds 2^31 - (blocks - 1): the top bit
// flips exactly when the last block arrives, whatever the order, and the counter needs no reset
// between barriers or launches. Arrival releases the block's writes (after the block barrier),
// the wait acquires everyone's.
// (with PROFILE, records when the whole block has arrived at the barrier that ends `phase`)
__device__ __forceinline__ void grid_sync(const Params& p, int layer, int phase) {
    unsigned* bar = p.barrier;
    __syncthreads();
    BARRIER_ARRIVAL(layer, phase);
    if (threadIdx.x == 0) {
        const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
        unsigned old;
        asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(bar), "r"(add) : "memory");
        while (((old ^ ld_acquire(bar)) & 0x80000000u) == 0) {
        }
    }
    __syncthreads();
}

// The MLP slices of layer `layer` into shared memory (every thread calls these; ISSUER hands them
// to the copy engine): gate rows then up rows in X, down rows in Y.
__device__ __forceinline__ void load_gate_up(const Params& p, int layer, unsigned x_smem, unsigned x_bar) {
    if (threadIdx.x != ISSUER) return;
    const int i0 = share_begin(INTER), ni = share_end(INTER) - i0;
    arm_region(x_bar, 2u * ni * HIDDEN * 2);
    const unsigned gate_bytes = bulk_rows(x_smem, p.layers[layer].gate_up, i0, ni, HIDDEN, x_bar);
    bulk_rows(x_smem + gate_bytes, p.layers[layer].gate_up, INTER + i0, ni, HIDDEN, x_bar);
}

__device__ __forceinline__ void load_down(const Params& p, int layer, unsigned y_smem, unsigned y_bar) {
    if (threadIdx.x != ISSUER) return;
    const int d0 = share_begin(HIDDEN), nd = share_end(HIDDEN) - d0;
    arm_region(y_bar, (unsigned)(nd * INTER * 2));
    bulk_rows(y_smem, p.layers[layer].down, d0, nd, INTER, y_bar);
}

// ---- block-wide pieces ---------------------------------------------------------------------

// xs = bf16(rms_norm(src) * weight) over HIDDEN; src is the residual stream (or, with embeds, the
// bf16 embedding). Every thread sums the warps' partial sums in the same order.
__device__ void norm_into(float* xs, const float* resid, const bf16* embeds, const bf16* weight, float eps, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // all of this thread's loads first (with a store to xs between them the compiler could not
    // issue the next load before it: it cannot tell that xs and resid do not overlap)
    float v[NORM_ITEMS], wv[NORM_ITEMS];
#pragma unroll
    for (int j = 0; j < NORM_ITEMS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        v[j] = i < HIDDEN ? (embeds ? bf(embeds[i]) : ldcg(resid + i)) : 0.f;
        wv[j] = i < HIDDEN ? bf(weight[i]) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_ITEMS; ++j) ss = fmaf(v[j], v[j], ss);
    ss = warp_sum(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < WARPS; ++w) total += red[w];
    const float inv = 1.0f / sqrtf(total / HIDDEN + eps);
#pragma unroll
    for (int j = 0; j < NORM_ITEMS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        if (i < HIDDEN) xs[i] = rbf(v[j] * inv * wv[j]);
    }
    __syncthreads();
}

// the block's q/k/v row r of 2 * nu: the lo (r < nu) or hi column of one of its column pairs
__device__ __forceinline__ int qkv_row(int u0, int nu, int r) {
    const int unit = u0 + (r < nu ? r : r - nu);
    return (unit / HALF) * HEAD_DIM + unit % HALF + (r < nu ? 0 : HALF);
}

// the rows warp w multiplies in phase A: w, w + WARPS, ... of the block's 2 * nu
__device__ __forceinline__ void load_qkv_rows(const Params& p, int layer, uint2 (&wq)[A_ROWS][KC_H]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u0 = share_begin(QKV_UNITS), nu = share_end(QKV_UNITS) - u0;
#pragma unroll
    for (int k = 0; k < A_ROWS; ++k) {
        const int r = warp + k * WARPS;
        if (r < 2 * nu) {
            const bf16* row = p.layers[layer].qkv + (long long)qkv_row(u0, nu, r) * HIDDEN;
#pragma unroll
            for (int c = 0; c < KC_H; ++c) wq[k][c] = *(const uint2*)(row + (c * 32 + lane) * 4);
        }
    }
}

__device__ __forceinline__ void l2_prefetch(const void* line) { asm volatile("prefetch.global.L2 [%0];" :: "l"(line)); }

#define LINES_H (HIDDEN * 2 / 128)  // 128-byte lines of a HIDDEN-wide bf16 row
#define LINES_Q (Q_SIZE * 2 / 128)

// this block's q/k/v rows of `layer` asked of L2 (a line a thread)
__device__ __forceinline__ void prefetch_qkv_rows(const Params& p, int layer) {
    const int u0 = share_begin(QKV_UNITS), nu = share_end(QKV_UNITS) - u0;
    for (int i = threadIdx.x; i < 2 * nu * LINES_H; i += THREADS)
        l2_prefetch((const char*)(p.layers[layer].qkv + (long long)qkv_row(u0, nu, i / LINES_H) * HIDDEN) + (i % LINES_H) * 128);
}

__device__ __forceinline__ void prefetch_o_rows(const Params& p, int layer) {
    const int c0 = share_begin(HIDDEN), nc = share_end(HIDDEN) - c0;
    const char* rows = (const char*)(p.layers[layer].o + (long long)c0 * Q_SIZE);
    for (int i = threadIdx.x; i < nc * LINES_Q; i += THREADS) l2_prefetch(rows + i * 128);
}

__device__ __forceinline__ void load_o_rows(const Params& p, int layer, uint2 (&wo)[KC_Q]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c0 = share_begin(HIDDEN), nc = share_end(HIDDEN) - c0;
    if (warp < nc) {
        const bf16* row = p.layers[layer].o + (long long)(c0 + warp) * Q_SIZE;
#pragma unroll
        for (int c = 0; c < KC_Q; ++c) wo[c] = *(const uint2*)(row + (c * 32 + lane) * 4);
    }
}


// the cache slot of token t (0 past t1)
__device__ __forceinline__ long long token_slot(const Params& p, int t, int t1) {
    return t < t1 ? p.block_table[t / KV_BLOCK] * KV_BLOCK + t % KV_BLOCK : 0;
}

// K and V of tokens [base, base + 16) (those before t1) of KV head g: lanes i and i + 16 take the
// two halves of token i's key row, every lane two dims of each token's value row; tslot is the
// slot of the lane's token (token_slot of base + lane % 16)
__device__ __forceinline__ void load_kv_tile(const bf16* kc, const bf16* vc, int g, int base, int t1, long long tslot,
                                             uint4 (&kr)[HEAD_DIM / 16], unsigned (&vr)[16]) {
    const int lane = threadIdx.x & 31, half = lane >> 4;
    const bool valid = base + (lane & 15) < t1;
    const bf16* krow = kc + (tslot * KV_HEADS + g) * HEAD_DIM + half * (HEAD_DIM / 2);
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 16; ++i) kr[i] = valid ? ldcg_u4(krow + 8 * i) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const long long s = __shfl_sync(0xffffffffu, tslot, i);
        vr[i] = base + i < t1 ? ldcg_u32(vc + (s * KV_HEADS + g) * HEAD_DIM + 2 * lane) : 0u;
    }
}

// ---- the kernel ----------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(THREADS, 1) decode_step(const Params p) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned long long* bars = (unsigned long long*)smem;        // [2] mbarriers: X, Y
    bf16* xw = (bf16*)(smem + 128);                              // gate/up slice
    bf16* yw = (bf16*)(smem + 128 + X_BYTES);                    // down_proj slice
    float* xs = (float*)(smem + 128 + X_BYTES + Y_BYTES);        // [max(HIDDEN, Q_SIZE)] block input
    float* red = xs + (HIDDEN > Q_SIZE ? HIDDEN : Q_SIZE);       // [RED_FLOATS] partial sums
    float* qs = red + RED_FLOATS;                                // [GROUP, HEAD_DIM] attention's q
    float* merge_m = qs + GROUP * HEAD_DIM;                      // [ATT_WARPS, GROUP]
    float* merge_l = merge_m + ATT_WARPS * GROUP;
    float* merge_acc = merge_l + ATT_WARPS * GROUP;              // [ATT_WARPS, GROUP, HEAD_DIM]

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const unsigned x_bar = smem_addr(bars), y_bar = smem_addr(bars + 1);
    const unsigned x_smem = smem_addr(xw), y_smem = smem_addr(yw);
    if (threadIdx.x == 0) {
        mbar_init(x_bar);
        mbar_init(y_bar);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    load_gate_up(p, 0, x_smem, x_bar);
    load_down(p, 0, y_smem, y_bar);
    uint2 wq[A_ROWS][KC_H], wo[KC_Q];

    const long long position = p.positions[0];
    const int context = (int)p.context_lens[0];
    const long long slot = p.slots[0];
    const int c0 = share_begin(HIDDEN), nc = share_end(HIDDEN) - c0;  // o_proj and down_proj rows
    const int u0 = share_begin(QKV_UNITS), nu = share_end(QKV_UNITS) - u0;  // q/k/v column pairs
    // attention: the context in spans of at least tokens_per_item tokens (at most MAX_SPLITS a KV
    // head); block i < KV_HEADS * splits takes KV head i / splits over span i % splits
    int span = (context + MAX_SPLITS - 1) / MAX_SPLITS;
    span = (span + 15) & ~15;
    if (span < p.tokens_per_item) span = p.tokens_per_item;
    const int splits = (context + span - 1) / span;
    const bool attends = blockIdx.x < KV_HEADS * splits;
    const int att_g = blockIdx.x / splits, att_t0 = (blockIdx.x % splits) * span;
    const int att_t1 = min(att_t0 + span, context);
    const int att_base = att_t0 + warp * 16;  // this warp's first 16 tokens
    // the block table does not change during the step: the slot of this lane's token of its first
    // tile, and of the token whose K (even threads) or V row this thread asks L2 for early
    const long long first_slot = attends && warp < ATT_WARPS ? token_slot(p, att_base + (lane & 15), att_t1) : 0;
    const int pf_token = att_t0 + threadIdx.x / 2;
    const long long pf_slot = attends ? token_slot(p, pf_token, att_t1) : 0;
    // the rotary factors of this block's column pairs: one position for every layer
    float rot_cos = 1.f, rot_sin = 0.f;
    if (threadIdx.x < nu) {
        const int j = (u0 + threadIdx.x) % HALF;
        rot_cos = rbf(p.cos_table[position * HEAD_DIM + j]);
        rot_sin = rbf(p.sin_table[position * HEAD_DIM + j]);
    }

    for (int layer = 0; layer < LAYERS; ++layer) {
        const LayerWeights* lw = p.layers + layer;
        const unsigned parity = layer & 1;
        if (layer > 0) load_down(p, layer, y_smem, y_bar);  // Y was read in the last phase E
        // the attention blocks ask L2 for their span's cached K/V rows, a line a thread
        if (attends) {
            const char* cache = (const char*)((threadIdx.x & 1 ? p.v_cache : p.k_cache) + layer * p.cache_layer_stride);
            for (int t = pf_token; t < att_t1 && t < context - 1; t += THREADS / 2) {  // the newest token is written in this phase
                const long long s = t == pf_token ? pf_slot : token_slot(p, t, att_t1);
                l2_prefetch(cache + (s * KV_HEADS + att_g) * HEAD_DIM * 2);
            }
        }

        // ---- A: norm, q/k/v projection + bias, rotary, cache write
        float bias_lo = 0.f, bias_hi = 0.f;
#if HAS_BIAS
        if (threadIdx.x < nu) {
            const int unit = u0 + threadIdx.x;
            const int row = (unit / HALF) * HEAD_DIM + unit % HALF;
            bias_lo = bf(lw->qkv_bias[row]);
            bias_hi = bf(lw->qkv_bias[row + HALF]);
        }
#endif
        load_qkv_rows(p, layer, wq);  // from L2 (asked for in the last phase E)
        prefetch_o_rows(p, layer);     // used in phase C
        norm_into(xs, p.resid, layer == 0 ? p.embeds : nullptr, lw->input_norm, p.eps, red);
        if (layer == 0)  // the residual stream starts as the embedding (this block's rows of it)
            for (int i = c0 + threadIdx.x; i < c0 + nc; i += THREADS) p.resid[i] = bf(p.embeds[i]);
        {
#pragma unroll
            for (int k = 0; k < A_ROWS; ++k) {
                const int r = warp + k * WARPS;
                if (r < 2 * nu) {
                    const float4* x4 = (const float4*)xs;
                    float d = 0.f;
#pragma unroll
                    for (int c = 0; c < KC_H; ++c) d = dot4(wq[k][c], x4[c * 32 + lane], d);
                    d = warp_sum(d);
                    if (lane == 0) red[r] = d;
                }
            }
            __syncthreads();
            if (threadIdx.x < nu) {
                const int unit = u0 + threadIdx.x, head = unit / HALF, j = unit % HALF;
                float lo = rbf(red[threadIdx.x] + bias_lo), hi = rbf(red[nu + threadIdx.x] + bias_hi);
                if (head < HEADS + KV_HEADS) {  // q and k heads are rotated
                    const float l2 = lo * rot_cos - hi * rot_sin, h2 = hi * rot_cos + lo * rot_sin;
                    lo = l2;
                    hi = h2;
                }
                if (head < HEADS) {
                    p.q[head * HEAD_DIM + j] = rbf(lo);
                    p.q[head * HEAD_DIM + j + HALF] = rbf(hi);
                } else {
                    const bool is_k = head < HEADS + KV_HEADS;
                    const int kv_head = is_k ? head - HEADS : head - HEADS - KV_HEADS;
                    bf16* cache = (is_k ? p.k_cache : p.v_cache) + layer * p.cache_layer_stride;
                    bf16* dst = cache + (slot * KV_HEADS + kv_head) * HEAD_DIM + j;
                    dst[0] = to_bf(lo);
                    dst[HALF] = to_bf(hi);
                }
            }
        }
        grid_sync(p, layer, 0);
        PHASE_END(layer, 0);

        // ---- B: attention partials; block i < KV_HEADS * splits takes one KV head over one span of tokens
        {
            const int item = blockIdx.x;
            const bf16* kc = p.k_cache + layer * p.cache_layer_stride;
            const bf16* vc = p.v_cache + layer * p.cache_layer_stride;
            uint4 kr[HEAD_DIM / 16];
            unsigned vr[16];
            if (attends && warp < ATT_WARPS && att_base < att_t1) load_kv_tile(kc, vc, att_g, att_base, att_t1, first_slot, kr, vr);
            PHASE_MARK(layer, 1);
            if (attends) {
                const int g = att_g, t0 = att_t0, t1 = att_t1;
                {
                    float qv[QS_ITEMS];
#pragma unroll
                    for (int j = 0; j < QS_ITEMS; ++j) {
                        const int i = threadIdx.x + j * THREADS;
                        qv[j] = i < GROUP * HEAD_DIM ? ldcg(p.q + g * GROUP * HEAD_DIM + i) : 0.f;
                    }
#pragma unroll
                    for (int j = 0; j < QS_ITEMS; ++j)
                        if (threadIdx.x + j * THREADS < GROUP * HEAD_DIM) qs[threadIdx.x + j * THREADS] = qv[j];
                }
                __syncthreads();
                PHASE_MARK(layer, 0);
                if (warp < ATT_WARPS) {
                    float m[GROUP], l[GROUP], acc0[GROUP], acc1[GROUP];
#pragma unroll
                    for (int h = 0; h < GROUP; ++h) {
                        m[h] = NEG_INF;
                        l[h] = 0.f;
                        acc0[h] = 0.f;
                        acc1[h] = 0.f;
                    }
                    // a warp takes 16 tokens at a time (load_kv_tile; the first tile's loads went out above)
                    const int half = lane >> 4;
                    for (int base = att_base; base < t1; base += ATT_WARPS * 16) {
                        const bool valid = base + (lane & 15) < t1;
                        if (base != att_base) load_kv_tile(kc, vc, g, base, t1, token_slot(p, base + (lane & 15), t1), kr, vr);
                        float sc[GROUP];
#pragma unroll
                        for (int h = 0; h < GROUP; ++h) sc[h] = 0.f;
#pragma unroll
                        for (int i = 0; i < HEAD_DIM / 16; ++i) {
                            const float k0 = bf_lo(kr[i].x), k1 = bf_hi(kr[i].x), k2 = bf_lo(kr[i].y), k3 = bf_hi(kr[i].y);
                            const float k4 = bf_lo(kr[i].z), k5 = bf_hi(kr[i].z), k6 = bf_lo(kr[i].w), k7 = bf_hi(kr[i].w);
                            const float* qh = qs + half * (HEAD_DIM / 2) + 8 * i;
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
                            const float full = sc[h] + __shfl_xor_sync(0xffffffffu, sc[h], 16);  // both halves of the row
                            const float s = valid ? full * p.scale : NEG_INF;
                            const float new_m = fmaxf(m[h], warp_max(s));
                            const float correction = __expf(m[h] - new_m);
                            const float pr = valid ? __expf(s - new_m) : 0.f;
                            l[h] = l[h] * correction + warp_sum(half ? 0.f : pr);  // each token once
                            acc0[h] *= correction;
                            acc1[h] *= correction;
                            m[h] = new_m;
                            sc[h] = rbf(pr);  // the value product takes p in bf16, as the Triton path does
                        }
                        if (base == t0) PHASE_MARK(layer, 2);
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
                PHASE_MARK(layer, 3);
                __syncthreads();
                for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += THREADS) {
                    const int h = i / HEAD_DIM, d = i % HEAD_DIM;
                    float mx = NEG_INF;
                    for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, merge_m[w * GROUP + h]);
                    float a = 0.f, sum = 0.f;
                    for (int w = 0; w < ATT_WARPS; ++w) {
                        const float mw = merge_m[w * GROUP + h];
                        const float f = mw == NEG_INF ? 0.f : __expf(mw - mx);
                        a = fmaf(f, merge_acc[(w * GROUP + h) * HEAD_DIM + d], a);
                        sum = fmaf(f, merge_l[w * GROUP + h], sum);
                    }
                    const int part = item * GROUP + h;
                    p.part_acc[part * HEAD_DIM + d] = a;
                    if (d == 0) {
                        p.part_ml[2 * part] = mx;
                        p.part_ml[2 * part + 1] = sum;
                    }
                }
            }
        }
        grid_sync(p, layer, 1);
        PHASE_END(layer, 1);

        // ---- C: combine the splits (every block, for all heads), o_proj of this block's rows, residual add
        {
            load_o_rows(p, layer, wo);  // from L2 (asked for in phase A)
            // this block's residual rows, written by it in phase E (or A): stable until its own add below
            const float resid_row = warp < nc ? ldcg(p.resid + c0 + warp) : 0.f;
            // each thread's partial outputs of every split requested at once (split count unrolled
            // up to MAX_SPLITS), then every split's max and sum into shared memory
            float parts[Q_ITEMS][MAX_SPLITS];
#pragma unroll
            for (int j = 0; j < Q_ITEMS; ++j) {
                const int i = threadIdx.x + j * THREADS;
                const int head = i / HEAD_DIM, d = i % HEAD_DIM;
                const int g = head / GROUP, h = head % GROUP;
#pragma unroll
                for (int s = 0; s < MAX_SPLITS; ++s)
                    parts[j][s] = i < Q_SIZE && s < splits ? ldcg(p.part_acc + ((g * splits + s) * GROUP + h) * HEAD_DIM + d) : 0.f;
            }
            float* split_m = merge_acc;
            float* split_l = merge_acc + KV_HEADS * MAX_SPLITS * GROUP;
            for (int i = threadIdx.x; i < KV_HEADS * splits * GROUP; i += THREADS) {
                split_m[i] = ldcg(p.part_ml + 2 * i);
                split_l[i] = ldcg(p.part_ml + 2 * i + 1);
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < Q_ITEMS; ++j) {
                const int i = threadIdx.x + j * THREADS;
                if (i < Q_SIZE) {
                    const int head = i / HEAD_DIM, d = i % HEAD_DIM;
                    const int g = head / GROUP, h = head % GROUP;
                    float mx = NEG_INF;
                    for (int s = 0; s < splits; ++s) mx = fmaxf(mx, split_m[(g * splits + s) * GROUP + h]);
                    float a = 0.f, sum = 0.f;
#pragma unroll
                    for (int s = 0; s < MAX_SPLITS; ++s) {
                        if (s < splits) {
                            const int part = (g * splits + s) * GROUP + h;
                            const float f = __expf(split_m[part] - mx);
                            a = fmaf(f, parts[j][s], a);
                            sum = fmaf(f, split_l[part], sum);
                        }
                    }
                    xs[i] = rbf(a / sum);
                }
            }
            __syncthreads();
            if (warp < nc) {
                const float4* x4 = (const float4*)xs;
                float d = 0.f;
#pragma unroll
                for (int c = 0; c < KC_Q; ++c) d = dot4(wo[c], x4[c * 32 + lane], d);
                d = warp_sum(d);
                if (lane == 0) p.resid[c0 + warp] = rbf(rbf(d) + resid_row);
            }
        }
        grid_sync(p, layer, 2);
        PHASE_END(layer, 2);

        // ---- D: norm, gate/up (from shared memory), SiLU gate
        norm_into(xs, p.resid, nullptr, lw->post_norm, p.eps, red);
        PHASE_MARK(layer, 4);
        {
            const int i0 = share_begin(INTER), ni = share_end(INTER) - i0;
            mbar_wait(x_bar, parity);
            PHASE_MARK(layer, 5);
            const float4* x4 = (const float4*)xs;
            // two rows a warp at a time (rows r and r + WARPS): four independent sums in flight
#pragma unroll 1
            for (int r = warp; r < ni; r += 2 * WARPS) {
                const int r2 = r + WARPS < ni ? r + WARPS : r;
                const bf16 *gate_a = xw + r * HIDDEN, *up_a = xw + (ni + r) * HIDDEN;
                const bf16 *gate_b = xw + r2 * HIDDEN, *up_b = xw + (ni + r2) * HIDDEN;
                float ga = 0.f, ua = 0.f, gb = 0.f, ub = 0.f;
#pragma unroll
                for (int c = 0; c < KC_H; ++c) {
                    const int k = (c * 32 + lane) * 4;
                    const float4 x = x4[c * 32 + lane];
                    ga = dot4(*(const uint2*)(gate_a + k), x, ga);
                    ua = dot4(*(const uint2*)(up_a + k), x, ua);
                    gb = dot4(*(const uint2*)(gate_b + k), x, gb);
                    ub = dot4(*(const uint2*)(up_b + k), x, ub);
                }
                ga = warp_sum(ga);
                ua = warp_sum(ua);
                gb = warp_sum(gb);
                ub = warp_sum(ub);
                if (lane == 0) {
                    float gate = rbf(ga), up = rbf(ua);
                    p.act[i0 + r] = to_bf(gate / (1.0f + __expf(-gate)) * up);
                    if (r2 != r) {
                        gate = rbf(gb);
                        up = rbf(ub);
                        p.act[i0 + r2] = to_bf(gate / (1.0f + __expf(-gate)) * up);
                    }
                }
            }
        }
        grid_sync(p, layer, 3);
        PHASE_END(layer, 3);

        // ---- E: down_proj (from shared memory), residual add: the activation into shared memory
        // (attention's merge space, free now), then one row a warp
        {
            const float resid_row = lane == 0 && warp < nc ? ldcg(p.resid + c0 + warp) : 0.f;  // written by this block in phase C
            uint4* act_s = (uint4*)merge_acc;
            uint4 av[ACT_ITEMS];
#pragma unroll
            for (int j = 0; j < ACT_ITEMS; ++j) {
                const int i = threadIdx.x + j * THREADS;
                if (i < INTER / 8) av[j] = ldcg_u4(p.act + 8 * i);
            }
            PHASE_MARK(layer, 6);
            if (layer + 1 < LAYERS) {
                load_gate_up(p, layer + 1, x_smem, x_bar);  // X was read in phase D
                prefetch_qkv_rows(p, layer + 1);
            }
#pragma unroll
            for (int j = 0; j < ACT_ITEMS; ++j) {
                const int i = threadIdx.x + j * THREADS;
                if (i < INTER / 8) act_s[i] = av[j];
            }
            mbar_wait(y_bar, parity);
            PHASE_MARK(layer, 7);
            __syncthreads();
            if (warp < nc) {
                // the row in 256-wide chunks, each summed across the warp, then the chunks in order
                const uint4* w_row = (const uint4*)(yw + warp * INTER);
                float part[KC_I];
#pragma unroll
                for (int c = 0; c < KC_I; ++c) part[c] = dot8(w_row[c * 32 + lane], act_s[c * 32 + lane], 0.f);
#pragma unroll
                for (int c = 0; c < KC_I; ++c) part[c] = warp_sum(part[c]);
                float d = 0.f;
#pragma unroll
                for (int c = 0; c < KC_I; ++c) d += part[c];
                if (lane == 0) p.resid[c0 + warp] = rbf(rbf(d) + resid_row);
            }
        }
        grid_sync(p, layer, 4);
        PHASE_END(layer, 4);
    }

    if (blockIdx.x == 0) {
        norm_into(xs, p.resid, nullptr, p.final_norm, p.eps, red);
        for (int i = threadIdx.x; i < HIDDEN; i += THREADS) p.out[i] = to_bf(xs[i]);
    }
}
