// The MLP of a few decode rows (bf16) as two kernels that hold their weight in shared memory:
//
//   staged_gate_up: act = silu(g) * u, [g, u] = rms_norm(x + residual) @ [W_gate; W_up]^T
//   staged_down:    out = act @ W_down^T
//
// One block per multiprocessor, each owning a fixed slice of the weight's rows. A block's first
// act is to hand its whole slice to the copy engine (bulk copies into shared memory, completing
// on an mbarrier) and let the next kernel launch (programmatic dependent launch); only then does
// it wait for the kernel before it. Launched while the attention chain still runs, the MLP's
// weight (most of a layer's bytes) streams in under that chain, and after the wait a block only
// multiplies from shared memory: no weight read is left behind the kernel boundary.
//
// Numerics follow the fused Triton path (kernels/fused_linear.py): x + residual rounded to bf16
// (the residual stream), the normed input rounded to bf16, float32 accumulation, the projections
// rounded to bf16 before the SiLU gate, every reduction in a fixed order.
//
// Shape constants come from the host as macros: HIDDEN (a multiple of 128), INTER (a multiple of
// 8), THREADS, ROWS (the decode rows; a build per row count), GU_ROWS / DN_ROWS (gate/up and down_proj rows a
// block owns at most), PROFILE (1: each block's thread 0 records when it started, when its wait
// ended, when its weight slice was in, and when it finished, in ns of the GPU's global timer).

#define WARPS (THREADS / 32)
#define HALF_WARPS (THREADS / 16)
#define X_PASSES (HIDDEN / 128)  // 8-element chunks a half-warp lane takes of a HIDDEN-wide row
#define NORM_ITEMS ((HIDDEN + THREADS - 1) / THREADS)
#define ACT_ITEMS ((INTER / 8 + THREADS - 1) / THREADS)  // 8-element chunks of an activation row a thread takes

struct GateUpParams {
    const bf16* x;          // [rows, HIDDEN]: the attention output projection
    const bf16* residual;   // [rows, HIDDEN]
    const bf16* norm;       // [HIDDEN]: the post-attention norm's weight
    const bf16* weight;     // [2 * INTER, HIDDEN]: gate rows, then up rows
    bf16* out;              // [rows, INTER]
    bf16* residual_out;     // [rows, HIDDEN]: x + residual
    float eps;
    unsigned long long* profile;  // with PROFILE: [blocks, 4] stamps
};

struct DownParams {
    const bf16* act;        // [rows, INTER]
    const bf16* weight;     // [HIDDEN, INTER]
    bf16* out;              // [rows, HIDDEN]
    unsigned long long* profile;
};

#if PROFILE
#define STAMP(i)                                                                \
    do {                                                                        \
        if (threadIdx.x == 0) {                                                 \
            unsigned long long t;                                               \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) :: "memory");   \
            p.profile[blockIdx.x * 4 + (i)] = t;                                \
        }                                                                       \
    } while (0)
#else
#define STAMP(i) do { } while (0)
#endif

// 8 bf16 weights times 8 float inputs, added to acc in order
__device__ __forceinline__ float dot8f(uint4 w, float4 x0, float4 x1, float acc) {
    acc = fmaf(bf_lo(w.x), x0.x, acc);
    acc = fmaf(bf_hi(w.x), x0.y, acc);
    acc = fmaf(bf_lo(w.y), x0.z, acc);
    acc = fmaf(bf_hi(w.y), x0.w, acc);
    acc = fmaf(bf_lo(w.z), x1.x, acc);
    acc = fmaf(bf_hi(w.z), x1.y, acc);
    acc = fmaf(bf_lo(w.w), x1.z, acc);
    return fmaf(bf_hi(w.w), x1.w, acc);
}

__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_kernel() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Thread 0 starts the bulk copies of `rows` rows from `first` of each of `count` matrices
// `stride` rows apart (gate and up: 2, INTER apart) into shared memory at `dst`, completing on `bar`.
__device__ __forceinline__ void stage_rows(unsigned dst, unsigned bar, const bf16* w, int first, int rows, int row_elems, int count,
                                           long long stride) {
    if (threadIdx.x != 0) return;
    mbar_init(bar);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    arm_region(bar, (unsigned)(count * rows * row_elems * 2));
    for (int c = 0; c < count; ++c) dst += bulk_rows(dst, w + c * stride * row_elems, first, rows, row_elems, bar);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) staged_gate_up(const GateUpParams p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned bar = smem_addr(smem);
    const bf16* w_smem = (const bf16*)(smem + 128);  // gate rows, then up rows
    float* xs = (float*)(smem + 128 + 2 * GU_ROWS * HIDDEN * 2);  // [ROWS, HIDDEN]: the normed rows
    float* red = xs + ROWS * HIDDEN;                           // [ROWS, WARPS]
    STAMP(0);
    const int i0 = share_begin(INTER), ni = share_end(INTER) - i0;
    stage_rows(bar + 128, bar, p.weight, i0, ni, HIDDEN, 2, INTER);
    __syncthreads();  // the mbarrier is initialized before anyone waits on it
    launch_dependents();
    wait_for_previous_kernel();
    STAMP(1);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    // x + residual (rounded as the residual stream is stored) and its sum of squares, per row
    float h[ROWS][NORM_ITEMS], nw[NORM_ITEMS];
#pragma unroll
    for (int j = 0; j < NORM_ITEMS; ++j) {
        const int i = threadIdx.x + j * THREADS;
        nw[j] = i < HIDDEN ? bf(p.norm[i]) : 0.f;
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
            const bool in = i < HIDDEN;
            h[m][j] = in ? bf(__ldcg(p.x + m * HIDDEN + i)) + bf(__ldcg(p.residual + m * HIDDEN + i)) : 0.f;
        }
    }
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) {
            h[m][j] = rbf(h[m][j]);
            ss = fmaf(h[m][j], h[m][j], ss);
            const int i = threadIdx.x + j * THREADS;
            if (blockIdx.x == 0 && i < HIDDEN) p.residual_out[m * HIDDEN + i] = to_bf(h[m][j]);
        }
        ss = warp_sum(ss);
        if (lane == 0) red[m * WARPS + warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int m = 0; m < ROWS; ++m) {
        float total = 0.f;
        for (int w = 0; w < WARPS; ++w) total += red[m * WARPS + w];
        const float inv = 1.0f / sqrtf(total / HIDDEN + p.eps);
#pragma unroll
        for (int j = 0; j < NORM_ITEMS; ++j) {
            const int i = threadIdx.x + j * THREADS;
            if (i < HIDDEN) xs[m * HIDDEN + i] = rbf(h[m][j] * inv * nw[j]);
        }
    }
    __syncthreads();

    // a half-warp takes a (gate, up) row pair at a time; its lanes hold their 8-element chunks of
    // the normed rows in registers
    const int sub = threadIdx.x & 15, half_warp = threadIdx.x >> 4;
    float4 xr[ROWS][X_PASSES][2];
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
#pragma unroll
        for (int c = 0; c < X_PASSES; ++c) {
            const float* src = xs + m * HIDDEN + c * 128 + sub * 8;
            xr[m][c][0] = *(const float4*)src;
            xr[m][c][1] = *(const float4*)(src + 4);
        }
    mbar_wait(bar, 0);
    STAMP(2);
    // every warp runs the same number of rounds (its shuffles need both half-warps); a half-warp
    // past the last row computes on the last row again and stores nothing
#pragma unroll 1
    for (int first = 0; first < ni; first += HALF_WARPS) {
        const int r = first + half_warp < ni ? first + half_warp : ni - 1;
        const bool owner = first + half_warp < ni;
        const bf16* wg = w_smem + r * HIDDEN + sub * 8;
        const bf16* wu = wg + ni * HIDDEN;
        float g[ROWS], u[ROWS];
#pragma unroll
        for (int m = 0; m < ROWS; ++m) g[m] = u[m] = 0.f;
#pragma unroll
        for (int c = 0; c < X_PASSES; ++c) {
            const uint4 a = *(const uint4*)(wg + c * 128), b = *(const uint4*)(wu + c * 128);
#pragma unroll
            for (int m = 0; m < ROWS; ++m) {
                g[m] = dot8f(a, xr[m][c][0], xr[m][c][1], g[m]);
                u[m] = dot8f(b, xr[m][c][0], xr[m][c][1], u[m]);
            }
        }
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
            for (int o = 8; o; o >>= 1) {  // the half-warp's sum
                g[m] += __shfl_xor_sync(0xffffffffu, g[m], o);
                u[m] += __shfl_xor_sync(0xffffffffu, u[m], o);
            }
            if (sub == 0 && owner) {
                const float gate = rbf(g[m]), up = rbf(u[m]);
                p.out[m * INTER + i0 + r] = to_bf(gate / (1.0f + __expf(-gate)) * up);
            }
        }
    }
    __syncthreads();
    STAMP(3);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1) staged_down(const DownParams p) {
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned bar = smem_addr(smem);
    const bf16* w_smem = (const bf16*)(smem + 128);
    float* red = (float*)(smem + 128 + DN_ROWS * INTER * 2);  // [WARPS, DN_ROWS, ROWS]
    STAMP(0);
    const int d0 = share_begin(HIDDEN), nd = share_end(HIDDEN) - d0;
    stage_rows(bar + 128, bar, p.weight, d0, nd, INTER, 1, 0);
    __syncthreads();
    launch_dependents();
    wait_for_previous_kernel();
    STAMP(1);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4 a[ROWS][ACT_ITEMS];  // this thread's 8-element chunks of each activation row
#pragma unroll
    for (int m = 0; m < ROWS; ++m)
#pragma unroll
        for (int j = 0; j < ACT_ITEMS; ++j) {
            const int v = threadIdx.x + j * THREADS;
            a[m][j] = v < INTER / 8 ? __ldcg((const uint4*)(p.act + m * INTER) + v) : make_uint4(0, 0, 0, 0);
        }
    mbar_wait(bar, 0);
    STAMP(2);
    float acc[DN_ROWS][ROWS];
#pragma unroll
    for (int r = 0; r < DN_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < ROWS; ++m) acc[r][m] = 0.f;
#pragma unroll
    for (int j = 0; j < ACT_ITEMS; ++j) {
        const int v = threadIdx.x + j * THREADS;
        if (v < INTER / 8) {
#pragma unroll
            for (int r = 0; r < DN_ROWS; ++r) {
                if (r < nd) {
                    const uint4 w = *((const uint4*)(w_smem + r * INTER) + v);
#pragma unroll
                    for (int m = 0; m < ROWS; ++m) acc[r][m] = dot8(w, a[m][j], acc[r][m]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DN_ROWS; ++r)
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
            const float s = warp_sum(acc[r][m]);
            if (lane == 0) red[(warp * DN_ROWS + r) * ROWS + m] = s;
        }
    __syncthreads();
    if (threadIdx.x < DN_ROWS * ROWS) {
        const int r = threadIdx.x / ROWS, m = threadIdx.x % ROWS;
        if (r < nd) {
            float s = 0.f;
            for (int w = 0; w < WARPS; ++w) s += red[(w * DN_ROWS + r) * ROWS + m];
            p.out[m * HIDDEN + d0 + r] = to_bf(s);
        }
    }
    STAMP(3);
}
