use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use ssm_tensor::{DType, HostTensor, TensorRef};

/// Why a vector file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CaseError {
    /// I/O.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not a valid safetensors file, or a bad header.
    #[error("{path}: {reason}")]
    Format {
        /// File.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// One conformance case.
#[derive(Debug, Clone)]
pub struct Case {
    /// File stem.
    pub name: String,
    /// The file.
    pub path: PathBuf,
    /// Peer op name (`op` metadata).
    pub op: String,
    /// Non-tensor arguments (`args` metadata).
    pub args: serde_json::Value,
    /// Broadcast shapes (`expand` metadata).
    pub expand: BTreeMap<String, Vec<usize>>,
    /// `tolerance` metadata.
    pub tolerance: serde_json::Value,
    /// Free text.
    pub notes: String,
    /// `in.*` and `out.*` tensors by full name.
    pub tensors: BTreeMap<String, HostTensor>,
}

impl Case {
    /// An input tensor (`in.<name>`).
    pub fn input(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(&format!("in.{name}"))
    }

    /// Expected outputs (`out.<name>`), by short name.
    pub fn expected(&self) -> Vec<(String, &HostTensor)> {
        self.tensors.iter().filter_map(|(k, v)| k.strip_prefix("out.").map(|n| (n.to_string(), v))).collect()
    }

    /// The tolerance of output `name` (exact when absent).
    pub fn tolerance(&self, name: &str) -> crate::Tolerance {
        let t = &self.tolerance[name];
        crate::Tolerance { atol: t["atol"].as_f64().unwrap_or(0.0), rtol: t["rtol"].as_f64().unwrap_or(0.0) }
    }

    /// A non-tensor argument.
    pub fn arg(&self, name: &str) -> Option<&serde_json::Value> {
        self.args.get(name)
    }

    /// The view of input `name`, broadcast to its `expand` shape when listed.
    pub fn input_view(&self, name: &str) -> Option<TensorRef<'_>> {
        let t = self.input(name)?;
        let v = t.view();
        Some(match self.expand.get(name) {
            Some(shape) => v.expand(shape).expect("expand shape is a broadcast of the stored tensor"),
            None => v,
        })
    }
}

fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// Reads one vector file.
pub fn load_file(path: &Path) -> Result<Case, CaseError> {
    let bytes = std::fs::read(path).map_err(|source| CaseError::Io { path: path.into(), source })?;
    let fmt = |reason: String| CaseError::Format { path: path.into(), reason };
    let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| fmt(e.to_string()))?;
    let md = meta.metadata().clone().unwrap_or_default();
    let json = |k: &str| -> Result<serde_json::Value, CaseError> {
        match md.get(k) {
            Some(s) => serde_json::from_str(s).map_err(|e| fmt(format!("metadata `{k}`: {e}"))),
            None => Ok(serde_json::Value::Null),
        }
    };
    let op = md.get("op").cloned().ok_or_else(|| fmt("metadata has no `op`".into()))?;
    let expand: BTreeMap<String, Vec<usize>> = match json("expand")? {
        serde_json::Value::Null => BTreeMap::new(),
        v => serde_json::from_value(v).map_err(|e| fmt(format!("metadata `expand`: {e}")))?,
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| fmt(e.to_string()))?;
    let mut tensors = BTreeMap::new();
    for (name, view) in st.tensors() {
        let dtype =
            dtype_of(view.dtype()).ok_or_else(|| fmt(format!("tensor `{name}` has dtype {:?}", view.dtype())))?;
        tensors.insert(name, HostTensor::from_bytes(dtype, view.shape().to_vec(), view.data()));
    }
    Ok(Case {
        name: path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        path: path.into(),
        op,
        args: json("args")?,
        expand,
        tolerance: json("tolerance")?,
        notes: md.get("notes").cloned().unwrap_or_default(),
        tensors,
    })
}

/// Reads every `*.safetensors` file under `dir` (recursively), sorted by path.
pub fn load_dir(dir: &Path) -> Result<Vec<Case>, CaseError> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|source| CaseError::Io { path: d.clone(), source })?;
        for e in rd {
            let p = e.map_err(|source| CaseError::Io { path: d.clone(), source })?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "safetensors") {
                files.push(p);
            }
        }
    }
    files.sort();
    files.iter().map(|p| load_file(p)).collect()
}
