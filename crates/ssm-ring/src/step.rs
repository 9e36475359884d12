//! The tracker arithmetic of one request row, written once for the reference and every
//! backend. Integers wrap on overflow (two's complement, as the device kernels' `int64`
//! arithmetic does), so garbage counters near `i64::MAX` give defined, identical results on
//! every backend rather than a panic or undefined behaviour.

/// `update_replayssm_ring_trackers`' step of one slot: `(ring_start, prev_num_accepted)` after
/// one more token, flushing the window when it would exceed `logical_window`.
#[inline]
pub fn advance(start: i64, prev: i64, logical_window: i64, ring_buffer_len: i64) -> (i64, i64) {
    let next = prev.wrapping_add(1);
    if next > logical_window { (start.wrapping_add(prev).rem_euclid(ring_buffer_len), 1) } else { (start, next) }
}

/// `commit_replayssm_ring_trackers`' step of one slot: `(ring_start, prev_num_accepted,
/// prev_query_len)` after a verified step that accepted `accepted` of its `cur_q` tokens.
#[inline]
pub fn commit(
    start: i64,
    prev: i64,
    prev_q: i64,
    accepted: i64,
    cur_q: i64,
    logical_window: i64,
    ring_buffer_len: i64,
) -> (i64, i64, i64) {
    let must = prev_q > 0 && prev.wrapping_add(prev_q) > logical_window;
    let next_start = if must { start.wrapping_add(prev).rem_euclid(ring_buffer_len) } else { start };
    let next_prev = match (prev_q, must) {
        (0, _) => 0,
        (_, true) => accepted,
        (_, false) => prev.wrapping_add(accepted),
    };
    (next_start, next_prev, cur_q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_at_the_edges_wrap_without_panicking() {
        assert_eq!(advance(0, 2, 4, 8), (0, 3));
        assert_eq!(advance(3, 4, 4, 8), (7, 1));
        // MAX + 1 wraps to MIN, below the window: no flush.
        assert_eq!(advance(i64::MAX, i64::MAX, 4, 8), (i64::MAX, i64::MIN));
        // A flush whose start + prev wraps stays in the ring.
        assert_eq!(advance(i64::MAX, 4, 4, 8), ((i64::MAX.wrapping_add(4)).rem_euclid(8), 1));
        assert_eq!(advance(5, i64::MAX, i64::MAX, 8), (5, i64::MIN), "MAX + 1 wraps below the window");
        let _ = commit(i64::MIN, i64::MAX, i64::MAX, i64::MAX, i64::MIN, 4, 1);
    }
}
