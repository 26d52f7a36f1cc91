// Helpers shared by the CUDA C++ kernels compiled with NVRTC (kernels/cuda_rtc.py): bf16 values
// as 16-bit integers (no headers), warp reductions, and Hopper's bulk copies into shared memory
// completing on an mbarrier. The host prepends this file to each kernel's source.

typedef unsigned short bf16;

// ---- bf16 and memory helpers ---------------------------------------------------------------

__device__ __forceinline__ float bf(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ unsigned short to_bf(float f) {  // round to nearest even, NaN kept
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

__device__ __forceinline__ float rbf(float f) { return bf(to_bf(f)); }

// data written by other blocks in this kernel is read at L2 (".cg"), past this block's L1; the
// builtins are ordinary loads to the compiler, so independent ones are issued together
__device__ __forceinline__ float ldcg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ unsigned ldcg_u32(const void* p) { return __ldcg((const unsigned*)p); }
__device__ __forceinline__ uint4 ldcg_u4(const void* p) { return __ldcg((const uint4*)p); }

__device__ __forceinline__ float dot4(uint2 w, float4 x, float acc) {
    acc = fmaf(bf_lo(w.x), x.x, acc);
    acc = fmaf(bf_hi(w.x), x.y, acc);
    acc = fmaf(bf_lo(w.y), x.z, acc);
    return fmaf(bf_hi(w.y), x.w, acc);
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc) {
    acc = fmaf(bf_lo(w.x), bf_lo(x.x), acc);
    acc = fmaf(bf_hi(w.x), bf_hi(x.x), acc);
    acc = fmaf(bf_lo(w.y), bf_lo(x.y), acc);
    acc = fmaf(bf_hi(w.y), bf_hi(x.y), acc);
    acc = fmaf(bf_lo(w.z), bf_lo(x.z), acc);
    acc = fmaf(bf_hi(w.z), bf_hi(x.z), acc);
    acc = fmaf(bf_lo(w.w), bf_lo(x.w), acc);
    return fmaf(bf_hi(w.w), bf_hi(x.w), acc);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// ---- bulk copies into shared memory (Hopper's copy engine, completing on an mbarrier) --------

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void mbar_init(unsigned bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

__device__ __forceinline__ void bulk_bytes(unsigned dst, const char* from, unsigned bytes, unsigned bar) {
    while (bytes) {  // pieces of at most 32 KB
        const unsigned piece = bytes < 32768u ? bytes : 32768u;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                     :: "r"(dst), "l"(from), "r"(piece), "r"(bar) : "memory");
        dst += piece;
        from += piece;
        bytes -= piece;
    }
}

__device__ __forceinline__ void expect_bytes(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}

// a block's share [begin, end) of n items
__device__ __forceinline__ int share_begin(int n) { return (int)(((long long)blockIdx.x * n) / gridDim.x); }
__device__ __forceinline__ int share_end(int n) { return (int)(((long long)(blockIdx.x + 1) * n) / gridDim.x); }

// rows [first, first + rows) of a [*, row_elems] bf16 matrix to shared memory at dst; returns
// the bytes. arm_region first: after this block's earlier reads of the region, the mbarrier expects
// the region's bytes.
__device__ __forceinline__ unsigned bulk_rows(unsigned dst, const bf16* w, int first, int rows, int row_elems, unsigned bar) {
    const unsigned bytes = (unsigned)(rows * row_elems * 2);
    bulk_bytes(dst, (const char*)(w + (long long)first * row_elems), bytes, bar);
    return bytes;
}

__device__ __forceinline__ void arm_region(unsigned bar, unsigned bytes) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    expect_bytes(bar, bytes);
}
