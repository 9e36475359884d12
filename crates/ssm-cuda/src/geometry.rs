//! The launch shape shared by the row-per-lane-group kernels (SSU, GDN recurrent): each state
//! row is read by `tpr` lanes, each lane owns `rpt` rows, a block holds `threads` lanes.

/// Resident threads of one wave on an H100/H200 (132 SMs × 2048).
pub(crate) const WAVE_THREADS: usize = 132 * 2048;

/// Rows per lane and threads per block, from a starting `rpt`, `tpr` lanes per row, the `rows`
/// of one head (the block's row tile never needs to exceed it) and `rows_total` (sequences ×
/// heads × rows of the call). Keeps about two waves of resident threads before giving lanes
/// several rows (small calls are latency-bound: more, shorter-lived threads), then shrinks the
/// rows per lane and the block (to 32 lanes at least) while one block still covers `rows`.
pub(crate) fn rows_and_threads(mut rpt: usize, tpr: usize, rows: usize, rows_total: usize) -> (usize, usize) {
    while rpt > 1 && rows_total * tpr / rpt < 2 * WAVE_THREADS {
        rpt /= 2;
    }
    let mut threads = 128usize;
    let rows = rows.max(1);
    rpt = fit_rows(rpt, tpr, threads, rows);
    while threads > 32 && (threads / tpr / 2) * rpt >= rows && threads / 2 >= tpr {
        threads /= 2;
    }
    (rpt, threads)
}

/// `want` rows per lane, halved while a block of `threads` lanes (`tpr` per row) would still
/// cover all `rows` of a head with half as many.
pub(crate) fn fit_rows(mut want: usize, tpr: usize, threads: usize, rows: usize) -> usize {
    while want > 1 && (threads / tpr) * want / 2 >= rows.max(1) {
        want /= 2;
    }
    want
}

/// The kernel defines of a row geometry (`VEC`, `TPR`, `VPT`, `RPT`, `NTHREADS`), as both
/// kernel families name them.
pub(crate) fn row_defines(vec: u32, tpr: u32, vpt: u32, rpt: u32, threads: u32) -> [(&'static str, String); 5] {
    [
        ("VEC", vec.to_string()),
        ("TPR", tpr.to_string()),
        ("VPT", vpt.to_string()),
        ("RPT", rpt.to_string()),
        ("NTHREADS", threads.to_string()),
    ]
}

/// The constants of an exact division by `d` in a kernel (`fast_div` in kernels/common.cuh):
/// `(m, l)` with l = ⌈log2 d⌉ and m = ⌊2³² (2ˡ − d) / d⌋ + 1, so that n / d =
/// (umulhi(n, m) + n) >> l for every n < 2³¹ (Granlund–Montgomery): one multiply-high, an add
/// and a shift instead of a division. `d` is clamped to 1..2³¹.
pub(crate) fn fast_div(d: usize) -> (u32, u32) {
    let d = d.clamp(1, 1 << 31) as u64;
    let l = 64 - (d - 1).leading_zeros();
    let m = ((1u64 << 32) * ((1u64 << l) - d)) / d + 1;
    (m as u32, l)
}

/// The constants a kernel splits its block index with (`BlockSplit` and `split_block` in
/// kernels/common.cuh): a grid of sequences × heads × row tiles, tile fastest, so that
/// neighbouring blocks share a state slot. Same field order as the CUDA struct.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub(crate) struct BlockSplit {
    tiles: u32,
    tiles_m: u32,
    tiles_l: u32,
    heads: u32,
    heads_m: u32,
    heads_l: u32,
}

impl BlockSplit {
    /// The split of a grid with `tiles` row tiles per head and `heads` heads per sequence (both
    /// below 2³¹: the launch checked the grid against `i32::MAX` blocks).
    pub(crate) fn new(tiles: usize, heads: usize) -> Self {
        let ((tiles_m, tiles_l), (heads_m, heads_l)) = (fast_div(tiles), fast_div(heads));
        BlockSplit { tiles: tiles as u32, tiles_m, tiles_l, heads: heads as u32, heads_m, heads_l }
    }
}

/// The grid's x extent for `blocks` blocks: `None` for an empty call (nothing to launch), an
/// error past the grid limit this crate launches within (`i32::MAX`).
pub(crate) fn grid_x(blocks: usize) -> Result<Option<u32>, crate::CudaError> {
    match blocks {
        0 => Ok(None),
        b if b > i32::MAX as usize => {
            Err(crate::CudaError::Unsupported(format!("{blocks} blocks exceed the grid limit")))
        }
        b => Ok(Some(b as u32)),
    }
}

/// The `key=value` pairs of a tuning variable (`SSM_CUDA_SSU_TUNE`, `SSM_CUDA_GDN_TUNE`): comma
/// separated, unsigned values; malformed pairs are ignored. For tuning sweeps on a GPU; unset in
/// normal use.
pub(crate) fn tune_pairs_of(var: &str) -> Vec<(String, u32)> {
    std::env::var(var)
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn divide(n: u32, (m, l): (u32, u32)) -> u32 {
        let hi = ((n as u64 * m as u64) >> 32) as u32;
        (hi + n) >> l
    }

    #[test]
    fn fast_div_is_exact_below_2_pow_31() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let divisors = (1..=300usize).chain([511, 512, 513, 65535, 65536, 1 << 20, (1 << 31) - 1, 1 << 31]);
        for d in divisors {
            let c = fast_div(d);
            let ns = (0..200u32)
                .chain([(1 << 31) - 1, (1 << 31) - 2, d as u32 - 1, d as u32])
                .chain((0..200).map(|_| (next() % (1 << 31)) as u32));
            for n in ns.filter(|&n| n < 1 << 31) {
                assert_eq!(divide(n, c), n / d as u32, "{n} / {d}");
            }
        }
    }
}
