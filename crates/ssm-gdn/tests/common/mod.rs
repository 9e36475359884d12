//! Shared test support: owned host buffers, the conformance-vector reader, and one runner per
//! op that maps a vector file's `in.*` tensors and `args` onto the op's Args and runs them
//! through any [`ssm_gdn::GdnBackend`].

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use ssm_gdn::{
    ChunkGatedDeltaRuleArgs, FusedGdnGatingArgs, FusedRecurrentGatedDeltaRuleArgs,
    FusedSigmoidGatingDeltaRuleUpdateArgs, StateLayout,
};
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

/// One conformance case.
pub struct Case {
    pub path: PathBuf,
    pub op: String,
    pub args: serde_json::Value,
    pub tolerance: HashMap<String, (f64, f64)>,
    pub tensors: HashMap<String, Buf>,
}

impl Case {
    pub fn load(path: &Path) -> Case {
        let bytes = std::fs::read(path).unwrap();
        let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
        let md = meta.metadata().clone().unwrap_or_default();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::BF16 => DType::BF16,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::I32 => DType::I32,
                safetensors::Dtype::I64 => DType::I64,
                safetensors::Dtype::BOOL => DType::Bool,
                d => panic!("{}: unexpected dtype {d:?}", path.display()),
            };
            tensors.insert(name, Buf::from_bytes(dtype, view.shape(), view.data()));
        }
        let tol: serde_json::Value = serde_json::from_str(&md["tolerance"]).unwrap();
        let tolerance = tol
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), (v["atol"].as_f64().unwrap(), v["rtol"].as_f64().unwrap())))
            .collect();
        Case {
            path: path.to_path_buf(),
            op: md["op"].clone(),
            args: serde_json::from_str(&md["args"]).unwrap(),
            tolerance,
            tensors,
        }
    }
    pub fn input(&self, name: &str) -> Option<&Buf> {
        self.tensors.get(&format!("in.{name}"))
    }
    pub fn expected(&self, name: &str) -> &Buf {
        &self.tensors[&format!("out.{name}")]
    }
    pub fn arg_f32(&self, name: &str, default: f32) -> f32 {
        self.args.get(name).and_then(|v| v.as_f64()).map(|x| x as f32).unwrap_or(default)
    }
    pub fn arg_bool(&self, name: &str, default: bool) -> bool {
        self.args.get(name).and_then(|v| v.as_bool()).unwrap_or(default)
    }
    pub fn name(&self) -> String {
        self.path.file_name().unwrap().to_string_lossy().into_owned()
    }
}

/// The vectors folder: `$SSM_CONFORMANCE_DIR` or `<workspace>/../shared/conformance/vectors`.
pub fn vectors_dir() -> PathBuf {
    match std::env::var_os("SSM_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/vectors"),
    }
}

/// Every case of `op`, sorted by file name.
pub fn cases(op: &str) -> Vec<Case> {
    let dir = vectors_dir().join(op);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("conformance vectors not found at {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    paths.sort();
    paths.iter().map(|p| Case::load(p)).collect()
}

/// `|got − want| <= atol + rtol·|want|` for every element; NaN expected = unspecified (skipped).
/// Returns the largest absolute error.
pub fn compare(what: &str, got: &Buf, want: &Buf, atol: f64, rtol: f64) -> Result<f64, String> {
    if got.shape != want.shape {
        return Err(format!("{what}: shape {:?}, expected {:?}", got.shape, want.shape));
    }
    let mut worst = 0.0f64;
    let mut bad = Vec::new();
    for i in 0..want.numel() {
        let w = want.get(i);
        if w.is_nan() {
            continue;
        }
        let g = got.get(i);
        let err = (g - w).abs();
        // NaN where a value is expected fails too.
        let within = err <= atol + rtol * w.abs();
        if !within {
            bad.push((i, g, w));
        }
        if err.is_finite() {
            worst = worst.max(err);
        } else {
            worst = f64::INFINITY;
        }
    }
    if bad.is_empty() {
        Ok(worst)
    } else {
        Err(format!(
            "{what}: {} of {} elements off (atol {atol}, rtol {rtol}); first {:?}",
            bad.len(),
            want.numel(),
            &bad[..bad.len().min(5)]
        ))
    }
}

/// Runs a case through `be` with the state in `layout` (the file's VK state is transposed for KV);
/// returns `(output name, got, expected)` triples, expected already in `layout`.
pub fn run_case<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(
    be: &B,
    case: &Case,
    layout: StateLayout,
) -> Vec<(String, Buf, Buf)> {
    let to_layout = |b: &Buf| if layout == StateLayout::KV { b.transpose_last2() } else { b.clone() };
    let opt = |n: &str| case.input(n).cloned();
    let eps = 1e-6;
    match case.op.as_str() {
        "fused_gdn_gating" => {
            let a = case.input("a").unwrap();
            let (t, hv) = (a.shape[0], a.shape[1]);
            let mut g = Buf::nan(DType::F32, &[1, t, hv]);
            let mut beta = Buf::nan(case.input("b").unwrap().dtype, &[1, t, hv]);
            {
                let args = FusedGdnGatingArgs {
                    a_log: case.input("A_log").unwrap().r(),
                    a: a.r(),
                    b: case.input("b").unwrap().r(),
                    dt_bias: case.input("dt_bias").unwrap().r(),
                    beta: case.arg_f32("beta", 1.0),
                    threshold: case.arg_f32("threshold", 20.0),
                    g: g.m(),
                    beta_output: beta.m(),
                };
                be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            }
            vec![
                ("g".into(), g, case.expected("g").clone()),
                ("beta_output".into(), beta, case.expected("beta_output").clone()),
            ]
        }
        "fused_recurrent_gated_delta_rule" | "fused_sigmoid_gating_delta_rule_update" => {
            let q = case.input("q").unwrap();
            let v = case.input("v").unwrap();
            let mut o = Buf::nan(q.dtype, &v.shape);
            let mut state = opt("initial_state").map(|s| to_layout(&s));
            let inplace = case.arg_bool("inplace_final_state", true);
            let mut final_state = if inplace {
                None
            } else {
                let s = state.as_ref().unwrap();
                let mut sh = s.shape.clone();
                sh[0] = q.shape[0] * q.shape[1];
                Some(Buf::nan(s.dtype, &sh))
            };
            let scale = case.args.get("scale").and_then(|x| x.as_f64()).map(|x| x as f32);
            let l2 = case.arg_bool("use_qk_l2norm_in_kernel", false);
            let (cu, ix, na) = (opt("cu_seqlens"), opt("ssm_state_indices"), opt("num_accepted_tokens"));
            if case.op == "fused_recurrent_gated_delta_rule" {
                let beta = opt("beta");
                let args = FusedRecurrentGatedDeltaRuleArgs {
                    q: q.r(),
                    k: case.input("k").unwrap().r(),
                    v: v.r(),
                    g: case.input("g").unwrap().r(),
                    beta: beta.as_ref().map(|b| b.r()),
                    scale,
                    initial_state: state.as_mut().map(|s| s.m()),
                    final_state: final_state.as_mut().map(|s| s.m()),
                    cu_seqlens: cu.as_ref().map(|b| b.r()),
                    ssm_state_indices: ix.as_ref().map(|b| b.r()),
                    num_accepted_tokens: na.as_ref().map(|b| b.r()),
                    use_qk_l2norm_in_kernel: l2,
                    eps,
                    state_layout: layout,
                    o: o.m(),
                };
                be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            } else {
                let args = FusedSigmoidGatingDeltaRuleUpdateArgs {
                    a_log: case.input("A_log").unwrap().r(),
                    a: case.input("a").unwrap().r(),
                    b: case.input("b").unwrap().r(),
                    dt_bias: case.input("dt_bias").unwrap().r(),
                    q: q.r(),
                    k: case.input("k").unwrap().r(),
                    v: v.r(),
                    beta: case.arg_f32("beta", 1.0),
                    threshold: case.arg_f32("threshold", 20.0),
                    scale,
                    initial_state: state.as_mut().map(|s| s.m()),
                    final_state: final_state.as_mut().map(|s| s.m()),
                    cu_seqlens: cu.as_ref().map(|b| b.r()),
                    ssm_state_indices: ix.as_ref().map(|b| b.r()),
                    num_accepted_tokens: na.as_ref().map(|b| b.r()),
                    use_qk_l2norm_in_kernel: l2,
                    eps,
                    state_layout: layout,
                    o: o.m(),
                };
                be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            }
            let mut outs = vec![("o".to_string(), o, case.expected("o").clone())];
            if let Some(fs) = final_state {
                outs.push(("final_state".into(), fs, to_layout(case.expected("final_state"))));
            } else if let Some(s) = state {
                outs.push(("initial_state".into(), s, to_layout(case.expected("initial_state"))));
            }
            outs
        }
        "chunk_gated_delta_rule" => {
            let q = case.input("q").unwrap();
            let v = case.input("v").unwrap();
            let mut o = Buf::nan(q.dtype, &v.shape);
            let mut state = opt("initial_state").map(|s| to_layout(&s));
            let cu = opt("cu_seqlens");
            let n = cu.as_ref().map(|c| c.numel() - 1).unwrap_or(q.shape[0]);
            let want_fs = to_layout(case.expected("final_state"));
            let mut fs = Buf::nan(want_fs.dtype, &want_fs.shape);
            assert_eq!(fs.shape[0], n);
            let args = ChunkGatedDeltaRuleArgs {
                q: q.r(),
                k: case.input("k").unwrap().r(),
                v: v.r(),
                g: case.input("g").unwrap().r(),
                beta: case.input("beta").unwrap().r(),
                scale: case.args.get("scale").and_then(|x| x.as_f64()).map(|x| x as f32),
                initial_state: state.as_mut().map(|s| s.m()),
                initial_state_indices: None,
                has_initial_state: None,
                pad_slot_id: None,
                inplace_final_state: false,
                final_state: Some(fs.m()),
                cu_seqlens: cu.as_ref().map(|b| b.r()),
                use_qk_l2norm_in_kernel: case.arg_bool("use_qk_l2norm_in_kernel", false),
                eps,
                state_layout: layout,
                o: o.m(),
                scratch: None,
            };
            be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            vec![("o".into(), o, case.expected("o").clone()), ("final_state".into(), fs, want_fs)]
        }
        op => panic!("unknown op {op}"),
    }
}

/// Runs every case of `op` through `be` in both layouts; returns how many passed.
pub fn check_op<B: ssm_gdn::GdnBackend<E>, E: std::fmt::Debug>(be: &B, label: &str, op: &str) -> usize {
    let cases = cases(op);
    assert!(!cases.is_empty(), "no vectors for {op}");
    let mut failures = Vec::new();
    for case in &cases {
        for layout in [StateLayout::VK, StateLayout::KV] {
            for (name, got, want) in run_case(be, case, layout) {
                let (atol, rtol) = case.tolerance[&name];
                match compare(&name, &got, &want, atol, rtol) {
                    Ok(worst) => eprintln!(
                        "{label} {op}/{} ({layout:?}) {name}: max abs err {worst:.3e} (atol {atol})",
                        case.name()
                    ),
                    Err(e) => failures.push(format!("{label} {op}/{} ({layout:?}): {e}", case.name())),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    cases.len()
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
