// Selective state update (SEMANTICS.md, semantics/ssu.md §2.4 and §3.2), one kernel for
// every route, specialised at NVRTC time by -D macros (see crates/ssm-cuda/src/ssu.rs):
//
//   STATE_T X_T DT_T A_T B_T C_T D_T DTB_T Z_T OUT_T   f32 / f16_t / bf16_t
//   SBI_T DST_T NACC_T CU_T                            int / i64 (index tables)
//   DSTATE VEC TPR VPT RPT NTHREADS MINB STATE_CS ROWSTORE   tile geometry (MINB: min blocks/SM,
//       0 = none; STATE_CS: streaming cache hints on the state; ROWSTORE: one-token final state
//       stored row by row as soon as computed)
//   HAS_Z HAS_D HAS_DT_BIAS DT_SOFTPLUS TIED HAS_SBI HAS_PAD VARLEN DENSE SPEC STOCH_ROUND BC_VEC RAW   0/1
//   NO_UPDATE ISTATES HAS_ISI ISI_T                                                     0/1, index type
//   QUANT QLIMIT                                                                        0/1, f32
//   (BC_VEC: B and C are contiguous along dstate and VEC-element aligned: vector loads;
//   RAW: one-token route with 16-byte state vectors, the tile held in its storage form;
//   NO_UPDATE: the pool is never written (disable_state_update, or the intermediate buffer);
//   ISTATES: token t's state goes to the intermediate buffer's row (entry, t), the entry from
//   intermediate_state_indices (HAS_ISI) or the source slot;
//   QUANT: STATE_T is short or signed char, a block-scaled integer state (FlashInfer's i16, or
//   i8) whose integers reach ±QLIMIT (32767 or 127): a row is read as q · its decode scale and
//   every stored row is quantized (ssm_ssu::quant) with its decode scale written beside it, in
//   state_scale or, for the buffer, intermediate_state_scales)
//
// One block owns one (sequence, head, tile of DIM_TILE = (NTHREADS / TPR) * RPT rows).
// TPR lanes share one row of the state; each lane holds VPT vectors of VEC elements of a
// row, for RPT rows, all loaded before the first use (RPT * VPT 16-byte loads in flight).
// The state is read once, carried in f32 registers over the tokens of the sequence and
// written once (or once per token in speculative mode). Memory-bound by design.
//
// Index values are checked here: the pad value reads a zero state and writes no state
// (out is still written); any other index outside its range skips the whole sequence
// (nothing written) and ORs a bit into the device error word, so no index value ever
// reads or writes outside its tensor.

// (Error-word bits ERR_*: kernels/common.cuh.)

// Token t of sequence b starts at (VARLEN ? cu_seqlens[b] * tok : b * seq) + t * tok
// (ssm_ssu::TokenStrides; the plan's element offset is folded into the pointer).
#define NARROW 1
struct TokStrides {
    i64 seq, tok, head, dim;  // B and C: head -> group, dim -> dstate column
};

// Mirrored by `SsuParams` in crates/ssm-cuda/src/ssu.rs (same field order, all 8-byte
// fields first, no padding).
struct SsuParams {
    u64 state, x, dt, a, b, c, d, dt_bias, z, out, sbi, dst, nacc, cu, err, ist, isi, seed_ptr, sc, ist_sc;
    i64 st_slot, st_head, st_dim;
    TokStrides xs, dts, zs, outs, bs, cs;
    i64 a_head, a_dim, a_n;
    i64 d_head, d_dim, dtb_head, dtb_dim;
    i64 sbi_seq, sbi_col, dst_seq, dst_col, nacc_s, cu_s;
    i64 slots, rows, pad, sbi_width, dst_width;
    i64 ist_entry, ist_step, ist_head, ist_dim, ist_entries, ist_steps, isi_s;  // intermediate buffer
    i64 sc_slot, sc_head, sc_dim, isc_entry, isc_step, isc_head, isc_dim;       // i16 decode scales
    u64 seed;  // the Philox key, unless seed_ptr (rand_seed) names an i64 to read it from
    int nseq, heads, dim, heads_per_group, steps, philox_rounds;
    BlockSplit split;  // grid = sequences × heads × row tiles
};

#define ROW_GROUPS (NTHREADS / TPR)
#define DIM_TILE (ROW_GROUPS * RPT)
#define NVEC ((DSTATE + VEC - 1) / VEC)

#if STOCH_ROUND
// Philox-4x32 (semantics/ssu.md §6.1); returns word c0, i.e. Triton's tl.randint.
__device__ __forceinline__ u32 philox_c0(u64 seed, u64 offset, int rounds) {
    u32 c0 = (u32)offset, c1 = (u32)(offset >> 32), c2 = 0u, c3 = 0u;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    for (int i = 0; i < rounds; ++i) {
        const u32 a0 = c0, a2 = c2;
        c0 = __umulhi(0xCD9E8D57u, a2) ^ c1 ^ k0;
        c2 = __umulhi(0xD2511F53u, a0) ^ c3 ^ k1;
        c1 = 0xCD9E8D57u * a2;
        c3 = 0xD2511F53u * a0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}
// Stochastic rounding of |x| to f16 with 13 random bits; bit-identical to
// `ssm_ssu::philox::round_f16_stochastic` (the CPU backend's definition).
__device__ __forceinline__ unsigned short round_f16_stochastic(float x, u32 rbits) {
    rbits &= 0x1FFFu;
    const u32 xb = __float_as_uint(x);
    if ((xb & 0x7fffffffu) > 0x7f800000u) {  // NaN, as half::f16::from_f32 renders it
        return (unsigned short)(((xb & 0x80000000u) >> 16) | 0x7C00u | 0x0200u | ((xb & 0x007FFFFFu) >> 13));
    }
    const unsigned short sign = (xb & 0x80000000u) ? 0x8000 : 0;
    const float ax = fabsf(x);
    unsigned short mag;
    if (ax >= 6.103515625e-5f) {
        const float v = __uint_as_float((__float_as_uint(ax) + rbits) & ~0x1FFFu);
        if (!(v <= 65504.f)) {
            mag = 0x7C00;
        } else {
            mag = from_f32<f16_t>(v).bits;  // exact: the low 13 mantissa bits are zero
        }
    } else {
        const float q = ax * 16777216.f;
        const float i = floorf(q);
        const u32 frac13 = (u32)floorf((q - i) * 8192.f);
        mag = (unsigned short)((u32)i + (frac13 + rbits >= 8192u ? 1u : 0u));
    }
    return sign | mag;
}

// Stores N state elements starting at column n0 with stochastic rounding. Elements n and
// n+1 (n even) share one Philox word drawn at the even element's source offset: the even
// one rounds with bits [12:0], the odd one with bits [28:16] (ssm_ssu::philox, rule 2).
template <int N>
__device__ __forceinline__ void sr_store_f16(f16_t* q, const float* v, u64 seed, i64 off, int n0, int rounds) {
    union {
        uint4 u;
        f16_t h[N];
    } pack;
    f16_t* o = pack.h;
    if constexpr (N % 2 == 0) {
#pragma unroll
        for (int e = 0; e < N; e += 2) {
            const u32 r = philox_c0(seed, (u64)(off + e), rounds);
            o[e].bits = round_f16_stochastic(v[e], r & 0x1FFFu);
            o[e + 1].bits = round_f16_stochastic(v[e + 1], (r >> 16) & 0x1FFFu);
        }
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) {
            const int odd = (n0 + e) & 1;
            const u32 r = philox_c0(seed, (u64)(off + e - odd), rounds);
            o[e].bits = round_f16_stochastic(v[e], odd ? (r >> 16) & 0x1FFFu : r & 0x1FFFu);
        }
    }
    if constexpr (N * 2 == 16) {
        *reinterpret_cast<uint4*>(q) = pack.u;
    } else {
#pragma unroll
        for (int e = 0; e < N; ++e) q[e] = o[e];
    }
}
#endif

__device__ __forceinline__ void raise_error(const SsuParams& p, u32 bit) {
    if (threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(p.err), bit);
}

// index · stride for an element offset. NARROW: the host proved that every stride and extent of
// the call fits in 32 bits (and index values are checked against their extents before use), so
// one 32 × 32 → 64-bit multiply (`IMAD.WIDE`) gives the exact product where a 64-bit one takes
// three; the 4-token bf16 step spent most of its instructions on address arithmetic.
__device__ __forceinline__ i64 wmul(i64 index, i64 stride) {
#if NARROW
    i64 r;  // (NVVM keeps a 64-bit multiply for the sign-extended form)
    asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"((int)index), "r"((int)stride));
    return r;
#else
    return index * stride;
#endif
}

__device__ __forceinline__ i64 tok_base(const TokStrides& ts, i64 seq, i64 bos, int t) {
    return VARLEN ? wmul(bos + t, ts.tok) : wmul(seq, ts.seq) + wmul(t, ts.tok);
}

__device__ __forceinline__ float softplus_thr(float v) { return v <= 20.f ? logf(expf(v) + 1.f) : v; }

#if QUANT && (STOCH_ROUND || ROWSTORE)
#error "an i16 state is stored whole rows at a time, rounded to nearest"
#endif

#if !SPEC && !QUANT
// Stores one row of the final (non-speculative) state to slot `dst`. With stochastic rounding
// the random offsets are element offsets of the *source* state (vLLM, semantics/ssu.md §2.7).
__device__ __forceinline__ void store_final_row(const SsuParams& p, float (&row)[VPT][VEC], int prow, int lane, int h,
                                                i64 src, i64 dst, u64 seed) {
    if (prow >= p.dim) return;
    STATE_T* out_state = reinterpret_cast<STATE_T*>(p.state);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int vi = lane + v * TPR;
        if (vi < NVEC) {
            STATE_T* q = out_state + wmul(dst, p.st_slot) + wmul(h, p.st_head) + wmul(prow, p.st_dim) + vi * VEC;
#if STOCH_ROUND
            const i64 off = wmul(src, p.st_slot) + wmul(h, p.st_head) + wmul(prow, p.st_dim) + vi * VEC;
            sr_store_f16<VEC>(q, row[v], seed, off, vi * VEC, p.philox_rounds);
#else
            (void)src, (void)seed;
            store_vec<VEC, STATE_T, STATE_CS>(q, row[v]);
#endif
        }
    }
}
#endif

// The inputs of one (token, head) a lane needs: x (and z, and dt unless tied) for its rows,
// B and C for its dstate columns. Loaded as a group before any is used, so that their
// round trips to memory overlap each other and the state's.
struct TokIn {
    float x[RPT];
#if HAS_Z
    float z[RPT];
#endif
#if TIED
    float dt;
#else
    float dt[RPT];
#endif
    float b[VPT][VEC], c[VPT][VEC];
};

__device__ __forceinline__ void load_token(const SsuParams& p, TokIn& in, i64 seq, i64 bos, int t, int h, int g,
                                           const int (&prow)[RPT], int lane) {
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const i64 pr = prow[r] < p.dim ? prow[r] : 0;
        in.x[r] = to_f32(ld_ro(reinterpret_cast<const X_T*>(p.x) + tok_base(p.xs, seq, bos, t) + wmul(h, p.xs.head) + wmul(pr, p.xs.dim)));
#if HAS_Z
        in.z[r] = to_f32(ld_ro(reinterpret_cast<const Z_T*>(p.z) + tok_base(p.zs, seq, bos, t) + wmul(h, p.zs.head) + wmul(pr, p.zs.dim)));
#endif
#if !TIED
        in.dt[r] = to_f32(ld_ro(reinterpret_cast<const DT_T*>(p.dt) + tok_base(p.dts, seq, bos, t) + wmul(h, p.dts.head) + wmul(pr, p.dts.dim)));
#endif
    }
#if TIED
    in.dt = to_f32(ld_ro(reinterpret_cast<const DT_T*>(p.dt) + tok_base(p.dts, seq, bos, t) + wmul(h, p.dts.head)));
#endif
    const B_T* bp = reinterpret_cast<const B_T*>(p.b) + tok_base(p.bs, seq, bos, t) + wmul(g, p.bs.head);
    const C_T* cp = reinterpret_cast<const C_T*>(p.c) + tok_base(p.cs, seq, bos, t) + wmul(g, p.cs.head);
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int vi = lane + v * TPR;
#if BC_VEC
        // B and C contiguous along dstate and aligned to VEC elements (host-checked).
        if (vi < NVEC) {
            load_vec_ro<VEC>(bp + vi * VEC, in.b[v]);
            load_vec_ro<VEC>(cp + vi * VEC, in.c[v]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) in.b[v][e] = in.c[v][e] = 0.f;
        }
#else
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int n = vi * VEC + e;
            const bool ok = n < DSTATE;
            in.b[v][e] = ok ? to_f32(ld_ro(bp + wmul(n, p.bs.dim))) : 0.f;
            in.c[v][e] = ok ? to_f32(ld_ro(cp + wmul(n, p.cs.dim))) : 0.f;
        }
#endif
    }
}

// The per-head parameters of one (head, row tile) a lane needs: A (tied: one per head), dt_bias
// and D for its rows.
struct HeadIn {
#if TIED
    float a;
#if HAS_DT_BIAS
    float dtb;
#endif
#elif HAS_DT_BIAS
    float dtb[RPT];
#endif
#if HAS_D
    float d[RPT];
#endif
};

__device__ __forceinline__ void load_head(const SsuParams& p, HeadIn& hi, int h, const int (&prow)[RPT]) {
#if TIED
    hi.a = to_f32(ld_ro(reinterpret_cast<const A_T*>(p.a) + wmul(h, p.a_head)));
#if HAS_DT_BIAS
    hi.dtb = to_f32(ld_ro(reinterpret_cast<const DTB_T*>(p.dt_bias) + wmul(h, p.dtb_head)));
#endif
#elif HAS_DT_BIAS
#pragma unroll
    for (int r = 0; r < RPT; ++r)
        hi.dtb[r] = prow[r] < p.dim ? to_f32(ld_ro(reinterpret_cast<const DTB_T*>(p.dt_bias) + wmul(h, p.dtb_head) + wmul(prow[r], p.dtb_dim))) : 0.f;
#endif
#if HAS_D
#pragma unroll
    for (int r = 0; r < RPT; ++r)
        hi.d[r] = prow[r] < p.dim ? to_f32(ld_ro(reinterpret_cast<const D_T*>(p.d) + wmul(h, p.d_head) + wmul(prow[r], p.d_dim))) : 0.f;
#endif
}

// Turns a token's raw dt into the step (dt_bias, softplus) in place; the tied form also scales
// B by dt (B·dt, rounded as the reference rounds it) and returns dA = exp(A·dt), shared by every
// row (vLLM's TIE_HDIM). The per-channel form returns 1 (its dA is per element).
__device__ __forceinline__ float prepare_token(TokIn& in, const HeadIn& hi) {
#if TIED
#if HAS_DT_BIAS
    in.dt += hi.dtb;
#endif
#if DT_SOFTPLUS
    in.dt = softplus_thr(in.dt);
#endif
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
        for (int e = 0; e < VEC; ++e) in.b[v][e] = __fmul_rn(in.b[v][e], in.dt);
    return expf(hi.a * in.dt);
#else
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
#if HAS_DT_BIAS
        in.dt[r] += hi.dtb[r];
#endif
#if DT_SOFTPLUS
        in.dt[r] = softplus_thr(in.dt[r]);
#endif
    }
    (void)hi;
    return 1.f;
#endif
}

// Row r of the lane by one prepared token (semantics/ssu.md §3.2): the update is one FMA (exact
// when dA = 1), dB·x rounded as the reference rounds it; returns this lane's part of C·s, from
// the un-rounded f32 state.
__device__ __forceinline__ float update_row(const SsuParams& p, float (&s)[VPT][VEC], const TokIn& in, float dA, int r,
                                            int prow, int h, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
#if TIED
            (void)p, (void)prow, (void)h, (void)lane;
            const float dbx = __fmul_rn(in.b[v][e], in.x[r]);
            const float da = dA;
#else
            (void)dA;
            const int n = (lane + v * TPR) * VEC + e;
            const bool ok = n < DSTATE && prow < p.dim;
            const A_T* a = reinterpret_cast<const A_T*>(p.a) + wmul(h, p.a_head);
            const float av = ok ? to_f32(ld_ro(a + wmul(prow, p.a_dim) + wmul(n, p.a_n))) : 0.f;
            const float da = expf(av * in.dt[r]);
            const float dbx = __fmul_rn(__fmul_rn(in.b[v][e], in.dt[r]), in.x[r]);
#endif
            s[v][e] = fmaf(s[v][e], da, dbx);
            acc = fmaf(s[v][e], in.c[v][e], acc);
        }
    }
    return acc;
}

// The sum of `acc` over the TPR lanes of one row.
__device__ __forceinline__ float row_sum(float acc) { return butterfly_sum<TPR>(acc); }

// out = (y + D·x) · silu(z) for the lane's rows.
// Y_SCATTER (SSU_SCATTER, on where RPT is a power of two up to TPR and at most 4): the rows' sums
// C·S are reduced and scattered over the row's lanes (`reduce_scatter`, common.cuh; bit-identical
// to a butterfly per row), so lane l holds row l / (TPR / RPT)'s sum in y[0] and one lane per row
// writes its output, every row in one pass. Else lane 0 writes every row's y[r]. Eight rows a
// lane keep the butterfly: with the scatter, measured on an H100 (docs/PERF.md, fourteenth
// session), the one-token bf16 decode at batch 64–1024 (RAW, 8 rows) took 1.29–1.33× the time
// and the f32 4-token step at batch ≥ 64 (8 rows) 1.007×.
#ifndef SSU_SCATTER
#define SSU_SCATTER 1
#endif
#define Y_SCATTER (SSU_SCATTER && (RPT & (RPT - 1)) == 0 && RPT <= TPR && RPT <= 4)

// Row r (`prow`) of token t's output from its sum `y`: + D·x, the z gate. (`pick` folds to a
// plain register where r is known at compile time.)
__device__ __forceinline__ void write_row(const SsuParams& p, float y, const TokIn& in, const HeadIn& hi, int r, int prow,
                                          i64 seq, i64 bos, int t, int h) {
    float out = y;
#if HAS_D
    out += pick(in.x, r) * pick(hi.d, r);
#else
    (void)hi;
#endif
#if HAS_Z
    const float z = pick(in.z, r);
    out = out * z * (1.f / (1.f + expf(-z)));
#endif
    reinterpret_cast<OUT_T*>(p.out)[tok_base(p.outs, seq, bos, t) + wmul(h, p.outs.head) + wmul(prow, p.outs.dim)] =
        from_f32<OUT_T>(out);
}

__device__ __forceinline__ void write_out(const SsuParams& p, const float (&y)[RPT], const TokIn& in, const HeadIn& hi,
                                          const int (&prow)[RPT], int lane, i64 seq, i64 bos, int t, int h) {
#if Y_SCATTER
    constexpr int SPAN = TPR / RPT;
    const int r = lane / SPAN, row = pick(prow, r);
    if (lane % SPAN == 0 && row < p.dim) write_row(p, y[0], in, hi, r, row, seq, bos, t, h);
#else
    if (lane != 0) return;
#pragma unroll
    for (int r = 0; r < RPT; ++r)
        if (prow[r] < p.dim) write_row(p, y[r], in, hi, r, prow[r], seq, bos, t, h);
#endif
}

#if QUANT
// A block-scaled integer state, operation for operation as ssm_ssu::quant defines it.
// The largest magnitude of one row over its TPR lanes (fmaxf from -FLT_MAX: NaN is ignored).
// Every lane of the warp must call it (the shuffles span the warp).
__device__ __forceinline__ float row_amax(const float (&row)[VPT][VEC]) {
    float m = -3.402823466e38f;
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
        for (int e = 0; e < VEC; ++e) m = fmaxf(m, fabsf(row[v][e]));
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o, TPR));
    return m;
}

__device__ __forceinline__ float encode_of(float amax) { return amax == 0.f ? 1.f : __fdiv_rn(QLIMIT, amax); }

// One element: v · encode clamped to ±QLIMIT (NaN becomes -QLIMIT), rounded to nearest even.
__device__ __forceinline__ STATE_T quant1(float v, float enc) {
    return (STATE_T)__float2int_rn(fminf(fmaxf(__fmul_rn(v, enc), -QLIMIT), QLIMIT));
}

// The largest magnitude of one row over its TPR lanes, NaN if any element is NaN (`max.NaN`).
__device__ __forceinline__ float row_amax_nan(const float (&row)[VPT][VEC]) {
    float m = 0.f;
#pragma unroll
    for (int v = 0; v < VPT; ++v)
#pragma unroll
        for (int e = 0; e < VEC; ++e) asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(fabsf(row[v][e])));
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, m, o, TPR);
        asm("max.NaN.f32 %0, %0, %1;" : "+f"(m) : "f"(other));
    }
    return m;
}

// The encode scale of a row (every lane of the warp calls it), and whether quantizing with it
// needs the clamp. A row whose elements are all finite has a finite positive encode scale, and
// then |v · encode| rounds to at most QLIMIT: the clamp changes nothing and is skipped (two of
// the per-element instructions). A NaN element or an infinite maximum takes the clamped path,
// with the maximum that ignores NaN, exactly as ssm_ssu::quant defines it.
__device__ __forceinline__ float row_encode(const float (&row)[VPT][VEC], bool& clamp) {
    float enc = encode_of(row_amax_nan(row));
    clamp = !(enc > 0.f && enc <= 3.402823466e38f);  // false for NaN
    if (__any_sync(0xffffffffu, clamp)) {
        const float exact = encode_of(row_amax(row));  // every lane: the shuffles span the warp
        if (clamp) enc = exact;
    }
    return enc;
}

// quant1 without the conversion unit: the (clamped) value plus 1.5 · 2^23 is rounded to an
// integer (nearest even, as __float2int_rn) whose two's complement is the sum's low mantissa bits.
template <bool CLAMP> __device__ __forceinline__ u32 quant1_bits(float v, float enc) {
    float t = __fmul_rn(v, enc);
    if constexpr (CLAMP) t = fminf(fmaxf(t, -QLIMIT), QLIMIT);
    return __float_as_uint(__fadd_rn(t, 12582912.f));
}

// 16 / sizeof(STATE_T) quantized elements (the first VEC of `v`, zeros after) as one 16-byte
// vector: the low bytes of each element's bits gathered by byte permutes.
template <bool CLAMP> __device__ __forceinline__ uint4 quant_vec_as(const float (&v)[VEC], float enc) {
    constexpr int K = 16 / sizeof(STATE_T);  // elements per vector
    u32 r[K];
#pragma unroll
    for (int e = 0; e < K; ++e) r[e] = quant1_bits<CLAMP>(e < VEC ? v[e] : 0.f, enc);
    u32 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if constexpr (sizeof(STATE_T) == 2) {
            w[i] = __byte_perm(r[2 * i], r[2 * i + 1], 0x5410);
        } else {
            const u32 lo = __byte_perm(r[4 * i], r[4 * i + 1], 0x0040);
            const u32 hi = __byte_perm(r[4 * i + 2], r[4 * i + 3], 0x0040);
            w[i] = __byte_perm(lo, hi, 0x5410);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ uint4 quant_vec(const float (&v)[VEC], float enc, bool clamp) {
    return clamp ? quant_vec_as<true>(v, enc) : quant_vec_as<false>(v, enc);
}

// Stores the lane's part of one row, quantized with `enc`, at `q` (the row's first element).
__device__ __forceinline__ void store_quant_row(STATE_T* q, const float (&row)[VPT][VEC], int lane, float enc, bool clamp) {
#pragma unroll
    for (int v = 0; v < VPT; ++v) {
        const int vi = lane + v * TPR;
        if (vi < NVEC) {
            if constexpr (VEC * sizeof(STATE_T) == 16) {
                store16<STATE_CS>(q + vi * VEC, quant_vec(row[v], enc, clamp));
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) q[vi * VEC + e] = quant1(row[v][e], enc);
            }
        }
    }
}

// Stores the f32 tile `s` quantized, row by row, to `rows + prow·row_stride`, and each row's decode
// scale to `scales[prow·scale_stride]` (a slot's head and its scales, or an intermediate-buffer
// row's). Called by every lane of the block.
__device__ __forceinline__ void store_tile_q(STATE_T* rows, i64 row_stride, float* scales, i64 scale_stride,
                                             const float (&s)[RPT][VPT][VEC], const int (&prow)[RPT], int lane, int dim) {
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        bool clamp;
        const float enc = row_encode(s[r], clamp);
        if (prow[r] < dim) {
            store_quant_row(rows + wmul(prow[r], row_stride), s[r], lane, enc, clamp);
            if (lane == 0) scales[wmul(prow[r], scale_stride)] = __fdiv_rn(1.f, enc);
        }
    }
}
#else
// Stores the lane's part of the f32 tile `s` (rounded to nearest) to the rows `rows + prow·row_stride`
// (a slot's, or an intermediate-buffer row's, head).
__device__ __forceinline__ void store_tile(STATE_T* rows, i64 row_stride, const float (&s)[RPT][VPT][VEC],
                                           const int (&prow)[RPT], int lane, int dim) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int vi = lane + v * TPR;
            if (prow[r] < dim && vi < NVEC) store_vec<VEC, STATE_T, STATE_CS>(rows + wmul(prow[r], row_stride) + vi * VEC, s[r][v]);
        }
}
#endif

__device__ __forceinline__ void lane_rows(int (&prow)[RPT], int tile, int row_group) {
#pragma unroll
    for (int r = 0; r < RPT; ++r) prow[r] = tile * DIM_TILE + r * ROW_GROUPS + row_group;
}

#if MINB > 0
#define SSU_BOUNDS __launch_bounds__(NTHREADS, MINB)
#else
#define SSU_BOUNDS __launch_bounds__(NTHREADS)
#endif

extern "C" __global__ void SSU_BOUNDS ssu_kernel(const SsuParams p) {
    const int lane = threadIdx.x % TPR;
    const int row_group = threadIdx.x / TPR;
    i64 seq;
    int h, tile;
    split_block(p.split, blockIdx.x, seq, h, tile);
    const int g = h / p.heads_per_group;

    // ---- index loads: every one is issued before any is used, so that a block waits for
    // one round trip to memory before its state loads, not one per table ----
#if VARLEN
    const CU_T* cu = reinterpret_cast<const CU_T*>(p.cu);
    i64 bos = load_index(cu + wmul(seq, p.cu_s));
    const i64 eos = load_index(cu + (seq + 1) * p.cu_s);
#else
    const i64 bos = 0;
#endif
#if HAS_SBI
    const SBI_T* srow = reinterpret_cast<const SBI_T*>(p.sbi) + wmul(seq, p.sbi_seq);
    const DST_T* dtab = reinterpret_cast<const DST_T*>(p.dst) + wmul(seq, p.dst_seq);
#if SPEC
    // The source column depends on the accepted count; the first four entries of the row are
    // read alongside it (speculative tables are narrow), the rest only when needed.
    const i64 accepted = load_index(reinterpret_cast<const NACC_T*>(p.nacc) + wmul(seq, p.nacc_s));
    i64 pre[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) pre[c] = c < p.sbi_width ? load_index(srow + wmul(c, p.sbi_col)) : 0;
#else
    const i64 src0 = load_index(srow);
    const i64 dst0 = load_index(dtab);
#endif
#endif

    // ---- the sequence's tokens ----
    int len = 1;
#if VARLEN
    if (bos < 0 || eos < bos || eos > p.rows) {
        raise_error(p, ERR_CU_SEQLENS);
        return;
    }
    if (eos == bos) return;  // empty sequence: nothing written
    len = (int)(eos - bos);
#elif DENSE
    len = p.steps;
#endif

    // Rows of this lane and the per-head parameters: loaded now, before the slot index is
    // back (they do not depend on it).
    int prow[RPT];
    lane_rows(prow, tile, row_group);
    // One-token route: the token's inputs are loaded now, before the slot index is back.
    // (Multi-token routes load each token at the top of its iteration: holding token 0 across
    // the state load costs them more registers than it saves.)
    TokIn cur;
#if !VARLEN && !DENSE
    load_token(p, cur, seq, bos, 0, h, g, prow, lane);
#endif
    HeadIn hi;
    load_head(p, hi, h, prow);
#if STOCH_ROUND
    // The Philox key: rand_seed's value when given (read as the call runs, so a replayed graph
    // sees the value of its replay), else the host's.
    const u64 seed = p.seed_ptr ? (u64)__ldcg(reinterpret_cast<const long long*>(p.seed_ptr)) : p.seed;
#else
    const u64 seed = 0;
#endif

    // ---- slots ----
    i64 src = seq;
#if !SPEC
    i64 dst = seq;
#endif
    bool live = true;
#if !HAS_SBI
    // Without tables sequence b reads and writes slot b (the plan cannot check the pool size
    // against a device call's sequences, so it is checked here).
    if (seq >= p.slots) {
        raise_error(p, ERR_SLOT);
        return;
    }
#else
#if SPEC
    const i64 col0 = accepted > 1 ? accepted - 1 : 0;  // no overflow at INT64_MIN
    if (col0 >= p.sbi_width || (!NO_UPDATE && len > p.dst_width)) {
        raise_error(p, ERR_ACCEPTED);
        return;
    }
    src = col0 == 0 ? pre[0] : col0 == 1 ? pre[1] : col0 == 2 ? pre[2] : col0 == 3 ? pre[3] : load_index(srow + wmul(col0, p.sbi_col));
#else
    src = src0;
    dst = dst0;
#endif
    live = !(HAS_PAD && src == p.pad);
    if (live && (src < 0 || src >= p.slots)) {
        raise_error(p, ERR_SLOT);
        return;
    }
#endif

    // ---- load the state tile (all loads issued before any use) ----
    const STATE_T* state = reinterpret_cast<const STATE_T*>(p.state) + wmul(src, p.st_slot) + wmul(h, p.st_head);
#if QUANT
    // The decode scales of the source rows (a pad source reads zeros and no scale).
    float dec_in[RPT];
    {
        const float* sc = reinterpret_cast<const float*>(p.sc) + wmul(src, p.sc_slot) + wmul(h, p.sc_head);
#pragma unroll
        for (int r = 0; r < RPT; ++r) dec_in[r] = live && prow[r] < p.dim ? __ldcs(sc + wmul(prow[r], p.sc_dim)) : 0.f;
    }
#endif
#if RAW
    // One token: the tile stays in its storage form (16 bytes per vector; half the registers
    // of f32 for a 16-bit state) and is widened one row at a time.
    uint4 raw[RPT][VPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int vi = lane + v * TPR;
            raw[r][v] = make_uint4(0u, 0u, 0u, 0u);  // zero bits: 0.0 in every float format
            if (live && prow[r] < p.dim && vi < NVEC) raw[r][v] = load16<STATE_CS>(state + wmul(prow[r], p.st_dim) + vi * VEC);
        }
    }
#else
    float s[RPT][VPT][VEC];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
#pragma unroll
        for (int v = 0; v < VPT; ++v) {
            const int vi = lane + v * TPR;
            if (live && prow[r] < p.dim && vi < NVEC) {
                load_vec<VEC, STATE_T, STATE_CS>(state + wmul(prow[r], p.st_dim) + vi * VEC, s[r][v]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s[r][v][e] = 0.f;
            }
        }
    }
#endif

#if HAS_SBI && !NO_UPDATE
    // Destinations are checked while the state loads are in flight; an invalid one still
    // skips the whole sequence before anything is written.
    if (live) {
#if SPEC
        for (int t = 0; t < len; ++t) {
            const i64 d = load_index(dtab + t * p.dst_col);
            if (!(HAS_PAD && d == p.pad) && (d < 0 || d >= p.slots)) {
                raise_error(p, ERR_SLOT);
                return;
            }
        }
#else
        if (!(HAS_PAD && dst == p.pad) && (dst < 0 || dst >= p.slots)) {
            raise_error(p, ERR_SLOT);
            return;
        }
#endif
    }
#endif

#if QUANT && !RAW
    // An integer tile is its integers times each row's decode scale.
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int v = 0; v < VPT; ++v)
#pragma unroll
            for (int e = 0; e < VEC; ++e) s[r][v][e] = __fmul_rn(s[r][v][e], dec_in[r]);
#endif

#if !SPEC
    // The final state goes to `dst` unless the source is a pad or the destination is the pad.
    const bool store_final = !NO_UPDATE && live && !(HAS_SBI && HAS_PAD && dst == p.pad);
#endif

#if ISTATES
    // The intermediate buffer's entry: from intermediate_state_indices (whose pad value writes no
    // buffer row) or the source slot. An entry outside the buffer, or a sequence longer than its
    // steps, skips the whole sequence before anything is written.
    STATE_T* ist_rows = nullptr;
#if QUANT
    float* ist_sc_rows = nullptr;
#endif
    if (live) {
#if HAS_ISI
        const i64 entry = load_index(reinterpret_cast<const ISI_T*>(p.isi) + wmul(seq, p.isi_s));
        const bool pad_entry = HAS_PAD && entry == p.pad;
#else
        const i64 entry = src;
        const bool pad_entry = false;
#endif
        if (!pad_entry) {
            if (entry < 0 || entry >= p.ist_entries) {
                raise_error(p, ERR_SLOT);
                return;
            }
            if (len > p.ist_steps) {
                raise_error(p, ERR_ACCEPTED);
                return;
            }
            ist_rows = reinterpret_cast<STATE_T*>(p.ist) + wmul(entry, p.ist_entry) + wmul(h, p.ist_head);
#if QUANT
            ist_sc_rows = reinterpret_cast<float*>(p.ist_sc) + wmul(entry, p.isc_entry) + wmul(h, p.isc_head);
#endif
        }
    }
#endif

#if QUANT && RAW
    float dec_out[RPT];  // the new decode scale of each row (one token: the final store's)
#endif
    for (int t = 0; t < len; ++t) {
        // Later tokens' inputs: loaded as a group before any is used (token 0's were loaded
        // before the state).
#if !VARLEN && !DENSE
        if (t > 0) load_token(p, cur, seq, bos, t, h, g, prow, lane);
#else
        load_token(p, cur, seq, bos, t, h, g, prow, lane);
#endif
        const float dA = prepare_token(cur, hi);
        float y[RPT];
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
#if RAW
            float row[VPT][VEC];
#pragma unroll
            for (int v = 0; v < VPT; ++v) unpack_vec<STATE_T>(raw[r][v], row[v]);
#if QUANT && TIED
            // q·(dA·decode): the row's decode scale folded into the head's decay (one FMA per
            // element, as for a float state; within an ulp of (q·decode)·dA).
            const float acc = update_row(p, row, cur, __fmul_rn(dA, dec_in[r]), r, prow[r], h, lane);
#else
#if QUANT
#pragma unroll
            for (int v = 0; v < VPT; ++v)
#pragma unroll
                for (int e = 0; e < VEC; ++e) row[v][e] = __fmul_rn(row[v][e], dec_in[r]);
#endif
            const float acc = update_row(p, row, cur, dA, r, prow[r], h, lane);
#endif
#if QUANT
            // Quantized once, as the final store stores it; stored with the other rows below.
            {
                bool clamp;
                const float enc = row_encode(row, clamp);
                dec_out[r] = __fdiv_rn(1.f, enc);
#pragma unroll
                for (int v = 0; v < VPT; ++v) raw[r][v] = quant_vec(row[v], enc, clamp);
            }
#elif ROWSTORE || STOCH_ROUND
            // This row's final state is known; store it now.
            if (store_final) store_final_row(p, row, prow[r], lane, h, src, dst, seed);
#else
            // Rounded once, as the final store rounds it; stored with the other rows below.
#pragma unroll
            for (int v = 0; v < VPT; ++v) raw[r][v] = pack_vec<STATE_T>(row[v]);
#endif
#else
            const float acc = update_row(p, s[r], cur, dA, r, prow[r], h, lane);
#if !SPEC && !VARLEN && !DENSE && ROWSTORE
            // One token: this row's final state is known; store it now (ROWSTORE).
            if (store_final) store_final_row(p, s[r], prow[r], lane, h, src, dst, seed);
#endif
#endif
#if Y_SCATTER
            y[r] = acc;
#else
            y[r] = row_sum(acc);
#endif
        }
#if Y_SCATTER
        reduce_scatter<RPT, TPR>(y, lane);
#endif

#if SPEC && !NO_UPDATE && !ISTATES
        // Speculative mode: token t's state goes to column t of the destination table
        // (plain round-to-nearest; a pad entry writes nothing; a pad source writes nothing).
        if (live) {
            const i64 d = load_index(reinterpret_cast<const DST_T*>(p.dst) + wmul(seq, p.dst_seq) + wmul(t, p.dst_col));
            if (!(HAS_PAD && d == p.pad)) {
                STATE_T* rows = reinterpret_cast<STATE_T*>(p.state) + wmul(d, p.st_slot) + wmul(h, p.st_head);
#if QUANT
                float* scales = reinterpret_cast<float*>(p.sc) + wmul(d, p.sc_slot) + wmul(h, p.sc_head);
                store_tile_q(rows, p.st_dim, scales, p.sc_dim, s, prow, lane, p.dim);
#else
                store_tile(rows, p.st_dim, s, prow, lane, p.dim);
#endif
            }
        }
#endif
#if ISTATES
        // Token t's state to the intermediate buffer's row (entry, t) (plain round-to-nearest; a
        // pad source or a pad entry writes nothing).
#if QUANT
        if (ist_rows)
            store_tile_q(ist_rows + wmul(t, p.ist_step), p.ist_dim, ist_sc_rows + wmul(t, p.isc_step), p.isc_dim, s, prow, lane,
                         p.dim);
#else
        if (ist_rows) store_tile(ist_rows + wmul(t, p.ist_step), p.ist_dim, s, prow, lane, p.dim);
#endif
#endif
        write_out(p, y, cur, hi, prow, lane, seq, bos, t, h);
    }

#if RAW && !ROWSTORE && !STOCH_ROUND
    // Final state (one token): the rows packed above, to the destination slot.
    if (store_final) {
        STATE_T* out_state = reinterpret_cast<STATE_T*>(p.state) + wmul(dst, p.st_slot) + wmul(h, p.st_head);
#pragma unroll
        for (int r = 0; r < RPT; ++r)
#pragma unroll
            for (int v = 0; v < VPT; ++v) {
                const int vi = lane + v * TPR;
                if (prow[r] < p.dim && vi < NVEC) store16<STATE_CS>(out_state + wmul(prow[r], p.st_dim) + vi * VEC, raw[r][v]);
            }
#if QUANT
        if (lane == 0) {
            float* scales = reinterpret_cast<float*>(p.sc) + wmul(dst, p.sc_slot) + wmul(h, p.sc_head);
#pragma unroll
            for (int r = 0; r < RPT; ++r)
                if (prow[r] < p.dim) scales[wmul(prow[r], p.sc_dim)] = dec_out[r];
        }
#endif
    }
#elif !RAW && !SPEC && QUANT
    // Final state (non-speculative): quantized to the destination slot, with its scales.
    if (store_final) {
        STATE_T* rows = reinterpret_cast<STATE_T*>(p.state) + wmul(dst, p.st_slot) + wmul(h, p.st_head);
        float* scales = reinterpret_cast<float*>(p.sc) + wmul(dst, p.sc_slot) + wmul(h, p.sc_head);
        store_tile_q(rows, p.st_dim, scales, p.sc_dim, s, prow, lane, p.dim);
    }
#elif !RAW && !SPEC && (VARLEN || DENSE || !ROWSTORE)
    // Final state (non-speculative): to the destination slot.
    if (store_final) {
#pragma unroll
        for (int r = 0; r < RPT; ++r) store_final_row(p, s[r], prow[r], lane, h, src, dst, seed);
    }
#endif
}
