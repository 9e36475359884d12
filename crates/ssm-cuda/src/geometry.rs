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
    let rpt = fit_rows(rpt, tpr, 128, rows);
    (rpt, block_threads(tpr, rpt, rows))
}

/// Threads per block for `tpr` lanes per row and `rpt` rows per lane: 128, halved (to 32 lanes
/// at least) while one block still covers all `rows` of a head.
pub(crate) fn block_threads(tpr: usize, rpt: usize, rows: usize) -> usize {
    let mut threads = 128usize;
    while threads > 32 && (threads / tpr / 2) * rpt >= rows.max(1) && threads / 2 >= tpr {
        threads /= 2;
    }
    threads
}

/// Rows per lane for a 16-bit tile held in its storage form (`RAW`), as measured on an H200
/// (docs/PERF.md): eight rows per lane halve the per-thread overhead per byte once the call fills
/// `waves` waves of threads at eight rows per lane; smaller calls take two (more, shorter
/// blocks). Fitted to the `rows` of one head.
pub(crate) fn raw16_rows(rows_total: usize, tpr: usize, threads: usize, rows: usize, waves: usize) -> usize {
    let want = if rows_total * tpr / 8 >= waves * WAVE_THREADS { 8 } else { 2 };
    fit_rows(want, tpr, threads, rows)
}

/// `want` rows per lane, halved while a block of `threads` lanes (`tpr` per row) would still
/// cover all `rows` of a head with half as many.
pub(crate) fn fit_rows(mut want: usize, tpr: usize, threads: usize, rows: usize) -> usize {
    while want > 1 && (threads / tpr) * want / 2 >= rows.max(1) {
        want /= 2;
    }
    want
}

/// The row geometry the SSU and GDN kernels share: each state row is read by `tpr` lanes, each
/// lane holds `vpt` vectors of `vec` elements of a row for `rpt` rows, a block holds `threads`
/// lanes (see the headers of `kernels/ssu.cu` and `kernels/gdn.cu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RowGeometry {
    /// State elements per vector access (16 bytes, or 1 when the state rows are not 16-byte aligned).
    pub vec: u32,
    /// Lanes sharing one state row (a power of two ≤ 32).
    pub tpr: u32,
    /// Vectors per lane and row.
    pub vpt: u32,
    /// Rows per lane.
    pub rpt: u32,
    /// Threads per block.
    pub threads: u32,
    /// Minimum resident blocks per SM asked of the compiler (`__launch_bounds__`); 0 = none.
    pub min_blocks: u32,
}

impl RowGeometry {
    /// A geometry from the sizes the choosers compute (each far below `u32::MAX`).
    pub(crate) fn new(vec: usize, tpr: usize, vpt: usize, rpt: usize, threads: usize, min_blocks: u32) -> Self {
        RowGeometry {
            vec: vec as u32,
            tpr: tpr as u32,
            vpt: vpt as u32,
            rpt: rpt as u32,
            threads: threads as u32,
            min_blocks,
        }
    }

    /// Rows one block covers.
    pub fn dim_tile(&self) -> u32 {
        self.threads / self.tpr * self.rpt
    }

    /// The kernel defines (`VEC`, `TPR`, `VPT`, `RPT`, `NTHREADS`, `MINB`), as both kernel
    /// families name them.
    pub(crate) fn defines(&self) -> [(&'static str, String); 6] {
        [
            ("VEC", self.vec.to_string()),
            ("TPR", self.tpr.to_string()),
            ("VPT", self.vpt.to_string()),
            ("RPT", self.rpt.to_string()),
            ("NTHREADS", self.threads.to_string()),
            ("MINB", self.min_blocks.to_string()),
        ]
    }
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

/// A tuning variable (`SSM_CUDA_SSU_TUNE`, `SSM_CUDA_GDN_TUNE`, `SSM_CUDA_SSD_TUNE`): comma
/// separated `key=value` pairs with unsigned values, read once; malformed pairs are ignored. For
/// tuning sweeps on a GPU; unset in normal use.
pub(crate) struct TuneVar {
    name: &'static str,
    pairs: std::sync::OnceLock<Vec<(String, u32)>>,
}

impl TuneVar {
    pub(crate) const fn new(name: &'static str) -> TuneVar {
        TuneVar { name, pairs: std::sync::OnceLock::new() }
    }

    /// Every pair, in the variable's order.
    pub(crate) fn pairs(&self) -> &[(String, u32)] {
        self.pairs.get_or_init(|| {
            std::env::var(self.name)
                .unwrap_or_default()
                .split(',')
                .filter_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    Some((k.trim().to_string(), v.trim().parse().ok()?))
                })
                .collect()
        })
    }

    /// The value of `key`, if set.
    pub(crate) fn get(&self, key: &str) -> Option<u32> {
        self.pairs().iter().find(|(k, _)| k == key).map(|&(_, v)| v)
    }

    /// The value of `key` as lanes per row, if set to a power of two up to 32.
    pub(crate) fn lanes(&self, key: &str) -> Option<usize> {
        self.get(key).map(|t| t as usize).filter(|&t| t.is_power_of_two() && t <= 32)
    }
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
