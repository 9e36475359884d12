//! Every `update_replayssm_ring_trackers` and `commit_replayssm_ring_trackers` conformance
//! vector through the reference: integers exact.

// One vector reader for the SSD and ring tests (kept in ssm-ssd/tests/common).
#[path = "../../ssm-ssd/tests/common/mod.rs"]
mod common;

use common::{Case, load};
use ssm_ring::{CommitRingTrackers, RingTrackers, UpdateRingTrackers, reference};

fn opt_i64(v: &serde_json::Value) -> Option<i64> {
    v.as_i64()
}

fn check_exact(case: &Case, name: &str, got: &common::Tensor) {
    assert_eq!(got.to_f64(), case.expected(name).to_f64(), "{}: {name}", case.name);
}

#[test]
fn reference_passes_every_update_vector() {
    let cases = load("update_replayssm_ring_trackers");
    assert!(cases.len() >= 4, "found {} cases", cases.len());
    for case in &cases {
        let (mut rs, mut pa, mut pq) =
            (case.input_copy("ring_start"), case.input_copy("prev_num_accepted"), case.input_copy("prev_query_len"));
        let args = UpdateRingTrackers {
            trackers: RingTrackers {
                ring_start: rs.view_mut(),
                prev_num_accepted: pa.view_mut(),
                prev_query_len: pq.view_mut(),
            },
            state_batch_indices: case.input("state_batch_indices").unwrap().view(),
            logical_window: opt_i64(&case.args["logical_window"]),
            ring_buffer_len: opt_i64(&case.args["ring_buffer_len"]),
            pad_slot_id: opt_i64(&case.args["pad_slot_id"]),
        };
        let p = ssm_tensor::Planned::new(args).unwrap();
        reference::update_replayssm_ring_trackers(p);
        check_exact(case, "ring_start", &rs);
        check_exact(case, "prev_num_accepted", &pa);
        check_exact(case, "prev_query_len", &pq);
        println!("{}: exact", case.name);
    }
}

#[test]
fn reference_passes_every_commit_vector() {
    let cases = load("commit_replayssm_ring_trackers");
    assert!(cases.len() >= 2, "found {} cases", cases.len());
    for case in &cases {
        let (mut rs, mut pa, mut pq) =
            (case.input_copy("ring_start"), case.input_copy("prev_num_accepted"), case.input_copy("prev_query_len"));
        let args = CommitRingTrackers {
            trackers: RingTrackers {
                ring_start: rs.view_mut(),
                prev_num_accepted: pa.view_mut(),
                prev_query_len: pq.view_mut(),
            },
            state_batch_indices: case.input("state_batch_indices").unwrap().view(),
            num_accepted_tokens: case.input("num_accepted_tokens").unwrap().view(),
            query_start_loc: case.input("query_start_loc").unwrap().view(),
            logical_window: case.args["logical_window"].as_i64().unwrap(),
            ring_buffer_len: case.args["ring_buffer_len"].as_i64().unwrap(),
            pad_slot_id: opt_i64(&case.args["pad_slot_id"]),
        };
        let p = ssm_tensor::Planned::new(args).unwrap();
        reference::commit_replayssm_ring_trackers(p);
        check_exact(case, "ring_start", &rs);
        check_exact(case, "prev_num_accepted", &pa);
        check_exact(case, "prev_query_len", &pq);
        println!("{}: exact", case.name);
    }
}
