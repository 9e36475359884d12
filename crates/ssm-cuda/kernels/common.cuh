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
// The integers of a block-scaled i16 / i8 state (the row's scale is the caller's).
__device__ __forceinline__ float to_f32(short v) { return (float)v; }
__device__ __forceinline__ float to_f32(signed char v) { return (float)v; }

template <typename T> struct FromF32;
template <> struct FromF32<float> {
    static __device__ __forceinline__ float cvt(float v) { return v; }
    static __device__ __forceinline__ float round(float v) { return v; }
    static __device__ __forceinline__ float copy(float v) { return v; }
};
template <> struct FromF32<f16_t> {
    // Round to nearest even, like the CPU backend's `half::f16::from_f32`.
    static __device__ __forceinline__ f16_t cvt(float v) {
        f16_t h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
        return h;
    }
    static __device__ __forceinline__ float round(float v) { return to_f32(cvt(v)); }
    static __device__ __forceinline__ f16_t copy(float v) { return cvt(v); }
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
    // A value that is a bf16 widened (a state or input element moved, not computed) back to
    // its own bits, NaN payloads included: the reference's element copy, one shift (or half a
    // byte permute) where `cvt` takes about eight.
    static __device__ __forceinline__ bf16_t copy(float v) {
        bf16_t b;
        b.bits = (unsigned short)(__float_as_uint(v) >> 16);
        return b;
    }
    // `v` rounded to the nearest bf16 (even on ties) and widened back, for a value that only
    // feeds more f32 arithmetic: one instruction on sm_80+ where `cvt` takes about eight. There a
    // NaN comes back as the canonical NaN, which is what the arithmetic it feeds makes of any
    // NaN anyway (the GPU's f32 operations return the canonical NaN), so results keep their bits.
    static __device__ __forceinline__ float round(float v) {
#if __CUDA_ARCH__ >= 800
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return __uint_as_float(((u32)h) << 16);
#else
        return to_f32(cvt(v));
#endif
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

// The causal conv1d's parameter block (kernels/conv.cu, and gdn.cu's fused decode step).
// Mirrored by `ConvParams` in crates/ssm-cuda/src/conv.rs (same field order, all 8-byte
// fields first, no padding). Addresses include each tensor's element offset.
struct ConvParams {
    u64 x, w, bias, state, out, ci, nacc, qsl, init, blk, err;
    i64 x_seq, x_tok, x_dim, out_seq, out_tok, out_dim;
    i64 st_slot, st_col, st_dim, w_dim, w_tap, b_dim;
    i64 ci_seq, ci_col, nacc_s, qsl_s, init_s, blk_s;
    i64 slots, state_len, rows, pad, ci_cols;
    int batch, dim, seqlen, chunk, cblocks, reserved;
};

// acc + round_T(a·b): the product of two storage values rounded to the storage dtype before
// the f32 accumulate (exact in f32 for f16/bf16 operands, so one rounding), fused for f32
// (Triton's and the CPU backend's contraction).
template <typename T> __device__ __forceinline__ float conv_mac(float a, float b, float acc) {
    if constexpr (sizeof(T) == 4) {
        return fmaf(a, b, acc);
    } else {
        return acc + FromF32<T>::round(__fmul_rn(a, b));
    }
}

// SiLU as vLLM's Triton conv kernels compute it, `x / (1 + exp(−x))`: Triton lowers an f32
// `tl.exp` to `ex2.approx.f32` of x·log2(e) and an f32 division to `div.full.f32` (both within
// 2 ulp), a few instructions where `expf` and an IEEE quotient take about thirty.
__device__ __forceinline__ float silu_triton(float x) {
    float e, q;
    asm("ex2.approx.f32 %0, %1;" : "=f"(e) : "f"(-x * 1.4426950408889634f));
    asm("div.full.f32 %0, %1, %2;" : "=f"(q) : "f"(x), "f"(1.f + e));
    return q;
}

// Programmatic dependent launch (sm_90+; no-ops before): a primary grid lets the next kernel of
// the stream, launched with programmatic stream serialization, start early; that kernel waits
// for the primary grid to complete, its writes visible, before it reads them.
__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The sum of `x` over G lanes that lie S apart in the warp (a butterfly: xor G/2 first, then
// halving); every lane of those G ends with it. G is a power of two, G <= 32 / S; every lane of
// the warp calls it.
template <int G, int S = 1> __device__ __forceinline__ float butterfly_sum(float x) {
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o * S);
    return x;
}

// N rows' partial sums, each spread over the G lanes of a row group whose lanes lie S apart in
// the warp (`lane`: the lane's index in its group), reduced and scattered: on return acc[0]
// holds the whole sum of row lane / (G / N). The additions are the butterfly's (xor G/2 first,
// then halving), pair for pair, so each row's sum is bit-identical to a butterfly over that row
// alone, with N − 1 + log2(G) shuffles instead of N·log2(G). N and G are powers of two,
// N <= G <= 32 / S; every lane of the warp calls it. (Template parameters, not the kernels'
// RPT/TPR macros, which would replace their names.)
template <int N, int G, int S = 1> __device__ __forceinline__ void reduce_scatter(float* acc, int lane) {
#pragma unroll
    for (int cnt = N, o = G / 2; cnt > 1; cnt >>= 1, o >>= 1) {
        const bool hi = (lane & o) != 0;
#pragma unroll
        for (int i = 0; i < cnt / 2; ++i) {
            const float send = hi ? acc[i] : acc[i + cnt / 2];
            const float keep = hi ? acc[i + cnt / 2] : acc[i];
            acc[i] = keep + __shfl_xor_sync(0xffffffffu, send, o * S);
        }
    }
    acc[0] = butterfly_sum<G / N, S>(acc[0]);
}

// Element `r` (< N, not known at compile time) of a register array, by selects (no local
// memory).
template <typename T, int N> __device__ __forceinline__ T pick(const T (&a)[N], int r) {
    T v = a[0];
#pragma unroll
    for (int i = 1; i < N; ++i)
        if (r == i) v = a[i];
    return v;
}

__device__ __forceinline__ i64 load_index(const int* p) { return (i64)*p; }
__device__ __forceinline__ i64 load_index(const i64* p) { return *p; }
__device__ __forceinline__ i64 load_index(const unsigned char* p) { return (i64)*p; }

// A 16-bit float from its bits.
template <typename T> __device__ __forceinline__ T half_of(unsigned short bits) {
    T v;
    v.bits = bits;
    return v;
}

// Read-only loads through the non-coherent cache (inputs the kernel never writes).
__device__ __forceinline__ float ld_ro(const float* p) { return __ldg(p); }
__device__ __forceinline__ f16_t ld_ro(const f16_t* p) { return half_of<f16_t>(__ldg(&p->bits)); }
__device__ __forceinline__ bf16_t ld_ro(const bf16_t* p) { return half_of<bf16_t>(__ldg(&p->bits)); }

// Loads cached in L2 only (`ld.global.cg`): for inputs another grid writes while this one runs
// (a programmatic dependent reads its primary's output after `pdl_wait`), where the
// non-coherent path's read-only contract does not hold.
__device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }
__device__ __forceinline__ f16_t ld_cg(const f16_t* p) { return half_of<f16_t>(__ldcg(&p->bits)); }
__device__ __forceinline__ bf16_t ld_cg(const bf16_t* p) { return half_of<bf16_t>(__ldcg(&p->bits)); }

// One 16-byte vector of T (16 / sizeof(T) elements) widened to f32.
template <typename T> __device__ __forceinline__ void unpack_vec(const uint4& u, float* out) {
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < (int)(16 / sizeof(T)); ++i) out[i] = to_f32(e[i]);
}
// Integers without the conversion unit (a quarter of the FP32 rate on sm_90, the bound of a
// block-scaled state's decode): each integer, offset to unsigned, becomes the low mantissa bits
// of 2^23 (one byte permute), and one exact subtraction removes 2^23 and the offset.
template <> __device__ __forceinline__ void unpack_vec<short>(const uint4& u, float* out) {
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 b = w[i] ^ 0x80008000u;  // q + 32768 in each half
        out[2 * i] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7410)) - 8421376.f;      // 2^23 + 32768
        out[2 * i + 1] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7432)) - 8421376.f;
    }
}
template <> __device__ __forceinline__ void unpack_vec<signed char>(const uint4& u, float* out) {
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 b = w[i] ^ 0x80808080u;  // q + 128 in each byte
#pragma unroll
        for (int j = 0; j < 4; ++j) out[4 * i + j] = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7540 | j)) - 8388736.f;
    }
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

// N consecutive elements through L2 only (see `ld_cg`): one 16-byte load when N * sizeof(T) is
// 16 (the caller guarantees the alignment), else element by element.
template <int N, typename T> __device__ __forceinline__ void load_vec_cg(const T* p, float* out) {
    if constexpr (N * sizeof(T) == 16) {
        unpack_vec<T>(__ldcg(reinterpret_cast<const uint4*>(p)), out);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = to_f32(ld_cg(p + i));
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

// Two widened 16-bit values (elements moved, not computed) as one word of their own bits, `lo`
// in the low half (`FromF32::copy` of each): for bf16 one byte permute of the high halves.
template <typename T> __device__ __forceinline__ u32 copy2(float lo, float hi);
template <> __device__ __forceinline__ u32 copy2<bf16_t>(float lo, float hi) {
    return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632);
}
template <> __device__ __forceinline__ u32 copy2<f16_t>(float lo, float hi) {
    return (u32)FromF32<f16_t>::copy(lo).bits | ((u32)FromF32<f16_t>::copy(hi).bits << 16);
}

// Whether every even column of a matrix of T at address `base`, with row strides `s1` and `s2` (in
// elements; columns contiguous), starts a pair that one 2-element access can reach.
template <typename T> __device__ __forceinline__ bool pairs_aligned(u64 base, i64 s1, i64 s2) {
    return base % (2 * sizeof(T)) == 0 && s1 % 2 == 0 && s2 % 2 == 0;
}

// p[0] and p[1] as f32, by one 2-element load (p aligned to two elements).
template <typename T> __device__ __forceinline__ void load_pair(const T* p, float (&v)[2]) {
    if constexpr (sizeof(T) == 4) {
        const float2 f = *reinterpret_cast<const float2*>(p);
        v[0] = f.x;
        v[1] = f.y;
    } else {
        const u32 w = *reinterpret_cast<const u32*>(p);
        T lo, hi;
        lo.bits = (unsigned short)(w & 0xffffu);
        hi.bits = (unsigned short)(w >> 16);
        v[0] = to_f32(lo);
        v[1] = to_f32(hi);
    }
}

// v[0] and v[1] into p[0] and p[1], each rounded as `from_f32` rounds, by one 2-element store
// (p aligned to two elements).
template <typename T> __device__ __forceinline__ void store_pair(T* p, const float (&v)[2]) {
    const T a = from_f32<T>(v[0]), b = from_f32<T>(v[1]);
    if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float2*>(p) = make_float2(a, b);
    } else {
        *reinterpret_cast<u32*>(p) = (u32)a.bits | ((u32)b.bits << 16);
    }
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

// One 16-byte global store through the intrinsic (`st.global.wb.v4`, the default policy; the
// caller guarantees the alignment). Where a plain `uint4` assignment came out as four 4-byte
// stores: the GDN recurrence's state tile (sm_90 SASS, NVRTC 13.5; 13.0 kept them whole), four
// times the store instructions.
__device__ __forceinline__ void store16_wb(void* p, const uint4& u) { __stwb(reinterpret_cast<uint4*>(p), u); }

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
// Waits until at most N of this thread's most recent groups are still in flight.
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// ---------------------------------------------------------------------------------------------
// Operands in shared memory and one warp's products over them, for the kernels compiled with an
// operand kind (OP_KIND: 0 bf16, 1 f16, 2 tf32; ssd.cu, gdn_chunk.cu). PADE: the padding, in
// elements, of a shared operand row (16 bytes: `ldmatrix` rows of a warp fall in distinct banks).
#ifdef OP_KIND
#if OP_KIND == 2
typedef float op_st;  // tf32 operands kept as f32 bits; `mma_tile<2>` rounds at the fragment load
#define KSTEP 8
#define PADE 4
#else
typedef unsigned short op_st;
#define KSTEP 16
#define PADE 8
#endif

__device__ __forceinline__ op_st to_op(float v) {
#if OP_KIND == 2
    return v;
#elif OP_KIND == 0
    return from_f32<bf16_t>(v).bits;
#else
    return from_f32<f16_t>(v).bits;
#endif
}

__device__ __forceinline__ float op_f32(op_st v) {
#if OP_KIND == 2
    return v;
#elif OP_KIND == 0
    return to_f32(bf16_t{v});
#else
    return to_f32(f16_t{v});
#endif
}

// The operand type as an element type of `pack2` / `pack_vec` (f32 for tf32).
#if OP_KIND == 2
typedef float op_elem;
#elif OP_KIND == 0
typedef bf16_t op_elem;
#else
typedef f16_t op_elem;
#endif

#if OP_KIND != 2
// Two operands rounded to the 16-bit operand type and packed, `lo` in the low half: one
// conversion for both on sm_80+ (`pack2`). The same bits as two `to_op` for every value but NaN,
// which comes out as the canonical NaN, as Triton's conversion makes it.
__device__ __forceinline__ u32 op_pair(float lo, float hi) { return pack2<op_elem>(lo, hi); }
#endif

// The value an operand of the operand type holds (identity for tf32: rounded in the product).
__device__ __forceinline__ float round_op(float v) { return op_f32(to_op(v)); }

// `ldmatrix` of four (two) 8×8 matrices of 16-bit operands, transposed when TRANS; `p` is this
// lane's row address (16-byte aligned).
template <bool TRANS> __device__ __forceinline__ void ldsm4(u32 (&r)[4], const op_st* p) {
    const u32 s = smem_addr(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(s));
}
template <bool TRANS> __device__ __forceinline__ void ldsm2(u32 (&r)[2], const op_st* p) {
    const u32 s = smem_addr(p);
    if constexpr (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

// Element (r, k) of an operand stored k-contiguous (m[r·ld + k]) or, when TRANS, transposed
// (m[k·ld + r]).
template <bool TRANS> __device__ __forceinline__ const op_st* elem(const op_st* m, int ld, int r, int k) {
    return TRANS ? m + k * ld + r : m + r * ld + k;
}

// A fragment: rows r0 .. r0 + 15, k0 .. k0 + KSTEP − 1 (16-bit operands: one `ldmatrix.x4`).
template <bool TRANS> __device__ __forceinline__ void frag_a(u32 (&a)[4], const op_st* m, int ld, int r0, int k0, int lane) {
#if OP_KIND == 2
    const int g = lane >> 2, t = lane & 3;
    a[0] = tf32_of(*elem<TRANS>(m, ld, r0 + g, k0 + t));
    a[1] = tf32_of(*elem<TRANS>(m, ld, r0 + g + 8, k0 + t));
    a[2] = tf32_of(*elem<TRANS>(m, ld, r0 + g, k0 + t + 4));
    a[3] = tf32_of(*elem<TRANS>(m, ld, r0 + g + 8, k0 + t + 4));
#else
    // Matrices (rows, k): (0..7, 0..7), (8..15, 0..7), (0..7, 8..15), (8..15, 8..15), lanes 8i..8i+7.
    if constexpr (TRANS) ldsm4<true>(a, m + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + r0 + ((lane >> 3) & 1) * 8);
    else ldsm4<false>(a, m + (r0 + (lane & 15)) * ld + k0 + (lane >> 4) * 8);
#endif
}

// B fragment: columns n0 .. n0 + 7, k0 .. k0 + KSTEP − 1.
template <bool TRANS> __device__ __forceinline__ void frag_b(u32 (&b)[2], const op_st* m, int ld, int n0, int k0, int lane) {
#if OP_KIND == 2
    const int g = lane >> 2, t = lane & 3;
    b[0] = tf32_of(*elem<TRANS>(m, ld, n0 + g, k0 + t));
    b[1] = tf32_of(*elem<TRANS>(m, ld, n0 + g, k0 + t + 4));
#else
    // Lanes 0..15 address the matrices (k0, k0 + 8); 16..31 repeat them (ignored by .x2).
    if constexpr (TRANS) ldsm2<true>(b, m + (k0 + (lane & 15)) * ld + n0);
    else ldsm2<false>(b, m + (n0 + (lane & 7)) * ld + k0 + ((lane >> 3) & 1) * 8);
#endif
}

// Two B fragments: columns n0 .. n0 + 7 into b[0..1] and n0 + 8 .. n0 + 15 into b[2..3].
template <bool TRANS> __device__ __forceinline__ void frag_b2(u32 (&b)[4], const op_st* m, int ld, int n0, int k0, int lane) {
#if OP_KIND == 2
    u32 lo[2], hi[2];
    frag_b<TRANS>(lo, m, ld, n0, k0, lane);
    frag_b<TRANS>(hi, m, ld, n0 + 8, k0, lane);
    b[0] = lo[0];
    b[1] = lo[1];
    b[2] = hi[0];
    b[3] = hi[1];
#else
    if constexpr (TRANS) ldsm4<true>(b, m + (k0 + (lane & 15)) * ld + n0 + (lane >> 4) * 8);
    else ldsm4<false>(b, m + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + ((lane >> 3) & 1) * 8);
#endif
}

// acc[mt][nt] += Σ_{k < kend} A[r0 + 16 mt + ·][k] · B[n0 + 8 nt + ·][k] for nt < ntmax, from
// shared memory; one warp. Each operand is stored k-contiguous (A[r][k] at A[r·lda + k]), or,
// with TA / TB, transposed (A[r][k] at A[k·lda + r]).
template <int MT, int NT, bool TA = false, bool TB = false>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const op_st* A, int lda, int r0, const op_st* B,
                                          int ldb, int n0, int kend, int lane, int ntmax = NT) {
    for (int k = 0; k < kend; k += KSTEP) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            frag_a<TA>(a[mt], A, lda, r0 + 16 * mt, k, lane);
        }
#pragma unroll
        for (int nt = 0; nt + 1 < NT; nt += 2) {
            if (nt < ntmax) {
                u32 b[4];
                frag_b2<TB>(b, B, ldb, n0 + 8 * nt, k, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_tile<OP_KIND>(acc[mt][nt], a[mt], b);
                    if (nt + 1 < ntmax) mma_tile<OP_KIND>(acc[mt][nt + 1], a[mt], b + 2);
                }
            }
        }
        if constexpr (NT % 2 == 1) {
            if (NT - 1 < ntmax) {
                u32 b[2];
                frag_b<TB>(b, B, ldb, n0 + 8 * (NT - 1), k, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) mma_tile<OP_KIND>(acc[mt][NT - 1], a[mt], b);
            }
        }
    }
}

// Visits a warp's accumulators: f(row, col, value&) with row = r0 + 16 mt + g (+ 8), col =
// n0 + 8 nt + 2t (+ 1).
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_acc(float (&acc)[MT][NT][4], int r0, int n0, int lane, F f) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                f(r0 + 16 * mt + g + (e >= 2 ? 8 : 0), n0 + 8 * nt + 2 * t + (e & 1), acc[mt][nt][e]);
}

// Multiplies row r of a warp's accumulators (the tiles `for_acc` visits, rows from r0) by f(r),
// evaluated once per row: a lane holds rows g and g + 8 of each 16-row tile.
template <int MT, int NT, typename F>
__device__ __forceinline__ void scale_acc_rows(float (&acc)[MT][NT][4], int r0, int lane, F f) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float k = f(r0 + 16 * mt + (lane >> 2) + 8 * half);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                acc[mt][nt][2 * half] *= k;
                acc[mt][nt][2 * half + 1] *= k;
            }
        }
    }
}


// ---------------------------------------------------------------------------------------------
// Hopper's warpgroup products (`wgmma`, sm_90a only: NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL when
// the specialisation is compiled for sm_90a, crates/ssm-cuda/src/compile.rs), 16-bit operands, f32
// accumulators. The four warps of a 128-thread block issue one m64n64k16 product together; each
// warp holds rows 16·warp .. 16·warp + 15 of the 64 × 64 result in the `mma` C-fragment layout
// (`for_acc` with MT = 1, NT = 8).
//
// Both operands are read from shared memory through matrix descriptors, without swizzle: a tile
// is stored as "core matrices" of 8 rows × 16 bytes (128 contiguous bytes), `core_at` below.
// Strides, as the PTX ISA's no-swizzle canonical layouts take them (every reading used here,
// K-major, N-major B and M-major A, measured so on an H100 by xtask/probes/wgmma_layouts.cu,
// docs/PERF.md): for an operand stored k-contiguous ("K-major"), the
// leading byte offset is the step between core matrices along k and the stride byte offset the
// step between 8-row groups; for one stored with M or N contiguous (transposed, `imm-trans` 1),
// the leading offset is the step between 8-row groups along k and the stride offset the step
// between core matrices along M or N.
#if defined(OP_KIND) && OP_KIND != 2 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HAS_WGMMA 1

// Element (r, c) of a tile whose rows hold `ld` elements (`ld` and `c` multiples of 8) in the
// core-matrix layout: core matrix (r / 8, c / 8) at ((r / 8)·(ld / 8) + c / 8)·64 elements, row
// r % 8 of it 16 bytes after row r % 8 − 1.
__device__ __forceinline__ int core_at(int r, int c, int ld) {
    return (((r >> 3) * (ld >> 3) + (c >> 3)) << 6) + ((r & 7) << 3) + (c & 7);
}

// Where the 16-byte group e of a tile with `per_row` groups per row is placed when eight
// consecutive groups run down the eight rows of a core matrix, then along the row (so that a
// warp's 16-byte stores fill 512 contiguous bytes of the core-matrix layout and its loads whole
// 32-byte sectors of the global rows): its row, and its first column. The row in signed and
// the column in unsigned arithmetic: the forms that compile best (`build-kernels`: with both
// signed the SSD's stage-1+2 kernel took 12 more registers and a 328-byte stack; with both
// unsigned its scan spilled).
__device__ __forceinline__ int core_group_row(int e, int per_row) { return (e & 7) + ((e >> 3) / per_row) * 8; }
__device__ __forceinline__ int core_group_col(unsigned e, unsigned per_row) { return (int)(((e >> 3) % per_row) * 8); }

// A shared-memory matrix descriptor: start address, leading and stride byte offsets (each
// stored >> 4, 14 bits), no swizzle.
__device__ __forceinline__ u64 wg_desc(const void* p, u32 lead, u32 stride) {
    return (u64)((smem_addr(p) >> 4) & 0x3fffu) | ((u64)((lead >> 4) & 0x3fffu) << 16) |
           ((u64)((stride >> 4) & 0x3fffu) << 32);
}

// d (+)= A·B for one 64 × 64 × 16 step; A and B transposed (M- / N-major) when TA / TB.
template <int TA, int TB> __device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], u64 a, u64 b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
#if OP_KIND == 0
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
#else
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
#endif
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
        "%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(1), "n"(TA), "n"(TB));
}

// Orders this warpgroup's register writes before the products that read them.
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Closes a group of issued products.
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until every group this thread issued has finished (its accumulators readable, its
// shared operands free).
__device__ __forceinline__ void wg_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Makes this thread's shared-memory writes (stores, finished `cp.async`) visible to the
// products' reads; before the barrier that publishes them.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// acc += A·B over k in [0, KS·16) of tiles in the core-matrix layout: A of 64 rows × KS·16 k
// (k-contiguous rows of `lda` elements) or, when TA, KS·16 k-rows × 64 (rows of `lda`); B
// likewise with 64 columns. Issued and committed as one group; `wg_wait_all` ends it.
template <int KS, bool TA, bool TB>
__device__ __forceinline__ void wg_product(float (&acc)[1][8][4], const op_st* a, int lda, const op_st* b,
                                           int ldb) {
    float(&d)[32] = reinterpret_cast<float(&)[32]>(acc);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
        // K-major: k-step ks starts 2·ks core matrices along the row (leading: 128 bytes
        // between them; stride: one 8-row group, lda / 8 core matrices). Transposed: 16·ks
        // k-rows down (leading: one 8-row group along k; stride: 128 bytes along M / N).
        const u64 da = TA ? wg_desc(a + core_at(16 * ks, 0, lda), (lda >> 3) * 128, 128)
                          : wg_desc(a + core_at(0, 16 * ks, lda), 128, (lda >> 3) * 128);
        const u64 db = TB ? wg_desc(b + core_at(16 * ks, 0, ldb), (ldb >> 3) * 128, 128)
                          : wg_desc(b + core_at(0, 16 * ks, ldb), 128, (ldb >> 3) * 128);
        wgmma_64x64x16<TA ? 1 : 0, TB ? 1 : 0>(d, da, db);
    }
    wg_commit();
}
#else
#define HAS_WGMMA 0
#endif

template <int MT, int NT> __device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}
#endif  // OP_KIND
