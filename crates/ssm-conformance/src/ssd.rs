//! `mamba_chunk_scan_combined_varlen` cases onto [`ssm_ssd`]'s arguments. The vectors store
//! vLLM's tensors as passed (`x` `[T, H, P]`, metadata i32); `in.out` is the caller's zeroed
//! buffer; the returned states are `out.varlen_states`. The [`crate::Variant::SsdScratch`] run
//! passes a caller-given scratch (NaN-poisoned, at an odd element offset).

use ssm_ssd::MambaChunkScanCombinedVarlenArgs;
use ssm_tensor::{DType, TensorMut};

use crate::{Case, HostTensor, Produced, Target};

fn limit(v: Option<&serde_json::Value>) -> Result<f32, (bool, String)> {
    match v {
        Some(serde_json::Value::String(s)) if s == "inf" => Ok(f32::INFINITY),
        Some(serde_json::Value::String(s)) if s == "-inf" => Ok(f32::NEG_INFINITY),
        Some(v) => v.as_f64().map(|f| f as f32).ok_or_else(|| (false, format!("dt_limit entry {v}"))),
        None => Err((false, "dt_limit has fewer than two entries".into())),
    }
}

/// Runs a `mamba_chunk_scan_combined_varlen` case.
pub(crate) fn run(target: &dyn Target, case: &Case, with_scratch: bool) -> Produced {
    let missing = |n: &str| (false, format!("input `{n}` missing"));
    let view = |n: &str| case.input_view(n);
    let req = |n: &'static str| view(n).ok_or_else(|| missing(n));
    let x = case.input("x").ok_or_else(|| missing("x"))?;
    let c = case.input("C").ok_or_else(|| missing("C"))?;
    let mut out = match case.input("out") {
        Some(o) => o.clone(),
        None => HostTensor::filled(x.dtype, x.shape.clone(), 0.0),
    };
    let state_dtype = match case.arg("state_dtype").and_then(|v| v.as_str()) {
        None => None,
        Some("float32") => Some(DType::F32),
        Some("bfloat16") => Some(DType::BF16),
        Some("float16") => Some(DType::F16),
        Some(s) => return Err((false, format!("unknown state_dtype `{s}`"))),
    };
    let intermediate = case.arg("return_intermediate_states").and_then(|v| v.as_bool()).unwrap_or(false);
    let seq_idx = case.input("seq_idx").ok_or_else(|| missing("seq_idx"))?;
    let cu_seqlens = case.input("cu_seqlens").ok_or_else(|| missing("cu_seqlens"))?;
    let rows = if intermediate { seq_idx.shape[0] } else { cu_seqlens.shape[0].saturating_sub(1) };
    let (&[_, heads, dim], &[_, _, dstate]) = (x.shape.as_slice(), c.shape.as_slice()) else {
        return Err((false, format!("x {:?} / C {:?} are not 3-D", x.shape, c.shape)));
    };
    let mut states = HostTensor::filled(state_dtype.unwrap_or(c.dtype), vec![rows, heads, dim, dstate], f32::NAN);
    let lim = case.arg("dt_limit").and_then(|v| v.as_array().cloned()).unwrap_or_default();
    let dt_limit = if lim.is_empty() { (0.0, f32::INFINITY) } else { (limit(lim.first())?, limit(lim.get(1))?) };
    let mut ws_buf: Vec<f32>;
    let mut args = MambaChunkScanCombinedVarlenArgs {
        x: req("x")?,
        dt: req("dt")?,
        a: req("A")?,
        b: req("B")?,
        c: req("C")?,
        chunk_size: case.arg("chunk_size").and_then(|v| v.as_u64()).ok_or_else(|| missing("chunk_size"))? as usize,
        cu_seqlens: req("cu_seqlens")?,
        cu_chunk_seqlens: req("cu_chunk_seqlens")?,
        last_chunk_indices: req("last_chunk_indices")?,
        seq_idx: req("seq_idx")?,
        out: Some(out.view_mut()),
        d: view("D"),
        z: view("z"),
        dt_bias: view("dt_bias"),
        initial_states: view("initial_states"),
        ssm_state: None,
        initial_state_indices: None,
        has_initial_state: None,
        final_state_indices: None,
        checkpoint_chunk_indices: None,
        checkpoint_state_indices: None,
        pad_slot_id: None,
        dt_softplus: case.arg("dt_softplus").and_then(|v| v.as_bool()).unwrap_or(false),
        dt_limit,
        return_intermediate_states: intermediate,
        state_dtype,
        varlen_states: Some(states.view_mut()),
        scratch: None,
    };
    if with_scratch {
        // The plan is the one place that knows the scratch size.
        let need = ssm_tensor::Op::plan(&args).map_err(|e| (false, e.to_string()))?.scratch_len();
        ws_buf = vec![f32::NAN; need + 3];
        args.scratch = Some(TensorMut::from_slice(&mut ws_buf[3..], &[need]).map_err(|e| (false, e.to_string()))?);
    }
    target.mamba_chunk_scan_combined_varlen(args).map_err(crate::TargetError::into_produced)?;
    Ok(vec![("out".into(), out), ("varlen_states".into(), states)])
}
