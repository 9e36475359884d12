// Gated delta rule chunked prefill (vLLM `chunk_gated_delta_rule`, semantics/gdn_conv.md §2.5):
// one block per (sequence, value head, tile of BV value rows) walks the sequence's chunks of
// CH = 64 tokens in order, with the state tile S [BV, K] in shared memory in f32. Per chunk, on
// tensor cores (`mma.sync`, f32 accumulation, `mma_tile` in common.cuh):
//
//   G      = in-chunk cumulative sum of g                      (a warp scan)
//   A      = β_i (k_i·k_j) e^{G_i − G_j}, i > j                 (K·Kᵀ)
//   P      = (q_i·k_j) e^{G_i − G_j}, i ≥ j                     (Q·Kᵀ), rounded to the operand type
//   Ainv   = (I + A)⁻¹, f32 (16×16 diagonal blocks by forward substitution, then block rows),
//            rounded to the operand type                        (FLA `solve_tril`)
//   W      = Ainv·(β e^G K),  U = Ainv·(β V), both rounded     (FLA `recompute_w_u`)
//   V'     = U − W·S_cᵀ, S_c the state rounded to the operand type (FLA `chunk_fwd_h`)
//   o      = scale·(e^{G_i} (q_i·S_cᵀ) + P·V')                  (FLA `chunk_fwd_o`)
//   S      = e^{G_last} S + Σ_i k_i ⊗ round(e^{G_last − G_i} V'_i)
//
// so every operand is rounded where vLLM's Triton kernels round it (they store A⁻¹, w, u, h and
// v_new in the input dtype). Operands are bf16 when q/k/v are bf16, f16 when f16, tf32 for f32.
//
// Device-resident values are checked before anything is written: a `cu_seqlens` range out of
// [0, T] skips the sequence (ERR_CU_SEQLENS); a slot equal to the pad value skips it silently; a
// slot out of [0, rows) skips it (ERR_SLOT). No access leaves the views the plan checked.
//
// Macros (crates/ssm-cuda/src/gdn_chunk.rs, `ChunkKey::spec`): Q_T K_T V_T O_T G_T BETA_T ST_T
// FS_T (element types), IX_T HAS_T CU_T (index types), OP_KIND (0 bf16, 1 f16, 2 tf32), KDIM
// (head_k_dim), KP (KDIM rounded up to 64), BV (32 or 64), flags L2NORM HAS_STATE HAS_IX HAS_HAS
// HAS_PAD INPLACE HAS_FINAL VARLEN LAYOUT_KV ASYNC.

#define CH 64
#define NTHREADS 256
#define NWARPS 8
#define FULL_MASK 0xffffffffu

#if OP_KIND == 2
typedef float op_st;  // tf32 operands kept as f32 bits; `mma_tile<2>` rounds at the fragment load
#define KSTEP 8
#define PADE 4
#else
typedef unsigned short op_st;
#define KSTEP 16
#define PADE 8
#endif
#define LDK (KP + PADE)  // rows of the K-contiguous operands: Ks, Qs, Ws, Sop
#define LDC (CH + PADE)  // rows of the chunk-contiguous operands: KT, Ai, Ps, VT, VsT
#define LDF (BV + 4)     // rows of the f32 state Sf [KP][BV]
#define LDA (CH + 1)     // rows of the f32 A / its inverse

// Strides of a per-token tensor `[b, t, head, dim]`.
struct Tok4 {
    i64 b, t, h, d;
};

// Mirrored by `ChunkParams` in crates/ssm-cuda/src/gdn_chunk.rs (8-byte fields first, no padding).
struct ChunkParams {
    u64 q, k, v, o, g, beta, state, final_state, ix, has, cu, err;
    Tok4 qs, ks, vs, os;
    i64 g_b, g_t, g_h, be_b, be_t, be_h;
    i64 st_row, fs_row, ix_s, has_s, cu_s;
    i64 pad, rows, seqlen;
    int seqs, v_heads, vdim, group, vtiles, reserved;
    float scale, eps;
};

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

// The value an operand of the operand type holds (identity for tf32: rounded in the product).
__device__ __forceinline__ float round_op(float v) { return op_f32(to_op(v)); }

__device__ __forceinline__ u32 ld32(const op_st* p) { return *reinterpret_cast<const u32*>(p); }

// 16 bytes from global `src` into shared `dst`, asynchronously; bytes past `src_bytes` (0..16)
// are zero-filled and not read.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
    u32 s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// Stages rows [0, CH) × columns [0, cols_pad) of a row-major tensor (`base` + row·ts + col·ds,
// rows < rows_valid and columns < cols_valid real, the rest zeros) into `dst` (row stride
// cols_pad), in the tensor's own type: 16-byte `cp.async` copies when ASYNC (ds = 1, rows
// 16-byte aligned), else plain loads and stores.
template <typename T>
__device__ __forceinline__ void stage_rows(T* dst, const T* base, i64 ts, i64 ds, int rows_valid, int cols_valid,
                                           int cols_pad) {
#if ASYNC
    constexpr int EPV = 16 / sizeof(T);
    const int segs = cols_pad / EPV;
    (void)ds;
    for (int e = threadIdx.x; e < CH * segs; e += NTHREADS) {
        const int r = e / segs, c = (e % segs) * EPV;
        const int n = r < rows_valid ? max(0, min(EPV, cols_valid - c)) : 0;
        cp_async16(dst + r * cols_pad + c, n > 0 ? (const void*)(base + r * ts + c) : (const void*)base,
                   n * (int)sizeof(T));
    }
#else
    for (int e = threadIdx.x; e < CH * cols_pad; e += NTHREADS) {
        const int r = e / cols_pad, c = e % cols_pad;
        dst[r * cols_pad + c] = r < rows_valid && c < cols_valid ? base[r * ts + c * ds] : T{};
    }
#endif
}

// A fragment: rows r0 .. r0 + 15, k0 .. k0 + KSTEP − 1 of a k-contiguous matrix (row stride ld).
__device__ __forceinline__ void frag_a(u32 (&a)[4], const op_st* m, int ld, int r0, int k0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const op_st* p0 = m + (r0 + g) * ld + k0;
    const op_st* p1 = p0 + 8 * ld;
#if OP_KIND == 2
    a[0] = tf32_of(p0[t]);
    a[1] = tf32_of(p1[t]);
    a[2] = tf32_of(p0[t + 4]);
    a[3] = tf32_of(p1[t + 4]);
#else
    a[0] = ld32(p0 + 2 * t);
    a[1] = ld32(p1 + 2 * t);
    a[2] = ld32(p0 + 2 * t + 8);
    a[3] = ld32(p1 + 2 * t + 8);
#endif
}

// B fragment: columns n0 .. n0 + 7 (rows of the k-contiguous matrix `m`), k0 .. k0 + KSTEP − 1.
__device__ __forceinline__ void frag_b(u32 (&b)[2], const op_st* m, int ld, int n0, int k0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const op_st* p = m + (n0 + g) * ld + k0;
#if OP_KIND == 2
    b[0] = tf32_of(p[t]);
    b[1] = tf32_of(p[t + 4]);
#else
    b[0] = ld32(p + 2 * t);
    b[1] = ld32(p + 2 * t + 8);
#endif
}

// acc[mt][nt] += Σ_{k < kend} A[r0 + 16 mt + ·][k] · B[n0 + 8 nt + ·][k] for nt < ntmax, both
// operands k-contiguous in shared memory; one warp.
template <int MT, int NT>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const op_st* A, int lda, int r0, const op_st* B,
                                          int ldb, int n0, int kend, int lane, int ntmax = NT) {
    for (int k = 0; k < kend; k += KSTEP) {
        u32 a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) frag_a(a[mt], A, lda, r0 + 16 * mt, k, lane);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if (nt < ntmax) {
                u32 b[2];
                frag_b(b, B, ldb, n0 + 8 * nt, k, lane);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) mma_tile<OP_KIND>(acc[mt][nt], a[mt], b);
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

template <int MT, int NT> __device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// Element (v, kk) of one head's state block.
__device__ __forceinline__ i64 state_at(int v, int kk, int vdim) {
#if LAYOUT_KV
    return (i64)kk * vdim + v;
#else
    (void)vdim;
    return (i64)v * KDIM + kk;
#endif
}

// One staged q or k row (`row`: KP elements, zeros past KDIM), l2-normalised when L2NORM,
// rounded to the operand type into `dst`; one warp.
template <typename T> __device__ __forceinline__ void norm_row(op_st* dst, const T* row, float eps, int lane) {
    float x[KP / 32];
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < KP / 32; ++e) {
        x[e] = to_f32(row[lane + 32 * e]);
        ss += x[e] * x[e];
    }
#if L2NORM
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(FULL_MASK, ss, off);
    const float inv = rsqrtf(ss + eps);
#pragma unroll
    for (int e = 0; e < KP / 32; ++e) x[e] *= inv;
#else
    (void)eps;
#endif
#pragma unroll
    for (int e = 0; e < KP / 32; ++e) dst[lane + 32 * e] = to_op(x[e]);
}

extern "C" __global__ void __launch_bounds__(NTHREADS, 1) gdn_chunk_kernel(const ChunkParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* Sf = reinterpret_cast<float*>(smem);              // state, f32, [KP][LDF] (k-major)
    Q_T* Qr = reinterpret_cast<Q_T*>(Sf + KP * LDF);           // staged q rows, [CH][KP]
    K_T* Kr = reinterpret_cast<K_T*>(Qr + CH * KP);            // staged k rows, [CH][KP]
    V_T* Vr = reinterpret_cast<V_T*>(Kr + CH * KP);            // staged v rows, [CH][BV]
    op_st* Sop = reinterpret_cast<op_st*>(Vr + CH * BV);       // state at the chunk's start, [BV][LDK]
    op_st* Ks = Sop + BV * LDK;                                // k rows, [CH][LDK]
    op_st* Qs = Ks + CH * LDK;                                 // q rows
    op_st* Ws = Qs + CH * LDK;                                 // W rows
    op_st* KT = Ws + CH * LDK;                                 // (β e^G k)ᵀ, then kᵀ: [KP][LDC]
    op_st* Ai = KT + KP * LDC;                                 // (I + A)⁻¹, [CH][LDC]
    op_st* Ps = Ai + CH * LDC;                                 // P, [CH][LDC]
    op_st* VT = Ps + CH * LDC;                                 // (β v)ᵀ, then V'ᵀ: [BV][LDC]
    op_st* VsT = VT + BV * LDC;                                // decayed V'ᵀ, [BV][LDC]
    float* As = reinterpret_cast<float*>(VsT + BV * LDC);      // A below the diagonal, A⁻¹ᵀ above
    float* Tb = As + CH * LDA;                                 // block products of the inverse, [3][16][16]
    float* gc = Tb + 3 * 256;                                  // G, [CH]
    float* bt = gc + CH;                                       // β
    float* ek = bt + CH;                                       // β e^G
    float* eg = ek + CH;                                       // e^G
    float* el = eg + CH;                                       // e^{G_last − G}

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int wr = w & 3, wc = w >> 2;  // row strip and column half of the chunk-row products
    const int r0 = 16 * wr;             // this warp's rows
    const int kend = 16 * (wr + 1);     // rows r0.. need columns j ≤ i < kend of Ai and P
    u32 bid = blockIdx.x;
    const int vt = (int)(bid % (u32)p.vtiles);
    bid /= (u32)p.vtiles;
    const int hv = (int)(bid % (u32)p.v_heads);
    const i64 n = (i64)(bid / (u32)p.v_heads);
    const int h = hv / p.group;
    const int v0 = vt * BV;
    u32* err = reinterpret_cast<u32*>(p.err);

    // ---- the sequence's tokens ----
#if VARLEN
    const CU_T* cu = reinterpret_cast<const CU_T*>(p.cu);
    const i64 bos = load_index(cu + n * p.cu_s), eos = load_index(cu + (n + 1) * p.cu_s);
    if (bos < 0 || eos < bos || eos > p.seqlen) {
        if (tid == 0) atomicOr(err, ERR_CU_SEQLENS);
        return;
    }
    const i64 bb = 0;
#else
    const i64 bos = 0, eos = p.seqlen, bb = n;
#endif

    // ---- where the state comes from and goes ----
    bool read = false;
    i64 slot = n, wrow = -1;
#if HAS_STATE
#if HAS_IX
    slot = load_index(reinterpret_cast<const IX_T*>(p.ix) + n * p.ix_s);
#if HAS_PAD
    if (slot == p.pad) return;  // a pad: nothing read or written
#endif
#endif
    if (slot < 0 || slot >= p.rows) {
        if (tid == 0) atomicOr(err, ERR_SLOT);
        return;
    }
    read = true;
#if HAS_HAS
    read = load_index(reinterpret_cast<const HAS_T*>(p.has) + n * p.has_s) != 0;
#endif
#if INPLACE
    wrow = slot;
#endif
#endif

    const Q_T* qb = reinterpret_cast<const Q_T*>(p.q) + bb * p.qs.b + (i64)h * p.qs.h;
    const K_T* kb = reinterpret_cast<const K_T*>(p.k) + bb * p.ks.b + (i64)h * p.ks.h;
    const V_T* vb = reinterpret_cast<const V_T*>(p.v) + bb * p.vs.b + (i64)hv * p.vs.h + (i64)v0 * p.vs.d;
    O_T* ob = reinterpret_cast<O_T*>(p.o) + bb * p.os.b + (i64)hv * p.os.h;
    const G_T* gb = reinterpret_cast<const G_T*>(p.g) + bb * p.g_b + (i64)hv * p.g_h;
    const BETA_T* betab = reinterpret_cast<const BETA_T*>(p.beta) + bb * p.be_b + (i64)hv * p.be_h;
    const int len = (int)(eos - bos);
    const int vcols = min(BV, p.vdim - v0);

    // The first chunk's rows, staged, and its gates (two rows per lane of warp 0).
    float g2[2] = {0.f, 0.f}, b2[2] = {0.f, 0.f};
    auto prefetch = [&](int c0) {
        const int cl = min(CH, len - c0);
        const i64 t0 = bos + c0;
        stage_rows(Qr, qb + t0 * p.qs.t, p.qs.t, p.qs.d, cl, KDIM, KP);
        stage_rows(Kr, kb + t0 * p.ks.t, p.ks.t, p.ks.d, cl, KDIM, KP);
        stage_rows(Vr, vb + t0 * p.vs.t, p.vs.t, p.vs.d, cl, vcols, BV);
        cp_async_commit();
        if (tid < 32) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = 2 * lane + e;
                g2[e] = r < cl ? to_f32(gb[(t0 + r) * p.g_t]) : 0.f;
                b2[e] = r < cl ? to_f32(betab[(t0 + r) * p.be_t]) : 0.f;
            }
        }
    };
    if (len > 0) prefetch(0);

    const i64 head_elems = (i64)KDIM * p.vdim;
    {
        const ST_T* src = reinterpret_cast<const ST_T*>(p.state) + slot * p.st_row + hv * head_elems;
        for (int e = tid; e < KP * BV; e += NTHREADS) {
            const int kk = e % KP, v = e / KP;
            float x = 0.f;
            if (read && kk < KDIM && v < vcols) x = to_f32(src[state_at(v0 + v, kk, p.vdim)]);
            Sf[kk * LDF + v] = x;
            Sop[v * LDK + kk] = to_op(x);
        }
    }

    for (int c0 = 0; c0 < len; c0 += CH) {
        const int cl = min(CH, len - c0);
        const i64 t0 = bos + c0;
        cp_async_wait_all();
        __syncthreads();  // the chunk is staged; the previous chunk's readers are done

        // ---- (a) gates (warp 0: a scan of two rows per lane), q and k rows ----
        if (tid < 32) {
            const float s0 = g2[0], s1 = g2[0] + g2[1];
            float incl = s1;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float y = __shfl_up_sync(FULL_MASK, incl, off);
                if (lane >= off) incl += y;
            }
            const float excl = incl - s1;
            gc[2 * lane] = excl + s0;
            gc[2 * lane + 1] = excl + s1;
            bt[2 * lane] = b2[0];
            bt[2 * lane + 1] = b2[1];
        }
        for (int r = w; r < CH; r += NWARPS) {
            norm_row(Qs + r * LDK, Qr + r * KP, p.eps, lane);
            norm_row(Ks + r * LDK, Kr + r * KP, p.eps, lane);
        }
        __syncthreads();
        const float glast = gc[cl - 1];
        for (int e = tid; e < CH * BV; e += NTHREADS) {
            const int j = e / BV, v = e % BV;
            VT[v * LDC + j] = to_op(to_f32(Vr[j * BV + v]) * bt[j]);
        }
        if (tid < CH) {
            const float gi = gc[tid];
            ek[tid] = bt[tid] * __expf(gi);
            eg[tid] = __expf(gi);
            el[tid] = tid < cl ? __expf(glast - gi) : 0.f;
        }
        __syncthreads();  // the staging area is free; decays ready
        if (c0 + CH < len) prefetch(c0 + CH);

        // ---- (b) A and P ----
        {
            float aa[1][4][4], pp[1][4][4];
            zero(aa);
            zero(pp);
            const int ntmax = max(0, min(4, 2 * (wr + 1) - 4 * wc));
            if (ntmax > 0) {
                warp_gemm<1, 4>(aa, Ks, LDK, r0, Ks, LDK, 32 * wc, KP, lane, ntmax);
                warp_gemm<1, 4>(pp, Qs, LDK, r0, Ks, LDK, 32 * wc, KP, lane, ntmax);
            }
            const int g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = r0 + g + (e >= 2 ? 8 : 0), j = 32 * wc + 8 * nt + 2 * t + (e & 1);
                    const float d = j <= i && i < cl ? __expf(gc[i] - gc[j]) : 0.f;
                    As[i * LDA + j] = j < i ? bt[i] * aa[0][nt][e] * d : 0.f;
                    Ps[i * LDC + j] = to_op(pp[0][nt][e] * d);
                }
        }
        __syncthreads();

        // ---- (c) Ainv = (I + A)⁻¹; X[i][c] (i > c) is stored at As[c][i] ----
        if (tid < CH) {
            // Diagonal 16×16 blocks: one column per thread, forward substitution.
            const int b0 = (tid / 16) * 16, c = tid % 16;
            float x[16];
#pragma unroll
            for (int r = 0; r < 16; ++r) {
                float s = r == c ? 1.f : 0.f;
#pragma unroll
                for (int j = 0; j < 16; ++j)
                    if (j >= c && j < r) s -= As[(b0 + r) * LDA + b0 + j] * x[j];
                x[r] = r >= c ? s : 0.f;
            }
#pragma unroll
            for (int r = 0; r < 16; ++r)
                if (r > c) As[(b0 + c) * LDA + b0 + r] = x[r];
        }
        __syncthreads();
        // Block rows 1..3, one block row at a time: X_ij = −X_ii · Σ_{k=j}^{i−1} A_ik X_kj, one
        // (row, column) of every block of the row per thread, in f32 (FLA's `solve_tril` runs
        // these products at "ieee" precision).
        static_assert(NTHREADS == 256, "one thread per element of a 16×16 block");
        {
            const int r = tid >> 4, c = tid & 15;
#pragma unroll
            for (int ib = 1; ib < 4; ++ib) {
                const int row = 16 * ib + r;
                float tsum[3];
#pragma unroll
                for (int jb = 0; jb < ib; ++jb) {
                    const int col = 16 * jb + c;
                    float s = 0.f;
#pragma unroll
                    for (int kk = 0; kk < 16; ++kk) {  // k in block jb: X[k][col] of the diagonal block
                        const float xk = kk == c ? 1.f : (kk > c ? As[col * LDA + 16 * jb + kk] : 0.f);
                        s += As[row * LDA + 16 * jb + kk] * xk;
                    }
#pragma unroll
                    for (int k = 16 * (jb + 1); k < 16 * ib; ++k) s += As[row * LDA + k] * As[col * LDA + k];
                    tsum[jb] = s;
                    Tb[jb * 256 + r * 16 + c] = s;
                }
                __syncthreads();
#pragma unroll
                for (int jb = 0; jb < ib; ++jb) {
                    float s = tsum[jb];
#pragma unroll
                    for (int m = 0; m < 16; ++m)
                        if (m < r) s += As[(16 * ib + m) * LDA + row] * Tb[jb * 256 + m * 16 + c];
                    As[(16 * jb + c) * LDA + row] = -s;
                }
                __syncthreads();
            }
        }
        for (int e = tid; e < CH * CH; e += NTHREADS) {
            const int i = e / CH, j = e % CH;
            Ai[i * LDC + j] = to_op(i == j ? 1.f : (j < i ? As[j * LDA + i] : 0.f));
        }
        // ---- (d) (β e^G k)ᵀ ----
        for (int e = tid; e < KP * CH; e += NTHREADS) {
            const int j = e % CH, kk = e / CH;
            KT[kk * LDC + j] = to_op(op_f32(Ks[j * LDK + kk]) * ek[j]);
        }
        __syncthreads();

        // ---- (e) W = Ainv·(β e^G K), U = Ainv·(β V) ----
        for (int kq = 0; kq < KP; kq += 64) {
            float ww[1][4][4];
            zero(ww);
            warp_gemm<1, 4>(ww, Ai, LDC, r0, KT, LDC, kq + 32 * wc, kend, lane);
            for_acc(ww, r0, kq + 32 * wc, lane, [&](int i, int kk, float& a) { Ws[i * LDK + kk] = to_op(a); });
        }
        constexpr int NV = BV / 16;  // n-tiles of a warp's half of the value columns
        const int vh = wc * (BV / 2);
        float uu[1][NV][4];
        zero(uu);
        warp_gemm<1, NV>(uu, Ai, LDC, r0, VT, LDC, vh, kend, lane);
        __syncthreads();  // W rows are read by the other column half too

        // ---- (f) V' = U − W·S_cᵀ ----
        float vv[1][NV][4];
        zero(vv);
        warp_gemm<1, NV>(vv, Ws, LDK, r0, Sop, LDK, vh, KP, lane);
        __syncthreads();  // every warp is done with KT and VT
        {
            float* u = &uu[0][0][0];
            float* x = &vv[0][0][0];
#pragma unroll
            for (int e = 0; e < NV * 4; ++e) x[e] = round_op(u[e]) - x[e];
        }
        for_acc(vv, r0, vh, lane, [&](int i, int v, float& a) {
            const bool in = i < cl;
            VT[v * LDC + i] = to_op(in ? a : 0.f);
            VsT[v * LDC + i] = to_op(in ? a * el[i] : 0.f);
        });
        for (int e = tid; e < KP * CH; e += NTHREADS) {
            const int j = e % CH, kk = e / CH;
            KT[kk * LDC + j] = Ks[j * LDK + kk];
        }
        __syncthreads();

        // ---- (g) o = scale·(e^G (Q·S_cᵀ) + P·V') ----
        {
            float oo[1][NV][4];
            zero(oo);
            warp_gemm<1, NV>(oo, Qs, LDK, r0, Sop, LDK, vh, KP, lane);
            for_acc(oo, r0, vh, lane, [&](int i, int, float& a) { a *= eg[i]; });
            warp_gemm<1, NV>(oo, Ps, LDC, r0, VT, LDC, vh, kend, lane);
            for_acc(oo, r0, vh, lane, [&](int i, int v, float& a) {
                if (i < cl && v < vcols) ob[(t0 + i) * p.os.t + (i64)(v0 + v) * p.os.d] = from_f32<O_T>(a * p.scale);
            });
        }
        __syncthreads();  // every warp is done with Sop

        // ---- (h) S = e^{G_last} S + Kᵀ·V's ----
        {
            constexpr int MT = KP / 64;
            const int k0 = wr * (KP / 4);
            const float e_last = __expf(glast);
            float ss[MT][NV][4];
            for_acc(ss, k0, vh, lane, [&](int kk, int v, float& a) { a = Sf[kk * LDF + v] * e_last; });
            warp_gemm<MT, NV>(ss, KT, LDC, k0, VsT, LDC, vh, (cl + 15) / 16 * 16, lane);
            for_acc(ss, k0, vh, lane, [&](int kk, int v, float& a) {
                Sf[kk * LDF + v] = a;
                Sop[v * LDK + kk] = to_op(a);
            });
        }
    }
    __syncthreads();

    // ---- the final state: `final_state[n]` and, in place, the slot it came from ----
#if HAS_FINAL || INPLACE
    for (int e = tid; e < KP * BV; e += NTHREADS) {
        const int kk = e % KP, v = e / KP;
        if (kk >= KDIM || v >= vcols) continue;
        const float x = Sf[kk * LDF + v];
        const i64 at = hv * head_elems + state_at(v0 + v, kk, p.vdim);
#if HAS_FINAL
        reinterpret_cast<FS_T*>(p.final_state)[n * p.fs_row + at] = from_f32<FS_T>(x);
#endif
        if (wrow >= 0) reinterpret_cast<ST_T*>(p.state)[wrow * p.st_row + at] = from_f32<ST_T>(x);
    }
#else
    (void)wrow;
#endif
}
