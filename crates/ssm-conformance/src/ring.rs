//! `update_replayssm_ring_trackers` and `commit_replayssm_ring_trackers` cases onto
//! [`ssm_ring`]'s arguments. Integer outputs must match exactly (tolerance 0).

use ssm_ring::{CommitRingTrackersArgs, RingTrackers, UpdateRingTrackersArgs};

use crate::{Case, Produced, Target};

fn missing(n: &str) -> (bool, String) {
    (false, format!("input `{n}` missing"))
}

/// Runs an `update_replayssm_ring_trackers` case (a reset when `logical_window` is null).
pub(crate) fn run_update(target: &dyn Target, case: &Case) -> Produced {
    let get = |n: &str| case.input(n).cloned().ok_or_else(|| missing(n));
    let (mut rs, mut pa, mut pq) = (get("ring_start")?, get("prev_num_accepted")?, get("prev_query_len")?);
    let args = UpdateRingTrackersArgs {
        trackers: RingTrackers {
            ring_start: rs.view_mut(),
            prev_num_accepted: pa.view_mut(),
            prev_query_len: pq.view_mut(),
        },
        state_batch_indices: case.input_view("state_batch_indices").ok_or_else(|| missing("state_batch_indices"))?,
        logical_window: case.arg("logical_window").and_then(|v| v.as_i64()),
        ring_buffer_len: case.arg("ring_buffer_len").and_then(|v| v.as_i64()),
        pad_slot_id: case.arg("pad_slot_id").and_then(|v| v.as_i64()),
    };
    target.update_replayssm_ring_trackers(args).map_err(crate::TargetError::into_produced)?;
    Ok(vec![("ring_start".into(), rs), ("prev_num_accepted".into(), pa), ("prev_query_len".into(), pq)])
}

/// Runs a `commit_replayssm_ring_trackers` case.
pub(crate) fn run_commit(target: &dyn Target, case: &Case) -> Produced {
    let get = |n: &str| case.input(n).cloned().ok_or_else(|| missing(n));
    let view = |n: &'static str| case.input_view(n).ok_or_else(|| missing(n));
    let int = |n: &'static str| case.arg(n).and_then(|v| v.as_i64()).ok_or_else(|| missing(n));
    let (mut rs, mut pa, mut pq) = (get("ring_start")?, get("prev_num_accepted")?, get("prev_query_len")?);
    let args = CommitRingTrackersArgs {
        trackers: RingTrackers {
            ring_start: rs.view_mut(),
            prev_num_accepted: pa.view_mut(),
            prev_query_len: pq.view_mut(),
        },
        state_batch_indices: view("state_batch_indices")?,
        num_accepted_tokens: view("num_accepted_tokens")?,
        query_start_loc: view("query_start_loc")?,
        logical_window: int("logical_window")?,
        ring_buffer_len: int("ring_buffer_len")?,
        pad_slot_id: case.arg("pad_slot_id").and_then(|v| v.as_i64()),
    };
    target.commit_replayssm_ring_trackers(args).map_err(crate::TargetError::into_produced)?;
    Ok(vec![("ring_start".into(), rs), ("prev_num_accepted".into(), pa), ("prev_query_len".into(), pq)])
}
