// Gated delta rule chunked prefill (vLLM `chunk_gated_delta_rule`, semantics/gdn_conv.md §2.5),
// split as FLA splits it: the work of a chunk that does not depend on the state runs for every
// chunk at once, and only the state recurrence walks a sequence's chunks in order. Four entries,
// one per module (ENTRY), launched in this order over one plan-sized scratch:
//
//   0 index  one block: checks every sequence's `cu_seqlens` range and slot, numbers the live
//            sequences' 64-token chunks (SeqInfo per sequence, (sequence, chunk) per chunk).
//   1 prep   per (chunk, value head), in parallel, on tensor cores (`mma.sync`, f32 accumulation):
//              G    = in-chunk cumulative sum of g                   (a warp scan)
//              A    = β_i (k_i·k_j) e^{G_i − G_j}, i > j              (K·Kᵀ)
//              Ainv = (I + A)⁻¹, f32 (16×16 diagonal blocks by forward substitution, then block
//                     rows), rounded to the operand type             (FLA `solve_tril`)
//              W    = Ainv·(β e^G K),  Uᵀ = (β V)ᵀ·Ainvᵀ, rounded     (FLA `recompute_w_u`)
//            and writes W, Uᵀ, G and the normalised q and k rows (once per key head) to the
//            scratch.
//   2 state  per (sequence, value head, tile of BV value rows), the chunks in order, the f32
//            state tile in registers, the next chunk's W, k, Uᵀ and G staged with `cp.async`:
//              H_c  = S_c rounded to the operand type, to the scratch (FLA `chunk_fwd_h`)
//              V'ᵀ  = Uᵀ − H_c·Wᵀ, rounded, over Uᵀ in the scratch
//              S    = e^{G_last} S + Kᵀ·round(e^{G_last − G_i} V'_i)
//            then the final state (`final_state`, and the pool slot in place).
//   3 out    per (chunk, value head, 128 value rows), in parallel, everything staged from the
//            scratch:
//              P    = (q_i·k_j) e^{G_i − G_j}, i ≥ j, rounded          (Q·Kᵀ)
//              o    = scale·(e^{G_i} (q_i·H_cᵀ) + P·V')               (FLA `chunk_fwd_o`)
//
// Every operand is rounded where vLLM's Triton kernels round it (they store A⁻¹, w, u, h and
// v_new in the input dtype). Operands are bf16 when q/k/v are bf16, f16 when f16, tf32 for f32.
//
// Device-resident values are checked once, by the index kernel, before anything is written: a
// `cu_seqlens` range out of [0, T] skips the sequence (ERR_CU_SEQLENS); a slot equal to the pad
// value skips it silently; a slot out of [0, rows) skips it (ERR_SLOT). Chunks past the
// scratch's `nb` (only reachable when some range is invalid) skip their sequence too. No access
// leaves the views the plan checked or the scratch.
//
// Macros (crates/ssm-cuda/src/gdn_chunk.rs, `ChunkKey::spec`): ENTRY (0..3), Q_T K_T V_T O_T
// G_T BETA_T ST_T FS_T (element types), IX_T HAS_T CU_T (index types), OP_KIND (0 bf16, 1 f16,
// 2 tf32), KDIM (head_k_dim), KP (KDIM rounded up to 64), BV (the state entry's value rows:
// 16 or 32), flags L2NORM HAS_STATE HAS_IX HAS_HAS HAS_PAD INPLACE HAS_FINAL VARLEN LAYOUT_KV.

#define CH 64
#define NTHREADS 256
#define NWARPS 8
#define FULL_MASK 0xffffffffu

#define LDK (KP + PADE)  // shared rows of the K-contiguous operands
#define LDC (CH + PADE)  // shared rows of the chunk-contiguous operands
#define LDA (CH + 1)     // rows of the f32 A / its inverse

// Strides of a per-token tensor `[b, t, head, dim]`.
struct Tok4 {
    i64 b, t, h, d;
};

// Mirrored by `ChunkParams` in crates/ssm-cuda/src/gdn_chunk.rs (8-byte fields first, no padding).
struct ChunkParams {
    u64 q, k, v, o, g, beta, state, final_state, ix, has, cu, err, ws;
    Tok4 qs, ks, vs, os;
    i64 g_b, g_t, g_h, be_b, be_t, be_h;
    i64 st_row, fs_row, ix_s, has_s, cu_s;
    i64 pad, rows, seqlen, nb;
    i64 off_info, off_map, off_w, off_qk, off_ut, off_h, off_g;  // scratch regions, bytes from ws
    int seqs, v_heads, vdim, group, vtiles, vp;
    float scale, eps;
};

// One sequence as the index kernel resolved it (`base` < 0: skipped). Mirrored by the scratch
// layout's 32 bytes per sequence in gdn_chunk.rs.
struct SeqInfo {
    i64 bos, slot;
    int len, base, read, bb;
};

// Element (v, kk) of one head's state block.
__device__ __forceinline__ i64 state_at(int v, int kk, int vdim) {
#if LAYOUT_KV
    return (i64)kk * vdim + v;
#else
    (void)vdim;
    return (i64)v * KDIM + kk;
#endif
}

// Visits a warp's accumulators in pairs of adjacent columns: f(row, col, v0, v1), col even.
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_pairs(float (&acc)[MT][NT][4], int r0, int n0, int lane, F f) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                f(r0 + 16 * mt + g + 8 * h, n0 + 8 * nt + 2 * t, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
}

// Two adjacent operands, rounded to the operand type (`p` is aligned to two elements).
__device__ __forceinline__ void st_pair(op_st* p, float a, float b) {
#if OP_KIND == 2
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
#else
    *reinterpret_cast<u32*>(p) = op_pair(a, b);
#endif
}

// Two operands rounded to the operand type, `a` to `pa` and `b` to `pb`: one conversion for both.
__device__ __forceinline__ void st_two(op_st* pa, op_st* pb, float a, float b) {
#if OP_KIND == 2
    *pa = a;
    *pb = b;
#else
    const u32 w = op_pair(a, b);
    *pa = (op_st)(w & 0xffffu);
    *pb = (op_st)(w >> 16);
#endif
}

// N adjacent operands, rounded to the operand type, by 16-byte stores (`p` 16-byte aligned, N
// operands a whole number of 16-byte vectors).
template <int N> __device__ __forceinline__ void st_ops(op_st* p, const float (&v)[N]) {
    static_assert(N * sizeof(op_st) % 16 == 0, "whole 16-byte vectors");
    constexpr int VE = 16 / (int)sizeof(op_st);
#pragma unroll
    for (int c = 0; c < N / VE; ++c) reinterpret_cast<uint4*>(p)[c] = pack_vec<op_elem>(v + VE * c);
}

// f(e) for this thread's e = tid, tid + NTHREADS, … below N, as straight-line code (the trip
// count is a compile-time constant).
template <int N, typename F> __device__ __forceinline__ void for_mine(F f) {
#pragma unroll
    for (int i = 0; i < (N + NTHREADS - 1) / NTHREADS; ++i) {
        const int e = (int)threadIdx.x + i * NTHREADS;
        if (N % NTHREADS == 0 || e < N) f(e);
    }
}

// Rows [0, rows) (rows ≤ ROWS) of ROW_BYTES bytes (a multiple of 16) from global `src` (row
// stride `src_ld` bytes, 16-byte aligned) to shared `dst` (row stride DST_LD bytes), with
// 16-byte `cp.async`.
template <int ROWS, int ROW_BYTES, int DST_LD>
__device__ __forceinline__ void stage_async(void* dst, const void* src, i64 src_ld, int rows = ROWS) {
    constexpr int SEGS = ROW_BYTES / 16;
    static_assert(ROW_BYTES % 16 == 0, "16-byte rows");
    for_mine<ROWS * SEGS>([&](int e) {
        const int r = e / SEGS, c = (e % SEGS) * 16;
        if (ROWS == 1 || r < rows)
            cp_async16(static_cast<char*>(dst) + r * DST_LD + c, static_cast<const char*>(src) + r * src_ld + c);
    });
}

// This warp's rows r = w, w + NWARPS, … of a q or k chunk `[CH][KDIM]` in global memory (row
// stride `ts`, element stride `ds`; zeros past `cl` rows and KDIM columns), l2-normalised per
// row when L2NORM, rounded to the operand type into `dst` (row stride `ld`, shared or global).
// Every load is issued before the first is used. Where the rows are whole (KDIM = KP),
// contiguous (`ds` = 1) and aligned to E elements, each lane takes the E adjacent columns E·lane…
// by one load and E / 2 paired stores; otherwise column lane + 32e element by element.
template <typename T>
__device__ __forceinline__ void norm_rows(op_st* dst, int ld, const T* base, i64 ts, i64 ds, int cl, float eps, int w,
                                          int lane) {
    constexpr int R = CH / NWARPS, E = KP / 32;
    static_assert(E % 2 == 0, "whole pairs of columns per lane");
    const bool vec = KDIM == KP && ds == 1 && ts % E == 0 && reinterpret_cast<u64>(base) % (E * sizeof(T)) == 0;
    float x[R][E];
    if (vec) {
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int r = w + NWARPS * i;
            if (r < cl) {
                load_vec_ro<E>(base + r * ts + E * lane, x[i]);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) x[i][e] = 0.f;
            }
        }
    } else {
        T raw[R][E];
#pragma unroll
        for (int i = 0; i < R; ++i) {
            const int r = w + NWARPS * i;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const int col = lane + 32 * e;
                raw[i][e] = r < cl && col < KDIM ? base[r * ts + col * ds] : T{};
            }
        }
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
            for (int e = 0; e < E; ++e) x[i][e] = to_f32(raw[i][e]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < E; ++e) ss += x[i][e] * x[i][e];
#if L2NORM
        ss = butterfly_sum<32>(ss);
        const float inv = rsqrtf(ss + eps);
#pragma unroll
        for (int e = 0; e < E; ++e) x[i][e] *= inv;
#else
        (void)eps;
        (void)ss;
#endif
        op_st* row = dst + (w + NWARPS * i) * ld;
        if (vec) {
#pragma unroll
            for (int e = 0; e < E; e += 2) st_pair(row + E * lane + e, x[i][e], x[i][e + 1]);
        } else {
#pragma unroll
            for (int e = 0; e < E; ++e) row[lane + 32 * e] = to_op(x[i][e]);
        }
    }
}

// ---- the scratch ----
__device__ __forceinline__ unsigned char* region(const ChunkParams& p, i64 off) {
    return reinterpret_cast<unsigned char*>(p.ws) + off;
}
// W of chunk b, value head hv: [CH][KP].
__device__ __forceinline__ op_st* w_of(const ChunkParams& p, i64 b, int hv) {
    return reinterpret_cast<op_st*>(region(p, p.off_w)) + (b * p.v_heads + hv) * (CH * KP);
}
// Normalised q and k rows of chunk b, key head h: [2][CH][KP] (q, then k).
__device__ __forceinline__ op_st* qk_of(const ChunkParams& p, i64 b, int h) {
    return reinterpret_cast<op_st*>(region(p, p.off_qk)) + (b * (p.v_heads / p.group) + h) * (2 * CH * KP);
}
// Uᵀ, then V'ᵀ, of chunk b, value head hv: [vp][CH].
__device__ __forceinline__ op_st* ut_of(const ChunkParams& p, i64 b, int hv) {
    return reinterpret_cast<op_st*>(region(p, p.off_ut)) + (b * p.v_heads + hv) * ((i64)p.vp * CH);
}
// The state at the chunk's start, rounded: [vp][KP].
__device__ __forceinline__ op_st* h_of(const ChunkParams& p, i64 b, int hv) {
    return reinterpret_cast<op_st*>(region(p, p.off_h)) + (b * p.v_heads + hv) * ((i64)p.vp * KP);
}
// G: [CH], f32.
__device__ __forceinline__ float* g_of(const ChunkParams& p, i64 b, int hv) {
    return reinterpret_cast<float*>(region(p, p.off_g)) + (b * p.v_heads + hv) * CH;
}
__device__ __forceinline__ SeqInfo* infos(const ChunkParams& p) { return reinterpret_cast<SeqInfo*>(region(p, p.off_info)); }
__device__ __forceinline__ int2* chunk_map(const ChunkParams& p) { return reinterpret_cast<int2*>(region(p, p.off_map)); }

#if ENTRY == 0
// Sequence n's token range and state slot, checked (`base` = 0 when live, −1 when skipped).
__device__ SeqInfo resolve_seq(const ChunkParams& p, int n, u32* err) {
    SeqInfo s;
    s.bos = 0;
    s.slot = n;
    s.len = 0;
    s.base = -1;
    s.read = 0;
#if VARLEN
    const CU_T* cu = reinterpret_cast<const CU_T*>(p.cu);
    const i64 bos = load_index(cu + n * p.cu_s), eos = load_index(cu + (n + 1) * p.cu_s);
    s.bb = 0;
    if (bos < 0 || eos < bos || eos > p.seqlen) {
        atomicOr(err, ERR_CU_SEQLENS);
        return s;
    }
#else
    const i64 bos = 0, eos = p.seqlen;
    s.bb = n;
#endif
    s.bos = bos;
    s.len = (int)(eos - bos);
#if HAS_STATE
#if HAS_IX
    s.slot = load_index(reinterpret_cast<const IX_T*>(p.ix) + n * p.ix_s);
#if HAS_PAD
    if (s.slot == p.pad) return s;  // a pad: nothing read or written
#endif
#endif
    if (s.slot < 0 || s.slot >= p.rows) {
        atomicOr(err, ERR_SLOT);
        return s;
    }
    s.read = 1;
#if HAS_HAS
    s.read = load_index(reinterpret_cast<const HAS_T*>(p.has) + n * p.has_s) != 0;
#endif
#endif
    s.base = 0;
    return s;
}

extern "C" __global__ void __launch_bounds__(NTHREADS) gdn_chunk_index_kernel(const ChunkParams p) {
    __shared__ i64 wsum[NWARPS];
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    u32* err = reinterpret_cast<u32*>(p.err);
    SeqInfo* info = infos(p);
    int2* map = chunk_map(p);
    for (i64 b = tid; b < p.nb; b += NTHREADS) map[b] = make_int2(-1, 0);
    __syncthreads();
    i64 carry = 0;
    for (int n0 = 0; n0 < p.seqs; n0 += NTHREADS) {
        const int n = n0 + tid;
        SeqInfo s;
        i64 cnt = 0;
        if (n < p.seqs) {
            s = resolve_seq(p, n, err);
            if (s.base >= 0) cnt = (s.len + CH - 1) / CH;
        }
        i64 incl = cnt;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const i64 y = __shfl_up_sync(FULL_MASK, incl, off);
            if (lane >= off) incl += y;
        }
        if (lane == 31) wsum[w] = incl;
        __syncthreads();
        i64 before = 0, total = 0;
#pragma unroll
        for (int i = 0; i < NWARPS; ++i) {
            const i64 x = wsum[i];
            total += x;
            if (i < w) before += x;
        }
        const i64 first = carry + before + incl - cnt;
        if (n < p.seqs) {
            if (s.base >= 0) {
                if (first + cnt > p.nb) {  // only when an invalid range let others overlap
                    atomicOr(err, ERR_CU_SEQLENS);
                    s.base = -1;
                } else {
                    s.base = (int)first;
                    for (int c = 0; c < (int)cnt; ++c) map[first + c] = make_int2(n, c);
                }
            }
            info[n] = s;
        }
        carry += total;
        __syncthreads();  // wsum is reused
    }
}
#endif

#if ENTRY == 1
extern "C" __global__ void __launch_bounds__(NTHREADS, 3) gdn_chunk_prep_kernel(const ChunkParams p) {
    const int2 m = chunk_map(p)[blockIdx.x];
    if (m.x < 0) return;
    extern __shared__ __align__(16) unsigned char smem[];
    op_st* Ks = reinterpret_cast<op_st*>(smem);  // normalised k rows, [CH][LDK]
    op_st* KB = Ks + CH * LDK;                   // β e^G k rows, [CH][LDK]
    op_st* Ai = KB + CH * LDK;                   // (I + A)⁻¹, [CH][LDC]
    op_st* VT = Ai + CH * LDC;                   // (β v)ᵀ of 64 value rows, [64][LDC]
    float* As = reinterpret_cast<float*>(VT + 64 * LDC);  // A below the diagonal, A⁻¹ᵀ above
    float* Tb = As + CH * LDA;                   // block products of the inverse, [3][16][16]
    float* gc = Tb + 3 * 256;                    // G, [CH]
    float* bt = gc + CH;                         // β
    float* ek = bt + CH;                         // β e^G

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int wr = w & 3, wc = w >> 2;  // row strip and column half of the chunk-row products
    const int r0 = 16 * wr;
    const int kend = 16 * (wr + 1);  // rows r0.. need columns j ≤ i < kend of Ai
    const i64 b = blockIdx.x;
    const int hv = blockIdx.y, h = hv / p.group;
    const SeqInfo s = infos(p)[m.x];
    const int c0 = m.y * CH, cl = min(CH, s.len - c0);
    const i64 t0 = s.bos + c0;

    // 64 value columns of the chunk's v rows into registers: warp w takes columns 8w … 8w + 7 of
    // rows 2·lane and 2·lane + 1, so that its paired stores of (β v)ᵀ below fall in 32 distinct
    // banks. Where the rows are contiguous and 16-byte aligned in whole groups of 8 (`vvec`), one
    // row's 8 columns come by 16-byte loads; otherwise element by element.
    static_assert(NTHREADS == 256 && CH == 64, "8 warps of 8 value columns, 32 lanes of 2 rows");
    const int vc0 = 8 * w, vj0 = 2 * lane;
    const V_T* vbase = reinterpret_cast<const V_T*>(p.v) + s.bb * p.vs.b + (i64)hv * p.vs.h + t0 * p.vs.t;
    const bool vvec = p.vdim % 8 == 0 && p.vs.d == 1 && p.vs.t % 8 == 0 && reinterpret_cast<u64>(vbase) % 16 == 0;
    const V_T* vrow = vbase + vj0 * p.vs.t;
    V_T vraw[2][8];
    auto load_v = [&](int vt0) {
        const int c0 = vt0 + vc0;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const bool row = vj0 + r < cl;
            const V_T* src = vrow + r * p.vs.t + (i64)c0 * p.vs.d;
            if (vvec) {
                constexpr int U = 8 * (int)sizeof(V_T) / 16;
                union {
                    uint4 u[U];
                    V_T e[8];
                } in;
#pragma unroll
                for (int q = 0; q < U; ++q)
                    in.u[q] = row && c0 < p.vdim ? __ldg(reinterpret_cast<const uint4*>(src) + q) : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int x = 0; x < 8; ++x) vraw[r][x] = in.e[x];
            } else {
#pragma unroll
                for (int x = 0; x < 8; ++x) vraw[r][x] = row && c0 + x < p.vdim ? src[x * p.vs.d] : V_T{};
            }
        }
    };

    // ---- gates (warp 0: a scan of two rows per lane), k rows ----
    if (tid < 32) {
        const G_T* gb = reinterpret_cast<const G_T*>(p.g) + s.bb * p.g_b + (i64)hv * p.g_h + t0 * p.g_t;
        const BETA_T* bb = reinterpret_cast<const BETA_T*>(p.beta) + s.bb * p.be_b + (i64)hv * p.be_h + t0 * p.be_t;
        float g2[2], b2[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = 2 * lane + e;
            g2[e] = r < cl ? to_f32(gb[r * p.g_t]) : 0.f;
            b2[e] = r < cl ? to_f32(bb[r * p.be_t]) : 0.f;
        }
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
    // The normalised q and k rows go to the scratch once per key head (for the state and output
    // passes), q straight from registers.
    op_st* qkg = hv % p.group == 0 ? qk_of(p, b, h) : nullptr;
    {
        const K_T* kb = reinterpret_cast<const K_T*>(p.k) + s.bb * p.ks.b + (i64)h * p.ks.h + t0 * p.ks.t;
        norm_rows(Ks, LDK, kb, p.ks.t, p.ks.d, cl, p.eps, w, lane);
        if (qkg) {
            const Q_T* qb = reinterpret_cast<const Q_T*>(p.q) + s.bb * p.qs.b + (i64)h * p.qs.h + t0 * p.qs.t;
            norm_rows(qkg, KP, qb, p.qs.t, p.qs.d, cl, p.eps, w, lane);
        }
    }
    load_v(0);  // in flight under A, the inverse and W
    __syncthreads();
    if (tid < CH) ek[tid] = bt[tid] * __expf(gc[tid]);

    // ---- A ----
    {
        float aa[1][4][4];
        zero(aa);
        const int ntmax = max(0, min(4, 2 * (wr + 1) - 4 * wc));
        if (ntmax > 0) warp_gemm<1, 4>(aa, Ks, LDK, r0, Ks, LDK, 32 * wc, KP, lane, ntmax);
        for_acc(aa, r0, 32 * wc, lane, [&](int i, int j, float& a) {
            As[i * LDA + j] = j < i && i < cl ? bt[i] * a * __expf(gc[i] - gc[j]) : 0.f;
        });
    }
    __syncthreads();

    // ---- Ainv = (I + A)⁻¹; X[i][c] (i > c) is stored at As[c][i] ----
    if (tid < CH) {
        // Diagonal 16×16 blocks: one column per thread, forward substitution.
        const int b0 = (tid / 16) * 16, c = tid % 16;
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            float sum = r == c ? 1.f : 0.f;
#pragma unroll
            for (int j = 0; j < 16; ++j)
                if (j >= c && j < r) sum -= As[(b0 + r) * LDA + b0 + j] * x[j];
            x[r] = r >= c ? sum : 0.f;
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
            // One pass over k for every block jb of the row: A[row][k] is read once for all of
            // them (each sum still adds its terms in ascending k, as one block at a time did).
            float tsum[3] = {0.f, 0.f, 0.f};
#pragma unroll
            for (int k = 0; k < 16 * ib; ++k) {
                const float ak = As[row * LDA + k];
#pragma unroll
                for (int jb = 0; jb < ib; ++jb) {
                    if (k < 16 * jb) continue;  // compile-time: k and jb are unrolled
                    const int col = 16 * jb + c;
                    const float x = As[col * LDA + k];  // read unconditionally: no branch
                    const int kk = k - 16 * jb;
                    // k in block jb: X[k][col] of the diagonal block (1 on its diagonal, 0 above)
                    const float xk = k >= 16 * (jb + 1) ? x : (kk == c ? 1.f : (kk > c ? x : 0.f));
                    tsum[jb] += ak * xk;
                }
            }
#pragma unroll
            for (int jb = 0; jb < ib; ++jb) Tb[jb * 256 + r * 16 + c] = tsum[jb];
            __syncthreads();
            // X_ii's row read once for every block jb.
#pragma unroll
            for (int mm = 0; mm < 16; ++mm) {
                const float a = As[(16 * ib + mm) * LDA + row];
#pragma unroll
                for (int jb = 0; jb < ib; ++jb) {
                    const float t = Tb[jb * 256 + mm * 16 + c];
                    tsum[jb] = mm < r ? fmaf(a, t, tsum[jb]) : tsum[jb];
                }
            }
#pragma unroll
            for (int jb = 0; jb < ib; ++jb) As[(16 * jb + c) * LDA + row] = -tsum[jb];
            __syncthreads();
        }
    }
    // Ai from X: row i = tid / 4, columns j0 … j0 + 15 of it per thread, by 16-byte stores.
    static_assert(NTHREADS == 4 * CH, "four threads per row of Ai");
    {
        const int i = tid >> 2, j0 = 16 * (tid & 3);
        float x[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) {
            const int j = j0 + e;
            const float a = As[j * LDA + i];
            x[e] = i == j ? 1.f : (j < i ? a : 0.f);
        }
        st_ops(Ai + i * LDC + j0, x);
    }
    // β e^G k rows, and the normalised k rows to the scratch (once per key head); 16 bytes a step.
    {
        constexpr int VE = 16 / (int)sizeof(op_st), SEGS = KP / VE;
        for_mine<CH * SEGS>([&](int e) {
            const int j = e / SEGS, c = (e % SEGS) * VE;
            const uint4 raw = *reinterpret_cast<const uint4*>(Ks + j * LDK + c);
            if (qkg) *reinterpret_cast<uint4*>(qkg + (CH + j) * KP + c) = raw;
            union {
                uint4 u;
                op_st e[VE];
            } in;
            in.u = raw;
            float out[VE];
#pragma unroll
            for (int x = 0; x < VE; ++x) out[x] = op_f32(in.e[x]) * ek[j];
            st_ops(KB + j * LDK + c, out);
        });
    }
    __syncthreads();

    // ---- W = Ainv·(β e^G K), to the scratch ----
    {
        op_st* wg = w_of(p, b, hv);
        for (int kq = 0; kq < KP; kq += 64) {
            float ww[1][4][4];
            zero(ww);
            warp_gemm<1, 4, false, true>(ww, Ai, LDC, r0, KB, LDK, kq + 32 * wc, kend, lane);
            for_pairs(ww, r0, kq + 32 * wc, lane, [&](int i, int kk, float a0, float a1) { st_pair(wg + i * KP + kk, a0, a1); });
        }
    }

    // ---- Uᵀ = (β V)ᵀ·Ainvᵀ, 64 value rows at a time (the first tile loaded before W) ----
    {
        op_st* ug = ut_of(p, b, hv);
        for (int vt0 = 0; vt0 < p.vp; vt0 += 64) {
            if (vt0 > 0) load_v(vt0);
#pragma unroll
            for (int x = 0; x < 8; ++x)
                st_pair(VT + (vc0 + x) * LDC + vj0, to_f32(vraw[0][x]) * bt[vj0], to_f32(vraw[1][x]) * bt[vj0 + 1]);
            __syncthreads();
            float uu[1][4][4];
            zero(uu);
            warp_gemm<1, 4>(uu, VT, LDC, r0, Ai, LDC, 32 * wc, CH, lane);
            for_pairs(uu, r0, 32 * wc, lane,
                      [&](int v, int i, float a0, float a1) { st_pair(ug + (i64)(vt0 + v) * CH + i, a0, a1); });
            __syncthreads();  // VT is refilled
        }
    }
    if (tid < CH) g_of(p, b, hv)[tid] = gc[tid];
}
#endif

#if ENTRY == 2
extern "C" __global__ void __launch_bounds__(NTHREADS, 2) gdn_chunk_state_kernel(const ChunkParams p) {
    u32 bid = blockIdx.x;
    const int vt = (int)(bid % (u32)p.vtiles);
    bid /= (u32)p.vtiles;
    const int hv = (int)(bid % (u32)p.v_heads);
    const int n = (int)(bid / (u32)p.v_heads);
    const SeqInfo s = infos(p)[n];
    if (s.base < 0) return;  // skipped by the index kernel (a pad, or an invalid value)

    extern __shared__ __align__(16) unsigned char smem[];
    op_st* Ws = reinterpret_cast<op_st*>(smem);  // W, [2][CH][LDK]
    op_st* Kn = Ws + 2 * CH * LDK;               // normalised k rows, [2][CH][LDK]
    op_st* UTs = Kn + 2 * CH * LDK;              // Uᵀ of the tile, [2][BV][LDC]
    op_st* Sop = UTs + 2 * BV * LDC;             // H_c, [BV][LDK]
    op_st* VsT = Sop + BV * LDK;                 // decayed V'ᵀ, [BV][LDC]
    float* Gs = reinterpret_cast<float*>(VsT + BV * LDC);  // G, [2][CH]

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int h = hv / p.group;
    const int v0 = vt * BV, vcols = min(BV, p.vdim - v0);
    const int nch = (s.len + CH - 1) / CH;
    constexpr int OPB = (int)sizeof(op_st);
    auto stage = [&](int c, int buf) {
        const i64 b = s.base + c;
        stage_async<CH, KP * OPB, LDK * OPB>(Ws + buf * CH * LDK, w_of(p, b, hv), KP * OPB);
        stage_async<CH, KP * OPB, LDK * OPB>(Kn + buf * CH * LDK, qk_of(p, b, h) + CH * KP, KP * OPB);
        stage_async<BV, CH * OPB, LDC * OPB>(UTs + buf * BV * LDC, ut_of(p, b, hv) + (i64)v0 * CH, CH * OPB);
        stage_async<1, CH * 4, 0>(Gs + buf * CH, g_of(p, b, hv), 0);
        cp_async_commit();
    };
    if (nch > 0) stage(0, 0);

    // The f32 state tile [KP][BV] in registers: warp (sr, sc) holds rows 16 sr.. and SNT
    // n-tiles of columns from vs0.
    constexpr int SR = KP / 16 < NWARPS ? KP / 16 : NWARPS;
    constexpr int SC = NWARPS / SR;
    constexpr int SNT = BV / SC / 8;
    static_assert(SNT >= 1 && SR * SC == NWARPS, "state tiling");
    const int k0 = 16 * (w % SR), vs0 = (BV / SC) * (w / SR);
    // V'ᵀ [BV][CH]: warp (vr, vc) holds rows 16 vr.. and VNT n-tiles of chunk rows from i0.
    constexpr int VR = BV / 16;
    constexpr int VC = NWARPS / VR;
    constexpr int VNT = CH / VC / 8;
    static_assert(VNT >= 1 && VR * VC == NWARPS, "V' tiling");
    const int vr0 = 16 * (w % VR), i0 = (CH / VC) * (w / VR);

    const i64 head_elems = (i64)KDIM * p.vdim;
    float ss[1][SNT][4];
    {
        const ST_T* src = reinterpret_cast<const ST_T*>(p.state) + s.slot * p.st_row + hv * head_elems;
        for_acc(ss, k0, vs0, lane, [&](int kk, int v, float& a) {
            a = s.read && kk < KDIM && v < vcols ? to_f32(src[state_at(v0 + v, kk, p.vdim)]) : 0.f;
            Sop[v * LDK + kk] = to_op(a);
        });
    }

    for (int c = 0; c < nch; ++c) {
        const i64 b = s.base + c;
        const int cl = min(CH, s.len - c * CH), buf = c & 1;
        cp_async_wait_all();
        __syncthreads();  // chunk c staged, H_c in Sop; chunk c − 1's readers are done
        if (c + 1 < nch) stage(c + 1, buf ^ 1);
        const op_st* W = Ws + buf * CH * LDK;
        const op_st* Kc = Kn + buf * CH * LDK;
        const op_st* UT = UTs + buf * BV * LDC;
        const float* G = Gs + buf * CH;
        {  // H_c to the scratch, for the output pass
            op_st* hg = h_of(p, b, hv) + (i64)v0 * KP;
            constexpr int SEGS = KP * OPB / 16;
            for_mine<BV * SEGS>([&](int e) {
                const int v = e / SEGS, q = (e % SEGS) * (16 / OPB);
                *reinterpret_cast<uint4*>(hg + v * KP + q) = *reinterpret_cast<const uint4*>(Sop + v * LDK + q);
            });
        }
        const float glast = G[cl - 1];
        {  // V'ᵀ = Uᵀ − H_c·Wᵀ
            float vv[1][VNT][4];
            zero(vv);
            warp_gemm<1, VNT>(vv, Sop, LDK, vr0, W, LDK, i0, KP, lane);
            op_st* ug = ut_of(p, b, hv) + (i64)v0 * CH;
            for_pairs(vv, vr0, i0, lane, [&](int v, int i, float a0, float a1) {
                const float x0 = i < cl ? op_f32(UT[v * LDC + i]) - a0 : 0.f;
                const float x1 = i + 1 < cl ? op_f32(UT[v * LDC + i + 1]) - a1 : 0.f;
                st_pair(ug + v * CH + i, x0, x1);
                const float e0 = i < cl ? __expf(glast - G[i]) : 0.f;
                const float e1 = i + 1 < cl ? __expf(glast - G[i + 1]) : 0.f;
                st_pair(VsT + v * LDC + i, x0 * e0, x1 * e1);
            });
        }
        __syncthreads();  // VsT complete; every warp is done with Sop
        {  // S = e^{G_last} S + Kᵀ·V's (Kᵀ read transposed from the k rows)
            const float e_last = __expf(glast);
            for_acc(ss, k0, vs0, lane, [&](int, int, float& a) { a *= e_last; });
            // All CH rows (a compile-time loop): past `cl` the decayed V' columns are zeros.
            warp_gemm<1, SNT, true>(ss, Kc, LDK, k0, VsT, LDC, vs0, CH, lane);
            for_pairs(ss, k0, vs0, lane,
                      [&](int kk, int v, float a0, float a1) { st_two(Sop + v * LDK + kk, Sop + (v + 1) * LDK + kk, a0, a1); });
        }
    }

    // ---- the final state: `final_state[n]` and, in place, the slot it came from ----
#if HAS_FINAL || INPLACE
    for_acc(ss, k0, vs0, lane, [&](int kk, int v, float& a) {
        if (kk >= KDIM || v >= vcols) return;
        const i64 at = hv * head_elems + state_at(v0 + v, kk, p.vdim);
#if HAS_FINAL
        reinterpret_cast<FS_T*>(p.final_state)[(i64)n * p.fs_row + at] = from_f32<FS_T>(a);
#endif
#if INPLACE
        reinterpret_cast<ST_T*>(p.state)[s.slot * p.st_row + at] = from_f32<ST_T>(a);
#endif
    });
#endif
}
#endif

#if ENTRY == 3
#define VO 128  // value rows of an output block

// The output products on Hopper's `wgmma` (WGMMA_ASKED, where common.cuh has it: 16-bit
// operands compiled for sm_90a): each warpgroup (warps 4·wc .. 4·wc + 3) issues m64n64k16
// products over operand tiles staged in the core-matrix layout (`core_at`, rows of the same
// LDK / LDC elements), and its warp wr holds rows 16·wr.. of the 64 × 64 result in the `mma`
// fragment layout, as the `mma.sync` form's warps do. Otherwise `mma.sync`.
#if defined(WGMMA_ASKED) && WGMMA_ASKED && HAS_WGMMA
#define OUT_WG 1
// Rows [0, rows) of a ROWS × COLS operand tile (global rows of `src_ld` elements) into `dst` in
// the core-matrix layout with rows of LD elements, by 16-byte `cp.async`, placed as
// `core_group_row` says, or (OUT_STAGE_ROWS) with consecutive threads along a global row.
template <int ROWS, int COLS, int LD>
__device__ __forceinline__ void stage_core(op_st* dst, const op_st* src, i64 src_ld, int rows = ROWS) {
    constexpr int SEGS = COLS / 8;
    static_assert(ROWS % 8 == 0 && COLS % 8 == 0 && LD % 8 == 0, "stage_core: whole core matrices");
    for_mine<ROWS * SEGS>([&](int e) {
#if OUT_STAGE_ROWS
        const int r = e / SEGS, c = (e % SEGS) * 8;  // consecutive threads along a global row
#else
        const int r = core_group_row(e, SEGS), c = core_group_col(e, SEGS);
#endif
        if (r < rows) cp_async16(dst + core_at(r, c, LD), src + r * src_ld + c);
    });
}
#else
#define OUT_WG 0
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, 2) gdn_chunk_out_kernel(const ChunkParams p) {
    const int2 m = chunk_map(p)[blockIdx.x];
    if (m.x < 0) return;
    extern __shared__ __align__(16) unsigned char smem[];
    op_st* Hs = reinterpret_cast<op_st*>(smem);  // H_c of VO value rows, [VO][LDK]
    op_st* VnT = Hs + VO * LDK;                  // V'ᵀ of the same rows, [VO][LDC]
    op_st* Qs = VnT + VO * LDC;                  // normalised q rows, [CH][LDK]
    op_st* Ks = Qs + CH * LDK;                   // normalised k rows, [CH][LDK]
    op_st* Ps = Ks + CH * LDK;                   // P, [CH][LDC]
    float* gc = reinterpret_cast<float*>(Ps + CH * LDC);  // G, [CH]

    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const int wr = w & 3, wc = w >> 2;  // row strip; column half (P: 32 columns, o: 64)
    const int r0 = 16 * wr;
    const int kend = 16 * (wr + 1);
    const i64 b = blockIdx.x;
    const int hv = blockIdx.y, h = hv / p.group, vt0 = VO * blockIdx.z;
    const int rows = min(VO, p.vp - vt0);  // a multiple of 64
    const SeqInfo s = infos(p)[m.x];
    const int c0 = m.y * CH, cl = min(CH, s.len - c0);
    const i64 t0 = s.bos + c0;
    constexpr int OPB = (int)sizeof(op_st);

#if OUT_WG
    (void)kend;
    (void)OPB;
    stage_core<VO, KP, LDK>(Hs, h_of(p, b, hv) + (i64)vt0 * KP, KP, rows);
    stage_core<VO, CH, LDC>(VnT, ut_of(p, b, hv) + (i64)vt0 * CH, CH, rows);
    stage_core<2 * CH, KP, LDK>(Qs, qk_of(p, b, h), KP);  // q rows, then k rows (Ks = Qs + CH·LDK)
#else
    stage_async<VO, KP * OPB, LDK * OPB>(Hs, h_of(p, b, hv) + (i64)vt0 * KP, KP * OPB, rows);
    stage_async<VO, CH * OPB, LDC * OPB>(VnT, ut_of(p, b, hv) + (i64)vt0 * CH, CH * OPB, rows);
    stage_async<2 * CH, KP * OPB, LDK * OPB>(Qs, qk_of(p, b, h), KP * OPB);  // q rows, then k rows
#endif
    stage_async<1, CH * 4, 0>(gc, g_of(p, b, hv), 0);
    cp_async_commit();
    cp_async_wait_all();
#if OUT_WG
    fence_async_shared();  // the copies, visible to the products' reads
#endif
    __syncthreads();

#if OUT_WG
    // Warpgroup 0 forms P (64 × 64 over KP) beside its e^G (Q·H_cᵀ); warpgroup 1 only the
    // latter, for its 64 value rows (`rows` ≥ 64: warpgroup 0's rows are always live).
    const bool mine = 64 * wc < rows;
    float oo[1][8][4];
    zero(oo);
    if (wc == 0) {
        float pp[1][8][4];
        zero(pp);
        wg_product<KP / 16, false, false>(pp, Qs, LDK, Ks, LDK);
        wg_product<KP / 16, false, false>(oo, Qs, LDK, Hs, LDK);
        wg_wait_all();
        for_acc(pp, r0, 0, lane, [&](int i, int j, float& a) {
            Ps[core_at(i, j, LDC)] = to_op(j <= i && i < cl ? a * __expf(gc[i] - gc[j]) : 0.f);
        });
    } else if (mine) {
        wg_product<KP / 16, false, false>(oo, Qs, LDK, Hs + core_at(64, 0, LDK), LDK);
        wg_wait_all();
    }
    if (mine) scale_acc_rows(oo, r0, lane, [&](int i) { return __expf(gc[i]); });
    fence_async_shared();  // P's stores, visible to the products' reads
    __syncthreads();       // P complete
    if (!mine) return;
    wg_product<CH / 16, false, false>(oo, Ps, LDC, VnT + core_at(64 * wc, 0, LDC), LDC);
    wg_wait_all();
#else
    // ---- P ----
    {
        float pp[1][4][4];
        zero(pp);
        const int ntmax = max(0, min(4, 2 * (wr + 1) - 4 * wc));
        if (ntmax > 0) warp_gemm<1, 4>(pp, Qs, LDK, r0, Ks, LDK, 32 * wc, KP, lane, ntmax);
        for_pairs(pp, r0, 32 * wc, lane, [&](int i, int j, float a0, float a1) {
            const bool live = i < cl;
            st_pair(Ps + i * LDC + j, j <= i && live ? a0 * __expf(gc[i] - gc[j]) : 0.f,
                    j + 1 <= i && live ? a1 * __expf(gc[i] - gc[j + 1]) : 0.f);
        });
    }
    // ---- o = scale·(e^G (Q·H_cᵀ) + P·V'), 64 value rows per warp ----
    const bool mine = 64 * wc < rows;
    float oo[1][8][4];
    zero(oo);
    if (mine) {
        warp_gemm<1, 8>(oo, Qs, LDK, r0, Hs, LDK, 64 * wc, KP, lane);
        scale_acc_rows(oo, r0, lane, [&](int i) { return __expf(gc[i]); });
    }
    __syncthreads();  // P complete
    if (!mine) return;
    warp_gemm<1, 8>(oo, Ps, LDC, r0, VnT, LDC, 64 * wc, kend, lane);
#endif
    O_T* ob = reinterpret_cast<O_T*>(p.o) + s.bb * p.os.b + (i64)hv * p.os.h + t0 * p.os.t;
    if (cl == CH && vt0 + 64 * (wc + 1) <= p.vdim && p.os.d == 1 && pairs_aligned<O_T>(reinterpret_cast<u64>(ob), p.os.t, 0)) {
        // Every row and column of the warp's 16 × 64 in range, columns contiguous and pairs
        // aligned: two row addresses per lane, two columns per store.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            O_T* row = ob + (i64)(r0 + (lane >> 2) + 8 * half) * p.os.t + vt0 + 64 * wc + 2 * (lane & 3);
#pragma unroll
            for (int nt = 0; nt < 8; ++nt) {
                const float y[2] = {oo[0][nt][2 * half] * p.scale, oo[0][nt][2 * half + 1] * p.scale};
                store_pair(row + 8 * nt, y);
            }
        }
        return;
    }
    for_acc(oo, r0, 64 * wc, lane, [&](int i, int v, float& a) {
        if (i < cl && vt0 + v < p.vdim) ob[i * p.os.t + (i64)(vt0 + v) * p.os.d] = from_f32<O_T>(a * p.scale);
    });
}
#endif
