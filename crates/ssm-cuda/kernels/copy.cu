// Device-to-device copy with 16-byte accesses, the bandwidth yardstick the SSU bench
// compares against (cuMemcpyDtoDAsync is measured too; the better of the two is reported).
// Each thread moves UNROLL vectors per step, all loaded before any store.

#ifndef UNROLL
#define UNROLL 4
#endif

extern "C" __global__ void __launch_bounds__(256) copy_u128(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 n) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) v[k] = src[i + k * stride];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) dst[i + k * stride] = v[k];
    }
    for (; i < n; i += stride) dst[i] = src[i];
}

// Uniform pseudo-random fill in [lo, hi) (a hash of the element index and the seed), so that
// benchmarks never time zeros and need no host-side generation of gigabytes.
__device__ __forceinline__ float uniform01(u64 i, u64 seed) {
    u64 z = i * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#define FILL_KERNEL(NAME, T)                                                                              \
    extern "C" __global__ void NAME(T* dst, u64 n, u64 seed, float lo, float hi) {                        \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) \
            dst[i] = from_f32<T>(lo + (hi - lo) * uniform01(i, seed));                                    \
    }
FILL_KERNEL(fill_uniform_f32, float)
FILL_KERNEL(fill_uniform_f16, f16_t)
FILL_KERNEL(fill_uniform_bf16, bf16_t)

// Whole rows moved through an index list (`copy_rows`: the layer cores' gather and scatter of
// one group of a mixed batch's tokens). Gather: dst row i <- src row index[i]; scatter: dst row
// index[i] <- src row i. Block b moves rows b, b + gridDim.x, ... with VEC-byte accesses (VEC
// divides every address, pitch and the width: the launcher picks it). An index value outside
// [0, rows) of the addressed tensor skips its row and sets ERR_ROW: nothing of it is written.
#ifndef VEC
#define VEC 16
#endif

template <int B> struct VecOf;
template <> struct VecOf<16> { typedef uint4 T; };
template <> struct VecOf<8> { typedef uint2 T; };
template <> struct VecOf<4> { typedef u32 T; };
template <> struct VecOf<2> { typedef unsigned short T; };
template <> struct VecOf<1> { typedef unsigned char T; };

struct CopyRowsParams {
    u64 src, dst, index, err;
    i64 src_pitch, dst_pitch;  // bytes between rows (may be negative)
    i64 index_stride;          // elements between index entries
    u64 n, width, rows;        // rows moved, bytes per row, rows of the addressed tensor
    int index_i64, scatter;
};

extern "C" __global__ void __launch_bounds__(256) copy_rows(const CopyRowsParams p) {
    typedef typename VecOf<VEC>::T T;
    const u64 nv = p.width / VEC;
    for (u64 i = blockIdx.x; i < p.n; i += gridDim.x) {
        const i64 at = (i64)i * p.index_stride;
        const i64 r = p.index_i64 ? ((const i64*)p.index)[at] : (i64)((const int*)p.index)[at];
        if (r < 0 || (u64)r >= p.rows) {
            if (threadIdx.x == 0) atomicOr((u32*)p.err, ERR_ROW);
            continue;
        }
        const i64 s = p.scatter ? (i64)i : r, d = p.scatter ? r : (i64)i;
        const T* src = (const T*)(p.src + (u64)(s * p.src_pitch));
        T* dst = (T*)(p.dst + (u64)(d * p.dst_pitch));
        for (u64 j = threadIdx.x; j < nv; j += blockDim.x) dst[j] = src[j];
    }
}
