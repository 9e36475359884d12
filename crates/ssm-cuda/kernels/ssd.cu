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
//   into `varlen_states` and its `ssm_state` slot, and its checkpoint (the end state of the chunk
//   `checkpoint_chunk_indices` names) into its checkpoint slot, after every read of an initial
//   state.
//
// Matrix products use `mma.sync` (m16n8k16 with bf16 or f16 operands, m16n8k8 with tf32 for
// f32 inputs, as Triton's `tl.dot` does on sm_80+) with f32 accumulation, or, asked for by
// WGMMA_ASKED on sm_90a with 16-bit operands, Hopper's `wgmma` (m64n64k16, both operands from
// shared memory, as Triton's `tl.dot` compiles there for these tiles). Operands are rounded
// to the operand type where vLLM's kernels round them (w ⊙ B and the causal weights to the
// input type, the entering state to C's type). Device-resident metadata and slot tables are
// checked here: a chunk whose bounds are out of range runs as empty (ERR_CU_SEQLENS), a
// sequence index or slot out of range is skipped (ERR_CU_SEQLENS / ERR_SLOT); no access leaves
// the views the plan checked.
//
// Macros (crates/ssm-cuda/src/ssd.rs, `SsdKey::spec`): X_T DT_T A_T B_T C_T Z_T OUT_T D_T BIAS_T
// INIT_T ST_T (element types), CU_T SEQ_T LAST_T II_T HI_T FI_T CKC_T CKS_T (index types),
// OP_KIND (0 bf16, 1 f16, 2 tf32), flags HAS_Z HAS_D HAS_BIAS SOFTPLUS INIT_MODE (0 none,
// 1 initial_states, 2 pool) HAS_HAS HAS_FINAL HAS_PAD HAS_VARLEN INTERMEDIATE HAS_CKPT
// DENSE_STATE (dstate a multiple of 8: the scratch's state rows unpadded), X_VEC B_VEC C_VEC (x, B, C
// rows loadable eight elements at a time: token and head/group strides multiples of 8, base
// 16-byte aligned), the product kernels' STAGES_ASKED (pipeline buffers), KT_ASKED (slice
// along k) and MINB (resident blocks asked per multiprocessor), the scan's REG_WEIGHTS
// (causal weights in registers), WGMMA_ASKED, and TILES_FIRST (the tile kernels' block order,
// `block_tile`).

#define TILE 64
// The products' slice along k (KT_ASKED, 32 or 64). tf32 tiles (twice the bytes) and three
// buffers keep 32: 64 would pass the 48 KiB of static shared memory.
#if OP_KIND == 2 || STAGES_ASKED == 3
#define KT 32
#else
#define KT KT_ASKED
#endif
#define THREADS 128
#define QCAP 256

// The product kernels on Hopper's `wgmma` (WGMMA_ASKED, where common.cuh has it: 16-bit operands
// compiled for sm_90a), else on `mma.sync`. With wgmma the operand tiles take its core-matrix
// layout (`tile_at`) and each warp holds a 16-row band of the 64 × 64 result (PMT × PNT
// accumulator tiles); with `mma.sync` they are padded rows and 32 × 32 quarters.
#if WGMMA_ASKED && HAS_WGMMA
#define WGMMA 1
#define PMT 1
#define PNT 8
#else
#define WGMMA 0
#define PMT 2
#define PNT 4
#endif

struct SsdParams {
    u64 x, dt, a, b, c, z, out, d, dt_bias, init, pool, varlen, init_idx, has_init, final_idx;
    u64 cu_chunk, seq_idx, last_chunk, ws, err;
    u64 ck_chunk, ck_slot;
    i64 x_t, x_h, dt_t, dt_h, a_h, b_t, b_g, c_t, c_g, z_t, z_h, out_t, out_h, d_h, d_p, bias_h;
    i64 init_b, init_h, init_p, pool_s, pool_h, pool_p, vs_r, vs_h, vs_p;
    i64 ii_s, hi_s, fi_s, cu_s, seq_s, last_s, ckc_s, cks_s;
    i64 pad, slots;
    i64 ws_dt, ws_da, ws_states, ws_cb;
    int tokens, heads, dim, dstate, groups, nchunks, batch, chunk_rows, q_row, state_row, ratio, ntiles_n;
    float lo, hi;
};


// ---------------------------------------------------------------------------------------------
// Operand tiles and the pipelined product loop.
//
// The products run over slices of KT along k. Every operand tile lives in shared memory in the
// layout of its global rows, so that a warp's loads are whole 16-byte groups of a few rows:
// "natural" tiles hold TILE rows × KT (k contiguous, rows of LDN), "transposed" tiles hold KT rows
// × TILE (k = row, rows of LDT) and reach the products through `ldmatrix.trans` (common.cuh's
// `warp_gemm`, TA / TB). A tile whose global rows already hold operands (bf16 x into bf16
// products, f32 into tf32) is copied by `cp.async`; the others (the weighted B, the f32 scratch
// state and causal weights, operands of another type) are loaded into registers and stored,
// converted, after the current slice's products.

#if WGMMA
#define LDN KT
#define LDT TILE
#else
#define LDN (KT + PADE)
#define LDT (TILE + PADE)
#endif
#define TILE_ELEMS (TILE * LDN > KT * LDT ? TILE * LDN : KT * LDT)
// Buffers of each operand (STAGES_ASKED, 2 or 3): one or two slices in flight while another is
// read (tf32 tiles, twice the bytes, keep one in flight: three would pass the 48 KiB of static
// shared memory).
#if OP_KIND == 2
#define STAGES 2
#else
#define STAGES STAGES_ASKED
#endif
typedef op_st OperandTiles[STAGES][TILE_ELEMS];

// Where the 16-byte group (r, c) of a tile with rows of `ld` elements lies: row-major, or in
// wgmma's core-matrix layout.
__device__ __forceinline__ int tile_at(int r, int c, int ld) {
#if WGMMA
    return core_at(r, c, ld);
#else
    return r * ld + c;
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

// Eight operands of one row into shared memory, rounded to the operand type (`dst` 16-byte
// aligned): one 16-byte store (two for tf32).
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

// Eight consecutive elements of T as loaded, not yet widened: four words for a 16-bit T, eight
// for f32. A slice's register loads land here, so that they stay in flight across the previous
// slice's products; the widening happens when the slice is stored to shared memory.
template <typename T> struct Raw8 {
    u32 w[2 * sizeof(T)];
};

template <typename T> __device__ __forceinline__ float raw_at(const Raw8<T>& r, int c);
template <> __device__ __forceinline__ float raw_at<float>(const Raw8<float>& r, int c) { return __uint_as_float(r.w[c]); }
template <> __device__ __forceinline__ float raw_at<bf16_t>(const Raw8<bf16_t>& r, int c) {
    const u32 w = r.w[c >> 1];
    return __uint_as_float((c & 1) ? (w & 0xffff0000u) : (w << 16));
}
template <> __device__ __forceinline__ float raw_at<f16_t>(const Raw8<f16_t>& r, int c) {
    f16_t h;
    h.bits = (unsigned short)(r.w[c >> 1] >> ((c & 1) * 16));
    return to_f32(h);
}

__device__ __forceinline__ void raw_set(Raw8<float>& r, int c, float v) { r.w[c] = __float_as_uint(v); }
template <typename T> __device__ __forceinline__ void raw_set(Raw8<T>& r, int c, T v) {
    r.w[c >> 1] |= (u32)v.bits << ((c & 1) * 16);
}

// Elements [col, col + 8) of row `row` of a row-major matrix (`base + row·stride`), as raw
// bits: 16-byte loads (one for 16-bit types, two for f32; `ld.global.nc`) when VEC (strides
// and base 16-byte aligned, checked by the host) and all eight lie inside `limit` columns, else
// element by element; zero bits (+0.0) for a row at or past `rows` and for columns at or past
// `limit`.
template <bool VEC, typename T>
__device__ __forceinline__ void load_raw8(const T* base, int row, int rows, i64 stride, int col, int limit, Raw8<T>& r) {
#pragma unroll
    for (int i = 0; i < 2 * (int)sizeof(T); ++i) r.w[i] = 0u;
    if (row >= rows) return;
    const T* ptr = base + (i64)row * stride + col;
    if (VEC && col + 8 <= limit) {
#pragma unroll
        for (int v = 0; v < (int)sizeof(T) / 2; ++v) {
            const uint4 u = __ldg(reinterpret_cast<const uint4*>(ptr) + v);
            r.w[4 * v] = u.x;
            r.w[4 * v + 1] = u.y;
            r.w[4 * v + 2] = u.z;
            r.w[4 * v + 3] = u.w;
        }
        return;
    }
#pragma unroll
    for (int c = 0; c < 8; ++c) {
        if (col + c < limit) raw_set(r, c, ld_ro(ptr + c));
    }
}

// Whether a T is already an operand (bf16 into bf16 products, f16 into f16, f32 into tf32,
// whose operands are kept as f32 bits): its bits are copied as they are.
template <typename T> struct IsOperand {
    static constexpr bool value = false;
};
#if OP_KIND == 0
template <> struct IsOperand<bf16_t> {
    static constexpr bool value = true;
};
#elif OP_KIND == 1
template <> struct IsOperand<f16_t> {
    static constexpr bool value = true;
};
#else
template <> struct IsOperand<float> {
    static constexpr bool value = true;
};
#endif

// Eight raw elements into shared memory as operands (`dst` 16-byte aligned), each scaled by
// `w`: copied when they are already operands and unscaled, else widened, scaled and rounded.
template <bool SCALED, typename T> __device__ __forceinline__ void store_raw8(op_st* dst, const Raw8<T>& r, float w) {
    if constexpr (IsOperand<T>::value && !SCALED) {
        uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
        for (int v = 0; v < (int)sizeof(T) / 2; ++v) d[v] = make_uint4(r.w[4 * v], r.w[4 * v + 1], r.w[4 * v + 2], r.w[4 * v + 3]);
    } else {
        float v[8];
#pragma unroll
        for (int c = 0; c < 8; ++c) v[c] = SCALED ? raw_at(r, c) * w : raw_at(r, c);
        store8(dst, v);
    }
}

// Where this thread's 16-byte group q of a tile with `per_row` groups per row lies: its row and
// its first column. Row-major order, or, with wgmma, as common.cuh's `core_group_row` places
// them. (The row-major form divides in unsigned arithmetic, as `threadIdx.x` is: through an
// `int` temporary the tf32 stage-1+2 kernel took 128 registers and a 72-byte stack.)
#if WGMMA
__device__ __forceinline__ int group_row_of(int q, int per_row) { return core_group_row(threadIdx.x + q * THREADS, per_row); }
__device__ __forceinline__ int group_col_of(int q, int per_row) { return core_group_col(threadIdx.x + q * THREADS, per_row); }
#else
__device__ __forceinline__ int group_row_of(int q, int per_row) { return (threadIdx.x + q * THREADS) / per_row; }
__device__ __forceinline__ int group_col_of(int q, int per_row) { return ((threadIdx.x + q * THREADS) % per_row) * 8; }
#endif

// One operand tile of R rows × C columns of a row-major global matrix (rows row0.., columns
// col0..; zeros for rows at or past `rows` and columns at or past `limit`) into shared rows of
// `ld`, in 16-byte groups, G per thread, placed by `group_row_of`. ASYNC (the rows hold
// operands, VEC, no scale): `issue` starts `cp.async` copies and `commit` has nothing to do;
// otherwise `issue` loads the groups into registers and `commit` stores them, each row scaled
// by `scale(row)` when SCALED.
template <typename T, bool VEC, bool SCALED, int R, int C> struct TileCopy {
    static constexpr int PER_ROW = C / 8;
    static constexpr int G = R * PER_ROW / THREADS;
    static constexpr bool ASYNC = VEC && IsOperand<T>::value && !SCALED;
    static_assert(G * THREADS == R * PER_ROW, "TileCopy: whole groups per thread");
    Raw8<T> v[ASYNC ? 1 : G];

#if WGMMA
    static_assert(R % 8 == 0, "TileCopy: whole core matrices");
#endif
    static __device__ __forceinline__ int row_of(int q) { return group_row_of(q, PER_ROW); }
    static __device__ __forceinline__ int col_of(int q) { return group_col_of(q, PER_ROW); }

    __device__ __forceinline__ void issue(op_st* dst, int ld, const T* base, int row0, int rows, i64 stride, int col0,
                                          int limit) {
#pragma unroll
        for (int q = 0; q < G; ++q) {
            const int r = row_of(q), c = col_of(q);
            if constexpr (ASYNC) {
                if (row0 + r < rows && col0 + c + 8 <= limit) {
                    // Eight elements: one 16-byte copy for 16-bit types, two for f32.
                    const T* src = base + (i64)(row0 + r) * stride + col0 + c;
#pragma unroll
                    for (int v = 0; v < (int)sizeof(T) / 2; ++v) {
                        cp_async16(dst + tile_at(r, c, ld) + v * (16 / sizeof(T)), src + v * (16 / sizeof(T)));
                    }
                } else {
                    Raw8<T> edge;
                    load_raw8<VEC>(base, row0 + r, rows, stride, col0 + c, limit, edge);
                    store_raw8<false>(dst + tile_at(r, c, ld), edge, 1.f);
                }
            } else {
                load_raw8<VEC>(base, row0 + r, rows, stride, col0 + c, limit, v[q]);
            }
        }
    }

    template <typename S> __device__ __forceinline__ void commit(op_st* dst, int ld, S scale) const {
        if constexpr (!ASYNC) {
#pragma unroll
            for (int q = 0; q < G; ++q) {
                const int r = row_of(q);
                store_raw8<SCALED>(dst + tile_at(r, col_of(q), ld), v[q], SCALED ? scale(r) : 1.f);
            }
        }
    }
    __device__ __forceinline__ void commit(op_st* dst, int ld) const {
        commit(dst, ld, [](int) { return 1.f; });
    }
};

// A natural TILE × KT tile and a transposed KT × TILE tile.
template <typename T, bool VEC, bool SCALED = false> using NaturalTile = TileCopy<T, VEC, SCALED, TILE, KT>;
template <typename T, bool VEC, bool SCALED = false> using TransposedTile = TileCopy<T, VEC, SCALED, KT, TILE>;

// A thread's groups of eight of a natural TILE × KT tile computed in f32 (the scratch
// operands): (row, k) of group q.
#define GROUPS (TILE * KT / 8 / THREADS)
__device__ __forceinline__ int group_row(int q) { return group_row_of(q, KT / 8); }
__device__ __forceinline__ int group_k(int q) { return group_col_of(q, KT / 8); }

// Eight consecutive f32 scratch values (`row` 16-byte aligned: two vector loads, else eight).
__device__ __forceinline__ void load_f32x8(const float* row, float* v) {
    if ((reinterpret_cast<u64>(row) & 15) == 0) {
        const float4 lo = __ldg(reinterpret_cast<const float4*>(row));
        const float4 hi = __ldg(reinterpret_cast<const float4*>(row) + 1);
        v[0] = lo.x; v[1] = lo.y; v[2] = lo.z; v[3] = lo.w;
        v[4] = hi.x; v[5] = hi.y; v[6] = hi.z; v[7] = hi.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __ldg(row + e);
    }
}

// Where a warp's part of a 64×64 product lies when each warp holds MT 16-row × NT 8-column
// accumulator tiles: (MT, NT) = (2, 4), four 32×32 quarters (rows wm·32.., columns wn·32..), or
// (1, 8), four 16-row bands across all 64 columns (each warp's A rows its own, so that an A
// operand computed in registers is computed once per block).
template <int MT, int NT> __device__ __forceinline__ int warp_r0() {
    static_assert((TILE / (16 * MT)) * (TILE / (8 * NT)) == THREADS / 32, "warp_r0: four warps cover the tile");
    return (threadIdx.x >> 5) / (TILE / (8 * NT)) * 16 * MT;
}
template <int MT, int NT> __device__ __forceinline__ int warp_n0() { return (threadIdx.x >> 5) % (TILE / (8 * NT)) * 8 * NT; }

// Σ over the KT-slices [0, kend): `product(i, a, b)` for each slice i with its operand tiles
// in shared memory. Software-pipelined over STAGES buffers with one barrier per slice:
// `issue(k0, regs, a, b)` starts a slice's loads (cp.async into its buffers, or register loads
// into `regs`, nothing that waits on them) STAGES − 1 slices ahead, and `commit(regs, k0, a, b)`
// stores a slice's register part after the products of the slice before it, so that STAGES − 1
// slices' loads are in flight while the products run. Starts with a barrier (earlier users of
// the buffers and of the block's shared data are done). `kend` is the same across the block.
template <typename Regs, typename Issue, typename Commit, typename Product>
__device__ __forceinline__ void pipelined(OperandTiles& As, OperandTiles& Bs, int kend, Issue issue, Commit commit,
                                          Product product) {
    __syncthreads();
    if (kend <= 0) return;
    const int slices = (kend + KT - 1) / KT;
    // Slice j's registers are regs[j % (STAGES − 1)], its buffers As/Bs[j % STAGES].
    Regs regs[STAGES - 1];
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j) {
        if (j < slices) issue(j * KT, regs[j], As[j], Bs[j]);
        cp_async_commit();
    }
    commit(regs[0], 0, As[0], Bs[0]);
    cp_async_wait<STAGES - 2>();
    // Slice i's products; slice i + STAGES − 1 started into `start` (slice i's registers, stored
    // by now), slice i + 1 stored from `next`.
    auto step = [&](int i, Regs& start, Regs& next) {
#if WGMMA
        // The previous slice's products are done with their buffers, and this thread's stores
        // and copies are visible to the next ones.
        wg_wait_all();
        fence_async_shared();
#endif
        __syncthreads();
        const int ahead = i + STAGES - 1;
        if (ahead < slices) issue(ahead * KT, start, As[ahead % STAGES], Bs[ahead % STAGES]);
        cp_async_commit();
        product(i, As[i % STAGES], Bs[i % STAGES]);
        if (i + 1 < slices) commit(next, (i + 1) * KT, As[(i + 1) % STAGES], Bs[(i + 1) % STAGES]);
        cp_async_wait<STAGES - 2>();
    };
#if STAGES == 3
    for (int i = 0; i < slices; i += 2) {
        step(i, regs[0], regs[1]);
        if (i + 1 < slices) step(i + 1, regs[1], regs[0]);
    }
#else
    for (int i = 0; i < slices; ++i) step(i, regs[0], regs[0]);
#endif
#if WGMMA
    wg_wait_all();
#endif
}

// acc += Σ over the KT-slices [0, kend) of A_slice·B_sliceᵀ, this warp's part of the 64×64
// output (`warp_r0` / `warp_n0`), the operands stored transposed when TA / TB (rows of LDT)
// else natural (rows of LDN), pipelined as `pipelined` says.
template <bool TA, bool TB, typename Regs, int MT, int NT, typename Issue, typename Commit>
__device__ __forceinline__ void pipelined_mma(OperandTiles& As, OperandTiles& Bs, int kend, float (&acc)[MT][NT][4],
                                              Issue issue, Commit commit) {
#if WGMMA
    // Issued here, finished by `pipelined` (before the next barrier and at its end).
    pipelined<Regs>(As, Bs, kend, issue, commit, [&](int, const op_st* a, const op_st* b) {
        wg_product<KT / 16, TA, TB>(acc, a, TA ? LDT : LDN, b, TB ? LDT : LDN);
    });
#else
    const int lane = threadIdx.x & 31;
    pipelined<Regs>(As, Bs, kend, issue, commit, [&](int, const op_st* a, const op_st* b) {
        warp_gemm<MT, NT, TA, TB>(acc, a, TA ? LDT : LDN, warp_r0<MT, NT>(), b, TB ? LDT : LDN, warp_n0<MT, NT>(), KT,
                                  lane);
    });
#endif
}

// Visits this warp's accumulator elements: f(row, col, value&) in tile coordinates.
template <int MT, int NT, typename F> __device__ __forceinline__ void for_tile(float (&acc)[MT][NT][4], F f) {
    for_acc(acc, warp_r0<MT, NT>(), warp_n0<MT, NT>(), threadIdx.x & 31, f);
}

// Multiplies each row of this warp's accumulators by f(row) (tile coordinates), once per row.
template <int MT, int NT, typename F> __device__ __forceinline__ void scale_rows(float (&acc)[MT][NT][4], F f) {
    scale_acc_rows(acc, warp_r0<MT, NT>(), threadIdx.x & 31, f);
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

// The block's chunk `c`, head `h` and tile `t` (of `ntiles`) in the state and scan kernels. With
// TILES_FIRST one (chunk, head)'s tiles run next to each other (blockIdx.x = c·ntiles + the tile,
// heads along y), so the rows they share (the chunk's x and dt, the entering state) come from DRAM
// once and then from L2; `reverse` numbers them from the last, so the scan's longest row tiles
// start first. Otherwise (c, h, t) = (x, y, z), each tile a full pass over every chunk and head.
__device__ __forceinline__ void block_tile(int ntiles, bool reverse, int& c, int& h, int& t) {
#if TILES_FIRST
    c = (int)(blockIdx.x / (unsigned)ntiles);
    t = (int)(blockIdx.x % (unsigned)ntiles);
    if (reverse) t = ntiles - 1 - t;
#else
    (void)ntiles;
    (void)reverse;
    c = (int)blockIdx.x;
    t = (int)blockIdx.z;
#endif
    h = (int)blockIdx.y;
}

// ---------------------------------------------------------------------------------------------
// Stages 1 and 2.

extern "C" __global__ void __launch_bounds__(THREADS, MINB) ssd_state_kernel(const SsdParams p) {
    __shared__ float s_dt[QCAP], s_da[QCAP], s_w[QCAP];
    __shared__ __align__(16) OperandTiles As, Bs;
    int c, h, tile;
    block_tile(((p.dim + TILE - 1) / TILE) * p.ntiles_n, false, c, h, tile);
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

    // Stage 2: states[p][n] = Σ_i x[i][p] · (exp(min(dA_last − dA_i, 0))·dt_i·B[i][n]), x and
    // w ⊙ B in their token-major global layout (transposed operands).
    float acc[PMT][PNT][4];
    zero(acc);
    const X_T* xh = reinterpret_cast<const X_T*>(p.x) + (i64)s * p.x_t + (i64)h * p.x_h;
    const B_T* bg = reinterpret_cast<const B_T*>(p.b) + (i64)s * p.b_t + (i64)g * p.b_g;
    struct Slice {
        TransposedTile<X_T, X_VEC> x;
        TransposedTile<B_T, B_VEC, true> b;
    };
    pipelined_mma<true, true, Slice>(
        As, Bs, len, acc,
        [&](int k0, Slice& r, op_st* a, op_st* b) {
            r.x.issue(a, LDT, xh, k0, len, p.x_t, p0, p.dim);
            r.b.issue(b, LDT, bg, k0, len, p.b_t, n0, p.dstate);
        },
        [&](const Slice& r, int k0, op_st* a, op_st* b) {
            r.x.commit(a, LDT);
            r.b.commit(b, LDT, [&](int row) { return k0 + row < len ? s_w[k0 + row] : 0.f; });
        });
    float* st = ws(p) + state_off(p, c, h);
    for_tile(acc, [&](int r, int col, float& v) {
        if (p0 + r < p.dim && n0 + col < p.dstate) st[(i64)(p0 + r) * p.state_row + n0 + col] = v;
    });
}

// ---------------------------------------------------------------------------------------------
// Stage 4.

extern "C" __global__ void __launch_bounds__(THREADS, MINB) ssd_cb_kernel(const SsdParams p) {
    __shared__ __align__(16) OperandTiles As, Bs;
    const int c = blockIdx.x, g = blockIdx.y;
    // Tile pair (ib, jb), jb <= ib, in row-major order of the lower triangle.
    int ib = 0, rest = blockIdx.z;
    while (rest > ib) {
        rest -= ib + 1;
        ++ib;
    }
    const int jb = rest;
    int s, len;
    chunk_bounds(p, c, s, len, false);
    const int i0 = ib * TILE, j0 = jb * TILE;
    if (i0 >= len) return;
    const C_T* cg = reinterpret_cast<const C_T*>(p.c) + (i64)s * p.c_t + (i64)g * p.c_g;
    const B_T* bg = reinterpret_cast<const B_T*>(p.b) + (i64)s * p.b_t + (i64)g * p.b_g;
    float acc[PMT][PNT][4];
    zero(acc);
    // C of tokens i0.., B of tokens j0.., state columns contiguous (natural operands).
    struct Slice {
        NaturalTile<C_T, C_VEC> c;
        NaturalTile<B_T, B_VEC> b;
    };
    pipelined_mma<false, false, Slice>(
        As, Bs, p.dstate, acc,
        [&](int k0, Slice& r, op_st* a, op_st* b) {
            r.c.issue(a, LDN, cg, i0, len, p.c_t, k0, p.dstate);
            r.b.issue(b, LDN, bg, j0, len, p.b_t, k0, p.dstate);
        },
        [&](const Slice& r, int, op_st* a, op_st* b) {
            r.c.commit(a, LDN);
            r.b.commit(b, LDN);
        });
    float* cb = ws(p) + p.ws_cb + ((i64)c * p.groups + g) * p.chunk_rows * p.q_row;
    for_tile(acc, [&](int r, int col, float& v) {
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

// The chunk range [first, last] of sequence b, or false (empty or out of range), found by the
// whole block (every thread calls it, `s` is the block's shared scratch): thread 0 reads the
// sequence's last chunk; the run of chunks of the same sequence ending there is then searched
// backwards STATE_THREADS chunks at a time, each thread reading one chunk's sequence index, so a
// sequence of n chunks costs ⌈n / STATE_THREADS⌉ dependent reads rather than n. The result is
// that of the walk `while (first > 0 && seq_of(first − 1) == seq_of(last)) --first` also for
// garbage metadata: the largest chunk before `last` whose index differs ends the run.
__device__ __forceinline__ bool seq_chunks(const SsdParams& p, i64 b, int& first, int& last, bool report, int* s) {
    constexpr int NO_STOP = -0x7fffffff - 1;  // below every chunk a thread reads (≥ −STATE_THREADS)
    if (threadIdx.x == 0) {
        const i64 l = load_index(reinterpret_cast<const LAST_T*>(p.last_chunk) + b * p.last_s);
        const bool bad = l < -1 || l >= p.nchunks;
        if (bad && report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_CU_SEQLENS);
        s[0] = bad || l < 0 ? -1 : (int)l;
    }
    __syncthreads();
    last = s[0];
    if (last < 0) return false;
    const i64 sq = seq_of(p, last);
    for (int base = last - 1;; base -= STATE_THREADS) {
        if (threadIdx.x == 0) s[1] = NO_STOP;
        __syncthreads();
        const int cc = base - (int)threadIdx.x;
        if (cc < 0 || seq_of(p, cc) != sq) atomicMax(&s[1], cc);
        __syncthreads();
        const int stop = s[1];
        __syncthreads();
        if (stop != NO_STOP) {
            first = stop + 1;
            return true;
        }
    }
}

// Element `k` of thread `tid` in block z: (row pp, column n), or false past the state. Block z
// holds elements [z, z + 1)·ELEMS·STATE_THREADS, the threads consecutive within each of its
// ELEMS runs, so that every load and store of a warp covers 128 contiguous bytes of a row.
__device__ __forceinline__ bool state_elem(const SsdParams& p, int k, int& pp, int& n) {
    const i64 e = ((i64)blockIdx.z * ELEMS + k) * STATE_THREADS + threadIdx.x;
    if (e >= (i64)p.dim * p.dstate) return false;
    pp = (int)(e / p.dstate);
    n = (int)(e - (i64)pp * p.dstate);
    return true;
}

// Chunks whose states a pass thread has in flight ahead of the one it passes on: the chunk loop
// runs PASS_AHEAD chunks an iteration, so that the ring of in-flight states is indexed at
// compile time (no register moves), and the decays are staged DECAYS (a multiple of
// PASS_AHEAD) chunks at a time, so that a refill falls on an iteration's first chunk.
#define PASS_AHEAD 3
#define DECAYS 255

// The (sequence b, head h) block of the state entering b, its element (pp, n) at
// rows[pp * row + n]: the block of `initial_states` or of b's pool slot, or null for zeros (no
// initial state, has_initial_state false, the pad, or a slot out of range, reported by `report`
// as ERR_SLOT). Read once per thread instead of once per element.
#if INIT_MODE == 1
typedef INIT_T entering_t;
#elif INIT_MODE == 2
typedef ST_T entering_t;
#else
typedef float entering_t;
#endif
__device__ __forceinline__ const entering_t* entering_rows(const SsdParams& p, i64 b, int h, i64& row, bool report) {
    row = 0;
#if INIT_MODE == 0
    return nullptr;
#else
#if HAS_HAS
    if (load_index(reinterpret_cast<const HI_T*>(p.has_init) + b * p.hi_s) == 0) return nullptr;
#endif
#if INIT_MODE == 1
    row = p.init_p;
    return reinterpret_cast<const INIT_T*>(p.init) + b * p.init_b + (i64)h * p.init_h;
#else
    const i64 slot = load_index(reinterpret_cast<const II_T*>(p.init_idx) + b * p.ii_s);
#if HAS_PAD
    if (slot == p.pad) return nullptr;
#endif
    if (slot < 0 || slot >= p.slots) {
        if (report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_SLOT);
        return nullptr;
    }
    row = p.pool_p;
    return reinterpret_cast<const ST_T*>(p.pool) + slot * p.pool_s + (i64)h * p.pool_h;
#endif
#endif
}

// Stage 3 for (sequence b, head h, elements of block z). DENSE (DENSE_STATE, chosen by the host):
// the scratch's state rows hold no padding (state_row == dstate, dstate a multiple of 8), so this thread's elements lie at fixed distances
// (k · STATE_THREADS) from its first in every chunk, and each access is one base pointer plus
// an immediate offset; otherwise each element keeps its 32-bit offset in the chunk's block
// (dim · state_row < 2³¹, checked by the host's limits).
template <bool DENSE>
__device__ __forceinline__ void pass_body(const SsdParams& p, i64 b, int h, int first, int last, float* s_decay) {
    const int e0 = blockIdx.z * ELEMS * STATE_THREADS + threadIdx.x;
    const int total = p.dim * p.dstate;
    bool live[ELEMS];
    int at[ELEMS];
    float S[ELEMS];
    i64 row = 0;
    const entering_t* init = entering_rows(p, b, h, row, blockIdx.z == 0 && threadIdx.x == 0);
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
        const int e = e0 + k * STATE_THREADS;
        live[k] = e < total;
        // With dense pool or initial-state rows (row == dstate) element e lies at init[e]:
        // pp = 0, n = e reads it without a division.
        const int pp = DENSE && row == p.dstate ? 0 : e / p.dstate;
        const int n = e - pp * p.dstate;
        at[k] = DENSE ? k * STATE_THREADS : pp * p.state_row + n;
        S[k] = live[k] && init != nullptr ? to_f32(init[(i64)pp * row + n]) : 0.f;
    }
#if HAS_VARLEN && INTERMEDIATE
    i64 vs_at[ELEMS];
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
        const int e = e0 + k * STATE_THREADS;
        const int pp = e / p.dstate;
        vs_at[k] = (i64)h * p.vs_h + (i64)pp * p.vs_p + (e - pp * p.dstate);
    }
#endif
    // This thread's elements of chunk c lie at base + (c − first)·stride + at[k].
    const i64 stride = (i64)p.heads * p.dim * p.state_row;
    float* base = ws(p) + state_off(p, first, h) + (DENSE ? e0 : 0);
    // The states of the next PASS_AHEAD chunks are in flight while chunk c's are passed on (they
    // never alias the ones stored: each chunk has its own rows of the scratch). `v[a]` holds
    // chunk c0 + a's in the iteration starting at c0; past `last` nothing is loaded.
    float v[PASS_AHEAD][ELEMS];
#pragma unroll
    for (int a = 0; a < PASS_AHEAD; ++a) {
        const bool in = first + a <= last;
        const float* st = base + a * stride;
#pragma unroll
        for (int k = 0; k < ELEMS; ++k) v[a][k] = in && live[k] ? st[at[k]] : 0.f;
    }
    int ci0 = 0;
    for (int c0 = first; c0 <= last; c0 += PASS_AHEAD) {
        if (ci0 == 0) {
            const int cn = min(DECAYS, last + 1 - c0);
            __syncthreads();
            for (int i = threadIdx.x; i < cn; i += STATE_THREADS) {
                s_decay[i] = expf(ws(p)[p.ws_da + row_off(p, c0 + i, h) + p.chunk_rows - 1]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int a = 0; a < PASS_AHEAD; ++a) {
            const int c = c0 + a;
            if (c > last) break;
            float* st = base;
            const float decay = s_decay[ci0 + a];
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) {
                S[k] = fmaf(S[k], decay, v[a][k]);
                if (live[k]) st[at[k]] = S[k];
            }
            if (c + PASS_AHEAD <= last) {
                const float* nst = base + PASS_AHEAD * stride;
#pragma unroll
                for (int k = 0; k < ELEMS; ++k) v[a][k] = live[k] ? nst[at[k]] : 0.f;
            }
#if HAS_VARLEN && INTERMEDIATE
            ST_T* vs = reinterpret_cast<ST_T*>(p.varlen) + (i64)c * p.vs_r;
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) {
                if (live[k]) vs[vs_at[k]] = from_f32<ST_T>(S[k]);
            }
#endif
            base += stride;
        }
        ci0 += PASS_AHEAD;
        if (ci0 == DECAYS) ci0 = 0;
    }
}

extern "C" __global__ void __launch_bounds__(STATE_THREADS) ssd_pass_kernel(const SsdParams p) {
    __shared__ int s_range[2];
    __shared__ float s_decay[DECAYS];
    const i64 b = blockIdx.x;
    const int h = blockIdx.y;
    int first = 0, last = -1;
    if (!seq_chunks(p, b, first, last, blockIdx.z == 0 && h == 0, s_range)) return;
    pass_body<DENSE_STATE != 0>(p, b, h, first, last, s_decay);
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
    }
#if HAS_CKPT
    // The checkpoint: chunk `ck` of this sequence (-1: none) into slot `cslot`, written before the
    // final state, so that where a device table names the final slot too the final state stays.
    {
        const i64 ck = load_index(reinterpret_cast<const CKC_T*>(p.ck_chunk) + b * p.ckc_s);
        const i64 cslot = load_index(reinterpret_cast<const CKS_T*>(p.ck_slot) + b * p.cks_s);
        const bool report = blockIdx.z == 0 && threadIdx.x == 0;
        bool write = ck != -1;
        if (ck != -1 && (ck < 0 || ck > l || seq_of(p, (int)ck) != b)) {
            if (report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_CU_SEQLENS);
            write = false;
        }
#if HAS_PAD
        if (cslot == p.pad) write = false;
#endif
        if (write && (cslot < 0 || cslot >= p.slots)) {
            if (report) atomicOr(reinterpret_cast<u32*>(p.err), ERR_SLOT);
            write = false;
        }
        if (write) {
            const float* st = ws(p) + state_off(p, (int)ck, h);
#pragma unroll
            for (int k = 0; k < ELEMS; ++k) {
                if (live[k]) {
                    reinterpret_cast<ST_T*>(p.pool)[cslot * p.pool_s + (i64)h * p.pool_h + (i64)pps[k] * p.pool_p + ns[k]] =
                        from_f32<ST_T>(st[(i64)pps[k] * p.state_row + ns[k]]);
                }
            }
        }
    }
#endif
#pragma unroll
    for (int k = 0; k < ELEMS; ++k) {
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

// The causal weights as A operands in registers (REG_WEIGHTS, 16-bit operands, KT = 32): each warp
// owns 16 rows of the block's 64 and computes the weights of its rows straight into its `mma`
// A fragments, from CB pairs loaded in the fragment layout: no shared round trip, no
// `ldmatrix`, each weight computed once per block. Otherwise (and for tf32) the weights are
// stored to shared memory as a natural operand and the warps hold 32×32 quarters.
#if WGMMA
#define SCAN_REG 0
#define SCAN_MT PMT
#define SCAN_NT PNT
#elif REG_WEIGHTS && OP_KIND != 2 && KT == 32
#define SCAN_REG 1
#define SCAN_MT 1
#define SCAN_NT 8
#else
#define SCAN_REG 0
#define SCAN_MT 2
#define SCAN_NT 4
#endif

#if SCAN_REG
// A lane's causal weights for one KT-slice from k0: rows i[r] (r = 0, 1: g and g + 8 of the
// warp's band), columns k0 + 8q + 2t + e (q < 4, e < 2), packed as the two k-steps' A fragments
// (`a[ks]`: rows g / g + 8 at columns 2t.. and 2t + 8.. of k-step ks). `cb[r][2q + e]` holds
// CB[i][j] (zero where not loaded); weights are CB·exp(min(dA_i − dA_j, 0))·dt_j, zero above the
// diagonal when MASK.
template <bool MASK>
__device__ __forceinline__ void causal_weights(u32 (&a)[2][4], const float (&cb)[2][8], const int (&i)[2],
                                               const float (&dai)[2], const float* s_da, const float* s_dt, int k0,
                                               int t) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int j = k0 + 8 * q + 2 * t;
        const float2 daj = *reinterpret_cast<const float2*>(s_da + j);
        const float2 dtj = *reinterpret_cast<const float2*>(s_dt + j);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float w0 = cb[r][2 * q] * exp2_fast(fminf(dai[r] - daj.x, 0.f)) * dtj.x;
            float w1 = cb[r][2 * q + 1] * exp2_fast(fminf(dai[r] - daj.y, 0.f)) * dtj.y;
            if (MASK) {
                w0 = j <= i[r] ? w0 : 0.f;
                w1 = j + 1 <= i[r] ? w1 : 0.f;
            }
#if OP_KIND == 0
            a[q >> 1][(q & 1) * 2 + r] = pack2<bf16_t>(w0, w1);
#else
            a[q >> 1][(q & 1) * 2 + r] = pack2<f16_t>(w0, w1);
#endif
        }
    }
}
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB) ssd_scan_kernel(const SsdParams p) {
    __shared__ __align__(16) float s_dt[QCAP];
    __shared__ __align__(16) float s_da[QCAP];
    __shared__ __align__(16) OperandTiles As, Bs;
    const int ptiles = (p.dim + TILE - 1) / TILE;
    int c, h, tile;
    block_tile(((p.chunk_rows + TILE - 1) / TILE) * ptiles, true, c, h, tile);
    const int ib = tile / ptiles, p0 = (tile % ptiles) * TILE;
    const int tid = threadIdx.x;
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
    float acc[SCAN_MT][SCAN_NT][4];
    zero(acc);

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
    const bool prev_ok = has_prev && seq_ok;
#if WGMMA
    // Without an entering state the product runs over no slices rather than being branched
    // around: with accumulators defined on two paths, ptxas serializes the wgmma products.
    {
#else
    if (prev_ok) {
#endif
        const float* prev = open ? nullptr : ws(p) + state_off(p, c - 1, h);
        const C_T* cg = reinterpret_cast<const C_T*>(p.c) + (i64)s * p.c_t + (i64)g * p.c_g;
        // C of tokens i0.. and the entering state's head-dim rows p0.., state columns
        // contiguous (natural operands); the state as f32 until stored.
        struct Slice {
            NaturalTile<C_T, C_VEC> c;
            float st[GROUPS][8];
        };
        pipelined_mma<false, false, Slice>(
            As, Bs, prev_ok ? p.dstate : 0, acc,
            [&](int k0, Slice& r, op_st* a, op_st*) {
                r.c.issue(a, LDN, cg, i0, len, p.c_t, k0, p.dstate);
#pragma unroll
                for (int q = 0; q < GROUPS; ++q) {
                    const int row = p0 + group_row(q), n = k0 + group_k(q);
                    float* v = r.st[q];
                    if (!open && row < p.dim && n + 8 <= p.dstate) {
                        load_f32x8(prev + (i64)row * p.state_row + n, v);
                        continue;
                    }
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        v[e] = 0.f;
                        if (row < p.dim && n + e < p.dstate) {
                            v[e] = open ? initial_state(p, seq, h, row, n + e) : __ldg(prev + (i64)row * p.state_row + n + e);
                        }
                    }
                }
            },
            [&](const Slice& r, int, op_st* a, op_st* b) {
                r.c.commit(a, LDN);
#pragma unroll
                for (int q = 0; q < GROUPS; ++q) store8(b + tile_at(group_row(q), group_k(q), LDN), r.st[q]);
            });
#if WGMMA
        // (A factor of one rather than a branch, for the same reason.)
        scale_rows(acc, [&](int r) { return prev_ok && i0 + r < len ? exp2_fast(s_da[i0 + r]) : 1.f; });
#else
        scale_rows(acc, [&](int r) { return i0 + r < len ? exp2_fast(s_da[i0 + r]) : 1.f; });
#endif
    }

    // Diagonal block: Σ_{j ≤ i} CB[i][j]·exp(min(dA_i − dA_j, 0))·dt_j · x[j][p]: the causal
    // weights of rows i0.. (from the f32 CB rows) and x of tokens j.. in its token-major layout
    // (a transposed operand).
    const float* cb = ws(p) + p.ws_cb + ((i64)c * p.groups + g) * p.chunk_rows * p.q_row;
    const X_T* xh = x + (i64)s * p.x_t + (i64)h * p.x_h;
    const int jend = min(i0 + TILE, len);
#if SCAN_REG
    {
        const int lane = tid & 31, gq = lane >> 2, t = lane & 3;
        const int r0 = warp_r0<SCAN_MT, SCAN_NT>();
        const int i[2] = {i0 + r0 + gq, i0 + r0 + gq + 8};
        // CB rows are 8-byte aligned when the scratch's base is (q_row is a multiple of 8).
        const bool pairs = (reinterpret_cast<u64>(cb) & 7) == 0;
        struct Slice {
            float cb[2][8];
            TransposedTile<X_T, X_VEC> x;
        };
        u32 wa[2][4];
        float dai[2];
        pipelined<Slice>(
            As, Bs, jend,
            [&](int k0, Slice& r, op_st*, op_st* b) {
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) {
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int j = k0 + 8 * q + 2 * t;
                        float2 v = make_float2(0.f, 0.f);
                        if (i[rr] < len && j <= i[rr]) {
                            const float* src = cb + (i64)i[rr] * p.q_row + j;
                            if (pairs) {
                                v = __ldg(reinterpret_cast<const float2*>(src));
                            } else {
                                v.x = __ldg(src);
                                if (j + 1 <= i[rr]) v.y = __ldg(src + 1);
                            }
                        }
                        r.cb[rr][2 * q] = v.x;
                        r.cb[rr][2 * q + 1] = v.y;
                    }
                }
                r.x.issue(b, LDT, xh, k0, len, p.x_t, p0, p.dim);
            },
            [&](const Slice& r, int k0, op_st*, op_st* b) {
                // dA_i of this lane's rows (s_da is complete: `pipelined` starts with a barrier).
                dai[0] = s_da[i[0]];
                dai[1] = s_da[i[1]];
                if (k0 + KT - 1 <= i0 + r0) causal_weights<false>(wa, r.cb, i, dai, s_da, s_dt, k0, t);
                else causal_weights<true>(wa, r.cb, i, dai, s_da, s_dt, k0, t);
                r.x.commit(b, LDT);
            },
            [&](int, const op_st*, const op_st* b) {
#pragma unroll
                for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
                    for (int nt = 0; nt < SCAN_NT; nt += 2) {
                        u32 bf[4];
                        frag_b2<true>(bf, b, LDT, 8 * nt, ks * KSTEP, lane);
                        mma_tile<OP_KIND>(acc[0][nt], wa[ks], bf);
                        mma_tile<OP_KIND>(acc[0][nt + 1], wa[ks], bf + 2);
                    }
                }
            });
    }
#else
    struct Slice {
        float cb[GROUPS][8];
        TransposedTile<X_T, X_VEC> x;
    };
    pipelined_mma<false, true, Slice>(
        As, Bs, jend, acc,
        [&](int k0, Slice& r, op_st*, op_st* b) {
#pragma unroll
            for (int q = 0; q < GROUPS; ++q) {
                // CB rows are 32-byte aligned in the scratch when its base is 16-byte aligned.
                const int i = i0 + group_row(q), j = k0 + group_k(q);
                if (i < len && j <= i) {
                    load_f32x8(cb + (i64)i * p.q_row + j, r.cb[q]);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; ++e) r.cb[q][e] = 0.f;
                }
            }
            r.x.issue(b, LDT, xh, k0, len, p.x_t, p0, p.dim);
        },
        [&](const Slice& r, int k0, op_st* a, op_st* b) {
#pragma unroll
            for (int q = 0; q < GROUPS; ++q) {
                const int i = i0 + group_row(q), j = k0 + group_k(q);
                float v[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) v[e] = 0.f;
                if (i < len && j + 7 <= i) {
                    // The whole group on or below the diagonal: no per-element mask.
                    const float dai = s_da[i];
#pragma unroll
                    for (int e = 0; e < 8; ++e) v[e] = r.cb[q][e] * exp2_fast(fminf(dai - s_da[j + e], 0.f)) * s_dt[j + e];
                } else if (i < len && j <= i) {
                    const float dai = s_da[i];
#pragma unroll
                    for (int e = 0; e < 8; ++e) {
                        v[e] = j + e <= i ? r.cb[q][e] * exp2_fast(fminf(dai - s_da[j + e], 0.f)) * s_dt[j + e] : 0.f;
                    }
                }
                store8(a + tile_at(group_row(q), group_k(q), LDN), v);
            }
            r.x.commit(b, LDT);
        });
#endif

    // Epilogue: + D·x, gate, store.
    OUT_T* out = reinterpret_cast<OUT_T*>(p.out);
    const bool vx = pairs_aligned<X_T>(p.x, p.x_t, p.x_h), vo = pairs_aligned<OUT_T>(p.out, p.out_t, p.out_h);
#if HAS_Z
    const Z_T* z = reinterpret_cast<const Z_T*>(p.z);
    const bool vz = pairs_aligned<Z_T>(p.z, p.z_t, p.z_h);
#else
    const bool vz = true;
#endif
    const int r0 = warp_r0<SCAN_MT, SCAN_NT>(), n0 = warp_n0<SCAN_MT, SCAN_NT>();
    if (i0 + TILE <= len && p0 + TILE <= p.dim && vx && vo && vz) {
        // The whole tile in range and every pair aligned: each row's addresses formed once, D's
        // columns loaded once, no per-element bounds.
        const int lane = tid & 31, col0 = p0 + n0 + 2 * (lane & 3);
#if HAS_D
        float dv[SCAN_NT][2];
#pragma unroll
        for (int nt = 0; nt < SCAN_NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 2; ++e) dv[nt][e] = to_f32(reinterpret_cast<const D_T*>(p.d)[(i64)h * p.d_h + (i64)(col0 + 8 * nt + e) * p.d_p]);
        }
#endif
        // Every x (and z) pair of the lane is loaded before any output is stored: the output may
        // alias them as far as the compiler knows, so loads left beside their uses would wait
        // one by one (13.5 % of the scan's stall samples on the H200, docs/PERF.md).
#if HAS_D
        float xv[SCAN_MT][2][SCAN_NT][2];
#endif
#if HAS_Z
        float zv[SCAN_MT][2][SCAN_NT][2];
#endif
        // f(mt, half, token) for each of the lane's rows.
        const auto each_row = [&](auto f) {
#pragma unroll
            for (int mt = 0; mt < SCAN_MT; ++mt) {
#pragma unroll
                for (int half = 0; half < 2; ++half) f(mt, half, s + i0 + r0 + 16 * mt + (lane >> 2) + 8 * half);
            }
        };
        each_row([&](int mt, int half, i64 tok) {
#pragma unroll
            for (int nt = 0; nt < SCAN_NT; ++nt) {
#if HAS_D
                load_pair(x + tok * p.x_t + (i64)h * p.x_h + col0 + 8 * nt, xv[mt][half][nt]);
#endif
#if HAS_Z
                load_pair(z + tok * p.z_t + (i64)h * p.z_h + col0 + 8 * nt, zv[mt][half][nt]);
#endif
            }
        });
        each_row([&](int mt, int half, i64 tok) {
            OUT_T* orow = out + tok * p.out_t + (i64)h * p.out_h + col0;
#pragma unroll
            for (int nt = 0; nt < SCAN_NT; ++nt) {
                float y[2] = {acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]};
#pragma unroll
                for (int e = 0; e < 2; ++e) {
#if HAS_D
                    y[e] += dv[nt][e] * xv[mt][half][nt][e];
#endif
#if HAS_Z
                    y[e] *= zv[mt][half][nt][e] / (1.f + expf(-zv[mt][half][nt][e]));
#endif
                }
                store_pair(orow + 8 * nt, y);
            }
        });
        return;
    }
    // Otherwise element by element, each bounded.
    for_tile(acc, [&](int r, int col, float& v) {
        const int i = i0 + r, pp = p0 + col;
        if (i >= len || pp >= p.dim) return;
        const i64 tok = s + i;
        float y = v;
#if HAS_D
        y += to_f32(reinterpret_cast<const D_T*>(p.d)[(i64)h * p.d_h + (i64)pp * p.d_p]) *
             to_f32(x[tok * p.x_t + (i64)h * p.x_h + pp]);
#endif
#if HAS_Z
        const float zv = to_f32(z[tok * p.z_t + (i64)h * p.z_h + pp]);
        y *= zv / (1.f + expf(-zv));
#endif
        out[tok * p.out_t + (i64)h * p.out_h + pp] = from_f32<OUT_T>(y);
    });
}
