//! Reads the conformance vectors (../shared/conformance/FORMAT.md) into host tensors.
#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::path::PathBuf;

use ssm_tensor::{DType, TensorMut, TensorRef};

/// One stored tensor, in 8-byte aligned memory.
pub struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    buf: Vec<u64>,
    len: usize,
}

impl Tensor {
    pub fn new(dtype: DType, shape: &[usize], bytes: &[u8]) -> Self {
        let mut buf = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..bytes.len()].copy_from_slice(bytes);
        Tensor { dtype, shape: shape.to_vec(), buf, len: bytes.len() }
    }
    pub fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.buf)[..self.len]
    }
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef::from_bytes(self.bytes(), self.dtype, &self.shape).unwrap()
    }
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let (dtype, shape, len) = (self.dtype, self.shape.clone(), self.len);
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.buf)[..len];
        TensorMut::from_bytes(bytes, dtype, &shape).unwrap()
    }
    pub fn to_f64(&self) -> Vec<f64> {
        let v = self.view();
        (0..v.numel()).map(|i| read(&v, i)).collect()
    }
}

fn read(v: &TensorRef<'_>, i: usize) -> f64 {
    let b = v.host_bytes().unwrap();
    match v.dtype() {
        DType::F32 => f32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
        DType::F16 => half::f16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
        DType::BF16 => half::bf16::from_le_bytes(b[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
        DType::I32 => i32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap()) as f64,
        DType::Bool => b[i] as f64,
    }
}

/// One case file.
pub struct Case {
    pub name: String,
    pub args: serde_json::Value,
    pub tolerance: serde_json::Value,
    pub tensors: HashMap<String, Tensor>,
}

impl Case {
    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(&format!("in.{name}"))
    }
    pub fn expected(&self, name: &str) -> &Tensor {
        self.tensors.get(&format!("out.{name}")).unwrap_or_else(|| panic!("{}: no out.{name}", self.name))
    }
    /// A fresh copy of an input (for buffers the op writes).
    pub fn input_copy(&self, name: &str) -> Tensor {
        let t = self.input(name).unwrap_or_else(|| panic!("{}: no in.{name}", self.name));
        Tensor::new(t.dtype, &t.shape, t.bytes())
    }
    pub fn arg_f32(&self, name: &str) -> f32 {
        json_f32(&self.args[name])
    }

    /// Compares `got` with `out.<name>` under the file's tolerance; NaN expected = skip.
    /// Returns (max abs error, elements checked).
    pub fn check(&self, name: &str, got: &Tensor) -> (f64, usize) {
        let want = self.expected(name);
        assert_eq!(want.shape, got.shape, "{}: shape of {name}", self.name);
        let tol = &self.tolerance[name];
        let atol = tol["atol"].as_f64().unwrap_or(0.0);
        let rtol = tol["rtol"].as_f64().unwrap_or(0.0);
        let (w, g) = (want.to_f64(), got.to_f64());
        let mut max_err = 0f64;
        let mut checked = 0;
        for (i, (&w, &g)) in w.iter().zip(&g).enumerate() {
            if w.is_nan() {
                continue;
            }
            let err = (g - w).abs();
            assert!(
                err <= atol + rtol * w.abs(),
                "{}: {name}[{i}] = {g}, expected {w} (atol {atol}, rtol {rtol})",
                self.name
            );
            max_err = max_err.max(err);
            checked += 1;
        }
        (max_err, checked)
    }
}

pub fn json_f32(v: &serde_json::Value) -> f32 {
    match v {
        serde_json::Value::String(s) if s == "inf" => f32::INFINITY,
        serde_json::Value::String(s) if s == "-inf" => f32::NEG_INFINITY,
        v => v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")) as f32,
    }
}

/// The vectors folder: `SSM_CONFORMANCE_DIR`, else `<workspace>/../shared/conformance/vectors`.
pub fn vectors_dir() -> PathBuf {
    match std::env::var_os("SSM_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/conformance/vectors"),
    }
}

/// Every case of one op, sorted by file name.
pub fn load(op: &str) -> Vec<Case> {
    let dir = vectors_dir().join(op);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("conformance vectors for {op} not found in {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let data = std::fs::read(&path).unwrap();
            let (_, meta) = safetensors::SafeTensors::read_metadata(&data).unwrap();
            let md = meta.metadata().clone().unwrap_or_default();
            let parse = |k: &str| md.get(k).map_or(serde_json::Value::Null, |s| serde_json::from_str(s).unwrap());
            let st = safetensors::SafeTensors::deserialize(&data).unwrap();
            let mut tensors = HashMap::new();
            for (name, view) in st.tensors() {
                let dtype = match view.dtype() {
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    safetensors::Dtype::I32 => DType::I32,
                    safetensors::Dtype::I64 => DType::I64,
                    safetensors::Dtype::BOOL => DType::Bool,
                    d => panic!("unexpected dtype {d:?}"),
                };
                tensors.insert(name.to_string(), Tensor::new(dtype, view.shape(), view.data()));
            }
            Case {
                name: path.file_name().unwrap().to_string_lossy().into_owned(),
                args: parse("args"),
                tolerance: parse("tolerance"),
                tensors,
            }
        })
        .collect()
}
