use ssm_ssu::SelectiveStateUpdateArgs;

use crate::{Case, HostTensor, Produced, Target};

/// Maps a `selective_state_update` case onto the op's arguments and runs it.
pub(crate) fn run(target: &dyn Target, case: &Case) -> Produced {
    let missing = |n: &str| (false, format!("input `{n}` missing"));
    let mut state = case.input("state").ok_or_else(|| missing("state"))?.clone();
    let x = case.input("x").ok_or_else(|| missing("x"))?;
    let mut out = match case.input("out") {
        Some(o) => o.clone(),
        None => HostTensor::filled(x.dtype, x.shape.clone(), 0.0),
    };
    let view = |n: &str| case.input_view(n);
    let req = |n: &'static str| view(n).ok_or_else(|| missing(n));
    // vLLM names the pad `null_block_id` today and `pad_slot_id` in older revisions.
    let pad = case.arg("null_block_id").or_else(|| case.arg("pad_slot_id")).and_then(|v| v.as_i64());
    if case.arg("enable_stochastic_rounding").and_then(|v| v.as_bool()) == Some(true) {
        return Err((true, "stochastic rounding draws its seed inside the peer; no vector can pin it".into()));
    }
    let args = SelectiveStateUpdateArgs {
        d: view("D"),
        dt_bias: view("dt_bias"),
        z: view("z"),
        dt_softplus: case.arg("dt_softplus").and_then(|v| v.as_bool()).unwrap_or(false),
        state_batch_indices: view("state_batch_indices"),
        dst_state_batch_indices: view("dst_state_batch_indices"),
        pad_slot_id: pad,
        num_accepted_tokens: view("num_accepted_tokens"),
        cu_seqlens: view("cu_seqlens"),
        ..SelectiveStateUpdateArgs::new(
            state.view_mut(),
            req("x")?,
            req("dt")?,
            req("A")?,
            req("B")?,
            req("C")?,
            out.view_mut(),
        )
    };
    target.selective_state_update(args).map_err(crate::TargetError::into_produced)?;
    Ok(vec![("out".into(), out), ("state".into(), state)])
}
