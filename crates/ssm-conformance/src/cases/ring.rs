//! ReplaySSM test pools shared by the CPU backend's ring tests and the facade's.

use ssm_ring::RingTrackers;
use ssm_tensor::TensorMut;

/// The three per-slot ReplaySSM cursors of a pool of `cache` slots (i32), as tests own them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trackers {
    /// `ring_start` `[cache]`.
    pub ring_start: Vec<i32>,
    /// `prev_num_accepted` `[cache]`.
    pub prev_num_accepted: Vec<i32>,
    /// `prev_query_len` `[cache]`.
    pub prev_query_len: Vec<i32>,
}

impl Trackers {
    /// Zeroed cursors for `cache` slots (every slot empty, nothing pending).
    pub fn zeros(cache: usize) -> Self {
        Trackers { ring_start: vec![0; cache], prev_num_accepted: vec![0; cache], prev_query_len: vec![0; cache] }
    }

    /// The cursors as one call's writable [`RingTrackers`] (`[cache]` each).
    pub fn views(&mut self) -> RingTrackers<'_> {
        fn view(v: &mut [i32]) -> TensorMut<'_> {
            let cache = v.len();
            TensorMut::from_slice(v, &[cache]).expect("a [cache] i32 view")
        }
        RingTrackers {
            ring_start: view(&mut self.ring_start),
            prev_num_accepted: view(&mut self.prev_num_accepted),
            prev_query_len: view(&mut self.prev_query_len),
        }
    }
}
