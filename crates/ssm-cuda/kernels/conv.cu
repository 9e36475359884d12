// Causal conv1d (semantics/gdn_conv.md §4.3–4.4; the arithmetic of ssm_conv::reference), one
// kernel for `causal_conv1d_update` and `causal_conv1d_fn`, specialised at NVRTC time by -D
// macros (see crates/ssm-cuda/src/conv.rs):
//
//   ELEM_T                              f32 / f16_t / bf16_t (x, weight, bias, state, out)
//   CI_T NACC_T QSL_T ISI_T BLK_T       int / i64 / unsigned char (index tables; INIT_T for
//                                       has_initial_state is always unsigned char)
//   WIDTH                               2..4
//   VEC NTHREADS                        channels per thread, threads per block
//   FN                                  1: causal_conv1d_fn (varlen prefill, has_initial_state)
//   HAS_CI HAS_PAD VARLEN SPEC APC HAS_INIT HAS_BIAS SILU        0/1
//   XPRE                                0/1: each chunk's first input is loaded before the
//                                       history (small, latency-bound grids)
//   HAS_CKPT                            0/1, FN only: prefix-caching checkpoints, the offsets in
//                                       the `nacc` table (NACC_T) and their slots in the `blk`
//                                       table (BLK_T), the update's tables
//   X_VEC OUT_VEC ST_VEC W_VEC B_VEC    0/1: the tensor is contiguous along the channels (for
//       the weight: [dim, WIDTH] row-major) and aligned to VEC channels' bytes (16, or 8) at
//       every vector start: one access per VEC channels (the weight: VEC × WIDTH taps, in
//       16-byte pieces where they are whole, else one by one)
//
// One thread owns VEC consecutive channels of one sequence and one chunk of its tokens. Block
// b covers channels [cb·NTHREADS·VEC, (cb+1)·NTHREADS·VEC) of sequence s (blockIdx.x = s ·
// cblocks + cb), so a warp reads 32·VEC consecutive channels of one token: coalesced along
// `dim` in the channel-contiguous layouts. blockIdx.z strides over token chunks of `chunk`
// tokens; chunk k > 0 reads its window's history from x (Triton's BLOCK_M pieces), chunk 0
// reads it from the state. The history window (WIDTH − 1 values per channel) stays in f32
// registers (storage values, exact); the state is written only by chunk 0, after its reads:
// - non-speculative: columns [0, WIDTH − 1) = the last WIDTH − 1 values of history ++ x,
//   taken from the registers and from x directly (no other chunk is waited for);
// - speculative (one chunk): columns [0, WIDTH − 2) = history[1..], then x_t at column
//   WIDTH − 2 + t as the tokens go;
// - a checkpoint (FN, HAS_CKPT), chunk 0 too, right after its history reads: columns
//   [0, WIDTH − 1) of the checkpoint's slot = the window after the first `offset` tokens
//   (history columns, then x), from the registers and from x.
//
// Index values are checked here: a pad skips the sequence (nothing written, as the
// reference); any other value outside its range skips the sequence and ORs a bit into the
// device error word, so no index value ever reads or writes outside its tensor.

// (Error-word bits ERR_*: kernels/common.cuh.)

// (`struct ConvParams`: kernels/common.cuh, shared with gdn.cu's fused decode step.)

// Every thread of a block meets the same index values; thread 0 (which always has channels)
// reports them.
__device__ __forceinline__ void raise_error(const ConvParams& p, u32 bit) {
    if (threadIdx.x == 0 && blockIdx.z == 0) atomicOr(reinterpret_cast<u32*>(p.err), bit);
}


// Bytes of one thread's VEC channels: one vector access of 16 (or, with fewer channels per
// thread, 8) bytes where the tensor allows it.
#define VEC_BYTES (VEC * (int)sizeof(ELEM_T))

// VEC channels starting at `p` (element stride `s` between channels): one vector access
// when CONTIG (the caller guarantees stride 1 and VEC_BYTES alignment), else element by
// element, channels at or past `n` left alone (reads give 0).
template <bool CONTIG> __device__ __forceinline__ void ld_ch(const ELEM_T* p, i64 s, int n, float* v) {
    if constexpr (CONTIG && VEC_BYTES == 8) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        const ELEM_T* e = reinterpret_cast<const ELEM_T*>(&u);
#pragma unroll
        for (int i = 0; i < VEC; ++i) v[i] = to_f32(e[i]);
    } else if constexpr (CONTIG) {
        load_vec<VEC, ELEM_T>(p, v);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = e < n ? to_f32(p[e * s]) : 0.f;
    }
}
template <bool CONTIG> __device__ __forceinline__ void ld_ch_ro(const ELEM_T* p, i64 s, int n, float* v) {
    if constexpr (CONTIG) {  // load_vec_ro takes 8 bytes as one access too
        load_vec_ro<VEC, ELEM_T>(p, v);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) v[e] = e < n ? to_f32(ld_ro(p + e * s)) : 0.f;
    }
}
// One channel's value narrowed to ELEM_T: rounded, or with COPY (a state or input element
// moved, not computed) given back its own bits, as the reference copies elements.
template <bool COPY> __device__ __forceinline__ ELEM_T narrow(float v) {
    if constexpr (COPY) {
        return FromF32<ELEM_T>::copy(v);
    } else {
        return from_f32<ELEM_T>(v);
    }
}
// (E is ELEM_T, a template parameter so that only 16-bit types instantiate `copy2`.)
template <bool CONTIG, bool COPY = false, typename E = ELEM_T> __device__ __forceinline__ void st_ch(E* p, i64 s, int n, const float* v) {
    if constexpr (COPY && CONTIG && sizeof(E) == 2 && (VEC_BYTES == 8 || VEC_BYTES == 16)) {
        // Two channels a word (for bf16 one byte permute of the two values' high halves).
        // One aligned vector of NW words, stored at once (sizes written in E, so that only the
        // 16-bit instantiations are checked).
        constexpr int NB = VEC * (int)sizeof(E), NW = NB / 4;
        struct alignas(NB) Words {
            u32 w[NW];
        } words;
#pragma unroll
        for (int i = 0; i < NW; ++i) words.w[i] = copy2<E>(v[2 * i], v[2 * i + 1]);
        *reinterpret_cast<Words*>(p) = words;
    } else if constexpr (CONTIG && VEC_BYTES == 8) {
        uint2 u;
        ELEM_T* e = reinterpret_cast<ELEM_T*>(&u);
#pragma unroll
        for (int i = 0; i < VEC; ++i) e[i] = narrow<COPY>(v[i]);
        *reinterpret_cast<uint2*>(p) = u;
    } else if constexpr (CONTIG) {
        store_vec<VEC, ELEM_T>(p, v);
    } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e)
            if (e < n) p[e * s] = narrow<COPY>(v[e]);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS) conv_kernel(const ConvParams p) {
    // A kernel launched after this one with programmatic stream serialization (the GDN decode
    // step's recurrence) may start now; it waits for this grid's writes before reading them.
    pdl_launch_dependents();
    // 32-bit quotient: the grid's x extent and `cblocks` are below 2^31.
    const unsigned cbs = (unsigned)p.cblocks;
    const i64 seq = blockIdx.x / cbs;
    const int cb = (int)(blockIdx.x % cbs);
    const int c0 = (cb * NTHREADS + (int)threadIdx.x) * VEC;
    if (seq >= p.batch || c0 >= p.dim) return;
    const int nch = p.dim - c0 < VEC ? p.dim - c0 : VEC;  // channels of this thread

    // ---- the sequence's tokens ----
    i64 bos = 0;
    int len = p.seqlen;
#if VARLEN
    {
        const QSL_T* q = reinterpret_cast<const QSL_T*>(p.qsl);
        bos = load_index(q + seq * p.qsl_s);
        const i64 eos = load_index(q + (seq + 1) * p.qsl_s);
        if (bos < 0 || eos < bos || eos > p.rows) {
            raise_error(p, ERR_CU_SEQLENS);
            return;
        }
        len = (int)(eos - bos);
    }
#endif

    // ---- slots (mirrors plan_update / plan_fn) ----
    i64 read_slot = seq, write_slot = seq;
#if HAS_CI
    {
        const CI_T* row = reinterpret_cast<const CI_T*>(p.ci) + seq * p.ci_seq;
        i64 rcol = 0, wcol = 0;
#if APC
        rcol = load_index(reinterpret_cast<const ISI_T*>(p.init) + seq * p.init_s);
        wcol = load_index(reinterpret_cast<const BLK_T*>(p.blk) + seq * p.blk_s);
        if (rcol < 0 || rcol >= p.ci_cols || wcol < 0 || wcol >= p.ci_cols) {
            raise_error(p, ERR_COLUMN);
            return;
        }
#endif
        read_slot = load_index(row + rcol * p.ci_col);
        if (HAS_PAD && read_slot == p.pad) return;  // pad: nothing written
        if (read_slot < 0 || read_slot >= p.slots) {
            raise_error(p, ERR_SLOT);
            return;
        }
        write_slot = wcol == rcol ? read_slot : load_index(row + wcol * p.ci_col);
        if (!(HAS_PAD && write_slot == p.pad) && (write_slot < 0 || write_slot >= p.slots)) {
            raise_error(p, ERR_SLOT);
            return;
        }
        if (HAS_PAD && write_slot == p.pad) write_slot = -1;  // prefix caching: no state write
    }
#else
    if (seq >= p.slots) {
        raise_error(p, ERR_SLOT);
        return;
    }
#endif
    if (len <= 0) return;  // empty sequence: nothing written

    int off = 0;  // first history column
#if SPEC
    {
        const i64 v = load_index(reinterpret_cast<const NACC_T*>(p.nacc) + seq * p.nacc_s);
        if (v < 1 || v > p.state_len + 2 - WIDTH || (i64)(WIDTH - 2) + len > p.state_len) {
            raise_error(p, ERR_ACCEPTED);
            return;
        }
        off = (int)(v - 1);
    }
#endif
    bool has_hist = true;
#if FN
#if HAS_INIT
    has_hist = load_index(reinterpret_cast<const unsigned char*>(p.init) + seq * p.init_s) != 0;
#else
    has_hist = false;
#endif
#endif
#if FN && HAS_CKPT
    // The checkpoint (mirrors plan_fn): offset 0 is none; an offset outside [1, len) or a slot
    // outside the pool (or the sequence's own) skips the sequence; the pad writes nothing.
    int ck_tokens = 0;
    i64 ck_slot = -1;
    {
        const i64 o = load_index(reinterpret_cast<const NACC_T*>(p.nacc) + seq * p.nacc_s);
        if (o != 0) {
            if (o < 0 || o >= len) {
                raise_error(p, ERR_CU_SEQLENS);
                return;
            }
            const i64 s = load_index(reinterpret_cast<const BLK_T*>(p.blk) + seq * p.blk_s);
            if (!(HAS_PAD && s == p.pad)) {
                if (s < 0 || s >= p.slots || s == write_slot) {
                    raise_error(p, ERR_SLOT);
                    return;
                }
                ck_tokens = (int)o;
                ck_slot = s;
            }
        }
    }
#endif

    // ---- per-channel constants ----
    const ELEM_T* x = reinterpret_cast<const ELEM_T*>(p.x) + (VARLEN ? bos * p.x_tok : seq * p.x_seq) + (i64)c0 * p.x_dim;
    ELEM_T* out = reinterpret_cast<ELEM_T*>(p.out) + (VARLEN ? bos * p.out_tok : seq * p.out_seq) + (i64)c0 * p.out_dim;
    float w[VEC][WIDTH];
    {
        const ELEM_T* wp = reinterpret_cast<const ELEM_T*>(p.w) + (i64)c0 * p.w_dim;
#if W_VEC
        float flat[VEC * WIDTH];
        load_vec_ro<VEC * WIDTH, ELEM_T>(wp, flat);
#pragma unroll
        for (int e = 0; e < VEC; ++e)
#pragma unroll
            for (int j = 0; j < WIDTH; ++j) w[e][j] = flat[e * WIDTH + j];
#else
#pragma unroll
        for (int e = 0; e < VEC; ++e)
#pragma unroll
            for (int j = 0; j < WIDTH; ++j) w[e][j] = e < nch ? to_f32(ld_ro(wp + e * p.w_dim + j * p.w_tap)) : 0.f;
#endif
    }
    float bias[VEC];
#if HAS_BIAS
    ld_ch_ro<B_VEC>(reinterpret_cast<const ELEM_T*>(p.bias) + (i64)c0 * p.b_dim, p.b_dim, nch, bias);
#else
#pragma unroll
    for (int e = 0; e < VEC; ++e) bias[e] = 0.f;
#endif
    ELEM_T* st = reinterpret_cast<ELEM_T*>(p.state) + (i64)c0 * p.st_dim;

    for (int k = blockIdx.z; (i64)k * p.chunk < len; k += gridDim.z) {
        const int t0 = k * p.chunk;
        const int t1 = (i64)t0 + p.chunk < len ? t0 + p.chunk : len;
        // XPRE: the chunk's first input, loaded before the history. The history's widening
        // waits for the state's bytes, so an x load issued after it adds a second memory round
        // trip to a one-token step (t0 < len here).
        float xn[VEC];
        if (XPRE) ld_ch<X_VEC>(x + (i64)t0 * p.x_tok, p.x_dim, nch, xn);
        // History window h[j], j = 0..WIDTH−2 (oldest first), per channel.
        float h[WIDTH - 1][VEC];
        if (k == 0) {
#pragma unroll
            for (int j = 0; j < WIDTH - 1; ++j) {
                if (has_hist) {
                    ld_ch<ST_VEC>(st + read_slot * p.st_slot + (i64)(off + j) * p.st_col, p.st_dim, nch, h[j]);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; ++e) h[j][e] = 0.f;
                }
            }
#if FN && HAS_CKPT
            // ---- the checkpoint: column i is history column i + offset, else token
            // i + offset − (WIDTH − 1) ----
            if (ck_slot >= 0) {
#pragma unroll
                for (int i = 0; i < WIDTH - 1; ++i) {
                    float v[VEC] = {};
                    const int src = i + ck_tokens - (WIDTH - 1);
                    if (src >= 0) {
                        ld_ch<X_VEC>(x + (i64)src * p.x_tok, p.x_dim, nch, v);
                    } else {
#pragma unroll
                        for (int j = 0; j < WIDTH - 1; ++j)
                            if (j == i + ck_tokens)
#pragma unroll
                                for (int e = 0; e < VEC; ++e) v[e] = h[j][e];
                    }
                    st_ch<ST_VEC, true>(st + ck_slot * p.st_slot + (i64)i * p.st_col, p.st_dim, nch, v);
                }
            }
#endif
            // ---- the new state, speculative (every read of the old state is done) ----
#if SPEC
            if (write_slot >= 0) {
#pragma unroll
                for (int i = 0; i < WIDTH - 2; ++i)
                    st_ch<ST_VEC, true>(st + write_slot * p.st_slot + (i64)i * p.st_col, p.st_dim, nch, h[i + 1]);
            }
#else
            // Non-speculative, several chunks (so len > chunk ≥ WIDTH − 1): the new window is
            // the last WIDTH − 1 inputs, read from x. (One chunk: the final window, below.)
            if (write_slot >= 0 && len > p.chunk) {
#pragma unroll
                for (int i = 0; i < WIDTH - 1; ++i) {
                    float v[VEC];
                    ld_ch<X_VEC>(x + (i64)(len - (WIDTH - 1) + i) * p.x_tok, p.x_dim, nch, v);
                    st_ch<ST_VEC, true>(st + write_slot * p.st_slot + (i64)i * p.st_col, p.st_dim, nch, v);
                }
            }
#endif
        } else {
#pragma unroll
            for (int j = 0; j < WIDTH - 1; ++j) ld_ch<X_VEC>(x + (i64)(t0 - (WIDTH - 1) + j) * p.x_tok, p.x_dim, nch, h[j]);
        }

        for (int t = t0; t < t1; ++t) {
            float xv[VEC];
            if (XPRE && t == t0) {
#pragma unroll
                for (int e = 0; e < VEC; ++e) xv[e] = xn[e];
            } else {
                ld_ch<X_VEC>(x + (i64)t * p.x_tok, p.x_dim, nch, xv);
            }
#if SPEC
            if (write_slot >= 0) st_ch<ST_VEC, true>(st + write_slot * p.st_slot + (i64)(WIDTH - 2 + t) * p.st_col, p.st_dim, nch, xv);
#endif
            float y[VEC];
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                float acc = bias[e];
#pragma unroll
                for (int j = 0; j < WIDTH - 1; ++j) acc = conv_mac<ELEM_T>(h[j][e], w[e][j], acc);
                acc = conv_mac<ELEM_T>(xv[e], w[e][WIDTH - 1], acc);
#if SILU
                acc = silu_triton(acc);
#endif
                y[e] = acc;
            }
            st_ch<OUT_VEC>(out + (i64)t * p.out_tok, p.out_dim, nch, y);
#pragma unroll
            for (int j = 0; j < WIDTH - 2; ++j)
#pragma unroll
                for (int e = 0; e < VEC; ++e) h[j][e] = h[j + 1][e];
#pragma unroll
            for (int e = 0; e < VEC; ++e) h[WIDTH - 2][e] = xv[e];
        }
#if !SPEC
        // One chunk: the final window (the last WIDTH − 1 values of history ++ x) is the new state.
        if (k == 0 && write_slot >= 0 && len <= p.chunk) {
#pragma unroll
            for (int i = 0; i < WIDTH - 1; ++i) st_ch<ST_VEC, true>(st + write_slot * p.st_slot + (i64)i * p.st_col, p.st_dim, nch, h[i]);
        }
#endif
    }
}
