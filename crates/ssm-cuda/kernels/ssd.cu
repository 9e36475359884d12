// Mamba2 SSD chunked prefill (vLLM `mamba_chunk_scan_combined_varlen`), the five stages of
// semantics/ssd_mamba2.md §1.1 as four kernels over the f32 scratch of `SsdPlan::scratch`
// (the CPU backend's passes, crates/ssm-cpu/src/ssd.rs, in the same order):
//
// - `ssd_state_kernel`, per (chunk, head, 64×64 tile of the state): stage 1 (processed dt,
//   zero past the chunk's end, and its A-scaled inclusive prefix sum; tile 0 stores both rows)
//   and stage 2, the chunk's own state Xᵀ·(w ⊙ B) on tensor cores;
// - `ssd_cb_kernel`, per (chunk, group, 64×64 tile on or below the diagonal): stage 4,
//   CB = C·Bᵀ on tensor cores;
// - `ssd_pass_kernel`, per (sequence, head, 2048 state elements): stage 3, the end state of
//   every chunk in place, S = exp(dA_last)·S + states[c], from the sequence's initial state;
// - `ssd_scan_kernel`, per (chunk, head, 64 rows × 64 head-dim columns): stage 5,
//   y = exp(dA_i)·C·S_inᵀ + (CB ⊙ decay ⊙ dt)·X + D·x, gated, on tensor cores;
// - `ssd_final_kernel`, per (sequence, head, 2048 state elements): each sequence's final state
//   into `varlen_states` and its `ssm_state` slot, after every read of an initial state.
//
// Matrix products use `mma.sync` (m16n8k16 with bf16 or f16 operands, m16n8k8 with tf32 for
// f32 inputs, as Triton's `tl.dot` does on sm_80+) with f32 accumulation. Operands are rounded
// to the operand type where vLLM's kernels round them (w ⊙ B and the causal weights to the
// input type, the entering state to C's type). Device-resident metadata and slot tables are
// checked here: a chunk whose bounds are out of range runs as empty (ERR_CU_SEQLENS), a
// sequence index or slot out of range is skipped (ERR_CU_SEQLENS / ERR_SLOT); no access leaves
// the views the plan checked.
//
// Macros (crates/ssm-cuda/src/ssd.rs, `SsdKey::spec`): X_T DT_T A_T B_T C_T Z_T OUT_T D_T BIAS_T
// INIT_T ST_T (element types), CU_T SEQ_T LAST_T II_T HI_T FI_T (index types), OP_KIND (0 bf16,
// 1 f16, 2 tf32), flags HAS_Z HAS_D HAS_BIAS SOFTPLUS INIT_MODE (0 none, 1 initial_states,
// 2 pool) HAS_HAS HAS_FINAL HAS_PAD HAS_VARLEN INTERMEDIATE, and X_VEC B_VEC C_VEC (x, B, C
// rows loadable eight elements at a time: token and head/group strides multiples of 8, base
// 16-byte aligned).

#define TILE 64
#define KT 32
#define THREADS 128
#define QCAP 256

struct SsdParams {
    u64 x, dt, a, b, c, z, out, d, dt_bias, init, pool, varlen, init_idx, has_init, final_idx;
    u64 cu_chunk, seq_idx, last_chunk, ws, err;
    i64 x_t, x_h, dt_t, dt_h, a_h, b_t, b_g, c_t, c_g, z_t, z_h, out_t, out_h, d_h, d_p, bias_h;
    i64 init_b, init_h, init_p, pool_s, pool_h, pool_p, vs_r, vs_h, vs_p;
    i64 ii_s, hi_s, fi_s, cu_s, seq_s, last_s;
    i64 pad, slots;
    i64 ws_dt, ws_da, ws_states, ws_cb;
    int tokens, heads, dim, dstate, groups, nchunks, batch, chunk_rows, q_row, state_row, ratio, ntiles_n;
    float lo, hi;
};


// ---------------------------------------------------------------------------------------------
// Operand type and one warp's 32×32 tile of mma.sync products.

#if OP_KIND == 2
typedef float op_st;   // tf32 operands kept as f32 bits in shared memory
#define KSTEP 8
#define LDS (KT + 4)
#else
typedef unsigned short op_st;
#define KSTEP 16
#define LDS (KT + 8)
#endif

// Two consecutive operands (k and k + 1 of one row) into shared memory, rounded to the operand
// type (one `cvt.rn.{bf16,f16}x2.f32` and one 32-bit store; `dst` 4-byte aligned).
__device__ __forceinline__ void store_pair(op_st* dst, float a, float b) {
#if OP_KIND == 2
    dst[0] = a;
    dst[1] = b;
#elif OP_KIND == 0
    *reinterpret_cast<u32*>(dst) = pack2<bf16_t>(a, b);
#else
    *reinterpret_cast<u32*>(dst) = pack2<f16_t>(a, b);
#endif
}

// exp(x) for x = y·log2(e) given as y·log2(e): one `ex2.approx` (Triton's `fast_exp`, which
// vLLM's SSD kernels use for the decays).
__device__ __forceinline__ float exp2_fast(float y) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}
#define LOG2E 1.4426950408889634f


// Eight consecutive elements [col, col + 8) of row `row` of a row-major matrix (`base +
// row·stride`), as f32: one vector load (`load_vec_ro`: 16 bytes for 16-bit types) when VEC
// (strides and base 16-byte aligned, checked by the host) and all eight lie inside `limit`
// columns, else element by element; zeros for a row at or past `rows` and for columns at or
// past `limit`.
template <bool VEC, typename T>
__device__ __forceinline__ void load8(const T* base, int row, int rows, i64 stride, int col, int limit, float* out) {
    if (row >= rows) {
#pragma unroll
        for (int c = 0; c < 8; ++c) out[c] = 0.f;
        return;
    }
    const T* ptr = base + (i64)row * stride + col;
    if (VEC && col + 8 <= limit) {
        load_vec_ro<8, T>(ptr, out);
        return;
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) out[c] = col + c < limit ? to_f32(ptr[c]) : 0.f;
}

// Eight operands of one row (k .. k + 7) into shared memory, rounded to the operand type
// (`dst` 16-byte aligned): one 16-byte store (two for tf32).
__device__ __forceinline__ void store8(op_st* dst, const float* v) {
#if OP_KIND == 2
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
#elif OP_KIND == 0
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack2<bf16_t>(v[0], v[1]), pack2<bf16_t>(v[2], v[3]), pack2<bf16_t>(v[4], v[5]), pack2<bf16_t>(v[6], v[7]));
#else
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack2<f16_t>(v[0], v[1]), pack2<f16_t>(v[2], v[3]), pack2<f16_t>(v[4], v[5]), pack2<f16_t>(v[6], v[7]));
#endif
}

// One thread's share of a transposed TILE × KT operand tile: rows (tokens) k0 + ip and
// k0 + ip + 1 of a row-major [tokens][columns] matrix, eight columns c0 .. c0 + 7 of each
// (two vector loads), stored as eight pairs in shared-memory rows c0 .. c0 + 7 (k contiguous),
// each row scaled by its weight. `ip` runs fastest across the threads, so that the eight
// 32-bit stores of a warp fall in distinct banks.
template <bool VEC, typename T>
__device__ __forceinline__ void fill_transposed(op_st* dst, const T* base, int k0, int rows, i64 stride, int col0,
                                                int limit, float w0, float w1) {
    const int ip = (threadIdx.x % (KT / 2)) * 2, c0 = (threadIdx.x / (KT / 2)) * 8;
    float a[8], b[8];
    load8<VEC>(base, k0 + ip, rows, stride, col0 + c0, limit, a);
    load8<VEC>(base, k0 + ip + 1, rows, stride, col0 + c0, limit, b);
#pragma unroll
    for (int c = 0; c < 8; ++c) store_pair(dst + (c0 + c) * LDS + ip, a[c] * w0, b[c] * w1);
}

// One thread's share of a natural TILE × KT operand tile (k contiguous in memory and in shared
// memory): rows row0 + rr, columns k0 + k8 .. k0 + k8 + 7, two groups of eight per thread.
template <bool VEC, typename T>
__device__ __forceinline__ void fill_natural(op_st* dst, const T* base, int row0, int rows, i64 stride, int k0,
                                             int limit) {
#pragma unroll
    for (int r = 0; r < TILE * KT / 8 / THREADS; ++r) {
        const int q = threadIdx.x + r * THREADS, rr = q / (KT / 8), k8 = (q % (KT / 8)) * 8;
        float v[8];
        load8<VEC>(base, row0 + rr, rows, stride, k0 + k8, limit, v);
        store8(dst + rr * LDS + k8, v);
    }
}

__device__ __forceinline__ u32 ld_pair(const op_st* p) { return *reinterpret_cast<const u32*>(p); }

// acc[mt][nt][4] += A[m][k] · B[n][k]ᵀ over one KT slice held in shared memory (rows of LDS
// elements, k contiguous): warp (wm, wn) owns rows wm*32.. and columns wn*32.. of the 64×64
// tile; fragment layouts of the PTX ISA's m16n8k16 / m16n8k8.
__device__ __forceinline__ void warp_mma(const op_st* As, const op_st* Bs, float (&acc)[2][4][4], int wm, int wn,
                                         int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int k = 0; k < KT; k += KSTEP) {
        u32 af[2][4], bfr[4][2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            const op_st* r0 = As + (wm * 32 + mt * 16 + g) * LDS + k;
            const op_st* r1 = r0 + 8 * LDS;
#if OP_KIND == 2
            af[mt][0] = tf32_of(r0[t]);
            af[mt][1] = tf32_of(r1[t]);
            af[mt][2] = tf32_of(r0[t + 4]);
            af[mt][3] = tf32_of(r1[t + 4]);
#else
            af[mt][0] = ld_pair(r0 + 2 * t);
            af[mt][1] = ld_pair(r1 + 2 * t);
            af[mt][2] = ld_pair(r0 + 2 * t + 8);
            af[mt][3] = ld_pair(r1 + 2 * t + 8);
#endif
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const op_st* c0 = Bs + (wn * 32 + nt * 8 + g) * LDS + k;
#if OP_KIND == 2
            bfr[nt][0] = tf32_of(c0[t]);
            bfr[nt][1] = tf32_of(c0[t + 4]);
#else
            bfr[nt][0] = ld_pair(c0 + 2 * t);
            bfr[nt][1] = ld_pair(c0 + 2 * t + 8);
#endif
        }
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                mma_tile<OP_KIND>(acc[mt][nt], af[mt], bfr[nt]);
            }
        }
    }
}

// Visits the accumulator elements of warp (wm, wn): f(row, col, value&) in tile coordinates.
template <typename F> __device__ __forceinline__ void for_acc(float (&acc)[2][4][4], int wm, int wn, int lane, F f) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = wm * 32 + mt * 16 + g + (e >= 2 ? 8 : 0);
                const int col = wn * 32 + nt * 8 + 2 * t + (e & 1);
                f(r, col, acc[mt][nt][e]);
            }
        }
    }
}

__device__ __forceinline__ void zero_acc(float (&acc)[2][4][4]) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// ---------------------------------------------------------------------------------------------
// Metadata, checked on the device.

// Chunk c's token range; an out-of-range one runs as empty and sets ERR_CU_SEQLENS.
__device__ __forceinline__ void chunk_bounds(const SsdParams& p, int c, int& s, int& len, bool report) {
    const CU_T* cu = reinterpret_cast<const CU_T*>(p.cu_chunk);
    const i64 a = load_index(cu + (i64)c * p.cu_s), b = load_index(cu + (i64)(c + 1) * p.cu_s);
    if (a < 0 || b <= a || b > p.tokens || b - a > p.chunk_rows) {
        if (report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_CU_SEQLENS);
        s = 0;
        len = 0;
        return;
    }
    s = (int)a;
    len = (int)(b - a);
}

__device__ __forceinline__ i64 seq_of(const SsdParams& p, int c) {
    return load_index(reinterpret_cast<const SEQ_T*>(p.seq_idx) + (i64)c * p.seq_s);
}

__device__ __forceinline__ bool opens(const SsdParams& p, int c) { return c == 0 || seq_of(p, c) != seq_of(p, c - 1); }

// The entering state of sequence b, head h, element (pp, n) as f32 (zeros without one).
__device__ __forceinline__ float initial_state(const SsdParams& p, i64 b, int h, int pp, int n) {
#if INIT_MODE == 0
    return 0.f;
#else
#if HAS_HAS
    if (load_index(reinterpret_cast<const HI_T*>(p.has_init) + b * p.hi_s) == 0) return 0.f;
#endif
#if INIT_MODE == 1
    return to_f32(reinterpret_cast<const INIT_T*>(p.init)[b * p.init_b + (i64)h * p.init_h + (i64)pp * p.init_p + n]);
#else
    const i64 slot = load_index(reinterpret_cast<const II_T*>(p.init_idx) + b * p.ii_s);
#if HAS_PAD
    if (slot == p.pad) return 0.f;
#endif
    if (slot < 0 || slot >= p.slots) {
        if (pp == 0 && n == 0) atomicOr(reinterpret_cast<u32*>(p.err), ERR_SLOT);
        return 0.f;
    }
    return to_f32(reinterpret_cast<const ST_T*>(p.pool)[slot * p.pool_s + (i64)h * p.pool_h + (i64)pp * p.pool_p + n]);
#endif
#endif
}

__device__ __forceinline__ float* ws(const SsdParams& p) { return reinterpret_cast<float*>(p.ws); }
__device__ __forceinline__ i64 row_off(const SsdParams& p, int c, int h) { return ((i64)c * p.heads + h) * p.q_row; }
__device__ __forceinline__ i64 state_off(const SsdParams& p, int c, int h) {
    return p.ws_states + ((i64)c * p.heads + h) * p.dim * p.state_row;
}

// ---------------------------------------------------------------------------------------------
// Stages 1 and 2.

extern "C" __global__ void __launch_bounds__(THREADS, 4) ssd_state_kernel(const SsdParams p) {
    __shared__ float s_dt[QCAP], s_da[QCAP], s_w[QCAP];
    __shared__ __align__(16) op_st As[TILE * LDS];
    __shared__ __align__(16) op_st Bs[TILE * LDS];
    const int c = blockIdx.x, h = blockIdx.y, tile = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int p0 = (tile / p.ntiles_n) * TILE, n0 = (tile % p.ntiles_n) * TILE;
    int s, len;
    chunk_bounds(p, c, s, len, tile == 0 && h == 0 && tid == 0);
    const int g = h / p.ratio;

    // Stage 1: dt + bias, softplus, clamp; zero past the chunk's end; A-scaled inclusive cumsum.
    const float a = to_f32(reinterpret_cast<const A_T*>(p.a)[(i64)h * p.a_h]);
    for (int i = tid; i < p.q_row; i += THREADS) {
        float v = 0.f;
        if (i < len) {
            v = to_f32(reinterpret_cast<const DT_T*>(p.dt)[(i64)(s + i) * p.dt_t + (i64)h * p.dt_h]);
#if HAS_BIAS
            v += to_f32(reinterpret_cast<const BIAS_T*>(p.dt_bias)[(i64)h * p.bias_h]);
#endif
#if SOFTPLUS
            if (v <= 20.f) v = log1pf(expf(v));
#endif
            v = fminf(fmaxf(v, p.lo), p.hi);
        }
        s_dt[i] = v;
    }
    __syncthreads();
    // Warp 0: each lane sums a run of q_row / 32 (rounded up) values, then a warp scan.
    if (warp == 0) {
        const int run = (p.q_row + 31) / 32;
        const int i0 = lane * run;
        float sum = 0.f;
        for (int i = i0; i < min(i0 + run, p.q_row); ++i) sum += a * s_dt[i];
        float incl = sum;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        float cum = incl - sum;
        for (int i = i0; i < min(i0 + run, p.q_row); ++i) {
            cum += a * s_dt[i];
            s_da[i] = cum;
        }
    }
    __syncthreads();
    if (tile == 0) {
        for (int i = tid; i < p.q_row; i += THREADS) {
            ws(p)[p.ws_dt + row_off(p, c, h) + i] = s_dt[i];
            ws(p)[p.ws_da + row_off(p, c, h) + i] = s_da[i];
        }
    }
    const float da_last = s_da[p.q_row - 1];
    // Each token's weight exp(min(dA_last − dA_i, 0))·dt_i.
    for (int i = tid; i < p.q_row; i += THREADS) s_w[i] = expf(fminf(da_last - s_da[i], 0.f)) * s_dt[i];

    // Stage 2: states[p][n] = Σ_i x[i][p] · (exp(min(dA_last − dA_i, 0))·dt_i·B[i][n]).
    float acc[2][4][4];
    zero_acc(acc);
    const int wm = warp >> 1, wn = warp & 1;
    const X_T* x = reinterpret_cast<const X_T*>(p.x);
    const B_T* bm = reinterpret_cast<const B_T*>(p.b);
    const X_T* xh = x + (i64)s * p.x_t + (i64)h * p.x_h;
    const B_T* bg = bm + (i64)s * p.b_t + (i64)g * p.b_g;
    const int ip = (tid % (KT / 2)) * 2;
    for (int k0 = 0; k0 < len; k0 += KT) {
        __syncthreads();
        // x and w ⊙ B stored transposed (rows p and n, tokens contiguous).
        fill_transposed<X_VEC>(As, xh, k0, len, p.x_t, p0, p.dim, 1.f, 1.f);
        const int t0 = k0 + ip;
        const float w0 = t0 < len ? s_w[t0] : 0.f, w1 = t0 + 1 < len ? s_w[t0 + 1] : 0.f;
        fill_transposed<B_VEC>(Bs, bg, k0, len, p.b_t, n0, p.dstate, w0, w1);
        __syncthreads();
        warp_mma(As, Bs, acc, wm, wn, lane);
    }
    float* st = ws(p) + state_off(p, c, h);
    for_acc(acc, wm, wn, lane, [&](int r, int col, float& v) {
        if (p0 + r < p.dim && n0 + col < p.dstate) st[(i64)(p0 + r) * p.state_row + n0 + col] = v;
    });
}

// ---------------------------------------------------------------------------------------------
// Stage 4.

extern "C" __global__ void __launch_bounds__(THREADS, 4) ssd_cb_kernel(const SsdParams p) {
    __shared__ __align__(16) op_st As[TILE * LDS];
    __shared__ __align__(16) op_st Bs[TILE * LDS];
    const int c = blockIdx.x, g = blockIdx.y;
    // Tile pair (ib, jb), jb <= ib, in row-major order of the lower triangle.
    int ib = 0, rest = blockIdx.z;
    while (rest > ib) {
        rest -= ib + 1;
        ++ib;
    }
    const int jb = rest;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int s, len;
    chunk_bounds(p, c, s, len, false);
    const int i0 = ib * TILE, j0 = jb * TILE;
    if (i0 >= len) return;
    const C_T* cm = reinterpret_cast<const C_T*>(p.c);
    const B_T* bm = reinterpret_cast<const B_T*>(p.b);
    float acc[2][4][4];
    zero_acc(acc);
    const int wm = warp >> 1, wn = warp & 1;
    const C_T* cg = cm + (i64)s * p.c_t + (i64)g * p.c_g;
    const B_T* bg = bm + (i64)s * p.b_t + (i64)g * p.b_g;
    for (int k0 = 0; k0 < p.dstate; k0 += KT) {
        __syncthreads();
        // C of tokens i0.., B of tokens j0.., state columns contiguous.
        fill_natural<C_VEC>(As, cg, i0, len, p.c_t, k0, p.dstate);
        fill_natural<B_VEC>(Bs, bg, j0, len, p.b_t, k0, p.dstate);
        __syncthreads();
        warp_mma(As, Bs, acc, wm, wn, lane);
    }
    float* cb = ws(p) + p.ws_cb + ((i64)c * p.groups + g) * p.chunk_rows * p.q_row;
    for_acc(acc, wm, wn, lane, [&](int r, int col, float& v) {
        const int i = i0 + r, j = j0 + col;
        if (i < len && j <= i) cb[(i64)i * p.q_row + j] = v;
    });
}

// ---------------------------------------------------------------------------------------------
// Stage 3 and the final states.

// State elements per thread of the pass and final kernels (independent loads in flight), and
// chunks whose decays a pass block stages in shared memory at a time.
#define ELEMS 8
#define STATE_THREADS 256
#define DECAYS 256

// The chunk range [first, last] of sequence b, or false (empty or out of range).
__device__ __forceinline__ bool seq_chunks(const SsdParams& p, i64 b, int& first, int& last, bool report) {
    const i64 l = load_index(reinterpret_cast<const LAST_T*>(p.last_chunk) + b * p.last_s);
    if (l < -1 || l >= p.nchunks) {
        if (report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_CU_SEQLENS);
        return false;
    }
    if (l < 0) return false;
    last = (int)l;
    first = last;
    const i64 sq = seq_of(p, last);
    while (first > 0 && seq_of(p, first - 1) == sq) --first;
    return true;
}

// Element `k` of thread `tid`'s run in block z: (row pp, column n), or false past the state.
__device__ __forceinline__ bool state_elem(const SsdParams& p, int k, int& pp, int& n) {
    const i64 e = ((i64)blockIdx.z * STATE_THREADS + threadIdx.x) * ELEMS + k;
    if (e >= (i64)p.dim * p.dstate) return false;
    pp = (int)(e / p.dstate);
    n = (int)(e - (i64)pp * p.dstate);
    return true;
}

extern "C" __global__ void __launch_bounds__(STATE_THREADS) ssd_pass_kernel(const SsdParams p) {
    __shared__ int s_range[3];
    __shared__ float s_decay[DECAYS];
    const i64 b = blockIdx.x;
    const int h = blockIdx.y;
    if (threadIdx.x == 0) {
        int first = 0, last = -1;
        s_range[2] = seq_chunks(p, b, first, last, blockIdx.z == 0 && h == 0);
        s_range[0] = first;
        s_range[1] = last;
    }
    __syncthreads();
    if (!s_range[2]) return;
    const int first = s_range[0], last = s_range[1];
    float S[ELEMS];
    i64 at[ELEMS];
    bool live[ELEMS];
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
        int pp = 0, n = 0;
        live[k] = state_elem(p, k, pp, n);
        at[k] = (i64)pp * p.state_row + n;
        S[k] = live[k] ? initial_state(p, b, h, pp, n) : 0.f;
    }
    for (int c0 = first; c0 <= last; c0 += DECAYS) {
        const int cn = min(DECAYS, last + 1 - c0);
        __syncthreads();
        for (int i = threadIdx.x; i < cn; i += STATE_THREADS) {
            s_decay[i] = expf(ws(p)[p.ws_da + row_off(p, c0 + i, h) + p.chunk_rows - 1]);
        }
        __syncthreads();
        for (int ci = 0; ci < cn; ++ci) {
            const int c = c0 + ci;
            float* st = ws(p) + state_off(p, c, h);
            float v[ELEMS];
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) v[k] = live[k] ? st[at[k]] : 0.f;
            const float decay = s_decay[ci];
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) {
                S[k] = fmaf(S[k], decay, v[k]);
                if (live[k]) st[at[k]] = S[k];
            }
#if HAS_VARLEN && INTERMEDIATE
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) {
                int pp = 0, n = 0;
                if (state_elem(p, k, pp, n)) {
                    reinterpret_cast<ST_T*>(p.varlen)[(i64)c * p.vs_r + (i64)h * p.vs_h + (i64)pp * p.vs_p + n] =
                        from_f32<ST_T>(S[k]);
                }
            }
#endif
        }
    }
}

extern "C" __global__ void __launch_bounds__(STATE_THREADS) ssd_final_kernel(const SsdParams p) {
    const i64 b = blockIdx.x;
    const int h = blockIdx.y;
    const i64 l = load_index(reinterpret_cast<const LAST_T*>(p.last_chunk) + b * p.last_s);
    if (l < -1 || l >= p.nchunks) return;  // reported by the pass kernel
#if HAS_FINAL
    i64 slot = load_index(reinterpret_cast<const FI_T*>(p.final_idx) + b * p.fi_s);
    bool write_slot = true;
#if HAS_PAD
    if (slot == p.pad) write_slot = false;
#endif
    if (write_slot && (slot < 0 || slot >= p.slots)) {
        if (blockIdx.z == 0 && threadIdx.x == 0) atomicOr(reinterpret_cast<u32*>(p.err), ERR_SLOT);
        write_slot = false;
    }
#endif
    float fin[ELEMS];
    int pps[ELEMS], ns[ELEMS];
    bool live[ELEMS];
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
        pps[k] = 0;
        ns[k] = 0;
        live[k] = state_elem(p, k, pps[k], ns[k]);
        fin[k] = !live[k] ? 0.f
                 : l < 0  ? initial_state(p, b, h, pps[k], ns[k])
                          : ws(p)[state_off(p, (int)l, h) + (i64)pps[k] * p.state_row + ns[k]];
    }
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
        if (!live[k]) continue;
        const int pp = pps[k], n = ns[k];
#if HAS_VARLEN && !INTERMEDIATE
        reinterpret_cast<ST_T*>(p.varlen)[b * p.vs_r + (i64)h * p.vs_h + (i64)pp * p.vs_p + n] = from_f32<ST_T>(fin[k]);
#endif
#if HAS_FINAL
        if (write_slot) {
            reinterpret_cast<ST_T*>(p.pool)[slot * p.pool_s + (i64)h * p.pool_h + (i64)pp * p.pool_p + n] =
                from_f32<ST_T>(fin[k]);
        }
#endif
    }
}

// ---------------------------------------------------------------------------------------------
// Stage 5.

extern "C" __global__ void __launch_bounds__(THREADS, 4) ssd_scan_kernel(const SsdParams p) {
    __shared__ float s_dt[QCAP], s_da[QCAP];
    __shared__ __align__(16) op_st As[TILE * LDS];
    __shared__ __align__(16) op_st Bs[TILE * LDS];
    const int c = blockIdx.x, h = blockIdx.y;
    const int ptiles = (p.dim + TILE - 1) / TILE;
    const int ib = blockIdx.z / ptiles, p0 = (blockIdx.z % ptiles) * TILE;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int s, len;
    chunk_bounds(p, c, s, len, false);
    const int i0 = ib * TILE;
    if (i0 >= len) return;
    const int g = h / p.ratio;
    // dA_cumsum scaled by log2(e), for exp2_fast.
    for (int i = tid; i < p.q_row; i += THREADS) {
        s_dt[i] = ws(p)[p.ws_dt + row_off(p, c, h) + i];
        s_da[i] = ws(p)[p.ws_da + row_off(p, c, h) + i] * LOG2E;
    }
    const X_T* x = reinterpret_cast<const X_T*>(p.x);
    const C_T* cm = reinterpret_cast<const C_T*>(p.c);
    const int wm = warp >> 1, wn = warp & 1;
    float acc[2][4][4];
    zero_acc(acc);

    // Off-diagonal: the entering state seen through C, decayed to each token.
    const bool open = opens(p, c);
    const bool has_prev = !open || INIT_MODE != 0;
    i64 seq = 0;
    bool seq_ok = true;
    if (open && INIT_MODE != 0) {
        seq = seq_of(p, c);
        if (seq < 0 || seq >= p.batch) {
            if (tid == 0 && p0 == 0 && ib == 0) atomicOr(reinterpret_cast<u32*>(p.err), ERR_CU_SEQLENS);
            seq_ok = false;
        }
    }
    if (has_prev && seq_ok) {
        const float* prev = open ? nullptr : ws(p) + state_off(p, c - 1, h);
        const C_T* cg = cm + (i64)s * p.c_t + (i64)g * p.c_g;
        for (int k0 = 0; k0 < p.dstate; k0 += KT) {
            __syncthreads();
            fill_natural<C_VEC>(As, cg, i0, len, p.c_t, k0, p.dstate);
#pragma unroll
            for (int r = 0; r < TILE * KT / 8 / THREADS; ++r) {
                // The entering state's head-dim row p0 + rr, state columns n .. n + 7.
                const int q = tid + r * THREADS, rr = q / (KT / 8), n = k0 + (q % (KT / 8)) * 8;
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    v[e] = 0.f;
                    if (p0 + rr < p.dim && n + e < p.dstate) {
                        v[e] = open ? initial_state(p, seq, h, p0 + rr, n + e)
                                    : prev[(i64)(p0 + rr) * p.state_row + n + e];
                    }
                }
                store8(Bs + rr * LDS + (n - k0), v);
            }
            __syncthreads();
            warp_mma(As, Bs, acc, wm, wn, lane);
        }
        for_acc(acc, wm, wn, lane, [&](int r, int, float& v) {
            if (i0 + r < len) v *= exp2_fast(s_da[i0 + r]);
        });
    }

    // Diagonal block: Σ_{j ≤ i} CB[i][j]·exp(min(dA_i − dA_j, 0))·dt_j · x[j][p].
    const float* cb = ws(p) + p.ws_cb + ((i64)c * p.groups + g) * p.chunk_rows * p.q_row;
    const X_T* xh = x + (i64)s * p.x_t + (i64)h * p.x_h;
    const int jend = min(i0 + TILE, len);
    for (int k0 = 0; k0 < jend; k0 += KT) {
        __syncthreads();
#pragma unroll
        for (int r = 0; r < TILE * KT / 8 / THREADS; ++r) {
            // The causal weights of row i0 + rr, columns j .. j + 7 (CB rows are 32-byte
            // aligned in the scratch when its base is 16-byte aligned: two vector loads).
            const int q = tid + r * THREADS, rr = q / (KT / 8), k8 = (q % (KT / 8)) * 8;
            const int i = i0 + rr, j = k0 + k8;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) v[e] = 0.f;
            if (i < len && j <= i) {
                const float* row = cb + (i64)i * p.q_row + j;
                if ((reinterpret_cast<u64>(row) & 15) == 0) {
                    const float4 lo = __ldg(reinterpret_cast<const float4*>(row));
                    const float4 hi = __ldg(reinterpret_cast<const float4*>(row) + 1);
                    v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
                    v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) v[e] = row[e];
                }
                const float dai = s_da[i];
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    v[e] = j + e <= i ? v[e] * exp2_fast(fminf(dai - s_da[j + e], 0.f)) * s_dt[j + e] : 0.f;
                }
            }
            store8(As + rr * LDS + k8, v);
        }
        // x of tokens k0.., stored transposed (rows p, tokens contiguous).
        fill_transposed<X_VEC>(Bs, xh, k0, len, p.x_t, p0, p.dim, 1.f, 1.f);
        __syncthreads();
        warp_mma(As, Bs, acc, wm, wn, lane);
    }

    // Epilogue: + D·x, gate, store.
    OUT_T* out = reinterpret_cast<OUT_T*>(p.out);
    for_acc(acc, wm, wn, lane, [&](int r, int col, float& v) {
        const int i = i0 + r, pp = p0 + col;
        if (i >= len || pp >= p.dim) return;
        const i64 tok = s + i;
        float y = v;
#if HAS_D
        y += to_f32(reinterpret_cast<const D_T*>(p.d)[(i64)h * p.d_h + (i64)pp * p.d_p]) *
             to_f32(x[tok * p.x_t + (i64)h * p.x_h + pp]);
#endif
#if HAS_Z
        const float zv = to_f32(reinterpret_cast<const Z_T*>(p.z)[tok * p.z_t + (i64)h * p.z_h + pp]);
        y *= zv / (1.f + expf(-zv));
#endif
        out[tok * p.out_t + (i64)h * p.out_h + pp] = from_f32<OUT_T>(y);
    });
}
