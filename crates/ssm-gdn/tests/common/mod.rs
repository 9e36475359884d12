//! Shared test support of the property and error tests: owned host buffers, owned calls and a
//! deterministic input generator. (The conformance vectors run through `ssm-conformance`.)

#![allow(dead_code, unreachable_pub)]

use half::{bf16, f16};
use ssm_gdn::{ChunkGatedDeltaRuleArgs, FusedRecurrentGatedDeltaRuleArgs, StateLayout};
use ssm_tensor::{DType, TensorMut, TensorRef};

/// An owned, 8-byte-aligned host tensor.
#[derive(Clone, Debug)]
pub struct Buf {
    pub dtype: DType,
    pub shape: Vec<usize>,
    words: Vec<u64>,
    nbytes: usize,
}

impl Buf {
    pub fn zeros(dtype: DType, shape: &[usize]) -> Buf {
        let nbytes = shape.iter().product::<usize>() * dtype.size();
        Buf { dtype, shape: shape.to_vec(), words: vec![0; nbytes.div_ceil(8)], nbytes }
    }
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Buf {
        let mut b = Buf::zeros(dtype, shape);
        b.bytes_mut().copy_from_slice(bytes);
        b
    }
    pub fn from_f32(dtype: DType, shape: &[usize], vals: &[f32]) -> Buf {
        let mut b = Buf::zeros(dtype, shape);
        for (i, &x) in vals.iter().enumerate() {
            b.set(i, x as f64);
        }
        b
    }
    pub fn from_i64(dtype: DType, shape: &[usize], vals: &[i64]) -> Buf {
        let mut b = Buf::zeros(dtype, shape);
        for (i, &x) in vals.iter().enumerate() {
            match dtype {
                DType::I32 => b.bytes_mut()[i * 4..i * 4 + 4].copy_from_slice(&(x as i32).to_le_bytes()),
                DType::I64 => b.bytes_mut()[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes()),
                DType::Bool => b.bytes_mut()[i] = x as u8,
                _ => panic!("not an integer dtype"),
            }
        }
        b
    }
    /// A float buffer filled with NaN (outputs are poisoned before every run).
    pub fn nan(dtype: DType, shape: &[usize]) -> Buf {
        let n: usize = shape.iter().product();
        Buf::from_f32(dtype, shape, &vec![f32::NAN; n])
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.nbytes]
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.nbytes]
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn r(&self) -> TensorRef<'_> {
        TensorRef::from_bytes(self.bytes(), self.dtype, &self.shape).unwrap()
    }
    pub fn m(&mut self) -> TensorMut<'_> {
        let (d, s) = (self.dtype, self.shape.clone());
        TensorMut::from_bytes(self.bytes_mut(), d, &s).unwrap()
    }
    pub fn get(&self, i: usize) -> f64 {
        let b = self.bytes();
        match self.dtype {
            DType::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
            DType::BF16 => bf16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
            DType::F16 => f16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
            DType::I32 => i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as f64,
            DType::Bool => b[i] as f64,
        }
    }
    pub fn set(&mut self, i: usize, x: f64) {
        let d = self.dtype;
        let b = self.bytes_mut();
        match d {
            DType::F32 => b[i * 4..i * 4 + 4].copy_from_slice(&(x as f32).to_le_bytes()),
            DType::BF16 => b[i * 2..i * 2 + 2].copy_from_slice(&bf16::from_f64(x).to_le_bytes()),
            DType::F16 => b[i * 2..i * 2 + 2].copy_from_slice(&f16::from_f64(x).to_le_bytes()),
            _ => panic!("not a float dtype"),
        }
    }
    /// Swaps the last two dimensions (element-exact), e.g. `[.., V, K]` → `[.., K, V]`.
    pub fn transpose_last2(&self) -> Buf {
        let r = self.shape.len();
        let (a, b) = (self.shape[r - 2], self.shape[r - 1]);
        let mut shape = self.shape.clone();
        shape.swap(r - 2, r - 1);
        let mut out = Buf::zeros(self.dtype, &shape);
        let es = self.dtype.size();
        let blocks = self.numel() / (a * b);
        for blk in 0..blocks {
            for i in 0..a {
                for j in 0..b {
                    let src = (blk * a * b + i * b + j) * es;
                    let dst = (blk * a * b + j * a + i) * es;
                    let v = self.bytes()[src..src + es].to_vec();
                    out.bytes_mut()[dst..dst + es].copy_from_slice(&v);
                }
            }
        }
        out
    }
}

/// Owned buffers of one recurrent call (`fused_recurrent_gated_delta_rule`), for the property
/// and error tests.
#[derive(Clone)]
pub struct RecCase {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub g: Buf,
    pub beta: Option<Buf>,
    pub state: Option<Buf>,
    pub final_state: Option<Buf>,
    pub cu: Option<Buf>,
    pub ix: Option<Buf>,
    pub na: Option<Buf>,
    pub o: Buf,
    pub scale: Option<f32>,
    pub l2norm: bool,
    pub layout: StateLayout,
}

impl RecCase {
    pub fn args(&mut self) -> FusedRecurrentGatedDeltaRuleArgs<'_> {
        FusedRecurrentGatedDeltaRuleArgs {
            q: self.q.r(),
            k: self.k.r(),
            v: self.v.r(),
            g: self.g.r(),
            beta: self.beta.as_ref().map(|b| b.r()),
            scale: self.scale,
            initial_state: self.state.as_mut().map(|s| s.m()),
            final_state: self.final_state.as_mut().map(|s| s.m()),
            cu_seqlens: self.cu.as_ref().map(|b| b.r()),
            ssm_state_indices: self.ix.as_ref().map(|b| b.r()),
            num_accepted_tokens: self.na.as_ref().map(|b| b.r()),
            use_qk_l2norm_in_kernel: self.l2norm,
            eps: 1e-6,
            state_layout: self.layout,
            o: self.o.m(),
        }
    }

    /// Plans and runs the call on `be`.
    pub fn run<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(&mut self, be: &B) -> Result<(), String> {
        let args = self.args();
        be.run(ssm_tensor::Planned::new(args).map_err(|e| e.to_string())?).map_err(|e| format!("{e:?}"))
    }
}

/// Owned buffers of one chunked-prefill call.
#[derive(Clone)]
pub struct ChunkCase {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub g: Buf,
    pub beta: Buf,
    pub state: Option<Buf>,
    pub indices: Option<Buf>,
    pub has_initial_state: Option<Buf>,
    pub pad_slot_id: Option<i64>,
    pub inplace: bool,
    pub final_state: Option<Buf>,
    pub cu: Option<Buf>,
    pub o: Buf,
    pub scratch: Option<Buf>,
    pub layout: StateLayout,
}

impl ChunkCase {
    pub fn args(&mut self) -> ChunkGatedDeltaRuleArgs<'_> {
        ChunkGatedDeltaRuleArgs {
            q: self.q.r(),
            k: self.k.r(),
            v: self.v.r(),
            g: self.g.r(),
            beta: self.beta.r(),
            scale: None,
            initial_state: self.state.as_mut().map(|s| s.m()),
            initial_state_indices: self.indices.as_ref().map(|b| b.r()),
            has_initial_state: self.has_initial_state.as_ref().map(|b| b.r()),
            pad_slot_id: self.pad_slot_id,
            inplace_final_state: self.inplace,
            final_state: self.final_state.as_mut().map(|s| s.m()),
            cu_seqlens: self.cu.as_ref().map(|b| b.r()),
            use_qk_l2norm_in_kernel: true,
            eps: 1e-6,
            state_layout: self.layout,
            o: self.o.m(),
            scratch: self.scratch.as_mut().map(|s| s.m()),
        }
    }

    /// Plans and runs the call on `be`.
    pub fn run<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(&mut self, be: &B) -> Result<(), String> {
        let args = self.args();
        be.run(ssm_tensor::Planned::new(args).map_err(|e| e.to_string())?).map_err(|e| format!("{e:?}"))
    }
}

/// A deterministic generator for test inputs.
pub struct Gen(rand_chacha::ChaCha8Rng);

impl Gen {
    pub fn new(seed: u64) -> Gen {
        use rand::SeedableRng;
        Gen(rand_chacha::ChaCha8Rng::seed_from_u64(seed))
    }
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        use rand::Rng;
        self.0.random_range(lo..hi)
    }
    pub fn below(&mut self, n: usize) -> usize {
        use rand::Rng;
        self.0.random_range(0..n)
    }
    pub fn normal_buf(&mut self, dtype: DType, shape: &[usize], scale: f32) -> Buf {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| (self.uniform(-1.0, 1.0) + self.uniform(-1.0, 1.0)) * scale).collect();
        Buf::from_f32(dtype, shape, &vals)
    }
    pub fn range_buf(&mut self, dtype: DType, shape: &[usize], lo: f32, hi: f32) -> Buf {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| self.uniform(lo, hi)).collect();
        Buf::from_f32(dtype, shape, &vals)
    }
    /// A random permutation of `0..n`.
    pub fn perm(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

/// Elementwise `|a − b| <= atol + rtol·|b|`, where both must be finite (or both NaN when
/// `nan_ok`); returns a description of the first mismatches.
pub fn close(what: &str, got: &Buf, want: &Buf, atol: f64, rtol: f64) -> Result<(), String> {
    assert_eq!(got.shape, want.shape, "{what}");
    let mut bad = Vec::new();
    for i in 0..want.numel() {
        let (g, w) = (got.get(i), want.get(i));
        let ok =
            if w.is_nan() || g.is_nan() { w.is_nan() && g.is_nan() } else { (g - w).abs() <= atol + rtol * w.abs() };
        if !ok {
            bad.push((i, g, w));
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {} of {} off; first {:?}", bad.len(), want.numel(), &bad[..bad.len().min(6)]))
    }
}
