// Gated delta rule (semantics/gdn_conv.md §1.1, §1.2, §2.1, §2.2): `fused_gdn_gating` and the
// recurrence of `fused_recurrent_gated_delta_rule` / `fused_sigmoid_gating_delta_rule_update`,
// specialised at NVRTC time by -D macros (see crates/ssm-cuda/src/gdn.rs).
//
// gdn_gating_kernel (GATING_ONLY=1): one thread per (token, value head), grid-stride.
//   ALOG_T DTB_T A_T B_T BETAO_T      f32 / f16_t / bf16_t (g is f32)
//
// gdn_recurrent_kernel:
//   Q_T K_T V_T O_T STATE_T FINAL_T   f32 / f16_t / bf16_t
//   G_T BETA_T                        precomputed gates (SIGMOID=0)
//   ALOG_T DTB_T A_T B_T              in-kernel gates (SIGMOID=1)
//   IX_T NACC_T CU_T                  int / i64
//   KDIM VEC TPR VPT RPT NTHREADS     tile geometry
//   MINB                              min resident blocks per SM (__launch_bounds__), 0 = none
//   SIGMOID HAS_BETA HAS_STATE HAS_FINAL SLOTS(0 none, 1 1-D, 2 2-D) HAS_NACC VARLEN
//   L2NORM LAYOUT_KV QK_VEC RAW       0/1 (RAW: one token per sequence, state in place through
//                                     a 1-D table or none, [V,K] 16-byte vectors: the tile is
//                                     held in its storage form and rounded once)
//
// One block owns one (sequence, value head, tile of DIM_TILE = (NTHREADS / TPR) * RPT rows of
// V). TPR lanes share one state row S[v][0..K); each lane holds VPT vectors of VEC elements of
// the row for RPT rows. The tile is read once into f32 registers, every token of the sequence
// is applied, and the tile is written once at the end (or once per token column in speculative
// mode / per token row of `final_state`). Sums over K (the l2norms, S·k and S·q) are shuffles
// among the TPR lanes of a row.
//   [V,K] (LAYOUT_KV=0): lanes run along K, VEC-element (16-byte) accesses.
//   [K,V] (LAYOUT_KV=1): element (v, k) is at k·V + v; the 32/TPR row groups of a warp take
//   consecutive v so that each access of a warp touches 32/TPR contiguous elements (VEC = 1).
//
// Index values read on the device are checked here, before anything is written: a null slot
// (<= 0, vLLM's NULL_BLOCK_ID) skips the sequence (read) or the store (write); a slot >= rows,
// a bad cu_seqlens range or more tokens than table columns skips the whole sequence (nothing
// written) and ORs a bit into the device error word. An accepted count outside [1, columns]
// writes zero outputs and no state (vLLM's newest contract). No value reads or writes outside
// its tensor.

// (Error-word bits ERR_*: kernels/common.cuh.)

#if GATING_ONLY

// Mirrored by `GatingParams` in crates/ssm-cuda/src/gdn.rs.
struct GatingParams {
    u64 a_log, dt_bias, a, b, g, beta_out;
    i64 a_log_s, dtb_s, a_t, a_h, b_t, b_h, g_t, g_h, bo_t, bo_h;
    i64 tokens;
    int heads;
    float softplus_beta, threshold;
    int reserved;
};

extern "C" __global__ void __launch_bounds__(256) gdn_gating_kernel(const GatingParams p) {
    const i64 n = p.tokens * p.heads;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        const i64 t = i / p.heads;
        const int h = (int)(i % p.heads);
        const float al = to_f32(ld_ro(reinterpret_cast<const ALOG_T*>(p.a_log) + h * p.a_log_s));
        const float db = to_f32(ld_ro(reinterpret_cast<const DTB_T*>(p.dt_bias) + h * p.dtb_s));
        const float av = to_f32(ld_ro(reinterpret_cast<const A_T*>(p.a) + t * p.a_t + h * p.a_h));
        const float bv = to_f32(ld_ro(reinterpret_cast<const B_T*>(p.b) + t * p.b_t + h * p.b_h));
        // g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b) (semantics/gdn_conv.md §1.2).
        const float x = av + db;
        const float bx = p.softplus_beta * x;
        const float sp = bx <= p.threshold ? (1.f / p.softplus_beta) * logf(1.f + expf(bx)) : x;
        reinterpret_cast<float*>(p.g)[t * p.g_t + h * p.g_h] = -expf(al) * sp;
        reinterpret_cast<BETAO_T*>(p.beta_out)[t * p.bo_t + h * p.bo_h] = from_f32<BETAO_T>(1.f / (1.f + expf(-bv)));
    }
}

#else

// Strides of a per-token tensor `[b, t, head, dim]` (dim = 0 for `[b, t, head]` tensors).
struct Tok4 {
    i64 b, t, h, d;
};

// Mirrored by `RecurrentParams` in crates/ssm-cuda/src/gdn.rs (8-byte fields first, no padding).
struct RecurrentParams {
    u64 q, k, v, o, g, beta, a_log, dt_bias, a, b, state, final_state, ix, nacc, cu, err;
    Tok4 qs, ks, vs, os, gs, betas, as_, bs;
    i64 a_log_s, dtb_s;
    i64 state_row, state_rows, final_row;
    i64 ix_seq, ix_col, nacc_s, cu_s;
    i64 ix_cols, seqlen;
    int seqs, heads, v_heads, vdim, group, reserved;
    float scale, eps, softplus_beta, threshold;
    BlockSplit split;  // grid = sequences × value heads × row tiles
};

#define ROW_GROUPS (NTHREADS / TPR)
#define DIM_TILE (ROW_GROUPS * RPT)
#define NVEC ((KDIM + VEC - 1) / VEC)
#if LAYOUT_KV
#define LANE_STRIDE (32 / TPR)
#else
#define LANE_STRIDE 1
#endif

__device__ __forceinline__ void raise_error(const RecurrentParams& p, u32 bit) {
    if (threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(p.err), bit);
}

// Sum over the TPR lanes that share one state row.
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o * LANE_STRIDE);
    return x;
}

__device__ __forceinline__ i64 tok(const Tok4& s, i64 seq, i64 bos, int t) {
    return VARLEN ? (bos + t) * s.t : seq * s.b + (i64)t * s.t;
}

// Element offset of S[v][k] within one head's block.
__device__ __forceinline__ i64 elem(int v, int k, int vdim) {
    return LAYOUT_KV ? (i64)k * vdim + v : (i64)v * KDIM + k;
}

// One token's inputs for a lane: its columns of q and k, its rows' v (and β), the gate.
struct TokIn {
    float q[VPT][VEC], k[VPT][VEC];
    float v[RPT], beta[RPT];
    float g;
};

__device__ __forceinline__ void load_qk(const RecurrentParams& p, float (&q)[VPT][VEC], float (&k)[VPT][VEC], i64 qo,
                                        i64 ko, int lane) {
    const Q_T* qp = reinterpret_cast<const Q_T*>(p.q) + qo;
    const K_T* kp = reinterpret_cast<const K_T*>(p.k) + ko;
#pragma unroll
    for (int w = 0; w < VPT; ++w) {
        const int vi = lane + w * TPR;
#if QK_VEC
        if (vi < NVEC) {
            load_vec_ro<VEC>(qp + vi * VEC, q[w]);
            load_vec_ro<VEC>(kp + vi * VEC, k[w]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) q[w][e] = k[w][e] = 0.f;
        }
#else
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int c = vi * VEC + e;
            const bool ok = c < KDIM;
            q[w][e] = ok ? to_f32(ld_ro(qp + (i64)c * p.qs.d)) : 0.f;
            k[w][e] = ok ? to_f32(ld_ro(kp + (i64)c * p.ks.d)) : 0.f;
        }
#endif
    }
}

__device__ __forceinline__ void load_token(const RecurrentParams& p, TokIn& in, i64 seq, i64 bos, int t, int hv,
                                           int h, const int (&prow)[RPT], int lane, float a_log_e, float dtb) {
    load_qk(p, in.q, in.k, tok(p.qs, seq, bos, t) + (i64)h * p.qs.h, tok(p.ks, seq, bos, t) + (i64)h * p.ks.h, lane);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const i64 pr = prow[r] < p.vdim ? prow[r] : 0;
        in.v[r] = to_f32(ld_ro(reinterpret_cast<const V_T*>(p.v) + tok(p.vs, seq, bos, t) + (i64)hv * p.vs.h + pr * p.vs.d));
#if !SIGMOID && HAS_BETA
        in.beta[r] = to_f32(ld_ro(reinterpret_cast<const BETA_T*>(p.beta) + tok(p.betas, seq, bos, t) + (i64)hv * p.betas.h + pr * p.betas.d));
#endif
    }
#if SIGMOID
    // g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), in f32 (semantics/gdn_conv.md §1.2).
    const float av = to_f32(ld_ro(reinterpret_cast<const A_T*>(p.a) + tok(p.as_, seq, bos, t) + (i64)hv * p.as_.h));
    const float bv = to_f32(ld_ro(reinterpret_cast<const B_T*>(p.b) + tok(p.bs, seq, bos, t) + (i64)hv * p.bs.h));
    const float x = av + dtb;
    const float bx = p.softplus_beta * x;
    const float sp = bx <= p.threshold ? (1.f / p.softplus_beta) * logf(1.f + expf(bx)) : x;
    in.g = -a_log_e * sp;
    const float beta = 1.f / (1.f + expf(-bv));
#pragma unroll
    for (int r = 0; r < RPT; ++r) in.beta[r] = beta;
#else
    in.g = to_f32(ld_ro(reinterpret_cast<const G_T*>(p.g) + tok(p.gs, seq, bos, t) + (i64)hv * p.gs.h));
#if !HAS_BETA
#pragma unroll
    for (int r = 0; r < RPT; ++r) in.beta[r] = 1.f;
#endif
#endif
}

// Loads the lane's part of one head block (`base` = element offset of the block).
template <typename T>
__device__ __forceinline__ void load_tile(const T* base, float (&s)[RPT][VPT][VEC], const int (&prow)[RPT], int lane,
                                          int vdim) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            if (prow[r] < vdim && vi < NVEC) {
#if LAYOUT_KV
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const int c = vi * VEC + e;
                    s[r][w][e] = c < KDIM ? to_f32(base[elem(prow[r], c, vdim)]) : 0.f;
                }
#else
                load_vec<VEC, T>(base + elem(prow[r], vi * VEC, vdim), s[r][w]);
#endif
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e) s[r][w][e] = 0.f;
            }
        }
}

template <typename T>
__device__ __forceinline__ void store_tile(T* base, const float (&s)[RPT][VPT][VEC], const int (&prow)[RPT], int lane,
                                           int vdim) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            if (prow[r] < vdim && vi < NVEC) {
#if LAYOUT_KV
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    const int c = vi * VEC + e;
                    if (c < KDIM) base[elem(prow[r], c, vdim)] = from_f32<T>(s[r][w][e]);
                }
#else
                store_vec<VEC, T>(base + elem(prow[r], vi * VEC, vdim), s[r][w]);
#endif
            }
        }
}

#if MINB > 0
#define GDN_BOUNDS __launch_bounds__(NTHREADS, MINB)
#else
#define GDN_BOUNDS __launch_bounds__(NTHREADS)
#endif

extern "C" __global__ void GDN_BOUNDS gdn_recurrent_kernel(const RecurrentParams p) {
#if LAYOUT_KV
    const int lane = (threadIdx.x % 32) / LANE_STRIDE;
    const int row_group = (threadIdx.x / 32) * LANE_STRIDE + threadIdx.x % LANE_STRIDE;
#else
    const int lane = threadIdx.x % TPR;
    const int row_group = threadIdx.x / TPR;
#endif
    i64 seq;
    int hv, tile;
    split_block(p.split, blockIdx.x, seq, hv, tile);
    const int h = hv / p.group;

    // ---- index loads, all issued before any is used ----
#if VARLEN
    const CU_T* cu = reinterpret_cast<const CU_T*>(p.cu);
    const i64 bos = load_index(cu + seq * p.cu_s);
    const i64 eos = load_index(cu + (seq + 1) * p.cu_s);
#else
    const i64 bos = seq * p.seqlen;
#endif
#if HAS_STATE && SLOTS != 0
    const IX_T* ixrow = reinterpret_cast<const IX_T*>(p.ix) + seq * p.ix_seq;
#if HAS_NACC
    const i64 accepted = load_index(reinterpret_cast<const NACC_T*>(p.nacc) + seq * p.nacc_s);
#else
    const i64 slot0 = load_index(ixrow);
#endif
#endif

    int len = (int)p.seqlen;
#if VARLEN
    if (bos < 0 || eos < bos || eos > p.seqlen) {
        raise_error(p, ERR_CU_SEQLENS);
        return;
    }
    len = (int)(eos - bos);
#endif
    if (len == 0) return;  // empty sequence: nothing read or written

    int prow[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) prow[r] = tile * DIM_TILE + r * ROW_GROUPS + row_group;

    // Per-head gate parameters and token 0's inputs: issued before the slot index is back.
#if SIGMOID
    const float a_log_e = expf(to_f32(ld_ro(reinterpret_cast<const ALOG_T*>(p.a_log) + (i64)hv * p.a_log_s)));
    const float dtb = to_f32(ld_ro(reinterpret_cast<const DTB_T*>(p.dt_bias) + (i64)hv * p.dtb_s));
#else
    const float a_log_e = 0.f, dtb = 0.f;
#endif
    TokIn cur;
    load_token(p, cur, seq, bos, 0, hv, h, prow, lane, a_log_e, dtb);

    // ---- the start state ----
    bool from_state = false;
    bool zero_output = false;
    i64 src = 0;
#if HAS_STATE
#if SLOTS == 0
    src = bos;
    if (src >= p.state_rows) {
        raise_error(p, ERR_SLOT);
        return;
    }
    from_state = true;
#else
#if HAS_NACC
    if (accepted < 1 || accepted > p.ix_cols) {
        zero_output = true;
    } else {
        src = load_index(ixrow + (accepted - 1) * p.ix_col);
    }
#else
    src = slot0;
#endif
    if (!zero_output) {
        if (src <= 0) return;  // null block: the sequence is skipped, nothing written
        if (src >= p.state_rows) {
            raise_error(p, ERR_SLOT);
            return;
        }
        from_state = true;
    }
#endif
#endif

    const i64 head_elems = (i64)KDIM * p.vdim;
#if RAW
    // One token, in place, 16-byte state vectors: the tile stays in its storage form (half the
    // registers of f32 for a 16-bit state), widened one row at a time, rounded once.
    uint4 raw[RPT][VPT];
    const STATE_T* sbase = reinterpret_cast<const STATE_T*>(p.state) + src * p.state_row + hv * head_elems;
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            raw[r][w] = make_uint4(0u, 0u, 0u, 0u);  // zero bits: 0.0 in every float format
            if (from_state && prow[r] < p.vdim && vi < NVEC) raw[r][w] = load16<false>(sbase + elem(prow[r], vi * VEC, p.vdim));
        }
#else
    float s[RPT][VPT][VEC];
    if (from_state) {
        load_tile(reinterpret_cast<const STATE_T*>(p.state) + src * p.state_row + hv * head_elems, s, prow, lane, p.vdim);
    } else {
#pragma unroll
        for (int r = 0; r < RPT; ++r)
#pragma unroll
            for (int w = 0; w < VPT; ++w)
#pragma unroll
                for (int e = 0; e < VEC; ++e) s[r][w][e] = 0.f;
    }
#endif

#if HAS_STATE && !HAS_FINAL && SLOTS == 2
    // Destination columns are checked while the state loads are in flight; a bad one skips
    // the whole sequence before anything is written.
    if (!zero_output) {
        if (len > p.ix_cols) {
            raise_error(p, ERR_ACCEPTED);
            return;
        }
        for (int t = 0; t < len; ++t) {
            const i64 d = load_index(ixrow + (i64)t * p.ix_col);
            if (d >= p.state_rows) {
                raise_error(p, ERR_SLOT);
                return;
            }
        }
    }
#endif

    O_T* out = reinterpret_cast<O_T*>(p.o);
    if (zero_output) {
        // Invalid accepted count: zero outputs, no state read or written.
        for (int t = 0; t < len; ++t) {
            if (lane == 0) {
#pragma unroll
                for (int r = 0; r < RPT; ++r)
                    if (prow[r] < p.vdim)
                        out[tok(p.os, seq, bos, t) + (i64)hv * p.os.h + (i64)prow[r] * p.os.d] = from_f32<O_T>(0.f);
            }
        }
        return;
    }

    for (int t = 0; t < len; ++t) {
        if (t > 0) load_token(p, cur, seq, bos, t, hv, h, prow, lane, a_log_e, dtb);
#if L2NORM
        // x·rsqrt(Σx² + eps), eps added to the sum of squares (semantics/gdn_conv.md §1.3).
        float qq = 0.f, kk = 0.f;
#pragma unroll
        for (int w = 0; w < VPT; ++w)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                qq += cur.q[w][e] * cur.q[w][e];
                kk += cur.k[w][e] * cur.k[w][e];
            }
        qq = row_sum(qq);
        kk = row_sum(kk);
        const float qinv = 1.f / sqrtf(qq + p.eps), kinv = 1.f / sqrtf(kk + p.eps);
#else
        const float qinv = 1.f, kinv = 1.f;
#endif
#pragma unroll
        for (int w = 0; w < VPT; ++w)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                cur.q[w][e] = cur.q[w][e] * qinv * p.scale;
                cur.k[w][e] = cur.k[w][e] * kinv;
            }
        const float decay = expf(cur.g);
        float y[RPT];
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
#if RAW
            float row[VPT][VEC];
#pragma unroll
            for (int w = 0; w < VPT; ++w) unpack_vec<STATE_T>(raw[r][w], row[w]);
#else
            float (&row)[VPT][VEC] = s[r];
#endif
            // S *= exp(g); u = β(v − S k); S += u kᵀ; o = S q (semantics/gdn_conv.md §1.1).
            float pred = 0.f;
#pragma unroll
            for (int w = 0; w < VPT; ++w)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    row[w][e] *= decay;
                    pred += row[w][e] * cur.k[w][e];
                }
            pred = row_sum(pred);
            const float u = (cur.v[r] - pred) * cur.beta[r];
            float acc = 0.f;
#pragma unroll
            for (int w = 0; w < VPT; ++w)
#pragma unroll
                for (int e = 0; e < VEC; ++e) {
                    row[w][e] += u * cur.k[w][e];
                    acc += row[w][e] * cur.q[w][e];
                }
            y[r] = row_sum(acc);
#if RAW
#pragma unroll
            for (int w = 0; w < VPT; ++w) raw[r][w] = pack_vec<STATE_T>(row[w]);
#endif
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RPT; ++r)
                if (prow[r] < p.vdim)
                    out[tok(p.os, seq, bos, t) + (i64)hv * p.os.h + (i64)prow[r] * p.os.d] = from_f32<O_T>(y[r]);
        }
#if HAS_FINAL
        // Not in place: the state after every token to row bos + t of `final_state`.
        store_tile(reinterpret_cast<FINAL_T*>(p.final_state) + (bos + t) * p.final_row + hv * head_elems, s, prow, lane,
                   p.vdim);
#elif HAS_STATE && SLOTS == 2
        // Speculative: the state after token t to column t (a null entry skips the store).
        {
            const i64 d = load_index(ixrow + (i64)t * p.ix_col);
            if (d > 0) store_tile(reinterpret_cast<STATE_T*>(p.state) + d * p.state_row + hv * head_elems, s, prow, lane, p.vdim);
        }
#endif
    }
#if RAW
    // In place, once: the rows packed above, to the slot read (1-D table) or row bos (no table).
    STATE_T* obase = reinterpret_cast<STATE_T*>(p.state) + src * p.state_row + hv * head_elems;
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            if (prow[r] < p.vdim && vi < NVEC) store16<false>(obase + elem(prow[r], vi * VEC, p.vdim), raw[r][w]);
        }
#elif !HAS_FINAL && HAS_STATE && SLOTS != 2
    // In place, once: to the slot read (1-D table) or row bos (no table).
    store_tile(reinterpret_cast<STATE_T*>(p.state) + src * p.state_row + hv * head_elems, s, prow, lane, p.vdim);
#endif
}

#endif
