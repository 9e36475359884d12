// Shared helpers for every ssm-kernels CUDA kernel. Header-free on purpose: NVRTC
// provides the built-in types and intrinsics, and the fp16/bf16 conversions below
// replace cuda_fp16.h / cuda_bf16.h, so no CUDA include directory is needed.
#pragma once

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;

// Bits of the device error word, one per kind of invalid index value met on the device.
// Mirrored by `DeviceErrors` in crates/ssm-cuda/src/error.rs (one definition for every kernel
// family, so no two families can give one bit two meanings).
#define ERR_SLOT 1u
#define ERR_CU_SEQLENS 2u
#define ERR_ACCEPTED 4u
#define ERR_COLUMN 8u
#define ERR_CURSOR 16u
#define ERR_ROW 32u

// Storage types of the 16-bit floats: raw bits, converted explicitly.
struct f16_t { unsigned short bits; };
struct bf16_t { unsigned short bits; };

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(f16_t v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
    return f;
}
__device__ __forceinline__ float to_f32(bf16_t v) { return __uint_as_float(((u32)v.bits) << 16); }

template <typename T> struct FromF32;
template <> struct FromF32<float> {
    static __device__ __forceinline__ float cvt(float v) { return v; }
};
template <> struct FromF32<f16_t> {
    // Round to nearest even, like the CPU backend's `half::f16::from_f32`.
    static __device__ __forceinline__ f16_t cvt(float v) {
        f16_t h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
        return h;
    }
};
template <> struct FromF32<bf16_t> {
    // Round to nearest even; NaN keeps its sign and becomes quiet (`half::bf16::from_f32`).
    static __device__ __forceinline__ bf16_t cvt(float v) {
        u32 u = __float_as_uint(v);
        bf16_t b;
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            b.bits = (unsigned short)((u >> 16) | 0x40u);
        } else {
            u += 0x7fffu + ((u >> 16) & 1u);
            b.bits = (unsigned short)(u >> 16);
        }
        return b;
    }
};
template <typename T> __device__ __forceinline__ T from_f32(float v) { return FromF32<T>::cvt(v); }

// n / d for n < 2^31, with (m, l) = fast_div(d) of crates/ssm-cuda/src/geometry.rs.
__device__ __forceinline__ u32 fast_div(u32 n, u32 m, u32 l) { return (__umulhi(n, m) + n) >> l; }

// The fast_div constants of a grid of sequences × heads × row tiles, tile fastest (neighbouring
// blocks share a state slot: contiguous memory). Mirrored by `BlockSplit` in
// crates/ssm-cuda/src/geometry.rs.
struct BlockSplit {
    u32 tiles, tiles_m, tiles_l, heads, heads_m, heads_l;
};

// Block `bid`'s (sequence, head, row tile), by multiply-high rather than a division routine.
__device__ __forceinline__ void split_block(const BlockSplit& b, u32 bid, i64& seq, int& head, int& tile) {
    const u32 ht = fast_div(bid, b.tiles_m, b.tiles_l);
    tile = (int)(bid - ht * b.tiles);
    const u32 sq = fast_div(ht, b.heads_m, b.heads_l);
    head = (int)(ht - sq * b.heads);
    seq = sq;
}

__device__ __forceinline__ i64 load_index(const int* p) { return (i64)*p; }
__device__ __forceinline__ i64 load_index(const i64* p) { return *p; }
__device__ __forceinline__ i64 load_index(const unsigned char* p) { return (i64)*p; }

// Read-only loads through the non-coherent cache (inputs the kernel never writes).
__device__ __forceinline__ float ld_ro(const float* p) { return __ldg(p); }
__device__ __forceinline__ f16_t ld_ro(const f16_t* p) {
    f16_t v;
    v.bits = __ldg(&p->bits);
    return v;
}
__device__ __forceinline__ bf16_t ld_ro(const bf16_t* p) {
    bf16_t v;
    v.bits = __ldg(&p->bits);
    return v;
}

// One 16-byte vector of T (16 / sizeof(T) elements) widened to f32.
template <typename T> __device__ __forceinline__ void unpack_vec(const uint4& u, float* out) {
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < (int)(16 / sizeof(T)); ++i) out[i] = to_f32(e[i]);
}

// N consecutive read-only elements as f32: one 16-, 8- or 4-byte load when N * sizeof(T) is
// one of those (the caller guarantees the alignment), else element by element.
template <int N, typename T> __device__ __forceinline__ void load_vec_ro(const T* p, float* out) {
    if constexpr (N * sizeof(T) == 16) {
        unpack_vec<T>(__ldg(reinterpret_cast<const uint4*>(p)), out);
    } else if constexpr (N * sizeof(T) > 16 && (N * sizeof(T)) % 16 == 0) {
        constexpr int K = 16 / sizeof(T);
#pragma unroll
        for (int c = 0; c < N / K; ++c) load_vec_ro<K>(p + c * K, out + c * K);
    } else if constexpr (N * sizeof(T) == 8) {
        uint2 u = __ldg(reinterpret_cast<const uint2*>(p));
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(e[i]);
    } else if constexpr (N * sizeof(T) == 4 && N > 1) {
        unsigned int u = __ldg(reinterpret_cast<const unsigned int*>(p));
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(ld_ro(p + i));
    }
}

// Two f32 → one packed pair of 16-bit floats, round to nearest even (one instruction on sm_80+).
template <typename T> __device__ __forceinline__ u32 pack2(float lo, float hi);
template <> __device__ __forceinline__ u32 pack2<bf16_t>(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)from_f32<bf16_t>(lo).bits | ((u32)from_f32<bf16_t>(hi).bits << 16);
#endif
}
template <> __device__ __forceinline__ u32 pack2<f16_t>(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)from_f32<f16_t>(lo).bits | ((u32)from_f32<f16_t>(hi).bits << 16);
#endif
}

// One 16-byte load (the caller guarantees the alignment); STREAMING: evict-first (`ld.global.cs`).
template <bool STREAMING> __device__ __forceinline__ uint4 load16(const void* p) {
    if constexpr (STREAMING) {
        return __ldcs(reinterpret_cast<const uint4*>(p));
    } else {
        return *reinterpret_cast<const uint4*>(p);
    }
}

// One 16-byte store (the caller guarantees the alignment); STREAMING: evict-first (`st.global.cs`).
template <bool STREAMING> __device__ __forceinline__ void store16(void* p, const uint4& u) {
    if constexpr (STREAMING) {
        __stcs(reinterpret_cast<uint4*>(p), u);
    } else {
        *reinterpret_cast<uint4*>(p) = u;
    }
}

// N consecutive elements starting at `p` as f32. With N * sizeof(T) == 16 the caller
// guarantees 16-byte alignment and one 128-bit load is issued.
template <int N, typename T, bool STREAMING = false> __device__ __forceinline__ void load_vec(const T* p, float* out) {
    if constexpr (N * sizeof(T) == 16) {
        unpack_vec<T>(load16<STREAMING>(p), out);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(p[i]);
    }
}

// VEC = 16 / sizeof(T) f32 values as one 16-byte vector of T (round to nearest even).
template <typename T> __device__ __forceinline__ uint4 pack_vec(const float* in) {
    if constexpr (sizeof(T) == 2) {
        return make_uint4(pack2<T>(in[0], in[1]), pack2<T>(in[2], in[3]), pack2<T>(in[4], in[5]), pack2<T>(in[6], in[7]));
    } else {
        static_assert(sizeof(T) == 4, "pack_vec: 2- or 4-byte elements");
        return make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
    }
}

// Stores N elements from f32 (round to nearest even). STREAMING: 16-byte accesses use the
// evict-first cache hint (`st.global.cs`); the state is written once and not read again.
template <int N, typename T, bool STREAMING = false> __device__ __forceinline__ void store_vec(T* p, const float* in) {
    if constexpr (N * sizeof(T) == 16) {
        store16<STREAMING>(p, pack_vec<T>(in));
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) p[i] = from_f32<T>(in[i]);
    }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core products (sm_80+): one warp's `mma.sync` tile, f32 accumulation. KIND selects the
// operand type: 0 bf16 and 1 f16 (m16n8k16, each u32 register holds two operands, k and k + 1),
// 2 tf32 (m16n8k8, one operand per register). Fragment layouts are the PTX ISA's: for lane
// (g = lane / 4, t = lane % 4), a = rows g and g + 8 at k = 2t, 2t + 8 (tf32: t, t + 4), b =
// column g at the same k, d = rows g and g + 8 at columns 2t and 2t + 1.

// f32 → tf32 bits (round to nearest, ties away, as Triton's tf32 `tl.dot`).
__device__ __forceinline__ u32 tf32_of(float v) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

template <int KIND> __device__ __forceinline__ void mma_tile(float* d, const u32* a, const u32* b) {
    if constexpr (KIND == 2) {
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else if constexpr (KIND == 0) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
}

// The shared-window address of a pointer into shared memory (the intrinsic, so that the
// compiler folds constant offsets into the instructions that use it).
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// 16 bytes from global `src` into shared `dst` (both 16-byte aligned), asynchronously (sm_80+);
// `cp_async_commit` closes a group, `cp_async_wait_all` waits for every group.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(16) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }
