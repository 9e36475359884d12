//! `causal_conv1d_update` and `causal_conv1d_fn` cases onto [`ssm_conv`]'s arguments.
//!
//! The vectors store vLLM's logical shapes, contiguous: update x `[batch, dim]`,
//! `[batch, dim, seqlen]` or `[num_tokens, dim]`; fn x `[dim, num_tokens]` (vLLM passes the
//! channel-last view); conv states `[slots, dim, state_len]`. Our ops are token-major, so x
//! and out are handed over as permuted-stride views of the same memory, and the states as
//! [`ConvStateLayout::DimStateLen`] (or, in the [`crate::Variant::ConvStateLenDim`] run,
//! transposed as [`ConvStateLayout::StateLenDim`]). vLLM's update writes its output into `x`: the output
//! buffer starts as a copy of `x` (rows vLLM skips keep the input) and is reported as both
//! `out` and `x`.

use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};

use crate::{Case, HostTensor, Produced, Target};

/// The state buffer handed over: the stored `[slots, dim, state_len]` copy, or its transpose.
fn state_in(stored: &HostTensor, state_len_dim: bool) -> (HostTensor, ConvStateLayout) {
    if state_len_dim {
        (stored.transpose_last2(), ConvStateLayout::StateLenDim)
    } else {
        (stored.clone(), ConvStateLayout::DimStateLen)
    }
}

/// The state back in the stored layout; the state update is a copy, so it must also be
/// bit-identical to the peer's (where the peer's is specified).
fn state_out(case: &Case, name: &str, state: HostTensor, state_len_dim: bool) -> Result<HostTensor, (bool, String)> {
    let state = if state_len_dim { state.transpose_last2() } else { state };
    if let Some(want) = case.tensors.get(&format!("out.{name}")) {
        let es = want.dtype.size();
        let w = want.to_f64_vec();
        let (gb, wb) = (state.bytes(), want.bytes());
        if gb.len() != wb.len() {
            return Err((false, format!("`{name}`: produced {} bytes, expected {}", gb.len(), wb.len())));
        }
        if let Some(i) = (0..w.len()).find(|&i| !w[i].is_nan() && gb[i * es..(i + 1) * es] != wb[i * es..(i + 1) * es])
        {
            return Err((false, format!("`{name}` is not bit-identical to the peer's (first at element {i})")));
        }
    }
    Ok(state)
}

fn activation(case: &Case) -> Result<Activation, (bool, String)> {
    match case.arg("activation") {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => Ok(Activation::None),
        Some(serde_json::Value::Bool(true)) => Ok(Activation::Silu),
        Some(serde_json::Value::String(s)) if s == "silu" || s == "swish" => Ok(Activation::Silu),
        Some(other) => Err((false, format!("unknown activation {other}"))),
    }
}

/// vLLM names the pad of the conv slot tables `null_block_id` today, `pad_slot_id` before.
fn pad(case: &Case) -> Option<i64> {
    case.arg("null_block_id").and_then(|v| v.as_i64()).or_else(|| case.arg("pad_slot_id").and_then(|v| v.as_i64()))
}

fn missing(n: &str) -> (bool, String) {
    (false, format!("input `{n}` missing"))
}

/// Runs a `causal_conv1d_update` case.
pub(crate) fn run_update(target: &dyn Target, case: &Case, state_len_dim: bool) -> Produced {
    let x = case.input("x").ok_or_else(|| missing("x"))?;
    let (mut state, layout) = state_in(case.input("conv_state").ok_or_else(|| missing("conv_state"))?, state_len_dim);
    // A caller-given `out` leaves x alone; otherwise the output overwrites x.
    let given_out = case.input("out").cloned();
    let mut out = given_out.clone().unwrap_or_else(|| x.clone());
    let (shape, strides): (Vec<usize>, Vec<isize>) = match x.shape.as_slice() {
        &[b, d, s] => (vec![b, s, d], vec![(d * s) as isize, 1, s as isize]),
        &[n, d] => (vec![n, d], vec![d as isize, 1]),
        other => return Err((false, format!("x has shape {other:?}"))),
    };
    let bad = |e: ssm_tensor::TensorError| (false, e.to_string());
    let view = |n: &str| case.input_view(n);
    let args = CausalConv1dUpdateArgs {
        x: x.view().with_layout(&shape, &strides, 0).map_err(bad)?,
        conv_state: state.view_mut(),
        conv_state_layout: layout,
        weight: view("weight").ok_or_else(|| missing("weight"))?,
        bias: view("bias"),
        activation: activation(case)?,
        conv_state_indices: view("conv_state_indices"),
        num_accepted_tokens: view("num_accepted_tokens"),
        query_start_loc: view("query_start_loc"),
        pad_slot_id: pad(case),
        block_idx_last_scheduled_token: view("block_idx_last_scheduled_token"),
        initial_state_idx: view("initial_state_idx"),
        out: out.view_mut().with_layout(&shape, &strides, 0).map_err(bad)?,
    };
    target.causal_conv1d_update(args).map_err(crate::TargetError::into_produced)?;
    let x_after = if given_out.is_some() { x.clone() } else { out.clone() };
    let state = state_out(case, "conv_state", state, state_len_dim)?;
    Ok(vec![("out".into(), out), ("x".into(), x_after), ("conv_state".into(), state)])
}

/// Runs a `causal_conv1d_fn` case.
pub(crate) fn run_fn(target: &dyn Target, case: &Case, state_len_dim: bool) -> Produced {
    let x = case.input("x").ok_or_else(|| missing("x"))?;
    let (mut states, layout) =
        state_in(case.input("conv_states").ok_or_else(|| missing("conv_states"))?, state_len_dim);
    let &[dim, tokens] = x.shape.as_slice() else {
        return Err((false, format!("x has shape {:?}, expected [dim, num_tokens]", x.shape)));
    };
    let mut out = match case.input("out") {
        Some(o) => o.clone(),
        None => HostTensor::filled(x.dtype, x.shape.clone(), 0.0),
    };
    let bad = |e: ssm_tensor::TensorError| (false, e.to_string());
    let view = |n: &str| case.input_view(n);
    // vLLM's x is the channel-last [dim, num_tokens] view of token-major memory: ours is [num_tokens, dim].
    let (shape, strides) = ([tokens, dim], [1isize, tokens as isize]);
    let args = CausalConv1dFnArgs {
        x: x.view().with_layout(&shape, &strides, 0).map_err(bad)?,
        weight: view("weight").ok_or_else(|| missing("weight"))?,
        bias: view("bias"),
        conv_states: states.view_mut(),
        conv_state_layout: layout,
        query_start_loc: view("query_start_loc").ok_or_else(|| missing("query_start_loc"))?,
        cache_indices: view("cache_indices"),
        has_initial_state: view("has_initial_state"),
        activation: activation(case)?,
        pad_slot_id: pad(case),
        checkpoint_offsets: None,
        checkpoint_state_indices: None,
        out: out.view_mut().with_layout(&shape, &strides, 0).map_err(bad)?,
    };
    if case.arg("block_size_to_align").and_then(|v| v.as_i64()).is_some_and(|b| b > 0)
        || case.input("block_idx_last_scheduled_token").is_some()
    {
        return Err((true, "causal_conv1d_fn prefix-caching mode is not supported".into()));
    }
    target.causal_conv1d_fn(args).map_err(crate::TargetError::into_produced)?;
    let states = state_out(case, "conv_states", states, state_len_dim)?;
    Ok(vec![("out".into(), out), ("conv_states".into(), states)])
}
