//! Causal conv1d on the CPU ([`ssm_conv::ConvBackend`]).
//!
//! Work items are (block of sequences, channel chunk) pairs: the plan guarantees that no
//! slot written by one sequence is used by another and that the written tensors do not
//! overlap themselves, and chunks touch disjoint channels, so every item writes memory no
//! other item reads or writes. Inside an item, per block of 256 channels, the taps and the
//! bias are loaded into lanes once; then for each sequence the history windows are loaded,
//! the new state windows are copied (storage values, bit-exact), and the tokens run in tiles
//! of 16: per eight channels, the window stays in lanes through the tile. Lanes load
//! directly where a tensor is contiguous along `dim` and gather/scatter otherwise, so both
//! conv-state layouts and any strides work.
//!
//! Numerics follow [`ssm_conv::reference`]: f32 accumulation from the bias, each product
//! rounded to the storage dtype for f16/bf16 (fused multiply-add for f32), silu as
//! `y / (1 + e^-y)`. Nothing is allocated per call.

use half::{bf16, f16};
use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvPlan, ConvSeq};
use ssm_tensor::{DType, Planned, Run, TensorMut, TensorRef};

use crate::shared::SharedBuf;
use crate::simd::{LANES, PowTwo, Real, Simd, SimdKernel, dispatch};
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

    /// Loads `n ≤ 8` elements `base + k·stride` as lanes (zeros past `n`).
    #[inline(always)]
    fn load<S: Simd>(&self, base: isize, stride: isize, n: usize) -> S {
        if stride == 1 && n == LANES {
            let b = base as usize;
            assert!(b + LANES <= self.len());
            // SAFETY: the 8 elements are in bounds (asserted) and written by no other item
            // while this one runs (module note), so a short-lived shared slice is sound.
            let s = unsafe { std::slice::from_raw_parts(self.elems::<T>(b, LANES), LANES) };
            T::load(s)
        } else {
            let mut buf = [0.0f32; LANES];
            for (k, v) in buf.iter_mut().enumerate().take(n) {
                // SAFETY: no other item writes the element (see the impl's note).
                *v = unsafe { self.read((base + k as isize * stride) as usize) }.to_f32();
            }
            S::load(&buf)
        }
    }

    /// Stores the first `n ≤ 8` lanes at `base + k·stride`, rounded to the storage dtype.
    #[inline(always)]
    fn store<S: Simd>(&self, v: S, base: isize, stride: isize, n: usize) {
        if stride == 1 && n == LANES {
            let b = base as usize;
            assert!(b + LANES <= self.len());
            // SAFETY: the 8 elements are in bounds (asserted) and belong to this item alone.
            let s = unsafe { std::slice::from_raw_parts_mut(self.elems::<T>(b, LANES), LANES) };
            T::store(v, s);
        } else {
            let mut buf = [0.0f32; LANES];
            v.store(&mut buf);
            for (k, &x) in buf.iter().enumerate().take(n) {
                // SAFETY: the element belongs to this item alone (see the impl's note).
                unsafe { self.write((base + k as isize * stride) as usize, T::from_f32(x)) };
            }
        }
    }
}

/// Loads `n ≤ 8` elements `base + k·stride` of a read-only slice as lanes.
#[inline(always)]
fn load_ro<T: Real, S: Simd>(d: &[T], base: isize, stride: isize, n: usize) -> S {
    if stride == 1 && n == LANES {
        T::load(&d[base as usize..])
    } else {
        let mut buf = [0.0f32; LANES];
        for (k, v) in buf.iter_mut().enumerate().take(n) {
            *v = d[(base + k as isize * stride) as usize].to_f32();
        }
        S::load(&buf)
    }
}

/// `acc + round_T(a·b)`: the product rounded to the storage dtype as vLLM's Triton kernel
/// forms it from f16/bf16 operands; fused for f32.
#[inline(always)]
fn mac<T: Real, S: Simd>(a: S, b: S, acc: S) -> S {
    if T::DTYPE == DType::F32 { a.mul_add(b, acc) } else { acc.add(T::round::<S>(a.mul(b))) }
}

/// `y / (1 + e^-y)` lane-wise.
#[inline(always)]
fn silu<S: Simd + PowTwo>(y: S) -> S {
    y.div(S::splat(1.0).add(S::splat(0.0).sub(y).exp()))
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

/// Channels whose taps and bias one item keeps in lanes while it walks its sequences.
const SUB: usize = 32 * LANES;

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
            2 => self.body::<S, 2>(),
            3 => self.body::<S, 3>(),
            _ => self.body::<S, 4>(),
        }
    }
}

impl<T: Real> Item<'_, T> {
    /// For each block of [`SUB`] channels: taps and bias into lanes once, then every sequence.
    #[inline(always)]
    fn body<S: Simd + PowTwo, const W: usize>(&self) {
        let Ctx { plan, w, bias, .. } = self.ctx;
        let mut c = self.c0;
        while c < self.c1 {
            let end = (c + SUB).min(self.c1);
            let groups = (end - c).div_ceil(LANES);
            // Plain loops, no closures: closures would not inherit the caller's target features,
            // and the lane intrinsics would stop inlining.
            let mut taps = [[S::splat(0.0); W]; SUB / LANES];
            let mut b0 = [S::splat(0.0); SUB / LANES];
            for g in 0..groups {
                let cg = c + g * LANES;
                let n = LANES.min(end - cg);
                let wb = plan.weight.offset as isize + cg as isize * plan.weight.dim;
                for j in 0..W {
                    taps[g][j] = load_ro::<T, S>(w, wb + j as isize * plan.weight.tap, plan.weight.dim, n);
                }
                if let (Some(b), Some(bs)) = (bias, plan.bias) {
                    b0[g] = load_ro::<T, S>(b, bs.offset as isize + cg as isize * bs.dim, bs.dim, n);
                }
            }
            for seq in self.seqs {
                self.block::<S, W>(seq, c, end, &taps, &b0);
            }
            c = end;
        }
    }

    /// Channels `[c, end)` (at most [`SUB`]) of one sequence: history, state window, then the
    /// tokens in order, each token's row walked contiguously.
    #[inline(always)]
    fn block<S: Simd + PowTwo, const W: usize>(
        &self,
        s: &ConvSeq,
        c: usize,
        end: usize,
        taps: &[[S; W]; SUB / LANES],
        b0: &[S; SUB / LANES],
    ) {
        let Ctx { plan, x, state, out, .. } = self.ctx;
        let st = plan.state;
        let groups = (end - c).div_ceil(LANES);
        // History windows, loaded before the state is written (read and write slot may coincide).
        let mut hist = [[S::splat(0.0); 3]; SUB / LANES];
        for g in 0..groups {
            let cg = c + g * LANES;
            let n = LANES.min(end - cg);
            let base = st.offset as isize + cg as isize * st.dim;
            if let Some(r) = s.read_slot {
                for j in 0..W - 1 {
                    hist[g][j] =
                        state.load::<S>(base + r as isize * st.slot + (s.offset + j) as isize * st.col, st.dim, n);
                }
            }
            // New window: kept history (source columns lie ahead of their targets), then inputs.
            if let Some(ws) = s.write_slot {
                for i in 0..s.state_len {
                    let dst = base + ws as isize * st.slot + i as isize * st.col;
                    if i + s.len < s.state_len {
                        match s.read_slot {
                            Some(r) => {
                                let src = base + r as isize * st.slot + (s.offset + i + s.shift) as isize * st.col;
                                state.copy_within(src, dst, st.dim, n)
                            }
                            None => state.fill(dst, st.dim, n, T::from_f32(0.0)),
                        }
                    } else {
                        let src =
                            s.x_start + (i + s.len - s.state_len) as isize * plan.x.token + cg as isize * plan.x.dim;
                        state.copy_from(x, src, plan.x.dim, dst, st.dim, n);
                    }
                }
            }
        }
        let silu_on = plan.activation == ssm_conv::Activation::Silu;
        // Tiles of TILE tokens: per group, the window and the taps stay in lanes for the whole
        // tile, and the tile's rows are walked contiguously across the block's channels.
        const TILE: usize = 16;
        let mut t0 = 0;
        while t0 < s.len {
            let t1 = (t0 + TILE).min(s.len);
            for g in 0..groups {
                let cg = c + g * LANES;
                let n = LANES.min(end - cg);
                let tg = taps[g];
                let mut h = hist[g];
                for t in t0..t1 {
                    let xt = load_ro::<T, S>(
                        x,
                        s.x_start + t as isize * plan.x.token + cg as isize * plan.x.dim,
                        plan.x.dim,
                        n,
                    );
                    let mut acc = b0[g];
                    for j in 0..W - 1 {
                        acc = mac::<T, S>(h[j], tg[j], acc);
                    }
                    acc = mac::<T, S>(xt, tg[W - 1], acc);
                    for j in 0..W - 2 {
                        h[j] = h[j + 1];
                    }
                    h[W - 2] = xt;
                    if silu_on {
                        acc = silu(acc);
                    }
                    out.store(
                        acc,
                        s.out_start + t as isize * plan.out.token + cg as isize * plan.out.dim,
                        plan.out.dim,
                        n,
                    );
                }
                hist[g] = h;
            }
            t0 = t1;
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
        let groups = plan.dim.div_ceil(LANES);
        let threads = self.par().threads();
        let target = if threads == 1 { 1 } else { 4 * threads };
        let chunks = target.min(groups.div_ceil(8)).max(1);
        let chunk = groups.div_ceil(chunks) * LANES;
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
    //! The CPU kernels against the scalar reference on random calls: odd dims, every width,
    //! both state layouts, strided x, pads, empty sequences, the speculative rolling buffer
    //! with accepted counts, prefix-caching tables and varlen prefill. Outputs start as NaN;
    //! every element that must be written is checked, every other one must keep its poison,
    //! and every state element outside the written windows must keep its bits.

    use std::num::NonZeroUsize;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use ssm_conv::reference::{Arithmetic, Reference};
    use ssm_conv::{Activation, ConvStateLayout};
    use ssm_tensor::{TensorMut, TensorRef};

    use super::*;
    use crate::Par;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Mode {
        /// x `[batch, dim]`.
        Single,
        /// x `[batch, seqlen, dim]`, no speculation.
        Multi,
        /// Packed varlen with `num_accepted_tokens`.
        SpecVarlen,
        /// x `[batch, seqlen, dim]` with `num_accepted_tokens`.
        Spec3d,
        /// 2-D table with `initial_state_idx` / `block_idx_last_scheduled_token`.
        Apc,
        /// `causal_conv1d_fn`.
        Prefill,
    }

    /// One random call, with everything needed to say what it must write.
    struct Case<T> {
        mode: Mode,
        dim: usize,
        width: usize,
        slots: usize,
        state_len: usize,
        layout: ConvStateLayout,
        activation: Activation,
        pad: Option<i64>,
        x: Vec<T>,
        x_shape: Vec<usize>,
        x_strides: Vec<isize>,
        weight: Vec<T>,
        bias: Option<Vec<T>>,
        state: Vec<T>,
        indices: Vec<i64>,
        indices_shape: Vec<usize>,
        accepted: Option<Vec<i32>>,
        starts: Option<Vec<i32>>,
        apc: Option<(Vec<i32>, Vec<i32>)>,
        has_init: Vec<u8>,
        /// Per sequence: (first token row, tokens, write slot or None, effective state length).
        expect: Vec<(usize, usize, Option<usize>, usize)>,
    }

    fn rand_vals<T: Real>(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<T> {
        (0..n).map(|_| T::from_f32((rng.random::<f32>() * 2.0 - 1.0) * scale)).collect()
    }

    fn gen_case<T: Real>(rng: &mut ChaCha8Rng, mode: Mode) -> Case<T> {
        let dim = [1, 3, 7, 8, 13, 17, 33, 70, 300][rng.random_range(0..9)];
        let width = rng.random_range(2..=4usize);
        let batch = rng.random_range(1..=5usize);
        let layout = if rng.random_bool(0.5) { ConvStateLayout::StateLenDim } else { ConvStateLayout::DimStateLen };
        let activation = if rng.random_bool(0.5) { Activation::Silu } else { Activation::None };
        let pad = [Some(0i64), Some(-1), None][rng.random_range(0..3)];
        let num_spec = rng.random_range(0..=3usize);
        let cols = if mode == Mode::Apc { 3 } else { 1 };
        // Slot 0 is reserved when it is the pad; three spare slots nobody names.
        let first = usize::from(pad == Some(0));
        let slots = first + batch * cols + 3;
        let mut free: Vec<usize> = (first..slots).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.random_range(0..=i));
        }
        let mut indices: Vec<i64> = free[..batch * cols].iter().map(|&s| s as i64).collect();
        let mut is_pad = vec![false; batch];
        if let Some(p) = pad {
            for b in 0..batch {
                if rng.random_bool(0.25) {
                    is_pad[b] = true;
                    let read_col = 0; // APC rows read column 0 in these cases
                    indices[b * cols + read_col] = p;
                }
            }
        }
        let spec = matches!(mode, Mode::SpecVarlen | Mode::Spec3d);
        let seqlen = match mode {
            Mode::Single | Mode::Apc => 1,
            Mode::Multi => rng.random_range(1..=4),
            Mode::Spec3d => num_spec + 1,
            _ => 0,
        };
        let lens: Vec<usize> = match mode {
            Mode::SpecVarlen => (0..batch).map(|_| rng.random_range(0..=num_spec + 1)).collect(),
            Mode::Prefill => (0..batch).map(|_| rng.random_range(0..=40)).collect(),
            _ => vec![seqlen; batch],
        };
        let extra = rng.random_range(0..=2);
        let state_len = width - 1 + if spec { num_spec } else { extra };
        let tokens: usize = lens.iter().sum();
        let varlen = matches!(mode, Mode::SpecVarlen | Mode::Prefill);
        let (x_shape, rows) = match mode {
            Mode::Single | Mode::Apc => (vec![batch, dim], batch),
            Mode::Multi | Mode::Spec3d => (vec![batch, seqlen, dim], batch * seqlen),
            _ => (vec![tokens, dim], tokens),
        };
        // Token-major storage, or vLLM's dim-major storage seen through permuted strides.
        let dim_major = rng.random_bool(0.4);
        let x_strides: Vec<isize> = match (x_shape.len(), dim_major) {
            (2, false) => vec![dim as isize, 1],
            (2, true) => vec![1, x_shape[0] as isize],
            (_, false) => vec![(seqlen * dim) as isize, dim as isize, 1],
            (_, true) => vec![(seqlen * dim) as isize, 1, seqlen as isize],
        };
        let accepted: Option<Vec<i32>> =
            spec.then(|| (0..batch).map(|_| rng.random_range(1..=(state_len + 2 - width) as i32)).collect());
        let starts: Option<Vec<i32>> = varlen.then(|| {
            let mut s = vec![0i32];
            for &l in &lens {
                s.push(s.last().unwrap() + l as i32);
            }
            s
        });
        let apc = (mode == Mode::Apc).then(|| {
            // Read column 0, write column 1 or 2 (never the pad: pads sit in column 0).
            (vec![0i32; batch], (0..batch).map(|_| rng.random_range(1..=2)).collect::<Vec<i32>>())
        });
        let has_init: Vec<u8> = (0..batch).map(|_| u8::from(rng.random_bool(0.6))).collect();
        let mut expect = Vec::new();
        let mut row = 0;
        for b in 0..batch {
            let len = lens[b];
            let start = if varlen { row } else { b * seqlen.max(1) };
            row += len;
            if is_pad[b] || len == 0 {
                continue;
            }
            let write_col = apc.as_ref().map_or(0, |(_, l)| l[b] as usize);
            let write = indices[b * cols + write_col] as usize;
            let eff = if spec { width - 2 + len } else { width - 1 };
            expect.push((start, len, Some(write), eff));
        }
        Case {
            mode,
            dim,
            width,
            slots,
            state_len,
            layout,
            activation,
            pad,
            x: rand_vals(rng, rows * dim, 2.0),
            x_shape,
            x_strides,
            weight: rand_vals(rng, dim * width, 1.0),
            bias: rng.random_bool(0.5).then(|| rand_vals(rng, dim, 0.5)),
            state: rand_vals(rng, slots * state_len * dim, 2.0),
            indices,
            indices_shape: if cols == 1 { vec![batch] } else { vec![batch, cols] },
            accepted,
            starts,
            apc,
            has_init,
            expect,
        }
    }

    /// Runs the case on `backend`; returns (state, out) after the call.
    fn run<T: Real, B: ssm_conv::ConvBackend<E>, E: std::fmt::Debug>(c: &Case<T>, backend: &B) -> (Vec<T>, Vec<T>) {
        let mut state = c.state.clone();
        let mut out = vec![T::from_f32(f32::NAN); c.x.len()];
        let state_shape = match c.layout {
            ConvStateLayout::StateLenDim => [c.slots, c.state_len, c.dim],
            ConvStateLayout::DimStateLen => [c.slots, c.dim, c.state_len],
        };
        let x = TensorRef::from_slice(&c.x, &[c.x.len()]).unwrap().with_layout(&c.x_shape, &c.x_strides, 0).unwrap();
        let outv =
            TensorMut::from_slice(&mut out, &[c.x.len()]).unwrap().with_layout(&c.x_shape, &c.x_strides, 0).unwrap();
        let stv = TensorMut::from_slice(&mut state, &state_shape).unwrap();
        let weight = TensorRef::from_slice(&c.weight, &[c.dim, c.width]).unwrap();
        let bias = c.bias.as_ref().map(|b| TensorRef::from_slice(b, &[c.dim]).unwrap());
        let indices = TensorRef::from_slice(&c.indices, &c.indices_shape).unwrap();
        let starts = c.starts.as_ref().map(|s| TensorRef::from_slice(s, &[s.len()]).unwrap());
        if c.mode == Mode::Prefill {
            let args = CausalConv1dFnArgs {
                x: x.with_layout(&[c.x_shape[0], c.dim], &[c.x_strides[0], c.x_strides[1]], 0).unwrap(),
                weight,
                bias,
                conv_states: stv,
                conv_state_layout: c.layout,
                query_start_loc: starts.unwrap(),
                cache_indices: Some(indices),
                has_initial_state: Some(TensorRef::from_slice(&c.has_init, &[c.has_init.len()]).unwrap()),
                activation: c.activation,
                pad_slot_id: c.pad,
                out: outv,
            };
            backend.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
        } else {
            let args = CausalConv1dUpdateArgs {
                x,
                conv_state: stv,
                conv_state_layout: c.layout,
                weight,
                bias,
                activation: c.activation,
                conv_state_indices: Some(indices),
                num_accepted_tokens: c.accepted.as_ref().map(|a| TensorRef::from_slice(a, &[a.len()]).unwrap()),
                query_start_loc: starts,
                pad_slot_id: c.pad,
                block_idx_last_scheduled_token: c
                    .apc
                    .as_ref()
                    .map(|(_, l)| TensorRef::from_slice(l, &[l.len()]).unwrap()),
                initial_state_idx: c.apc.as_ref().map(|(i, _)| TensorRef::from_slice(i, &[i.len()]).unwrap()),
                out: outv,
            };
            backend.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
        }
        (state, out)
    }

    fn bits<T: Real>(v: T) -> u32 {
        v.to_f32().to_bits()
    }

    fn check_case<T: Real>(seed: u64, mode: Mode, tol: f32) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let c = gen_case::<T>(&mut rng, mode);
        let (ref_state, ref_out) = run(&c, &Reference { precision: Arithmetic::F32 });
        let two = CpuBackend::new(Par::Rayon(NonZeroUsize::new(2).unwrap())).unwrap();
        for (label, backend) in [("seq", CpuBackend::new(Par::Seq).unwrap()), ("rayon", two)] {
            let (state, out) = run(&c, &backend);
            let ctx = format!("seed {seed} {mode:?} {label} dim {} width {} layout {:?}", c.dim, c.width, c.layout);
            // The state is a copy of storage values: bit-identical to the reference everywhere.
            for (i, (a, b)) in state.iter().zip(&ref_state).enumerate() {
                assert_eq!(bits(*a), bits(*b), "{ctx}: state element {i}");
            }
            // Outputs: the rows the call must write (from the case, not the plan) are written
            // and agree with the reference; every other element keeps its NaN poison.
            let mut written = vec![false; c.x.len()];
            let pos = |row: usize, ch: usize| -> usize {
                let (r, s) = (&c.x_shape, &c.x_strides);
                let e = if r.len() == 3 {
                    (row / r[1]) as isize * s[0] + (row % r[1]) as isize * s[1] + ch as isize * s[2]
                } else {
                    row as isize * s[0] + ch as isize * s[1]
                };
                e as usize
            };
            for &(start, len, _, _) in &c.expect {
                for row in start..start + len {
                    for ch in 0..c.dim {
                        let i = pos(row, ch);
                        written[i] = true;
                        let (g, w) = (out[i].to_f32(), ref_out[i].to_f32());
                        assert!(!w.is_nan() && !g.is_nan(), "{ctx}: out row {row} ch {ch} not written");
                        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{ctx}: out row {row} ch {ch}: {g} vs {w}");
                    }
                }
            }
            for (i, w) in written.iter().enumerate() {
                if !w {
                    assert!(out[i].to_f32().is_nan() && ref_out[i].to_f32().is_nan(), "{ctx}: out element {i} written");
                }
            }
        }
        // Untouched state: every slot outside the written windows keeps its bits.
        let at = |slot: usize, col: usize, ch: usize| match c.layout {
            ConvStateLayout::StateLenDim => (slot * c.state_len + col) * c.dim + ch,
            ConvStateLayout::DimStateLen => (slot * c.dim + ch) * c.state_len + col,
        };
        for slot in 0..c.slots {
            let window = c.expect.iter().find(|e| e.2 == Some(slot)).map_or(0, |e| e.3);
            for col in window..c.state_len {
                for ch in 0..c.dim {
                    let i = at(slot, col, ch);
                    assert_eq!(bits(ref_state[i]), bits(c.state[i]), "seed {seed}: slot {slot} col {col} touched");
                }
            }
        }
    }

    #[test]
    fn conv_empty_calls_write_nothing() {
        // dim 0, and a batch of pads only: plans succeed and nothing is written.
        let cpu = CpuBackend::new(Par::Rayon(NonZeroUsize::new(2).unwrap())).unwrap();
        for (dim, indices) in [(0usize, [1i32, 2]), (4, [0, 0])] {
            let x = vec![1.0f32; 2 * dim];
            let w = vec![0.5f32; dim * 3];
            let mut state = vec![7.0f32; 3 * 2 * dim];
            let mut out = vec![f32::NAN; 2 * dim];
            let args = CausalConv1dUpdateArgs {
                x: TensorRef::from_slice(&x, &[2, dim]).unwrap(),
                conv_state: TensorMut::from_slice(&mut state, &[3, 2, dim]).unwrap(),
                conv_state_layout: ConvStateLayout::StateLenDim,
                weight: TensorRef::from_slice(&w, &[dim, 3]).unwrap(),
                bias: None,
                activation: Activation::Silu,
                conv_state_indices: Some(TensorRef::from_slice(&indices, &[2]).unwrap()),
                num_accepted_tokens: None,
                query_start_loc: None,
                pad_slot_id: Some(0),
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out: TensorMut::from_slice(&mut out, &[2, dim]).unwrap(),
            };
            cpu.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            assert!(state.iter().all(|&v| v == 7.0));
            assert!(out.iter().all(|v| v.is_nan()));
        }
    }

    const MODES: [Mode; 6] = [Mode::Single, Mode::Multi, Mode::SpecVarlen, Mode::Spec3d, Mode::Apc, Mode::Prefill];

    #[test]
    fn conv_cpu_matches_reference_f32() {
        for seed in 0..60 {
            for mode in MODES {
                check_case::<f32>(seed, mode, 2e-5);
            }
        }
    }

    #[test]
    fn conv_cpu_matches_reference_bf16() {
        for seed in 100..140 {
            for mode in MODES {
                check_case::<half::bf16>(seed, mode, 1e-2);
            }
        }
    }

    #[test]
    fn conv_cpu_matches_reference_f16() {
        for seed in 200..240 {
            for mode in MODES {
                check_case::<half::f16>(seed, mode, 2e-3);
            }
        }
    }

    #[test]
    fn conv_portable_lanes_match_reference() {
        // Every lane type, whatever this CPU supports: run the item bodies on portable lanes.
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for mode in MODES {
            let c = gen_case::<f32>(&mut rng, mode);
            let (ref_state, ref_out) = run(&c, &Reference { precision: Arithmetic::F32 });
            let (state, out) = run(&c, &Portable1);
            assert_eq!(state, ref_state);
            for (g, w) in out.iter().zip(&ref_out) {
                assert!((g.is_nan() && w.is_nan()) || (g - w).abs() <= 2e-5 * (1.0 + w.abs()));
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
