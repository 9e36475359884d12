//! Shared pieces of the GPU tests: the skip rule, host tensors and random SSU cases.
#![allow(dead_code, unreachable_pub)]

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_cuda::{Availability, CudaBackend, probe};
use ssm_ssu::{SelectiveStateUpdate, StochasticRounding};
use ssm_tensor::{DType, TensorMut, TensorRef};

/// The backend, or `None` after printing why the test is skipped. With `SSM_REQUIRE_GPU=1`
/// a missing GPU or NVRTC fails the test instead.
pub fn gpu(test: &str) -> Option<CudaBackend> {
    let require = std::env::var("SSM_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let reason = match probe() {
        Availability::Ready { .. } if !ssm_cuda::nvrtc_available() => {
            Some("NVRTC (libnvrtc.so.13) not found".to_string())
        }
        Availability::Ready { .. } => None,
        other => Some(other.to_string()),
    };
    if let Some(reason) = reason {
        assert!(!require, "{test}: SSM_REQUIRE_GPU=1 but {reason}");
        eprintln!("skipping {test}: {reason}");
        return None;
    }
    Some(CudaBackend::new(0).unwrap_or_else(|e| panic!("{test}: CUDA backend: {e}")))
}

/// An owned host tensor with an arbitrary layout over 16-byte aligned memory.
#[derive(Clone, Debug)]
pub struct HostTensor {
    data: Vec<u128>,
    pub nbytes: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub offset: usize,
}

impl HostTensor {
    /// `len` memory elements, all set from `fill`, viewed as `shape`/`strides`/`offset`.
    pub fn new(dtype: DType, len: usize, shape: &[usize], strides: &[isize], offset: usize) -> Self {
        let nbytes = len * dtype.size();
        HostTensor {
            data: vec![0u128; nbytes.div_ceil(16).max(1)],
            nbytes,
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        }
    }

    /// A contiguous tensor of `shape`.
    pub fn contiguous(dtype: DType, shape: &[usize]) -> Self {
        let mut strides = vec![0isize; shape.len()];
        let mut s = 1isize;
        for d in (0..shape.len()).rev() {
            strides[d] = s;
            s *= shape[d] as isize;
        }
        Self::new(dtype, shape.iter().product::<usize>().max(1), shape, &strides, 0)
    }

    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.data)[..self.nbytes]
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.nbytes;
        &mut bytemuck::cast_slice_mut(&mut self.data)[..n]
    }

    pub fn len(&self) -> usize {
        self.nbytes / self.dtype.size()
    }

    pub fn view(&self) -> TensorRef<'_> {
        TensorRef::from_bytes(self.bytes(), self.dtype, &[self.len()])
            .and_then(|t| t.with_layout(&self.shape, &self.strides, self.offset))
            .expect("valid host layout")
    }

    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let (dtype, len) = (self.dtype, self.len());
        let (shape, strides, offset) = (self.shape.clone(), self.strides.clone(), self.offset);
        TensorMut::from_bytes(self.bytes_mut(), dtype, &[len])
            .and_then(|t| t.with_layout(&shape, &strides, offset))
            .expect("valid host layout")
    }

    /// Memory element `i` as f64 (floats) or as an integer (indices).
    pub fn get(&self, i: usize) -> f64 {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
            DType::F16 => f16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
            DType::I32 => i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as f64,
            DType::Bool => b[i] as f64,
        }
    }

    /// Raw bits of memory element `i`.
    pub fn bits(&self, i: usize) -> u64 {
        let s = self.dtype.size();
        let mut v = [0u8; 8];
        v[..s].copy_from_slice(&self.bytes()[i * s..(i + 1) * s]);
        u64::from_le_bytes(v)
    }

    pub fn set_f(&mut self, i: usize, v: f32) {
        let dtype = self.dtype;
        let b = self.bytes_mut();
        match dtype {
            DType::F32 => b[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes()),
            DType::F16 => b[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            DType::BF16 => b[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
            _ => panic!("not a float tensor"),
        }
    }

    pub fn set_i(&mut self, i: usize, v: i64) {
        let dtype = self.dtype;
        let b = self.bytes_mut();
        match dtype {
            DType::I32 => b[i * 4..i * 4 + 4].copy_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => b[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes()),
            DType::Bool => b[i] = u8::from(v != 0),
            _ => panic!("not an index tensor"),
        }
    }

    pub fn fill_uniform(&mut self, rng: &mut ChaCha8Rng, lo: f32, hi: f32) {
        for i in 0..self.len() {
            self.set_f(i, rng.random_range(lo..hi));
        }
    }

    pub fn fill_nan(&mut self) {
        for i in 0..self.len() {
            self.set_f(i, f32::NAN);
        }
    }
}

/// How the tokens of a random case are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    OneToken,
    Varlen,
    Dense(usize),
}

/// Parameters of a random case.
#[derive(Debug, Clone, Copy)]
pub struct CaseSpec {
    pub layout: Layout,
    pub spec: bool,
    pub tied: bool,
    pub state: DType,
    pub io: DType,
    pub index: DType,
    pub seqs: usize,
    pub heads: usize,
    pub groups: usize,
    pub dim: usize,
    pub dstate: usize,
    pub pad: Option<i64>,
    pub tables: bool,
    pub with_z: bool,
    pub with_d: bool,
    pub with_dt_bias: bool,
    pub softplus: bool,
    /// Extra elements between state slots (breaks 16-byte alignment when odd).
    pub slot_pad: usize,
    pub sr: Option<StochasticRounding>,
    /// Use `A = 0` so that `dA = 1` exactly on every backend (bit-exact state checks).
    pub zero_a: bool,
}

impl CaseSpec {
    pub fn mamba2(seqs: usize, state: DType) -> Self {
        CaseSpec {
            layout: Layout::OneToken,
            spec: false,
            tied: true,
            state,
            io: DType::BF16,
            index: DType::I32,
            seqs,
            heads: 8,
            groups: 2,
            dim: 64,
            dstate: 128,
            pad: Some(-1),
            tables: true,
            with_z: false,
            with_d: true,
            with_dt_bias: true,
            softplus: true,
            slot_pad: 0,
            sr: None,
            zero_a: false,
        }
    }
}

/// A random SSU case with owned host tensors.
#[derive(Clone, Debug)]
pub struct Case {
    pub spec: CaseSpec,
    pub state: HostTensor,
    pub x: HostTensor,
    pub dt: HostTensor,
    pub a: HostTensor,
    pub b: HostTensor,
    pub c: HostTensor,
    pub d: Option<HostTensor>,
    pub dt_bias: Option<HostTensor>,
    pub z: Option<HostTensor>,
    pub out: HostTensor,
    pub sbi: Option<HostTensor>,
    pub dst: Option<HostTensor>,
    pub nacc: Option<HostTensor>,
    pub cu: Option<HostTensor>,
    /// Slots some table entry names (others must stay bit-identical).
    pub named_slots: Vec<usize>,
}

impl Case {
    pub fn random(s: CaseSpec, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (h, dim, ds, g) = (s.heads, s.dim, s.dstate, s.groups);
        // Token layout.
        let width = if s.spec { 4 } else { 1 };
        let mut lens = vec![1usize; s.seqs];
        match s.layout {
            Layout::Varlen => {
                for l in lens.iter_mut() {
                    *l = rng.random_range(0..=width.max(3).min(if s.spec { width } else { 3 }));
                }
            }
            Layout::Dense(steps) => lens.iter_mut().for_each(|l| *l = steps),
            Layout::OneToken => {}
        }
        let rows: usize = lens.iter().sum();
        let tok_prefix: Vec<usize> = match s.layout {
            Layout::Dense(steps) => vec![s.seqs, steps],
            _ => vec![rows],
        };
        let tok = |inner: usize, last: usize| {
            let mut sh = tok_prefix.clone();
            sh.extend([inner, last]);
            sh
        };
        let io = s.io;
        let mut x = HostTensor::contiguous(io, &tok(h, dim));
        x.fill_uniform(&mut rng, -1.0, 1.0);
        let mut b = HostTensor::contiguous(io, &tok(g, ds));
        b.fill_uniform(&mut rng, -1.0, 1.0);
        let mut c = HostTensor::contiguous(io, &tok(g, ds));
        c.fill_uniform(&mut rng, -1.0, 1.0);
        let z = s.with_z.then(|| {
            let mut z = HostTensor::contiguous(io, &tok(h, dim));
            z.fill_uniform(&mut rng, -2.0, 2.0);
            z
        });
        let mut out = HostTensor::contiguous(io, &tok(h, dim));
        out.fill_nan();
        let np = tok_prefix.len();
        // dt / A / dt_bias / D: tied = stride-0 views of per-head vectors.
        let dt = if s.tied {
            let mut shape = tok_prefix.clone();
            shape.extend([h, dim]);
            let mut strides: Vec<isize> = vec![0; np + 2];
            let mut st = h as isize;
            for d in (0..np).rev() {
                strides[d] = st;
                st *= tok_prefix[d] as isize;
            }
            strides[np] = 1;
            let mut t = HostTensor::new(io, tok_prefix.iter().product::<usize>() * h, &shape, &strides, 0);
            t.fill_uniform(&mut rng, -3.0, 1.0);
            t
        } else {
            let mut t = HostTensor::contiguous(io, &tok(h, dim));
            t.fill_uniform(&mut rng, -3.0, 1.0);
            t
        };
        let mut a = if s.tied {
            HostTensor::new(DType::F32, h, &[h, dim, ds], &[1, 0, 0], 0)
        } else {
            HostTensor::contiguous(DType::F32, &[h, dim, ds])
        };
        for i in 0..a.len() {
            let v = if s.zero_a { 0.0 } else { -(rng.random_range(-2.0f32..1.0)).exp() };
            a.set_f(i, v);
        }
        let per_head = |rng: &mut ChaCha8Rng, lo: f32, hi: f32| {
            let mut t = if s.tied {
                HostTensor::new(DType::F32, h, &[h, dim], &[1, 0], 0)
            } else {
                HostTensor::contiguous(DType::F32, &[h, dim])
            };
            t.fill_uniform(rng, lo, hi);
            t
        };
        let dt_bias = s.with_dt_bias.then(|| per_head(&mut rng, -1.0, 1.0));
        let d = s.with_d.then(|| per_head(&mut rng, -1.0, 1.0));

        // Slots: distinct per (sequence, column), none shared between sequences.
        let reserve0 = s.pad == Some(0);
        let first = usize::from(reserve0);
        let needed = s.seqs * width * 2 + 3;
        let slots = first + needed;
        let mut pool: Vec<usize> = (first..slots).collect();
        for i in (1..pool.len()).rev() {
            let j = rng.random_range(0..=i);
            pool.swap(i, j);
        }
        let mut named = Vec::new();
        let (sbi, dst, nacc) = if s.tables {
            let shape: Vec<usize> = if s.spec { vec![s.seqs, width] } else { vec![s.seqs] };
            let mut sbi = HostTensor::contiguous(s.index, &shape);
            let mut dst = HostTensor::contiguous(s.index, &shape);
            let mut next = 0;
            for bq in 0..s.seqs {
                for col in 0..width {
                    let i = bq * width + col;
                    let pad_it = s.pad.is_some() && rng.random_range(0..8) == 0;
                    let (src_slot, dst_slot) = (pool[next], pool[next + 1]);
                    next += 2;
                    if pad_it {
                        sbi.set_i(i, s.pad.unwrap());
                    } else {
                        sbi.set_i(i, src_slot as i64);
                        named.push(src_slot);
                    }
                    if let Some(pad) = s.pad.filter(|_| rng.random_range(0..8) == 0) {
                        dst.set_i(i, pad);
                    } else {
                        dst.set_i(i, dst_slot as i64);
                        named.push(dst_slot);
                    }
                }
            }
            let nacc = s.spec.then(|| {
                let mut n = HostTensor::contiguous(s.index, &[s.seqs]);
                for bq in 0..s.seqs {
                    n.set_i(bq, rng.random_range(0..=width as i64));
                }
                n
            });
            (Some(sbi), Some(dst), nacc)
        } else {
            named.extend(0..s.seqs);
            (None, None, None)
        };
        let slots = if s.tables { slots } else { s.seqs + 2 };
        let slot_stride = h * dim * ds + s.slot_pad;
        let mut state = HostTensor::new(
            s.state,
            slots * slot_stride,
            &[slots, h, dim, ds],
            &[slot_stride as isize, (dim * ds) as isize, ds as isize, 1],
            0,
        );
        state.fill_uniform(&mut rng, -1.0, 1.0);
        let cu = (s.layout == Layout::Varlen).then(|| {
            let mut cu = HostTensor::contiguous(s.index, &[s.seqs + 1]);
            let mut acc = 0i64;
            cu.set_i(0, 0);
            for (i, l) in lens.iter().enumerate() {
                acc += *l as i64;
                cu.set_i(i + 1, acc);
            }
            cu
        });
        Case { spec: s, state, x, dt, a, b, c, d, dt_bias, z, out, sbi, dst, nacc, cu, named_slots: named }
    }

    pub fn args(&mut self) -> SelectiveStateUpdate<'_> {
        SelectiveStateUpdate {
            state: self.state.view_mut(),
            x: self.x.view(),
            dt: self.dt.view(),
            a: self.a.view(),
            b: self.b.view(),
            c: self.c.view(),
            d: self.d.as_ref().map(|t| t.view()),
            dt_bias: self.dt_bias.as_ref().map(|t| t.view()),
            z: self.z.as_ref().map(|t| t.view()),
            dt_softplus: self.spec.softplus,
            state_batch_indices: self.sbi.as_ref().map(|t| t.view()),
            dst_state_batch_indices: self.dst.as_ref().map(|t| t.view()),
            pad_slot_id: self.spec.pad,
            out: self.out.view_mut(),
            num_accepted_tokens: self.nacc.as_ref().map(|t| t.view()),
            cu_seqlens: self.cu.as_ref().map(|t| t.view()),
            stochastic_rounding: self.spec.sr,
        }
    }
}

/// Absolute and relative tolerance for values stored as `dtype`.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-4, 2e-4),
        DType::F16 => (4e-3, 4e-3),
        _ => (3.2e-2, 1.6e-2),
    }
}

/// Compares two tensors element by element (memory order): NaN must match NaN (unwritten
/// poison), other values within the tolerance of `dtype`. Returns the first mismatch.
pub fn compare(what: &str, got: &HostTensor, want: &HostTensor) -> Result<(), String> {
    assert_eq!(got.len(), want.len());
    let (atol, rtol) = tolerance(want.dtype);
    let mut worst = 0.0f64;
    for i in 0..want.len() {
        let (g, w) = (got.get(i), want.get(i));
        if w.is_nan() || g.is_nan() {
            if !(w.is_nan() && g.is_nan()) {
                return Err(format!("{what}[{i}]: got {g}, want {w} (one is unwritten)"));
            }
            continue;
        }
        let err = (g - w).abs();
        worst = worst.max(err / (atol + rtol * w.abs()));
        if err > atol + rtol * w.abs() {
            return Err(format!("{what}[{i}]: got {g}, want {w} (|err| {err:.3e}, tol {:.3e})", atol + rtol * w.abs()));
        }
    }
    let _ = worst;
    Ok(())
}
