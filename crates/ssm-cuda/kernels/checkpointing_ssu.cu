// ReplaySSM's checkpointing SSU (semantics/ssu.md §7.2–7.3; the arithmetic of the CPU backend's
// crates/ssm-cpu/src/ring.rs), specialised at NVRTC time by -D macros (see
// crates/ssm-cuda/src/ring.rs):
//
//   STATE_T XC_T BC_T X_T DT_T A_T B_T C_T D_T DTB_T Z_T OUT_T   f32 / f16_t / bf16_t
//   SBI_T CU_T RS_T PN_T                                        int / i64 (index tables)
//   DSTATE NTHREADS                                             state size, threads per block
//   CKPT_MINB                                                   blocks per SM (launch bounds)
//   TPR VEC RB                                                  lanes per state row, elements per
//       lane vector (VEC > 1: every state row 16-byte aligned, DSTATE a multiple of TPR·VEC: one
//       16-byte access per vector), rows each row group holds at once
//   CKPT_SCATTER CKPT_WIDE_C                                    0/1: the one-pass output (sums
//       reduced and scattered over the row group), the C values read as 16-byte vectors
//   HAS_Z HAS_D HAS_DTB DT_SOFTPLUS HAS_SBI HAS_PAD VARLEN      0/1
//
// One block owns one (sequence, head). It gathers the live history (k ring rows from
// ring_start) and the n new tokens into shared memory as f32 (dt processed: bias, softplus),
// takes the prefix sums cum_j = A·Σ_{i<=j} dt_i over the m = k + n rows, and uses the closed
// form rather than a token-by-token replay:
// - no flush (m <= W): y_t = e^{cum_t}·(C_t·S0) + Σ_{j<=t} e^{cum_t − cum_j}·dt_j·(C_t·B_j)·x_j,
//   reading the checkpoint S0 once and writing no state (ReplaySSM's saving);
// - flush: S_k = e^{cum_{k−1}}·S0 + Σ_{j<k} e^{cum_{k−1} − cum_j}·dt_j·x_j ⊗ B_j is stored, and
//   the outputs use S_k (unrounded) plus the new tokens' terms.
// Then + D·x, the z gate, and the new tokens are appended at ring rows (start + k + i) % L (x
// and dt per head; B by the group's first head). Appended rows are never live rows (k + n <=
// L), so the appends race with no other head's reads.
//
// Phases, each behind a barrier: (1) gather the rows into shared memory (a warp per row, lanes
// over its columns); (2) the prefix sums; (3) the flush weights, the token scales and the
// C_t·B_j weights (a warp per pair); (4) the history terms Σ_j w_tj·x_j + D·x of every (token,
// head-dim) pair, a thread each; (5) the state: groups of TPR lanes own RB head-dim rows at a
// time (all their loads issued before any use), fold the history in on a flush and store it,
// and reduce C_t·S over the group for each token; (6) append the new rows to the ring.
//
// Index values are checked here: a pad sequence writes nothing (not even out); a slot outside
// [0, cache), cu_seqlens out of order or a sequence longer than its window, and cursors outside
// the ring (ring_start outside [0, L), prev_num_accepted_tokens outside [0, W]) skip the
// sequence and OR a bit into the device error word.

#define NWARPS (NTHREADS / 32)
#define NGROUPS (NTHREADS / TPR)
#define NVEC ((DSTATE + TPR * VEC - 1) / (TPR * VEC))  // vectors per lane
#define EPL (NVEC * VEC)                                // state values per lane and row

// Mirrored by `CkptParams` in crates/ssm-cuda/src/ring.rs (same order, no padding). Strides
// are in elements; addresses include each tensor's element offset; every last axis (dim or
// dstate) has stride 1 (the plan's rule).
struct CkptParams {
    u64 state, xc, bc, dtc, rs, pn, x, dt, a, b, c, d, dtb, z, out, sbi, cu, err;
    i64 st_slot, st_head, st_dim;
    i64 xc_slot, xc_head, xc_row;
    i64 bc_slot, bc_group, bc_row;
    i64 dtc_slot, dtc_head, dtc_row;
    i64 x_seq, x_tok, x_head;
    i64 dt_seq, dt_tok, dt_head;
    i64 b_seq, b_tok, b_group;
    i64 c_seq, c_tok, c_group;
    i64 z_seq, z_tok, z_head;
    i64 out_seq, out_tok, out_head;
    i64 a_head, d_head, d_dim, dtb_head;
    i64 sbi_s, cu_s, rs_s, pn_s;
    i64 cache, pad, total;
    int heads, tokens, dim, ring_len, window, heads_per_group;
};

__device__ __forceinline__ void raise_error(const CkptParams& p, u32 bit) {
    if (threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(p.err), bit);
}

// Column of value e (< EPL) of lane `g` (< TPR) of a row group.
__device__ __forceinline__ int column(int g, int e) { return (g + TPR * (e / VEC)) * VEC + e % VEC; }

// Lane `g`'s EPL values of the f32 shared row `r` (B or C), in `column` order: with WIDE,
// 16-byte loads where the lane's vectors are whole float4s (VEC a multiple of 4: DSTATE is then
// a multiple of TPR·VEC and every row starts on 16 bytes), else one value at a time, 0 past
// DSTATE. The flush loop reads B one value at a time: with 16-byte reads there the bf16-state
// kernel spills (188 bytes at 64 registers, NVRTC 13.5, sm_90); the token loop's C reads do not.
template <bool WIDE> __device__ __forceinline__ void lane_values(const float* r, int g, float* v) {
#pragma unroll
    for (int w = 0; w < NVEC; ++w) {
        if (WIDE && VEC % 4 == 0) {
#pragma unroll
            for (int u = 0; u < VEC; u += 4) {
                const float4 f = *reinterpret_cast<const float4*>(r + column(g, w * VEC) + u);
                v[w * VEC + u] = f.x;
                v[w * VEC + u + 1] = f.y;
                v[w * VEC + u + 2] = f.z;
                v[w * VEC + u + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const int c = column(g, w * VEC + e);
                v[w * VEC + e] = c < DSTATE ? r[c] : 0.f;
            }
        }
    }
}

// RB_SCATTER: each token's RB row sums reduced and scattered over the row group
// (`reduce_scatter`, common.cuh), one writer lane per row in one pass; where RB is a power of
// two up to TPR.
#ifndef CKPT_SCATTER
#define CKPT_SCATTER 1
#endif
#ifndef CKPT_WIDE_C
#define CKPT_WIDE_C 1
#endif
#define RB_SCATTER (CKPT_SCATTER && (RB & (RB - 1)) == 0 && RB <= TPR)

#ifndef CKPT_MINB
#define CKPT_MINB 4
#endif

extern "C" __global__ void __launch_bounds__(NTHREADS, CKPT_MINB) checkpointing_ssu_kernel(const CkptParams p) {
    extern __shared__ float sm[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int b = (int)(blockIdx.x / (u32)p.heads);
    const int h = (int)(blockIdx.x - (u32)b * (u32)p.heads);
    const int g = h / p.heads_per_group;
    const int P = p.dim, L = p.ring_len, T = p.tokens;

    i64 slot = b;
#if HAS_SBI
    slot = load_index((const SBI_T*)p.sbi + (i64)b * p.sbi_s);
#if HAS_PAD
    if (slot == p.pad) return;
#endif
    if (slot < 0 || slot >= p.cache) {
        raise_error(p, ERR_SLOT);
        return;
    }
#endif
    i64 seq = b, tok0 = 0;
    int n = T;
#if VARLEN
    {
        const i64 s0 = load_index((const CU_T*)p.cu + (i64)b * p.cu_s);
        const i64 s1 = load_index((const CU_T*)p.cu + (i64)(b + 1) * p.cu_s);
        if (s0 < 0 || s1 < s0 || s1 > p.total || s1 - s0 > T) {
            raise_error(p, ERR_CU_SEQLENS);
            return;
        }
        seq = 0;
        tok0 = s0;
        n = (int)(s1 - s0);
    }
#endif
    if (n == 0) return;
    const i64 start = load_index((const RS_T*)p.rs + slot * p.rs_s);
    const i64 k64 = load_index((const PN_T*)p.pn + slot * p.pn_s);
    if (start < 0 || start >= L || k64 < 0 || k64 > p.window) {
        raise_error(p, ERR_CURSOR);
        return;
    }
    const int k = (int)k64, m = k + n, st0 = (int)start;
    const bool flush = m > p.window;

    // Shared layout (f32), the big arrays first so that B and C rows stay 16-byte aligned
    // (DSTATE is a multiple of 4 wherever VEC > 1). Mirrored by `ckpt_shared_floats`.
    float* bs = sm;                 // [L][DSTATE]
    float* cs = bs + L * DSTATE;    // [T][DSTATE]
    float* xs = cs + T * DSTATE;    // [L][P]
    float* yh = xs + L * P;         // [T][P] history terms
    float* wt = yh + T * P;         // [T][L] C_t·B_j weights
    float* dts = wt + T * L;        // [L]
    float* cum = dts + L;           // [L]
    float* fw = cum + L;            // [L] flush weights
    float* sc = fw + L;             // [T] token scales

    // (1) Gather: history rows from the ring, new tokens from the inputs; a warp per row.
    const float* dtc = (const float*)p.dtc + slot * p.dtc_slot + h * p.dtc_head;
    const XC_T* xc = (const XC_T*)p.xc + slot * p.xc_slot + h * p.xc_head;
    const X_T* x = (const X_T*)p.x + seq * p.x_seq + h * p.x_head;
    const BC_T* bc = (const BC_T*)p.bc + slot * p.bc_slot + g * p.bc_group;
    const B_T* bt = (const B_T*)p.b + seq * p.b_seq + g * p.b_group;
    const C_T* ct = (const C_T*)p.c + seq * p.c_seq + g * p.c_group;
    for (int j = warp; j < m; j += NWARPS) {
        float* xr = xs + j * P;
        float* br = bs + j * DSTATE;
        if (j < k) {
            int r = st0 + j;
            if (r >= L) r -= L;
            const XC_T* xsrc = xc + r * p.xc_row;
            const BC_T* bsrc = bc + r * p.bc_row;
            for (int q = lane; q < P; q += 32) xr[q] = to_f32(xsrc[q]);
            for (int e = lane; e < DSTATE; e += 32) br[e] = to_f32(bsrc[e]);
            if (lane == 0) dts[j] = dtc[r * p.dtc_row];
        } else {
            const i64 tok = tok0 + (j - k);
            const X_T* xsrc = x + tok * p.x_tok;
            const B_T* bsrc = bt + tok * p.b_tok;
            const C_T* csrc = ct + tok * p.c_tok;
            float* cr = cs + (j - k) * DSTATE;
            for (int q = lane; q < P; q += 32) xr[q] = to_f32(xsrc[q]);
            for (int e = lane; e < DSTATE; e += 32) {
                br[e] = to_f32(bsrc[e]);
                cr[e] = to_f32(csrc[e]);
            }
            if (lane == 0) {
                float v = to_f32(((const DT_T*)p.dt)[seq * p.dt_seq + tok * p.dt_tok + h * p.dt_head]);
#if HAS_DTB
                v += to_f32(((const DTB_T*)p.dtb)[h * p.dtb_head]);
#endif
#if DT_SOFTPLUS
                v = v <= 20.f ? log1pf(expf(v)) : v;
#endif
                dts[j] = v;
            }
        }
    }
    __syncthreads();
    // (2) Prefix sums, unfused, as the CPU backend sums.
    if (tid == 0) {
        const float a = to_f32(((const A_T*)p.a)[h * p.a_head]);
        float acc = 0.f;
        for (int j = 0; j < m; ++j) {
            acc = __fadd_rn(acc, __fmul_rn(a, dts[j]));
            cum[j] = acc;
        }
    }
    __syncthreads();
    // (3) Weights.
    const int first = flush ? k : 0;
    const float base = (flush && k > 0) ? cum[k - 1] : 0.f;
    for (int j = tid; j < k; j += NTHREADS) fw[j] = expf(cum[k - 1] - cum[j]) * dts[j];
    for (int t = tid; t < n; t += NTHREADS) sc[t] = expf(cum[k + t] - base);
    for (int pr = warp; pr < n * m; pr += NWARPS) {
        const int t = pr / m, j = pr - t * m;
        float d = 0.f;
        if (j >= first && j <= k + t) {
            for (int e = lane; e < DSTATE; e += 32) d = fmaf(cs[t * DSTATE + e], bs[j * DSTATE + e], d);
            d = butterfly_sum<32>(d);
        }
        if (lane == 0) wt[t * L + j] = (j >= first && j <= k + t) ? expf(cum[k + t] - cum[j]) * dts[j] * d : 0.f;
    }
    __syncthreads();
    // (4) History terms and D·x of every (token, head-dim) pair.
    for (int i = tid; i < n * P; i += NTHREADS) {
        const int t = i / P, q = i - t * P;
        float y = 0.f;
        for (int j = first; j <= k + t; ++j) y = fmaf(wt[t * L + j], xs[j * P + q], y);
#if HAS_D
        y = fmaf(to_f32(((const D_T*)p.d)[h * p.d_head + q * p.d_dim]), xs[(k + t) * P + q], y);
#endif
        yh[i] = y;
    }
    __syncthreads();

    // (5) The state, RB rows per row group at a time.
    const int grp = tid / TPR, gl = tid - grp * TPR;
    STATE_T* st = (STATE_T*)p.state + slot * p.st_slot + h * p.st_head;
    const float decay = expf(base);
    // The trip count is the same for every group (rows past P are masked), so that the group
    // reductions below always have their whole warp.
    for (int qb = 0; qb < P; qb += NGROUPS * RB) {
        const int q0 = qb + grp * RB;
        float s[RB][EPL];
#pragma unroll
        for (int r = 0; r < RB; ++r) {
            const int q = q0 + r;
            const STATE_T* row = st + (i64)q * p.st_dim;
#pragma unroll
            for (int v = 0; v < NVEC; ++v) {
                const int c = column(gl, v * VEC);
                if (VEC > 1) {
                    if (q < P) load_vec<VEC, STATE_T>(row + c, &s[r][v * VEC]);
                    else {
#pragma unroll
                        for (int e = 0; e < VEC; ++e) s[r][v * VEC + e] = 0.f;
                    }
                } else {
                    s[r][v] = (q < P && c < DSTATE) ? to_f32(row[c]) : 0.f;
                }
            }
        }
        if (flush) {
#pragma unroll
            for (int r = 0; r < RB; ++r) {
#pragma unroll
                for (int e = 0; e < EPL; ++e) s[r][e] *= decay;
            }
            for (int j = 0; j < k; ++j) {
                const float* br = bs + j * DSTATE;
                float bv[EPL];
                lane_values<false>(br, gl, bv);
#pragma unroll
                for (int r = 0; r < RB; ++r) {
                    const int q = q0 + r;
                    const float w = q < P ? fw[j] * xs[j * P + q] : 0.f;
#pragma unroll
                    for (int e = 0; e < EPL; ++e) s[r][e] = fmaf(w, bv[e], s[r][e]);
                }
            }
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int q = q0 + r;
                if (q >= P) continue;
                STATE_T* row = st + (i64)q * p.st_dim;
#pragma unroll
                for (int v = 0; v < NVEC; ++v) {
                    const int c = column(gl, v * VEC);
                    if (VEC > 1) {
                        store_vec<VEC, STATE_T>(row + c, &s[r][v * VEC]);
                    } else if (c < DSTATE) {
                        row[c] = from_f32<STATE_T>(s[r][v]);
                    }
                }
            }
        }
        for (int t = 0; t < n; ++t) {
            float cv[EPL];
            lane_values<CKPT_WIDE_C != 0>(cs + t * DSTATE, gl, cv);
            float acc[RB];
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                acc[r] = 0.f;
#pragma unroll
                for (int e = 0; e < EPL; ++e) acc[r] = fmaf(s[r][e], cv[e], acc[r]);
            }
            // Row q's output: its sum, the token's scale, the history terms and the z gate.
            const auto emit = [&](float sum, int q) {
                float y = sc[t] * sum + yh[t * P + q];
                const i64 tok = tok0 + t;
#if HAS_Z
                const float zv = to_f32(((const Z_T*)p.z)[seq * p.z_seq + tok * p.z_tok + h * p.z_head + q]);
                y *= zv / (1.f + expf(-zv));
#endif
                ((OUT_T*)p.out)[seq * p.out_seq + tok * p.out_tok + h * p.out_head + q] = from_f32<OUT_T>(y);
            };
#if RB_SCATTER
            // One writer lane per row, all RB rows' writers in one pass (not RB divergent ones).
            reduce_scatter<RB, TPR>(acc, gl);
            const int q = q0 + gl / (TPR / RB);
            if (gl % (TPR / RB) == 0 && q < P) emit(acc[0], q);
#else
#pragma unroll
            for (int r = 0; r < RB; ++r) acc[r] = butterfly_sum<TPR>(acc[r]);
#pragma unroll
            for (int r = 0; r < RB; ++r) {
                const int q = q0 + r;
                if (q < P && gl == r % TPR) emit(acc[r], q);
            }
#endif
        }
    }

    // (6) Append the new tokens after the live window, on both branches.
    XC_T* xcw = (XC_T*)p.xc + slot * p.xc_slot + h * p.xc_head;
    float* dtcw = (float*)p.dtc + slot * p.dtc_slot + h * p.dtc_head;
    BC_T* bcw = (BC_T*)p.bc + slot * p.bc_slot + g * p.bc_group;
    const bool writes_b = h % p.heads_per_group == 0;
    for (int t = warp; t < n; t += NWARPS) {
        int r = st0 + k + t;
        if (r >= L) r -= L;
        const float* xr = xs + (k + t) * P;
        for (int q = lane; q < P; q += 32) xcw[r * p.xc_row + q] = from_f32<XC_T>(xr[q]);
        if (lane == 0) dtcw[r * p.dtc_row] = dts[k + t];
        if (writes_b) {
            const float* br = bs + (k + t) * DSTATE;
            for (int e = lane; e < DSTATE; e += 32) bcw[r * p.bc_row + e] = from_f32<BC_T>(br[e]);
        }
    }
}
