//! Causal conv1d on the CPU ([`ssm_conv::ConvBackend`]).
//!
//! Work items are (sequence, channel chunk) pairs: the plan guarantees that no slot written
//! by one sequence is used by another, and chunks of one sequence touch disjoint channels,
//! so every item writes memory no other item reads or writes. Inside an item, eight
//! channels at a time: the weights and the history window are loaded once into lanes, the
//! new state window is copied (storage values, bit-exact), then every token of the sequence
//! runs through the window in registers. Lanes load directly where a tensor is contiguous
//! along `dim` and gather/scatter otherwise, so both conv-state layouts and any strides work.
//!
//! Numerics follow [`ssm_conv::reference`]: f32 accumulation from the bias, each product
//! rounded to the storage dtype for f16/bf16 (fused multiply-add for f32), silu as
//! `y / (1 + e^-y)`. Nothing is allocated per call.

use half::{bf16, f16};
use ssm_conv::{CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvBackend, ConvPlan, ConvSeq};
use ssm_tensor::{DType, TensorMut, TensorRef};

use crate::simd::{LANES, PowTwo, Real, Simd, SimdKernel, dispatch};
use crate::{CpuBackend, CpuError, require_host};

/// A raw view of a buffer that several items write, each at elements no other item touches.
struct SharedBuf<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> Clone for SharedBuf<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SharedBuf<T> {}

// SAFETY: items only access, through this pointer, elements that the plan assigns to them
// alone (disjoint slots per sequence, disjoint channels per chunk), so sharing it across
// threads creates no data race.
unsafe impl<T: Send> Send for SharedBuf<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for SharedBuf<T> {}

impl<T: Real> SharedBuf<T> {
    fn new(s: &mut [T]) -> Self {
        SharedBuf { ptr: s.as_mut_ptr(), len: s.len() }
    }

    #[inline(always)]
    fn read(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in bounds (asserted); no other item writes element i (module note).
        unsafe { self.ptr.add(i).read() }
    }

    #[inline(always)]
    fn write(&self, i: usize, v: T) {
        assert!(i < self.len);
        // SAFETY: in bounds (asserted); element i belongs to the calling item alone.
        unsafe { self.ptr.add(i).write(v) }
    }

    /// Loads `n ≤ 8` elements `base + k·stride` as lanes (zeros past `n`).
    #[inline(always)]
    fn load<S: Simd>(&self, base: isize, stride: isize, n: usize) -> S {
        if stride == 1 && n == LANES {
            let b = base as usize;
            assert!(b + LANES <= self.len);
            // SAFETY: the 8 elements are in bounds (asserted) and written by no other item
            // while this one runs (module note), so a short-lived shared slice is sound.
            let s = unsafe { std::slice::from_raw_parts(self.ptr.add(b), LANES) };
            T::load(s)
        } else {
            let mut buf = [0.0f32; LANES];
            for (k, v) in buf.iter_mut().enumerate().take(n) {
                *v = self.read((base + k as isize * stride) as usize).to_f32();
            }
            S::load(&buf)
        }
    }

    /// Stores the first `n ≤ 8` lanes at `base + k·stride`, rounded to the storage dtype.
    #[inline(always)]
    fn store<S: Simd>(&self, v: S, base: isize, stride: isize, n: usize) {
        if stride == 1 && n == LANES {
            let b = base as usize;
            assert!(b + LANES <= self.len);
            // SAFETY: the 8 elements are in bounds (asserted) and belong to this item alone.
            let s = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(b), LANES) };
            T::store(v, s);
        } else {
            let mut buf = [0.0f32; LANES];
            v.store(&mut buf);
            for (k, &x) in buf.iter().enumerate().take(n) {
                self.write((base + k as isize * stride) as usize, T::from_f32(x));
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
    if T::DTYPE == DType::F32 {
        a.mul_add(b, acc)
    } else {
        let mut r = [T::from_f32(0.0); LANES];
        T::store(a.mul(b), &mut r);
        acc.add(T::load::<S>(&r))
    }
}

/// `y / (1 + e^-y)` lane-wise.
#[inline(always)]
fn silu<S: Simd + PowTwo>(y: S) -> S {
    let d = S::splat(1.0).add(S::splat(0.0).sub(y).exp());
    let (mut a, mut b) = ([0.0f32; LANES], [0.0f32; LANES]);
    y.store(&mut a);
    d.store(&mut b);
    for k in 0..LANES {
        a[k] /= b[k];
    }
    S::load(&a)
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

/// One (sequence, channel range) item.
struct Item<'a, T> {
    ctx: Ctx<'a, T>,
    seq: &'a ConvSeq,
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
    #[inline(always)]
    fn body<S: Simd + PowTwo, const W: usize>(&self) {
        let Ctx { plan, x, w, bias, state, out } = self.ctx;
        let s = self.seq;
        let st = plan.state;
        let at = |slot: usize, col: usize, c: usize| {
            st.offset as isize + slot as isize * st.slot + col as isize * st.col + c as isize * st.dim
        };
        let silu_on = plan.activation == ssm_conv::Activation::Silu;
        let mut c = self.c0;
        while c < self.c1 {
            let n = LANES.min(self.c1 - c);
            let ci = c as isize;
            let wb = plan.weight.offset as isize + ci * plan.weight.dim;
            let taps: [S; W] =
                std::array::from_fn(|j| load_ro::<T, S>(w, wb + j as isize * plan.weight.tap, plan.weight.dim, n));
            let b0 = match (bias, plan.bias) {
                (Some(b), Some(g)) => load_ro::<T, S>(b, g.offset as isize + ci * g.dim, g.dim, n),
                _ => S::splat(0.0),
            };
            // History window, loaded before the state is written (read and write slot may coincide).
            let mut hist: [S; 3] = std::array::from_fn(|j| match s.read_slot {
                Some(r) if j < W - 1 => state.load::<S>(at(r, s.offset + j, c), st.dim, n),
                _ => S::splat(0.0),
            });
            // New window: kept history (source columns lie ahead of their targets), then inputs.
            if let Some(ws) = s.write_slot {
                for i in 0..s.state_len {
                    let dst = at(ws, i, c);
                    if i + s.len < s.state_len {
                        match s.read_slot {
                            Some(r) => {
                                let src = at(r, s.offset + i + s.shift, c);
                                for k in 0..n as isize {
                                    state.write((dst + k * st.dim) as usize, state.read((src + k * st.dim) as usize));
                                }
                            }
                            None => {
                                for k in 0..n as isize {
                                    state.write((dst + k * st.dim) as usize, T::from_f32(0.0));
                                }
                            }
                        }
                    } else {
                        let src = s.x_start + (i + s.len - s.state_len) as isize * plan.x.token + ci * plan.x.dim;
                        for k in 0..n as isize {
                            state.write((dst + k * st.dim) as usize, x[(src + k * plan.x.dim) as usize]);
                        }
                    }
                }
            }
            for t in 0..s.len {
                let xt = load_ro::<T, S>(x, s.x_start + t as isize * plan.x.token + ci * plan.x.dim, plan.x.dim, n);
                let mut acc = b0;
                for j in 0..W - 1 {
                    acc = mac::<T, S>(hist[j], taps[j], acc);
                }
                acc = mac::<T, S>(xt, taps[W - 1], acc);
                for j in 0..W - 2 {
                    hist[j] = hist[j + 1];
                }
                hist[W - 2] = xt;
                if silu_on {
                    acc = silu(acc);
                }
                out.store(acc, s.out_start + t as isize * plan.out.token + ci * plan.out.dim, plan.out.dim, n);
            }
            c += LANES;
        }
    }
}

impl CpuBackend {
    fn conv<T: Real>(
        &self,
        plan: &ConvPlan,
        x: &TensorRef<'_>,
        weight: &TensorRef<'_>,
        bias: Option<&TensorRef<'_>>,
        state: &mut TensorMut<'_>,
        out: &mut TensorMut<'_>,
    ) {
        let seqs = plan.seqs.as_deref().expect("host plans resolve their sequences");
        let ctx = Ctx {
            plan,
            x: x.host_data::<T>().expect("plan checked dtype and device"),
            w: weight.host_data::<T>().expect("plan checked dtype and device"),
            bias: bias.map(|b| b.host_data::<T>().expect("plan checked dtype and device")),
            state: SharedBuf::new(state.host_data_mut::<T>().expect("plan checked dtype and device")),
            out: SharedBuf::new(out.host_data_mut::<T>().expect("plan checked dtype and device")),
        };
        if seqs.is_empty() {
            return;
        }
        // Split channels so that small batches still give every thread several items,
        // with at least 64 channels per item.
        let groups = plan.dim.div_ceil(LANES);
        let threads = self.par().threads();
        let per_seq = if threads == 1 { 1 } else { (4 * threads).div_ceil(seqs.len()).clamp(1, groups.div_ceil(8)) };
        let chunk = groups.div_ceil(per_seq) * LANES;
        let chunks = plan.dim.div_ceil(chunk);
        self.for_each(seqs.len() * chunks, |i| {
            let c0 = (i % chunks) * chunk;
            dispatch(Item { ctx, seq: &seqs[i / chunks], c0, c1: (c0 + chunk).min(plan.dim) });
        });
    }

    fn conv_any(
        &self,
        plan: &ConvPlan,
        x: &TensorRef<'_>,
        weight: &TensorRef<'_>,
        bias: Option<&TensorRef<'_>>,
        state: &mut TensorMut<'_>,
        out: &mut TensorMut<'_>,
    ) -> Result<(), CpuError> {
        require_host("x", x.device())?;
        require_host("weight", weight.device())?;
        if let Some(b) = bias {
            require_host("bias", b.device())?;
        }
        require_host("conv_state", state.device())?;
        require_host("out", out.device())?;
        match plan.dtype {
            DType::F32 => self.conv::<f32>(plan, x, weight, bias, state, out),
            DType::F16 => self.conv::<f16>(plan, x, weight, bias, state, out),
            DType::BF16 => self.conv::<bf16>(plan, x, weight, bias, state, out),
            other => unreachable!("plan admits float dtypes only, got {other}"),
        }
        Ok(())
    }
}

impl ConvBackend for CpuBackend {
    type Error = CpuError;

    /// Runs `causal_conv1d_update` as planned; allocates nothing.
    fn causal_conv1d_update(&self, plan: &ConvPlan, mut args: CausalConv1dUpdateArgs<'_>) -> Result<(), CpuError> {
        self.conv_any(plan, &args.x, &args.weight, args.bias.as_ref(), &mut args.conv_state, &mut args.out)
    }

    /// Runs `causal_conv1d_fn` as planned; allocates nothing.
    fn causal_conv1d_fn(&self, plan: &ConvPlan, mut args: CausalConv1dFnArgs<'_>) -> Result<(), CpuError> {
        self.conv_any(plan, &args.x, &args.weight, args.bias.as_ref(), &mut args.conv_states, &mut args.out)
    }
}
