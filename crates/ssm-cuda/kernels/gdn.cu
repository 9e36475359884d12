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
//   PDL_WAIT                          0/1: launched as the programmatic dependent of the kernel
//                                     that writes q/k/v (the decode step's conv): slot and state
//                                     loads first, then griddepcontrol.wait, then the inputs
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
__device__ __forceinline__ float row_sum(float x) { return butterfly_sum<TPR, LANE_STRIDE>(x); }

// Y_SCATTER (GDN_SCATTER, on where RPT is a power of two up to TPR): the outputs' sums over the
// row's lanes are reduced and scattered (`reduce_scatter`, common.cuh; bit-identical to a
// butterfly per row), so that lane l of a row group ends with row l / (TPR / RPT)'s output in
// y[0] and one lane per row stores it, all rows in one pass. Else lane 0 stores every row's y[r].
#ifndef GDN_SCATTER
#define GDN_SCATTER 1
#endif
#define Y_SCATTER (GDN_SCATTER && (RPT & (RPT - 1)) == 0 && RPT <= TPR)

// The lane's index within its row's TPR lanes, from its thread index.
__device__ __forceinline__ int row_lane() { return (int)(threadIdx.x % 32) / LANE_STRIDE % TPR; }

// Stores the rows' outputs from apply_token's `y` to `out[prow[r] · sd]` (rows past `vdim`
// skipped): one lane per row with Y_SCATTER, else lane 0 of the row group.
template <typename O> __device__ __forceinline__ void store_rows(O* out, i64 sd, const int (&prow)[RPT], int vdim,
                                                                 const float (&y)[RPT]) {
#if Y_SCATTER
    constexpr int SPAN = TPR / RPT;
    const int lane = row_lane(), row = pick(prow, lane / SPAN);
    if (lane % SPAN == 0 && row < vdim) out[(i64)row * sd] = from_f32<O>(y[0]);
#else
    if (row_lane() == 0) {
#pragma unroll
        for (int r = 0; r < RPT; ++r)
            if (prow[r] < vdim) out[(i64)prow[r] * sd] = from_f32<O>(y[r]);
    }
#endif
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

// q, k and v: read-only for this grid, except as the programmatic dependent of the conv that
// writes them (PDL_WAIT), where they are read through L2 after the wait.
#if PDL_WAIT
#define LD_IN(ptr) ld_cg(ptr)
#define LD_IN_VEC(ptr, out) load_vec_cg<VEC>(ptr, out)
#else
#define LD_IN(ptr) ld_ro(ptr)
#define LD_IN_VEC(ptr, out) load_vec_ro<VEC>(ptr, out)
#endif

__device__ __forceinline__ void load_qk(const RecurrentParams& p, float (&q)[VPT][VEC], float (&k)[VPT][VEC], i64 qo,
                                        i64 ko, int lane) {
    const Q_T* qp = reinterpret_cast<const Q_T*>(p.q) + qo;
    const K_T* kp = reinterpret_cast<const K_T*>(p.k) + ko;
#pragma unroll
    for (int w = 0; w < VPT; ++w) {
        const int vi = lane + w * TPR;
#if QK_VEC
        if (vi < NVEC) {
            LD_IN_VEC(qp + vi * VEC, q[w]);
            LD_IN_VEC(kp + vi * VEC, k[w]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) q[w][e] = k[w][e] = 0.f;
        }
#else
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const int c = vi * VEC + e;
            const bool ok = c < KDIM;
            q[w][e] = ok ? to_f32(LD_IN(qp + (i64)c * p.qs.d)) : 0.f;
            k[w][e] = ok ? to_f32(LD_IN(kp + (i64)c * p.ks.d)) : 0.f;
        }
#endif
    }
}

#if SIGMOID
// g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), in f32 (semantics/gdn_conv.md §1.2);
// `a_log_e` = exp(A_log).
__device__ __forceinline__ void sigmoid_gates(const RecurrentParams& p, float av, float bv, float a_log_e, float dtb,
                                              float& g, float& beta) {
    const float x = av + dtb;
    const float bx = p.softplus_beta * x;
    const float sp = bx <= p.threshold ? (1.f / p.softplus_beta) * logf(1.f + expf(bx)) : x;
    g = -a_log_e * sp;
    beta = 1.f / (1.f + expf(-bv));
}
#endif

__device__ __forceinline__ void load_token(const RecurrentParams& p, TokIn& in, i64 seq, i64 bos, int t, int hv,
                                           int h, const int (&prow)[RPT], int lane, float a_log_e, float dtb) {
    load_qk(p, in.q, in.k, tok(p.qs, seq, bos, t) + (i64)h * p.qs.h, tok(p.ks, seq, bos, t) + (i64)h * p.ks.h, lane);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        const i64 pr = prow[r] < p.vdim ? prow[r] : 0;
        in.v[r] = to_f32(LD_IN(reinterpret_cast<const V_T*>(p.v) + tok(p.vs, seq, bos, t) + (i64)hv * p.vs.h + pr * p.vs.d));
#if !SIGMOID && HAS_BETA
        in.beta[r] = to_f32(ld_ro(reinterpret_cast<const BETA_T*>(p.beta) + tok(p.betas, seq, bos, t) + (i64)hv * p.betas.h + pr * p.betas.d));
#endif
    }
#if SIGMOID
    // g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), in f32 (semantics/gdn_conv.md §1.2).
    const float av = to_f32(ld_ro(reinterpret_cast<const A_T*>(p.a) + tok(p.as_, seq, bos, t) + (i64)hv * p.as_.h));
    const float bv = to_f32(ld_ro(reinterpret_cast<const B_T*>(p.b) + tok(p.bs, seq, bos, t) + (i64)hv * p.bs.h));
    float beta;
    sigmoid_gates(p, av, bv, a_log_e, dtb, in.g, beta);
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

// GDN_WIDE_STORE (on unless `SSM_CUDA_GDN_TUNE="wide=0"`, for the A/B): the recurrence's 16-byte
// state stores go through the intrinsic (`store16_wb`): its plain `uint4` stores came out as four
// 4-byte stores each (sm_90 SASS, NVRTC 13.5; 13.0 kept them whole). The step kernel's came out
// whole, and the intrinsic raised its bf16 spills from 12 to 60 bytes, so it keeps them.
#ifndef GDN_WIDE_STORE
#define GDN_WIDE_STORE 1
#endif
__device__ __forceinline__ void state_store16(void* p, const uint4& u) {
#if GDN_WIDE_STORE && !CONV_STEP
    store16_wb(p, u);
#else
    store16<false>(p, u);
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
                // f32 through `state_store16`; a 16-bit tile's plain stores kept their registers
                // better (no spill, against 40-48 bytes with the intrinsic).
                if constexpr (VEC * sizeof(T) == 16 && sizeof(T) == 4)
                    state_store16(base + elem(prow[r], vi * VEC, vdim), pack_vec<T>(s[r][w]));
                else
                    store_vec<VEC, T>(base + elem(prow[r], vi * VEC, vdim), s[r][w]);
#endif
            }
        }
}

// The RAW route's tile in storage form: the lane's 16-byte vectors of its rows of one head block
// (`base`), zero bits (0.0 in every float format) where `from_state` is false or outside the block.
__device__ __forceinline__ void load_raw_tile(const STATE_T* base, uint4 (&raw)[RPT][VPT], const int (&prow)[RPT],
                                              int lane, int vdim, bool from_state) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            raw[r][w] = make_uint4(0u, 0u, 0u, 0u);
            if (from_state && prow[r] < vdim && vi < NVEC) raw[r][w] = load16<false>(base + elem(prow[r], vi * VEC, vdim));
        }
}

__device__ __forceinline__ void store_raw_tile(STATE_T* base, const uint4 (&raw)[RPT][VPT], const int (&prow)[RPT],
                                               int lane, int vdim) {
#pragma unroll
    for (int r = 0; r < RPT; ++r)
#pragma unroll
        for (int w = 0; w < VPT; ++w) {
            const int vi = lane + w * TPR;
            if (prow[r] < vdim && vi < NVEC) state_store16(base + elem(prow[r], vi * VEC, vdim), raw[r][w]);
        }
}

// The lane's state tile: RPT rows of VPT 16-byte vectors in storage form (RAW), else in f32.
#if RAW
typedef uint4 Tile[RPT][VPT];
#define TILE_OF raw
#else
typedef float Tile[RPT][VPT][VEC];
#define TILE_OF s
#endif

// One token on the lane's rows of the tile: the l2norms, then per row S *= exp(g);
// u = β(v − S k); S += u kᵀ; y = S q (semantics/gdn_conv.md §1.1, §1.3). Scales `cur.q`/`cur.k`.
__device__ __forceinline__ void apply_token(const RecurrentParams& p, TokIn& cur, Tile& tile, float (&y)[RPT]) {
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
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
#if RAW
        float row[VPT][VEC];
#pragma unroll
        for (int w = 0; w < VPT; ++w) unpack_vec<STATE_T>(tile[r][w], row[w]);
#else
        float (&row)[VPT][VEC] = tile[r];
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
#if Y_SCATTER
        y[r] = acc;
#else
        y[r] = row_sum(acc);
#endif
#if RAW
#pragma unroll
        for (int w = 0; w < VPT; ++w) tile[r][w] = pack_vec<STATE_T>(row[w]);
#endif
    }
#if Y_SCATTER
    reduce_scatter<RPT, TPR, LANE_STRIDE>(y, row_lane());
#endif
}

#if MINB > 0
#define GDN_BOUNDS __launch_bounds__(NTHREADS, MINB)
#else
#define GDN_BOUNDS __launch_bounds__(NTHREADS)
#endif

#if !CONV_STEP
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
#if !PDL_WAIT
    load_token(p, cur, seq, bos, 0, hv, h, prow, lane, a_log_e, dtb);
#endif

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
    load_raw_tile(reinterpret_cast<const STATE_T*>(p.state) + src * p.state_row + hv * head_elems, raw, prow, lane,
                  p.vdim, from_state);
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

#if PDL_WAIT
    // Launched as the dependent of the conv that writes q, k and v (the decode step): the slot
    // and the state tile above were read while it ran; its writes are visible after the wait.
    pdl_wait();
    load_token(p, cur, seq, bos, 0, hv, h, prow, lane, a_log_e, dtb);
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
        float y[RPT];
        apply_token(p, cur, TILE_OF, y);
        store_rows(out + tok(p.os, seq, bos, t) + (i64)hv * p.os.h, p.os.d, prow, p.vdim, y);
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
    store_raw_tile(reinterpret_cast<STATE_T*>(p.state) + src * p.state_row + hv * head_elems, raw, prow, lane, p.vdim);
#elif !HAS_FINAL && HAS_STATE && SLOTS != 2
    // In place, once: to the slot read (1-D table) or row bos (no table).
    store_tile(reinterpret_cast<STATE_T*>(p.state) + src * p.state_row + hv * head_elems, s, prow, lane, p.vdim);
#endif
}

#else  // CONV_STEP

// ---- gdn_step_kernel: one decode step, conv update + gates + recurrence in one launch ----
//
// The RAW route (one token, in place, [V,K] 16-byte state vectors) with the conv update of
// the projected row folded in front (crates/ssm-gdn decode_step.rs: the step is the conv
// update, then fused_sigmoid_gating_delta_rule_update on its output). Extra macros:
//   CELEM_T CI_T WIDTH HAS_CI HAS_PAD HAS_BIAS SILU   as in conv.cu
// Block (seq, hv, tile) computes the conv of the 2·K q/k channels of its q/k head h and of the
// V channels of its tile, into shared memory, rounded to CELEM_T as the conv stores them (so the
// recurrence sees exactly the values the two-call path reads back). It writes the conv output
// (q/k channels: the first block of head h only) and the new conv state of its own V channels.
// The q/k channels' conv state is read by every block of (seq, h), so it is written by the last
// of them to arrive: each block, once the values it read are consumed, adds 1 to
// counters[seq·H + h] and runs its recurrence while the atomic returns; the one whose ticket is
// group·tiles − 1 then shifts that state in place and sets the counter back to 0 (nothing waits
// for another block, so the grid needs no co-residency).
// A sequence whose conv is skipped (pad, bad slot) reads q/k/v from `out`, as the two calls do.

// Mirrored by `StepParams` in crates/ssm-cuda/src/gdn.rs.
struct StepParams {
    RecurrentParams r;
    ConvParams c;
    u64 counters;  // u32 per (sequence, q/k head)
    i64 hk;        // H·K: the first k channel (v channels start at 2·H·K)
};

#define QK_PER_THREAD ((2 * KDIM + NTHREADS - 1) / NTHREADS)

// One channel of the conv at slot `slot`: its window (state columns 0..WIDTH−2) into `win`,
// its input into `xv`; returns the output before rounding (conv.cu's arithmetic).
__device__ __forceinline__ float conv_channel(const ConvParams& c, i64 seq, i64 slot, i64 ch, float (&win)[WIDTH - 1],
                                              float& xv) {
    const CELEM_T* st = reinterpret_cast<const CELEM_T*>(c.state) + slot * c.st_slot + ch * c.st_dim;
#pragma unroll
    for (int j = 0; j < WIDTH - 1; ++j) win[j] = to_f32(st[j * c.st_col]);
    xv = to_f32(ld_ro(reinterpret_cast<const CELEM_T*>(c.x) + seq * c.x_seq + ch * c.x_dim));
    const CELEM_T* wp = reinterpret_cast<const CELEM_T*>(c.w) + ch * c.w_dim;
#if HAS_BIAS
    float acc = to_f32(ld_ro(reinterpret_cast<const CELEM_T*>(c.bias) + ch * c.b_dim));
#else
    float acc = 0.f;
#endif
#pragma unroll
    for (int j = 0; j < WIDTH - 1; ++j) acc = conv_mac<CELEM_T>(win[j], to_f32(ld_ro(wp + j * c.w_tap)), acc);
    acc = conv_mac<CELEM_T>(xv, to_f32(ld_ro(wp + (WIDTH - 1) * c.w_tap)), acc);
#if SILU
    acc = silu_triton(acc);
#endif
    return acc;
}

// The new window of one channel (history[1..] ++ x) to state columns 0..WIDTH−2, each element
// copied bit for bit (`FromF32::copy`), as the reference copies them.
__device__ __forceinline__ void conv_store_window(const ConvParams& c, i64 slot, i64 ch, const float (&win)[WIDTH - 1],
                                                  float xv) {
    CELEM_T* st = reinterpret_cast<CELEM_T*>(c.state) + slot * c.st_slot + ch * c.st_dim;
#pragma unroll
    for (int j = 0; j < WIDTH - 2; ++j) st[j * c.st_col] = FromF32<CELEM_T>::copy(win[j + 1]);
    st[(WIDTH - 2) * c.st_col] = FromF32<CELEM_T>::copy(xv);
}

// The recurrence of one decode step on the block's tile (gdn_recurrent_kernel's RAW route) with
// q/k/v from shared memory: the output rows, then the tile back in place.
__device__ __forceinline__ void step_recurrence(const RecurrentParams& p, i64 seq, int hv, int lane,
                                                const int (&prow)[RPT], i64 v0, const float* s_qk, const float* s_v,
                                                float av, float bv, float a_log_e, float dtb, STATE_T* sbase,
                                                uint4 (&raw)[RPT][VPT]) {
    TokIn cur;
#pragma unroll
    for (int w = 0; w < VPT; ++w) {
        const int vi = lane + w * TPR;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
            const bool ok = vi < NVEC;
            cur.q[w][e] = ok ? s_qk[vi * VEC + e] : 0.f;
            cur.k[w][e] = ok ? s_qk[KDIM + vi * VEC + e] : 0.f;
        }
    }
    float beta;
    sigmoid_gates(p, av, bv, a_log_e, dtb, cur.g, beta);
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        cur.v[r] = prow[r] < p.vdim ? s_v[prow[r] - v0] : 0.f;
        cur.beta[r] = beta;
    }
    float y[RPT];
    apply_token(p, cur, raw, y);
    store_rows(reinterpret_cast<O_T*>(p.o) + seq * p.os.b + (i64)hv * p.os.h, p.os.d, prow, p.vdim, y);
    store_raw_tile(sbase, raw, prow, lane, p.vdim);
}

// The same, read back from the state in place (the last block of (seq, h), for the q/k
// channels whose state no other block writes): columns shift down by one, x goes last.
__device__ __forceinline__ void conv_shift_window(const ConvParams& c, i64 seq, i64 slot, i64 ch) {
    CELEM_T* st = reinterpret_cast<CELEM_T*>(c.state) + slot * c.st_slot + ch * c.st_dim;
#pragma unroll
    for (int j = 0; j < WIDTH - 2; ++j) st[j * c.st_col] = st[(j + 1) * c.st_col];
    st[(WIDTH - 2) * c.st_col] = ld_ro(reinterpret_cast<const CELEM_T*>(c.x) + seq * c.x_seq + ch * c.x_dim);
}

extern "C" __global__ void GDN_BOUNDS gdn_step_kernel(const StepParams sp) {
    const RecurrentParams& p = sp.r;
    const ConvParams& c = sp.c;
    const int lane = threadIdx.x % TPR;
    const int row_group = threadIdx.x / TPR;
    i64 seq;
    int hv, tile;
    split_block(p.split, blockIdx.x, seq, hv, tile);
    const int h = hv / p.group;
    const i64 v0 = (i64)tile * DIM_TILE;

    // ---- slots and gates, all loads issued first ----
#if HAS_CI
    const i64 cslot = load_index(reinterpret_cast<const CI_T*>(c.ci) + seq * c.ci_seq);
#else
    const i64 cslot = seq;
#endif
#if SLOTS == 1
    const i64 src = load_index(reinterpret_cast<const IX_T*>(p.ix) + seq * p.ix_seq);
#else
    const i64 src = seq;
#endif
    const float a_log_e = expf(to_f32(ld_ro(reinterpret_cast<const ALOG_T*>(p.a_log) + (i64)hv * p.a_log_s)));
    const float dtb = to_f32(ld_ro(reinterpret_cast<const DTB_T*>(p.dt_bias) + (i64)hv * p.dtb_s));
    const float av = to_f32(ld_ro(reinterpret_cast<const A_T*>(p.a) + seq * p.as_.b + (i64)hv * p.as_.h));
    const float bv = to_f32(ld_ro(reinterpret_cast<const B_T*>(p.b) + seq * p.bs.b + (i64)hv * p.bs.h));

    // The recurrence's start state: in flight while the conv runs.
    bool rule_runs = true;
#if SLOTS == 1
    if (src <= 0) rule_runs = false;  // null block: no output, no state
#endif
    if (rule_runs && src >= p.state_rows) {
        rule_runs = false;
        if (threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(p.err), ERR_SLOT);
    }
    int prow[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) prow[r] = (int)v0 + r * ROW_GROUPS + row_group;
    const i64 head_elems = (i64)KDIM * p.vdim;
    STATE_T* sbase = reinterpret_cast<STATE_T*>(p.state) + (rule_runs ? src : 0) * p.state_row + hv * head_elems;
    uint4 raw[RPT][VPT];
    load_raw_tile(sbase, raw, prow, lane, p.vdim, rule_runs);

    // ---- the conv ----
    bool conv_runs = true;
    if (HAS_PAD && HAS_CI && cslot == c.pad) {
        conv_runs = false;  // pad: the conv writes nothing for this sequence
    } else if (cslot < 0 || cslot >= c.slots) {
        conv_runs = false;
        if (threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(c.err), ERR_SLOT);
    }
    __shared__ float s_qk[2 * KDIM];
    __shared__ float s_v[DIM_TILE];
    __shared__ int s_last;
    CELEM_T* cout = reinterpret_cast<CELEM_T*>(c.out) + seq * c.out_seq;
    const i64 vch0 = 2 * sp.hk + (i64)hv * p.vdim + v0;  // channel of row v0
    u32 ticket = 0;
    if (conv_runs) {
        const bool qk_writer = hv % p.group == 0 && tile == 0;
#pragma unroll
        for (int i = 0; i < QK_PER_THREAD; ++i) {
            const int idx = threadIdx.x + i * NTHREADS;
            if (idx < 2 * KDIM) {
                const i64 ch = idx < KDIM ? (i64)h * KDIM + idx : sp.hk + (i64)h * KDIM + (idx - KDIM);
                float win[WIDTH - 1], xq;
                const CELEM_T y = from_f32<CELEM_T>(conv_channel(c, seq, cslot, ch, win, xq));
                s_qk[idx] = to_f32(y);
                if (qk_writer) cout[ch * c.out_dim] = y;
            }
        }
        // This tile's V channels belong to this block alone: their state is written at once.
        for (int i = threadIdx.x; i < DIM_TILE; i += NTHREADS) {
            if (v0 + i < p.vdim) {
                float w2[WIDTH - 1], xv;
                const i64 ch = vch0 + i;
                const CELEM_T y = from_f32<CELEM_T>(conv_channel(c, seq, cslot, ch, w2, xv));
                s_v[i] = to_f32(y);
                cout[ch * c.out_dim] = y;
                conv_store_window(c, cslot, ch, w2, xv);
            }
        }
        __syncthreads();
        // Every q/k state value this block read is consumed (in shared memory): arrive now;
        // the ticket is looked at after the recurrence, so its round trip overlaps it.
        if (threadIdx.x == 0) ticket = atomicAdd(reinterpret_cast<u32*>(sp.counters) + seq * p.heads + h, 1u);
    } else {
        // The conv skipped this sequence (no block of it writes `out`): q, k and v are what
        // `out` holds, as the recurrence of the two-call path reads them.
        for (int idx = threadIdx.x; idx < 2 * KDIM; idx += NTHREADS) {
            const i64 ch = idx < KDIM ? (i64)h * KDIM + idx : sp.hk + (i64)h * KDIM + (idx - KDIM);
            s_qk[idx] = to_f32(cout[ch * c.out_dim]);
        }
        for (int i = threadIdx.x; i < DIM_TILE; i += NTHREADS)
            if (v0 + i < p.vdim) s_v[i] = to_f32(cout[(vch0 + i) * c.out_dim]);
        __syncthreads();
    }

    if (rule_runs) step_recurrence(p, seq, hv, lane, prow, v0, s_qk, s_v, av, bv, a_log_e, dtb, sbase, raw);

    // ---- the q/k channels' new conv state, by the last block of (seq, h) to arrive ----
    if (conv_runs) {
        if (threadIdx.x == 0) {
            const bool last = ticket == (u32)p.group * p.split.tiles - 1;
            if (last) {
                // Every other block of (seq, h) has read the old state. Reset the counter for
                // the next launch and order the writes below after the arrivals.
                atomicExch(reinterpret_cast<u32*>(sp.counters) + seq * p.heads + h, 0u);
                __threadfence();
            }
            s_last = last;
        }
        __syncthreads();
        if (s_last) {
#pragma unroll
            for (int i = 0; i < QK_PER_THREAD; ++i) {
                const int idx = threadIdx.x + i * NTHREADS;
                if (idx < 2 * KDIM) {
                    const i64 ch = idx < KDIM ? (i64)h * KDIM + idx : sp.hk + (i64)h * KDIM + (idx - KDIM);
                    conv_shift_window(c, seq, cslot, ch);
                }
            }
        }
    }
}

#endif  // CONV_STEP

#endif
