//! Loading the conformance vectors (`shared/conformance/vectors`, FORMAT.md) and running them
//! through any [`ssm_conv::ConvBackend`].

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_tensor::{TensorMut, TensorRef};

/// The vectors directory: `SSM_CONFORMANCE_DIR`, or `../shared/conformance/vectors` next to the workspace.
pub fn vectors_dir() -> PathBuf {
    match std::env::var_os("SSM_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/vectors"),
    }
}

/// The `.safetensors` files of one op, sorted.
pub fn vector_files(op: &str) -> Vec<PathBuf> {
    let dir = vectors_dir().join(op);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

/// A typed, aligned copy of one stored tensor.
#[derive(Clone, Debug)]
pub enum Buf {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    Bool(Vec<u8>),
}

impl Buf {
    fn from_bytes(dtype: safetensors::Dtype, b: &[u8]) -> Buf {
        use safetensors::Dtype as D;
        match dtype {
            D::F32 => Buf::F32(b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
            D::F16 => Buf::F16(b.chunks_exact(2).map(|c| f16::from_le_bytes(c.try_into().unwrap())).collect()),
            D::BF16 => Buf::BF16(b.chunks_exact(2).map(|c| bf16::from_le_bytes(c.try_into().unwrap())).collect()),
            D::I32 => Buf::I32(b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()),
            D::I64 => Buf::I64(b.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
            D::BOOL => Buf::Bool(b.to_vec()),
            other => panic!("unexpected dtype {other:?}"),
        }
    }

    pub fn view(&self, shape: &[usize]) -> TensorRef<'_> {
        match self {
            Buf::F32(v) => TensorRef::from_slice(v, shape),
            Buf::F16(v) => TensorRef::from_slice(v, shape),
            Buf::BF16(v) => TensorRef::from_slice(v, shape),
            Buf::I32(v) => TensorRef::from_slice(v, shape),
            Buf::I64(v) => TensorRef::from_slice(v, shape),
            Buf::Bool(v) => TensorRef::from_slice(v, shape),
        }
        .unwrap()
    }

    pub fn view_mut(&mut self, shape: &[usize]) -> TensorMut<'_> {
        match self {
            Buf::F32(v) => TensorMut::from_slice(v, shape),
            Buf::F16(v) => TensorMut::from_slice(v, shape),
            Buf::BF16(v) => TensorMut::from_slice(v, shape),
            Buf::I32(v) => TensorMut::from_slice(v, shape),
            Buf::I64(v) => TensorMut::from_slice(v, shape),
            Buf::Bool(v) => TensorMut::from_slice(v, shape),
        }
        .unwrap()
    }

    /// Floating-point values widened to f64 (exactly).
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            Buf::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Buf::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Buf::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            other => panic!("not a float buffer: {other:?}"),
        }
    }

    /// Bit patterns, for exact comparisons.
    pub fn bits(&self) -> Vec<u64> {
        match self {
            Buf::F32(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
            Buf::F16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
            Buf::BF16(v) => v.iter().map(|x| x.to_bits() as u64).collect(),
            Buf::I32(v) => v.iter().map(|&x| x as u32 as u64).collect(),
            Buf::I64(v) => v.iter().map(|&x| x as u64).collect(),
            Buf::Bool(v) => v.iter().map(|&x| x as u64).collect(),
        }
    }

    /// Permutes a contiguous `[a, b, c]` buffer into contiguous `[a, c, b]`.
    pub fn swap_last2(&self, a: usize, b: usize, c: usize) -> Buf {
        fn perm<T: Copy>(v: &[T], a: usize, b: usize, c: usize) -> Vec<T> {
            let mut out = Vec::with_capacity(v.len());
            for i in 0..a {
                for k in 0..c {
                    for j in 0..b {
                        out.push(v[(i * b + j) * c + k]);
                    }
                }
            }
            out
        }
        match self {
            Buf::F32(v) => Buf::F32(perm(v, a, b, c)),
            Buf::F16(v) => Buf::F16(perm(v, a, b, c)),
            Buf::BF16(v) => Buf::BF16(perm(v, a, b, c)),
            Buf::I32(v) => Buf::I32(perm(v, a, b, c)),
            Buf::I64(v) => Buf::I64(perm(v, a, b, c)),
            Buf::Bool(v) => Buf::Bool(perm(v, a, b, c)),
        }
    }
}

/// One conformance case.
pub struct Vector {
    pub name: String,
    pub args: serde_json::Value,
    pub tolerance: HashMap<String, (f64, f64)>,
    pub tensors: HashMap<String, (Vec<usize>, Buf)>,
}

impl Vector {
    pub fn load(path: &Path) -> Vector {
        let bytes = std::fs::read(path).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let md = meta.metadata().clone().unwrap_or_default();
        let args: serde_json::Value = serde_json::from_str(md.get("args").map_or("{}", |s| s.as_str())).unwrap();
        let tol: serde_json::Value = serde_json::from_str(md.get("tolerance").map_or("{}", |s| s.as_str())).unwrap();
        let tolerance = tol
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), (v["atol"].as_f64().unwrap(), v["rtol"].as_f64().unwrap())))
            .collect();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let tensors = st
            .tensors()
            .into_iter()
            .map(|(name, t)| (name, (t.shape().to_vec(), Buf::from_bytes(t.dtype(), t.data()))))
            .collect();
        Vector { name: path.file_name().unwrap().to_string_lossy().into_owned(), args, tolerance, tensors }
    }

    pub fn get(&self, name: &str) -> Option<&(Vec<usize>, Buf)> {
        self.tensors.get(name)
    }

    pub fn input(&self, name: &str) -> Option<TensorRef<'_>> {
        self.get(&format!("in.{name}")).map(|(s, b)| b.view(s))
    }

    fn activation(&self) -> Activation {
        match &self.args["activation"] {
            serde_json::Value::String(s) if s == "silu" || s == "swish" => Activation::Silu,
            serde_json::Value::Bool(true) => Activation::Silu,
            serde_json::Value::Null | serde_json::Value::Bool(false) => Activation::None,
            other => panic!("unknown activation {other}"),
        }
    }

    /// The pad value of the slot tables: `null_block_id` when given, else `pad_slot_id`.
    fn pad(&self) -> Option<i64> {
        self.args["null_block_id"].as_i64().or_else(|| self.args["pad_slot_id"].as_i64())
    }
}

/// Compares `got` with the expected output `out.<name>`; NaN expected = skip. Returns the
/// number of elements checked.
pub fn compare(v: &Vector, name: &str, got: &[f64]) -> Result<usize, String> {
    let (_, want) = v.get(&format!("out.{name}")).ok_or_else(|| format!("no out.{name}"))?;
    let want = want.to_f64();
    let (atol, rtol) = *v.tolerance.get(name).ok_or_else(|| format!("no tolerance for {name}"))?;
    if want.len() != got.len() {
        return Err(format!("{}: {name} has {} elements, expected {}", v.name, got.len(), want.len()));
    }
    let mut checked = 0;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        if w.is_nan() {
            continue;
        }
        // Written so that a NaN result fails.
        let within = (g - w).abs() <= atol + rtol * w.abs();
        if !within {
            return Err(format!("{}: {name}[{i}] = {g}, expected {w} (atol {atol}, rtol {rtol})", v.name));
        }
        checked += 1;
    }
    Ok(checked)
}

/// Runs a `causal_conv1d_update` vector with the given state layout; returns elements checked.
pub fn run_update<B: ssm_conv::ConvBackend<E>, E: std::fmt::Debug>(
    backend: &B,
    v: &Vector,
    layout: ConvStateLayout,
) -> Result<usize, String> {
    let (xshape, xbuf) = v.get("in.x").unwrap();
    let (sshape, sbuf) = v.get("in.conv_state").unwrap();
    let (slots, dim, state_len) = (sshape[0], sshape[1], sshape[2]);
    let qsl = v.input("query_start_loc");
    // x/out views: vLLM's [batch, dim, seqlen] becomes the token-major view [batch, seqlen, dim].
    let (vshape, vstrides): (Vec<usize>, Vec<isize>) = if xshape.len() == 3 {
        let (b, d, s) = (xshape[0], xshape[1], xshape[2]);
        (vec![b, s, d], vec![(d * s) as isize, 1, s as isize])
    } else {
        (xshape.clone(), vec![xshape[1] as isize, 1])
    };
    let x = xbuf.view(xshape).with_layout(&vshape, &vstrides, 0).unwrap();
    // vLLM writes into x: the output buffer starts as a copy of x.
    let mut out_buf = xbuf.clone();
    let mut state_buf = match layout {
        ConvStateLayout::DimStateLen => sbuf.clone(),
        ConvStateLayout::StateLenDim => sbuf.swap_last2(slots, dim, state_len),
    };
    let state_shape = match layout {
        ConvStateLayout::DimStateLen => vec![slots, dim, state_len],
        ConvStateLayout::StateLenDim => vec![slots, state_len, dim],
    };
    {
        let args = CausalConv1dUpdateArgs {
            x,
            conv_state: state_buf.view_mut(&state_shape),
            conv_state_layout: layout,
            weight: v.input("weight").unwrap(),
            bias: v.input("bias"),
            activation: v.activation(),
            conv_state_indices: v.input("conv_state_indices"),
            num_accepted_tokens: v.input("num_accepted_tokens"),
            query_start_loc: qsl,
            pad_slot_id: v.pad(),
            block_idx_last_scheduled_token: v.input("block_idx_last_scheduled_token"),
            initial_state_idx: v.input("initial_state_idx"),
            out: out_buf.view_mut(xshape).with_layout(&vshape, &vstrides, 0).unwrap(),
        };
        backend
            .run(ssm_tensor::Planned::new(args).map_err(|e| format!("{}: plan: {e}", v.name))?)
            .map_err(|e| format!("{}: backend: {e:?}", v.name))?;
    }
    let state_logical = match layout {
        ConvStateLayout::DimStateLen => state_buf,
        ConvStateLayout::StateLenDim => state_buf.swap_last2(slots, state_len, dim),
    };
    let out = out_buf.to_f64();
    let mut n = compare(v, "out", &out)?;
    if v.get("out.x").is_some() {
        n += compare(v, "x", &out)?;
    }
    n += compare(v, "conv_state", &state_logical.to_f64())?;
    // The state update is a copy: bit-exact against the peer.
    let (_, want) = v.get("out.conv_state").unwrap();
    if want.bits() != state_logical.bits() {
        return Err(format!("{}: conv_state is not bit-identical to the peer's", v.name));
    }
    Ok(n)
}

/// Runs a `causal_conv1d_fn` vector with the given state layout; returns elements checked.
pub fn run_fn<B: ssm_conv::ConvBackend<E>, E: std::fmt::Debug>(
    backend: &B,
    v: &Vector,
    layout: ConvStateLayout,
) -> Result<usize, String> {
    let (xshape, xbuf) = v.get("in.x").unwrap();
    let (dim, tokens) = (xshape[0], xshape[1]);
    let (sshape, sbuf) = v.get("in.conv_states").unwrap();
    let (slots, state_len) = (sshape[0], sshape[2]);
    // vLLM's x is the channel-last [dim, num_tokens] view; ours is [num_tokens, dim] over the same memory.
    let x = xbuf.view(xshape).with_layout(&[tokens, dim], &[1, tokens as isize], 0).unwrap();
    let mut out_buf = match v.get("in.out") {
        Some((_, b)) => b.clone(),
        None => {
            let mut b = xbuf.clone();
            b.view_mut(xshape).host_bytes_mut().unwrap().fill(0);
            b
        }
    };
    let mut state_buf = match layout {
        ConvStateLayout::DimStateLen => sbuf.clone(),
        ConvStateLayout::StateLenDim => sbuf.swap_last2(slots, dim, state_len),
    };
    let state_shape = match layout {
        ConvStateLayout::DimStateLen => vec![slots, dim, state_len],
        ConvStateLayout::StateLenDim => vec![slots, state_len, dim],
    };
    {
        let args = CausalConv1dFnArgs {
            x,
            weight: v.input("weight").unwrap(),
            bias: v.input("bias"),
            conv_states: state_buf.view_mut(&state_shape),
            conv_state_layout: layout,
            query_start_loc: v.input("query_start_loc").unwrap(),
            cache_indices: v.input("cache_indices"),
            has_initial_state: v.input("has_initial_state"),
            activation: v.activation(),
            pad_slot_id: v.pad(),
            out: out_buf.view_mut(xshape).with_layout(&[tokens, dim], &[1, tokens as isize], 0).unwrap(),
        };
        backend
            .run(ssm_tensor::Planned::new(args).map_err(|e| format!("{}: plan: {e}", v.name))?)
            .map_err(|e| format!("{}: backend: {e:?}", v.name))?;
    }
    let state_logical = match layout {
        ConvStateLayout::DimStateLen => state_buf,
        ConvStateLayout::StateLenDim => state_buf.swap_last2(slots, state_len, dim),
    };
    let mut n = compare(v, "out", &out_buf.to_f64())?;
    n += compare(v, "conv_states", &state_logical.to_f64())?;
    let (_, want) = v.get("out.conv_states").unwrap();
    if want.bits() != state_logical.bits() {
        return Err(format!("{}: conv_states is not bit-identical to the peer's", v.name));
    }
    Ok(n)
}
