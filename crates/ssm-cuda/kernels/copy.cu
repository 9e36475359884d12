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
