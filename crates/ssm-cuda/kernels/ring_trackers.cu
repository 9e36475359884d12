// ReplaySSM ring trackers (semantics/ssu.md §7.4; the arithmetic of ssm_ring::step), one kernel
// for `update_replayssm_ring_trackers` (advance), its reset, and
// `commit_replayssm_ring_trackers`, specialised at NVRTC time by -D macros (see
// crates/ssm-cuda/src/ring.rs):
//
//   TRK_T IDX_T ACC_T QSL_T   int / i64 (trackers, slot table, accepted counts, query starts)
//   MODE                      0 reset, 1 advance, 2 commit
//   HAS_PAD                   0/1
//
// The contract applies rows in order, so a slot named by several rows takes their steps one
// after the other. One block of 1024 threads does the whole call, CHUNK rows at a time: each
// chunk's (slot, row) keys are sorted in shared memory (bitonic), and the thread at the head of
// each slot's run applies that run's rows in row order with the cursors in registers (one load
// and one store per slot). Chunks follow each other behind a barrier, so rows of a later chunk
// see the earlier chunks' cursors. Pads and slots outside [0, num_states) are skipped: not an
// error (the contract, which mirrors vLLM's mask), so this kernel never sets the error word.
// Integer arithmetic wraps (two's complement, on u64), as the reference's does.

#define CHUNK 2048
#define NTHREADS 1024
#define ROW_BITS 11  // CHUNK = 1 << ROW_BITS
#define NO_KEY 0xffffffffffffffffull

// Mirrored by `TrackerParams` in crates/ssm-cuda/src/ring.rs (same order, no padding).
struct TrackerParams {
    u64 rs, pa, pq, idx, acc, qsl;
    i64 rs_s, pa_s, pq_s, idx_s, acc_s, qsl_s;
    i64 num_states, pad, window, ring_len, rows;
};

__device__ __forceinline__ i64 wrap_add(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i64 wrap_sub(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
// Rust's i64::rem_euclid for l > 0.
__device__ __forceinline__ i64 rem_euclid(i64 a, i64 l) {
    const i64 r = a % l;
    return r < 0 ? r + l : r;
}

__device__ __forceinline__ void store_tracker(TRK_T* p, i64 v) { *p = (TRK_T)v; }

extern "C" __global__ void __launch_bounds__(NTHREADS) ring_trackers_kernel(const TrackerParams p) {
    __shared__ u64 keys[CHUNK];
    const int tid = threadIdx.x;
    for (i64 base = 0; base < p.rows; base += CHUNK) {
        const int cnt = (int)min((i64)CHUNK, p.rows - base);
        for (int i = tid; i < CHUNK; i += NTHREADS) {
            u64 key = NO_KEY;
            if (i < cnt) {
                const i64 s = load_index((const IDX_T*)p.idx + (base + i) * p.idx_s);
                const bool pad = HAS_PAD && s == p.pad;
                if (!pad && s >= 0 && s < p.num_states) key = ((u64)s << ROW_BITS) | (u64)i;
            }
            keys[i] = key;
        }
        __syncthreads();
        // Bitonic sort of the CHUNK keys, ascending: (slot, row) order.
        for (int size = 2; size <= CHUNK; size <<= 1) {
            for (int stride = size >> 1; stride > 0; stride >>= 1) {
                for (int i = tid; i < CHUNK; i += NTHREADS) {
                    const int j = i ^ stride;
                    if (j > i) {
                        const u64 a = keys[i], b = keys[j];
                        const bool up = (i & size) == 0;
                        if ((a > b) == up) {
                            keys[i] = b;
                            keys[j] = a;
                        }
                    }
                }
                __syncthreads();
            }
        }
        for (int i = tid; i < cnt; i += NTHREADS) {
            const u64 key = keys[i];
            if (key == NO_KEY) continue;
            const u64 slot = key >> ROW_BITS;
            if (i > 0 && (keys[i - 1] >> ROW_BITS) == slot) continue;  // not the head of its run
            TRK_T* rs = (TRK_T*)p.rs + (i64)slot * p.rs_s;
            TRK_T* pa = (TRK_T*)p.pa + (i64)slot * p.pa_s;
            TRK_T* pq = (TRK_T*)p.pq + (i64)slot * p.pq_s;
#if MODE == 0
            store_tracker(rs, 0);
            store_tracker(pa, 0);
            store_tracker(pq, 0);
#else
            i64 start = load_index(rs), prev = load_index(pa);
#if MODE == 2
            i64 prev_q = load_index(pq);
#endif
            for (int q = i; q < cnt && (keys[q] >> ROW_BITS) == slot; ++q) {
#if MODE == 1
                const i64 next = wrap_add(prev, 1);
                if (next > p.window) {
                    start = rem_euclid(wrap_add(start, prev), p.ring_len);
                    prev = 1;
                } else {
                    prev = next;
                }
#else
                const i64 row = base + (i64)(keys[q] & ((1u << ROW_BITS) - 1));
                const i64 accepted = load_index((const ACC_T*)p.acc + row * p.acc_s);
                const i64 cur_q = wrap_sub(load_index((const QSL_T*)p.qsl + (row + 1) * p.qsl_s),
                                           load_index((const QSL_T*)p.qsl + row * p.qsl_s));
                const bool must = prev_q > 0 && wrap_add(prev, prev_q) > p.window;
                if (must) start = rem_euclid(wrap_add(start, prev), p.ring_len);
                prev = prev_q == 0 ? 0 : (must ? accepted : wrap_add(prev, accepted));
                prev_q = cur_q;
#endif
                // Stored (and so truncated to TRK_T) after every row, as the reference does.
                start = (i64)(TRK_T)start;
                prev = (i64)(TRK_T)prev;
#if MODE == 2
                prev_q = (i64)(TRK_T)prev_q;
#endif
            }
            store_tracker(rs, start);
            store_tracker(pa, prev);
#if MODE == 2
            store_tracker(pq, prev_q);
#endif
#endif
        }
        __syncthreads();  // the next chunk reads what this one stored
    }
}
