// Two ways for the blocks of a kernel to read their share of a weight that is not in L2
// (benchmarks/weight_stream_gpu.py; compiled after kernels/cuda_common.cuh):
//
//   bulk_stream:      thread 0 of each block streams its share into shared memory with bulk
//                     copies of PIECE bytes through STAGES buffers (up to STAGES * PIECE bytes
//                     in flight a block), each stage completing on its own mbarrier;
//   register_stream:  every thread loads 16-byte vectors of the share, UNROLL independent loads
//                     in flight a thread, and folds them into one register.
//
// Both leave a word per block in `sink`, so nothing they read is dead code. BLOCKS_PER_SM: the
// blocks a multiprocessor the run asks for (it bounds register_stream's registers).

struct StreamParams {
    const char* src;   // the blocks' shares, one after another
    long long share;   // bytes a block reads (a multiple of PIECE; of THREADS * UNROLL * 16 for register_stream)
    unsigned* sink;    // [blocks]
};

extern "C" __global__ void __launch_bounds__(THREADS) bulk_stream(const StreamParams p) {
    extern __shared__ __align__(128) unsigned char smem[];
    if (threadIdx.x != 0) return;
    const unsigned bars = smem_addr(smem), data = bars + 1024;  // STAGES mbarriers of 8 bytes, then the buffers
    for (int s = 0; s < STAGES; ++s) mbar_init(bars + 8 * s);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const char* base = p.src + blockIdx.x * p.share;
    const long long pieces = p.share / PIECE;
    for (long long i = 0; i < pieces; ++i) {
        const int s = (int)(i % STAGES);
        if (i >= STAGES) mbar_wait(bars + 8 * s, (unsigned)((i / STAGES - 1) & 1));  // the stage's last piece is in
        arm_region(bars + 8 * s, PIECE);
        bulk_bytes(data + s * PIECE, base + i * PIECE, PIECE, bars + 8 * s);
    }
    for (long long i = pieces > STAGES ? pieces - STAGES : 0; i < pieces; ++i)
        mbar_wait(bars + 8 * (int)(i % STAGES), (unsigned)((i / STAGES) & 1));
    p.sink[blockIdx.x] = *(const unsigned*)(smem + 1024);
}

extern "C" __global__ void __launch_bounds__(THREADS, BLOCKS_PER_SM) register_stream(const StreamParams p) {
    const long long share_vectors = p.share / 16;
    const uint4* base = (const uint4*)(p.src + blockIdx.x * p.share);
    unsigned acc = 0;
#pragma unroll 1  // exactly UNROLL loads in flight
    for (long long i = threadIdx.x; i < share_vectors; i += (long long)THREADS * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)  // streaming (read once); volatile, so that all go out before the first is used
            asm volatile("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(base + i + (long long)u * THREADS));
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(p.sink + blockIdx.x, acc);
}
