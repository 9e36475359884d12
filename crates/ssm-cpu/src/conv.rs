//! Causal conv1d on the CPU ([`ssm_conv::ConvBackend`]).
//!
//! Work items are (block of sequences, channel chunk) pairs: the plan guarantees that no
//! slot written by one sequence (its state or its prefix-caching checkpoint) is used by
//! another and that the written tensors do not
//! overlap themselves, and chunks touch disjoint channels, so every item writes memory no
//! other item reads or writes. Inside an item, per block of 1024 channels, the taps and the
//! bias are widened once into the level's widest lanes (sixteen channels per vector with
//! AVX-512); then each sequence runs over the block. Where `x`, `out`
//! and the state are contiguous along `dim` (vLLM's `(slots, state_len, dim)` layout), the
//! tokens run first, in tiles of 16, with the history read straight from the read slot
//! (prefetched one sequence ahead) or from `x`'s previous rows, and the new window is written
//! after them as one copy per column (a checkpoint's window just before, while the old window
//! is still there). Elsewhere (any strides, both layouts) the history is
//! loaded and the window written first, through gathers and scatters where a tensor is not
//! contiguous along `dim`.
//!
//! Numerics follow [`ssm_conv::reference`]: f32 accumulation from the bias, each product
//! rounded to the storage dtype for f16/bf16 (fused multiply-add for f32), silu as
//! `y / (1 + e^-y)`. Nothing is allocated per call.

use half::{bf16, f16};
use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvPlan, ConvSeq};
use ssm_tensor::{DType, Planned, Run, TensorMut, TensorRef};

use crate::shared::SharedBuf;
use crate::simd::{LANES, PowTwo, Real, Simd, SimdKernel, WideLanes, dispatch};
use crate::{CpuBackend, CpuError, require_host};

// Conv's own accesses to the shared [`SharedBuf`] (items touch only elements the plan assigns
// to them alone: disjoint slots per sequence, disjoint channels per chunk).
impl<T: Real> SharedBuf<T> {
    /// Copies `n` elements `src + k·stride` to `dst + k·stride` (distinct columns of this item).
    #[inline(always)]
    fn copy_within(&self, src: isize, dst: isize, stride: isize, n: usize) {
        if stride == 1 && n == LANES {
            let (s, d) = (src as usize, dst as usize);
            assert!(s + LANES <= self.len() && d + LANES <= self.len());
            // SAFETY: both ranges are in bounds (asserted) and belong to this item alone; the
            // eight values are read before they are written.
            unsafe {
                let v = self.elems::<T>(s, LANES).cast::<[T; LANES]>().read_unaligned();
                self.elems::<T>(d, LANES).cast::<[T; LANES]>().write_unaligned(v);
            }
        } else if stride == 1 {
            let (s, d) = (src as usize, dst as usize);
            assert!(s + n <= self.len() && d + n <= self.len());
            // SAFETY: both ranges are in bounds (asserted) and belong to this item alone;
            // `copy` allows overlap.
            unsafe { std::ptr::copy(self.elems::<T>(s, n), self.elems::<T>(d, n), n) }
        } else {
            for k in 0..n as isize {
                // SAFETY: both elements belong to this item alone (see the impl's note).
                unsafe { self.write((dst + k * stride) as usize, self.read((src + k * stride) as usize)) };
            }
        }
    }

    /// Copies `n` elements `src[from + k·sstride]` to `dst + k·dstride`.
    #[inline(always)]
    fn copy_from(&self, src: &[T], from: isize, sstride: isize, dst: isize, dstride: isize, n: usize) {
        if sstride == 1 && dstride == 1 && n == LANES {
            let (f, d) = (from as usize, dst as usize);
            let v: [T; LANES] = src[f..f + LANES].try_into().expect("eight elements");
            assert!(d + LANES <= self.len());
            // SAFETY: the target range is in bounds (asserted) and belongs to this item alone.
            unsafe { self.elems::<T>(d, LANES).cast::<[T; LANES]>().write_unaligned(v) }
        } else if sstride == 1 && dstride == 1 {
            let (f, d) = (from as usize, dst as usize);
            let src = &src[f..f + n];
            assert!(d + n <= self.len());
            // SAFETY: the target range is in bounds (asserted) and belongs to this item alone;
            // `src` is another tensor's memory (a shared borrow), so the ranges do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.elems::<T>(d, n), n) }
        } else {
            for k in 0..n as isize {
                // SAFETY: the element belongs to this item alone (see the impl's note).
                unsafe { self.write((dst + k * dstride) as usize, src[(from + k * sstride) as usize]) };
            }
        }
    }

    /// Writes `v` to `n` elements `dst + k·stride`.
    #[inline(always)]
    fn fill(&self, dst: isize, stride: isize, n: usize, v: T) {
        for k in 0..n as isize {
            // SAFETY: the element belongs to this item alone (see the impl's note).
            unsafe { self.write((dst + k * stride) as usize, v) };
        }
    }

    /// Loads `n ≤ V::WIDTH` elements `base + k·stride` as lanes (zeros past `n`).
    #[inline(always)]
    fn load<V: WideLanes>(&self, base: isize, stride: isize, n: usize) -> V {
        if stride == 1 && n == V::WIDTH {
            let b = base as usize;
            assert!(b + n <= self.len());
            // SAFETY: the `n` elements are in bounds (asserted) and written by no other item
            // while this one runs (module note).
            unsafe { T::load_wide(self.elems::<T>(b, n)) }
        } else {
            let mut buf = [0.0f32; 16];
            for (k, v) in buf.iter_mut().enumerate().take(n) {
                // SAFETY: no other item writes the element (see the impl's note).
                *v = unsafe { self.read((base + k as isize * stride) as usize) }.to_f32();
            }
            // SAFETY: `buf` holds 16 ≥ `V::WIDTH` f32.
            unsafe { V::load(buf.as_ptr()) }
        }
    }

    /// Stores the first `n ≤ V::WIDTH` lanes at `base + k·stride`, rounded to the storage dtype.
    #[inline(always)]
    fn store<V: WideLanes>(&self, v: V, base: isize, stride: isize, n: usize) {
        if stride == 1 && n == V::WIDTH {
            let b = base as usize;
            assert!(b + n <= self.len());
            // SAFETY: the `n` elements are in bounds (asserted) and belong to this item alone.
            unsafe { T::store_wide(v, self.elems::<T>(b, n)) };
        } else {
            let mut buf = [0.0f32; 16];
            // SAFETY: `buf` holds 16 ≥ `V::WIDTH` f32.
            unsafe { v.store(buf.as_mut_ptr()) };
            for (k, &x) in buf.iter().enumerate().take(n) {
                // SAFETY: the element belongs to this item alone (see the impl's note).
                unsafe { self.write((base + k as isize * stride) as usize, T::from_f32(x)) };
            }
        }
    }
}

/// Loads `n ≤ V::WIDTH` elements `base + k·stride` of a read-only slice as lanes.
#[inline(always)]
fn load_ro<T: Real, V: WideLanes>(d: &[T], base: isize, stride: isize, n: usize) -> V {
    if stride == 1 && n == V::WIDTH {
        let s = &d[base as usize..base as usize + n];
        // SAFETY: `s` holds the `V::WIDTH` elements read.
        unsafe { T::load_wide(s.as_ptr()) }
    } else {
        let mut buf = [0.0f32; 16];
        for (k, v) in buf.iter_mut().enumerate().take(n) {
            *v = d[(base + k as isize * stride) as usize].to_f32();
        }
        // SAFETY: `buf` holds 16 ≥ `V::WIDTH` f32.
        unsafe { V::load(buf.as_ptr()) }
    }
}

/// `bias + Σ_j round_T(window[j]·taps[j])` in tap order, over the window's `W − 1` history
/// lanes (oldest first) and then the token's (`window[3]`): each product rounded to the storage
/// dtype as vLLM's Triton kernel forms it from f16/bf16 operands, the `W` of them together
/// ([`Real::round_each_wide`]); fused multiply-adds for f32.
#[inline(always)]
fn taps_sum<T: Real, V: WideLanes, const W: usize>(window: [V; 4], taps: &[V; W], bias: V) -> V {
    if T::DTYPE == DType::F32 {
        let mut acc = bias;
        for j in 0..W {
            acc = window[if j + 1 == W { 3 } else { j }].mul_add(taps[j], acc);
        }
        return acc;
    }
    let mut p = [V::splat(0.0); W];
    for j in 0..W {
        p[j] = window[if j + 1 == W { 3 } else { j }].mul(taps[j]);
    }
    let mut acc = bias;
    for r in T::round_each_wide::<V, W>(p) {
        acc = acc.add(r);
    }
    acc
}

/// Everything one item needs.
struct Ctx<'a, T> {
    plan: &'a ConvPlan,
    x: &'a [T],
    w: &'a [T],
    bias: Option<&'a [T]>,
    state: SharedBuf<T>,
    out: SharedBuf<T>,
}

impl<T> Clone for Ctx<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ctx<'_, T> {}

/// Channels per block of an item: their taps and bias are widened once into lanes, then every
/// sequence of the item runs over the block. 1024 channels keep each sequence's state runs 2 KiB
/// long per column (bf16), long enough for the hardware prefetchers (256 gave runs of eight
/// lines, each started cold), and the taps, bias and history arrays at 64 KiB of stack (sixteen
/// lanes; half of that on eight).
const SUB: usize = 128 * LANES;

/// Channels per group of the widest lanes ([`Simd::Wide`]): channel chunks are multiples of it.
const GRAIN: usize = 16;

/// Tokens per tile: per group of channels, the window and the taps stay in lanes for the whole
/// tile, and the tile's rows are walked contiguously across the block's channels.
const TILE: usize = 16;

/// One (block of sequences, channel range) item.
struct Item<'a, T> {
    ctx: Ctx<'a, T>,
    seqs: &'a [ConvSeq],
    c0: usize,
    c1: usize,
}

impl<T: Real> SimdKernel for Item<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd + PowTwo>(self) {
        match self.ctx.plan.width {
            2 => self.body::<S, S::Wide, 2>(),
            3 => self.body::<S, S::Wide, 3>(),
            _ => self.body::<S, S::Wide, 4>(),
        }
    }
}

impl<T: Real> Item<'_, T> {
    /// For each block of [`SUB`] channels: taps and bias into lanes `V` (the level's widest,
    /// [`Simd::Wide`]: sixteen channels per group with AVX-512) once, then every sequence.
    #[inline(always)]
    fn body<S: Simd + PowTwo, V: WideLanes, const W: usize>(&self) {
        let Ctx { plan, w, bias, .. } = self.ctx;
        let ws = plan.weight;
        // x, out and the state contiguous along `dim` (the `(slots, state_len, dim)` layout).
        let contiguous = plan.x.dim == 1 && plan.out.dim == 1 && plan.state.dim == 1;
        let mut c = self.c0;
        while c < self.c1 {
            let end = (c + SUB).min(self.c1);
            let groups = (end - c).div_ceil(V::WIDTH);
            // Plain loops, no closures: closures would not inherit the caller's target features,
            // and the lane intrinsics would stop inlining.
            let mut taps = [[V::splat(0.0); W]; SUB / LANES];
            let mut b0 = [V::splat(0.0); SUB / LANES];
            for g in 0..groups {
                let cg = c + g * V::WIDTH;
                let n = V::WIDTH.min(end - cg);
                let wb = ws.offset as isize + cg as isize * ws.dim;
                if n == V::WIDTH && ws.tap == 1 && ws.dim == W as isize {
                    // `(dim, width)` weights: a group's taps are `WIDTH·W` consecutive elements,
                    // widened a vector at a time, then picked tap by tap.
                    let (wv, flat) = (&w[wb as usize..wb as usize + W * n], &mut [0.0f32; 4 * 16]);
                    for k in 0..W {
                        // SAFETY: `wv` and `flat` hold `W·WIDTH` elements.
                        unsafe { T::load_wide::<V>(wv.as_ptr().add(k * n)).store(flat.as_mut_ptr().add(k * n)) };
                    }
                    for j in 0..W {
                        let tj =
                            std::array::from_fn::<f32, 16, _>(|l| if l < V::WIDTH { flat[l * W + j] } else { 0.0 });
                        // SAFETY: `tj` holds 16 ≥ `WIDTH` f32.
                        taps[g][j] = unsafe { V::load(tj.as_ptr()) };
                    }
                } else {
                    for j in 0..W {
                        taps[g][j] = load_ro::<T, V>(w, wb + j as isize * ws.tap, ws.dim, n);
                    }
                }
                if let (Some(b), Some(bs)) = (bias, plan.bias) {
                    b0[g] = load_ro::<T, V>(b, bs.offset as isize + cg as isize * bs.dim, bs.dim, n);
                }
            }
            if contiguous && (end - c).is_multiple_of(V::WIDTH) {
                for (k, seq) in self.seqs.iter().enumerate() {
                    self.block_contiguous::<S, V, W>(seq, self.seqs.get(k + 1), c, end, &taps, &b0);
                }
            } else {
                for seq in self.seqs {
                    self.block::<V, W>(seq, c, end, &taps, &b0);
                }
            }
            c = end;
        }
    }

    /// Channels `[c, end)` (at most [`SUB`]) of one sequence, any strides: history, state
    /// window, then the tokens in order, each token's row walked contiguously.
    #[inline(always)]
    fn block<V: WideLanes, const W: usize>(
        &self,
        s: &ConvSeq,
        c: usize,
        end: usize,
        taps: &[[V; W]; SUB / LANES],
        b0: &[V; SUB / LANES],
    ) {
        let Ctx { plan, state, .. } = self.ctx;
        // Every geometry field in a local: the stores below would otherwise make the compiler
        // reload them from the plan on each access.
        let st = plan.state;
        let (st_dim, x_dim, out_dim) = (st.dim, plan.x.dim, plan.out.dim);
        let ConvSeq { x_start, out_start, len, read_slot, offset, .. } = *s;
        let lanes = |cg: usize| V::WIDTH.min(end - cg);
        let groups = (end - c).div_ceil(V::WIDTH);
        // History windows, loaded before the state is written (read and write slot may coincide).
        let mut hist = [[V::splat(0.0); 3]; SUB / LANES];
        for g in 0..groups {
            let cg = c + g * V::WIDTH;
            let n = lanes(cg);
            let base = st.offset as isize + cg as isize * st_dim;
            if let Some(r) = read_slot {
                let rb = base + r as isize * st.slot + offset as isize * st.col;
                for j in 0..W - 1 {
                    hist[g][j] = state.load::<V>(rb + j as isize * st.col, st_dim, n);
                }
            }
        }
        self.write_window(s, c, end - c);
        let mut t0 = 0;
        while t0 < len {
            let t1 = (t0 + TILE).min(len);
            for g in 0..groups {
                let cg = c + g * V::WIDTH;
                let n = lanes(cg);
                let tg = &taps[g];
                let at = (x_start + cg as isize * x_dim, out_start + cg as isize * out_dim);
                hist[g] = self.tokens::<V, W>(hist[g], tg, b0[g], at, (x_dim, out_dim), n, t0..t1);
            }
            t0 = t1;
        }
    }

    /// Tokens `ts` of one group of `n ≤ V::WIDTH` channels: from the window `h` (the `W − 1` previous
    /// inputs, oldest first), each token's output row; returns the window after them. `x` of
    /// token `t` is at `at.0 + t·token + k·dims.0` for channel `k` of the group, `out` alike.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn tokens<V: WideLanes, const W: usize>(
        &self,
        h: [V; 3],
        taps: &[V; W],
        bias: V,
        at: (isize, isize),
        dims: (isize, isize),
        n: usize,
        ts: std::ops::Range<usize>,
    ) -> [V; 3] {
        let Ctx { plan, x, out, .. } = self.ctx;
        let (xt_stride, ot_stride) = (plan.x.token, plan.out.token);
        let silu_on = plan.activation == ssm_conv::Activation::Silu;
        // The window in three named lanes, not an array: an array's shift compiled to
        // overlapping 64-byte stack copies with AVX-512, whose loads stalled on the store
        // forwarding of the previous token's stores.
        let [mut h0, mut h1, mut h2] = h;
        for t in ts {
            let xt = load_ro::<T, V>(x, at.0 + t as isize * xt_stride, dims.0, n);
            let mut acc = taps_sum::<T, V, W>([h0, h1, h2, xt], taps, bias);
            match W {
                2 => h0 = xt,
                3 => (h0, h1) = (h1, xt),
                _ => (h0, h1, h2) = (h1, h2, xt),
            }
            if silu_on {
                acc = acc.silu();
            }
            out.store(acc, at.1 + t as isize * ot_stride, dims.1, n);
        }
        [h0, h1, h2]
    }

    /// [`Item::block`] where `x`, `out` and the state are contiguous along `dim` and `[c, end)`
    /// is whole groups: the tokens first, the history read straight from the read slot for the
    /// first tile (prefetched one sequence ahead: each sequence's runs start cold) and from
    /// `x`'s previous rows after it; then the new window as one copy of `end − c` elements per
    /// column, after every read of the old one.
    #[inline(always)]
    fn block_contiguous<S: Simd + PowTwo, V: WideLanes, const W: usize>(
        &self,
        s: &ConvSeq,
        next: Option<&ConvSeq>,
        c: usize,
        end: usize,
        taps: &[[V; W]; SUB / LANES],
        b0: &[V; SUB / LANES],
    ) {
        let Ctx { plan, x, state, .. } = self.ctx;
        let (st, xs) = (plan.state, plan.x);
        let ConvSeq { x_start, out_start, len, read_slot, offset, .. } = *s;
        let groups = (end - c) / V::WIDTH;
        let hist_at = |r: usize, off: usize| st.offset as isize + r as isize * st.slot + off as isize * st.col;
        let mut t0 = 0;
        while t0 < len {
            let t1 = (t0 + TILE).min(len);
            for g in 0..groups {
                let cg = (c + g * V::WIDTH) as isize;
                let tg = &taps[g];
                let mut h = [V::splat(0.0); 3];
                if t0 == 0 {
                    if let Some(q) = next
                        && let Some(r) = q.read_slot
                        && (g * V::WIDTH * std::mem::size_of::<T>()).is_multiple_of(64)
                    {
                        let rb = hist_at(r, q.offset) + cg;
                        for j in 0..W - 1 {
                            S::prefetch(state.elems::<T>((rb + j as isize * st.col) as usize, 0));
                        }
                    }
                    if let Some(r) = read_slot {
                        let rb = hist_at(r, offset) + cg;
                        for (j, hj) in h.iter_mut().enumerate().take(W - 1) {
                            *hj = state.load::<V>(rb + j as isize * st.col, 1, V::WIDTH);
                        }
                    }
                } else {
                    for (j, hj) in h.iter_mut().enumerate().take(W - 1) {
                        let t = (t0 + j + 1 - W) as isize;
                        *hj = load_ro::<T, V>(x, x_start + t * xs.token + cg, 1, V::WIDTH);
                    }
                }
                self.tokens::<V, W>(h, tg, b0[g], (x_start + cg, out_start + cg), (1, 1), V::WIDTH, t0..t1);
            }
            t0 = t1;
        }
        self.write_window(s, c, end - c);
    }

    /// Sequence `s`'s new window in its write slot (if any), channels `[c, c + n)`, and its
    /// checkpoint's window (if any) before it: the checkpoint reads the old window, which the
    /// sequence's own write may replace. Call it after every read of the old window.
    #[inline(always)]
    fn write_window(&self, s: &ConvSeq, c: usize, n: usize) {
        if let Some(k) = s.checkpoint {
            self.window_into(s, k.slot, (k.tokens, k.tokens, self.ctx.plan.width - 1), c, n);
        }
        if let Some(ws) = s.write_slot {
            self.window_into(s, ws, (s.len, s.shift, s.state_len), c, n);
        }
    }

    /// The window after `len` of sequence `s`'s tokens into slot `ws`, channels `[c, c + n)`,
    /// `(len, shift, state_len)` as in [`ConvSeq`]: column `i` is the read slot's column
    /// `offset + i + shift` (kept history), zeros without a read slot, or the input of token
    /// `i + len − state_len`. Columns go in increasing order, one copy of `n` channels each: a
    /// kept column's source lies ahead of its target, so with the read slot as the write slot
    /// each column is read before it is overwritten.
    #[inline(always)]
    fn window_into(&self, s: &ConvSeq, ws: usize, (len, shift, state_len): (usize, usize, usize), c: usize, n: usize) {
        let Ctx { plan, x, state, .. } = self.ctx;
        let (st, xs) = (plan.state, plan.x);
        let ConvSeq { x_start, read_slot, offset, .. } = *s;
        let col =
            |r: usize, i: usize| st.offset as isize + r as isize * st.slot + i as isize * st.col + c as isize * st.dim;
        for i in 0..state_len {
            let dst = col(ws, i);
            if i + len < state_len {
                match read_slot {
                    Some(r) => state.copy_within(col(r, offset + i + shift), dst, st.dim, n),
                    None => state.fill(dst, st.dim, n, T::from_f32(0.0)),
                }
            } else {
                let src = x_start + (i + len - state_len) as isize * xs.token + c as isize * xs.dim;
                state.copy_from(x, src, xs.dim, dst, st.dim, n);
            }
        }
    }
}

/// The tensors of one conv call (both ops): what the plan was built from.
struct Tensors<'r, 'a> {
    x: &'r TensorRef<'a>,
    weight: &'r TensorRef<'a>,
    bias: Option<&'r TensorRef<'a>>,
    state: &'r mut TensorMut<'a>,
    out: &'r mut TensorMut<'a>,
}

impl CpuBackend {
    fn conv<T: Real>(&self, plan: &ConvPlan, t: Tensors<'_, '_>) {
        let Tensors { x, weight, bias, state, out } = t;
        let seqs = plan.seqs.as_deref().expect("host plans resolve their sequences");
        let ctx = Ctx {
            plan,
            x: x.host_data::<T>().expect("plan checked dtype and device"),
            w: weight.host_data::<T>().expect("plan checked dtype and device"),
            bias: bias.map(|b| b.host_data::<T>().expect("plan checked dtype and device")),
            state: SharedBuf::new(state.host_data_mut::<T>().expect("plan checked dtype and device")),
            out: SharedBuf::new(out.host_data_mut::<T>().expect("plan checked dtype and device")),
        };
        if seqs.is_empty() || plan.dim == 0 {
            return;
        }
        // About four items per thread: channel chunks of at least 64 channels first, then
        // blocks of sequences when the channels alone do not give enough items.
        // Chunks are whole groups of the widest lanes (sixteen channels).
        let groups = plan.dim.div_ceil(GRAIN);
        let threads = self.par().threads();
        let target = if threads == 1 { 1 } else { 4 * threads };
        let chunks = target.min(groups.div_ceil(4)).max(1);
        let chunk = groups.div_ceil(chunks) * GRAIN;
        let chunks = plan.dim.div_ceil(chunk);
        let blocks = target.div_ceil(chunks).clamp(1, seqs.len());
        let block = seqs.len().div_ceil(blocks);
        let blocks = seqs.len().div_ceil(block);
        self.for_each(chunks * blocks, |i| {
            let (b, k) = (i / chunks, i % chunks);
            let c0 = k * chunk;
            let seqs = &seqs[b * block..((b + 1) * block).min(seqs.len())];
            dispatch(Item { ctx, seqs, c0, c1: (c0 + chunk).min(plan.dim) });
        });
    }

    fn conv_any(&self, plan: &ConvPlan, t: Tensors<'_, '_>) -> Result<(), CpuError> {
        require_host("x", t.x.device())?;
        require_host("weight", t.weight.device())?;
        if let Some(b) = t.bias {
            require_host("bias", b.device())?;
        }
        require_host("conv_state", t.state.device())?;
        require_host("out", t.out.device())?;
        match plan.dtype {
            DType::F32 => self.conv::<f32>(plan, t),
            DType::F16 => self.conv::<f16>(plan, t),
            DType::BF16 => self.conv::<bf16>(plan, t),
            other => unreachable!("plan admits float dtypes only, got {other}"),
        }
        Ok(())
    }
}

impl Run<CausalConv1dUpdateArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let t = Tensors {
            x: &args.x,
            weight: &args.weight,
            bias: args.bias.as_ref(),
            state: &mut args.conv_state,
            out: &mut args.out,
        };
        self.conv_any(&plan, t)
    }
}

impl Run<CausalConv1dFnArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<CausalConv1dFnArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let t = Tensors {
            x: &args.x,
            weight: &args.weight,
            bias: args.bias.as_ref(),
            state: &mut args.conv_states,
            out: &mut args.out,
        };
        self.conv_any(&plan, t)
    }
}

#[cfg(test)]
mod tests {
    //! The item bodies on portable lanes, whatever this CPU supports, against the scalar
    //! reference on random calls of every mode from the one conv case generator
    //! ([`ssm_conformance::cases::conv`]); the property tests of the backend itself (both
    //! `Par` settings, every dtype) are in `tests/conv_props.rs`.

    use ssm_conformance::cases::conv::{Case, MODES, assert_agrees};
    use ssm_conv::reference::{Arithmetic, Reference};

    use super::*;

    #[test]
    fn conv_portable_lanes_match_reference() {
        for seed in 0..3 {
            for mode in MODES {
                let initial = Case::random(DType::F32, mode, 7000 + seed);
                let mut want = initial.clone();
                want.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
                let mut got = initial.clone();
                got.run_on(&Portable1).unwrap();
                assert_agrees(&format!("portable seed {seed} {mode:?}"), &initial, &want, &got);
            }
        }
    }

    /// A sequential backend that runs items on `simd::Portable` lanes.
    struct Portable1;

    impl Run<CausalConv1dUpdateArgs<'_>> for Portable1 {
        type Error = CpuError;
        fn run(&self, call: Planned<CausalConv1dUpdateArgs<'_>>) -> Result<(), CpuError> {
            let (mut a, plan) = call.into_parts();
            portable(&plan, &a.x, &a.weight, a.bias.as_ref(), &mut a.conv_state, &mut a.out);
            Ok(())
        }
    }

    impl Run<CausalConv1dFnArgs<'_>> for Portable1 {
        type Error = CpuError;
        fn run(&self, call: Planned<CausalConv1dFnArgs<'_>>) -> Result<(), CpuError> {
            let (mut a, plan) = call.into_parts();
            portable(&plan, &a.x, &a.weight, a.bias.as_ref(), &mut a.conv_states, &mut a.out);
            Ok(())
        }
    }

    fn portable(
        plan: &ConvPlan,
        x: &TensorRef<'_>,
        w: &TensorRef<'_>,
        b: Option<&TensorRef<'_>>,
        s: &mut TensorMut<'_>,
        o: &mut TensorMut<'_>,
    ) {
        let ctx = Ctx {
            plan,
            x: x.host_data::<f32>().unwrap(),
            w: w.host_data::<f32>().unwrap(),
            bias: b.map(|b| b.host_data::<f32>().unwrap()),
            state: SharedBuf::new(s.host_data_mut::<f32>().unwrap()),
            out: SharedBuf::new(o.host_data_mut::<f32>().unwrap()),
        };
        Item { ctx, seqs: plan.seqs.as_ref().unwrap(), c0: 0, c1: plan.dim }.run::<crate::simd::Portable>();
    }
}
