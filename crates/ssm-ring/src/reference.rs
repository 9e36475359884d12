//! Scalar reference of the ReplaySSM ops: the tracker kernels integer-exact, and
//! `checkpointing_ssu` as the plain sequential recurrence (checkpoint → history replay →
//! new tokens) in f32 ([`checkpointing_ssu`]) or f64 ([`checkpointing_ssu_f64`]).
//! Slow and allocation-happy on purpose: it is the oracle, not a kernel.

use crate::Planned;
use crate::{CheckpointingSsuArgs, CheckpointingSsuPlan, CommitRingTrackersArgs, TrackerMode, UpdateRingTrackersArgs};

/// Runs `update_replayssm_ring_trackers` (or reset) on host tensors, rows in order.
pub fn update_replayssm_ring_trackers(call: Planned<UpdateRingTrackersArgs<'_>>) {
    let (mut args, plan) = call.into_parts();
    let plan = &plan;
    for row in 0..plan.rows {
        let Some(s) = plan.slot_of(&args.state_batch_indices, row) else { continue };
        let [rs, pa, pq] = plan.trackers;
        let tr = &mut args.trackers;
        match plan.mode {
            TrackerMode::Reset => {
                tr.ring_start.set_i64(rs.at([s]), 0);
                tr.prev_num_accepted.set_i64(pa.at([s]), 0);
                tr.prev_query_len.set_i64(pq.at([s]), 0);
            }
            TrackerMode::Advance { logical_window, ring_buffer_len } => {
                let prev = tr.prev_num_accepted.as_ref().elem_i64(pa.at([s]));
                let start = tr.ring_start.as_ref().elem_i64(rs.at([s]));
                let (next_start, next_prev) = crate::step::advance(start, prev, logical_window, ring_buffer_len);
                tr.ring_start.set_i64(rs.at([s]), next_start);
                tr.prev_num_accepted.set_i64(pa.at([s]), next_prev);
            }
            TrackerMode::Commit { .. } => unreachable!("update plans never commit"),
        }
    }
}

/// Runs `reset_replayssm_ring_trackers`: the same call as [`update_replayssm_ring_trackers`]
/// with a reset plan.
pub fn reset_replayssm_ring_trackers(call: Planned<UpdateRingTrackersArgs<'_>>) {
    update_replayssm_ring_trackers(call)
}

/// Runs `commit_replayssm_ring_trackers` on host tensors, rows in order.
pub fn commit_replayssm_ring_trackers(call: Planned<CommitRingTrackersArgs<'_>>) {
    let (mut args, plan) = call.into_parts();
    let plan = &plan;
    let TrackerMode::Commit { logical_window, ring_buffer_len } = plan.mode else {
        unreachable!("commit needs a commit plan")
    };
    let acc = plan.num_accepted_tokens.expect("commit plan");
    let qsl = plan.query_start_loc.expect("commit plan");
    for row in 0..plan.rows {
        let Some(s) = plan.slot_of(&args.state_batch_indices, row) else { continue };
        let [rs, pa, pq] = plan.trackers;
        let tr = &mut args.trackers;
        let prev = tr.prev_num_accepted.as_ref().elem_i64(pa.at([s]));
        let start = tr.ring_start.as_ref().elem_i64(rs.at([s]));
        let prev_q = tr.prev_query_len.as_ref().elem_i64(pq.at([s]));
        let accepted = args.num_accepted_tokens.elem_i64(acc.at([row]));
        let cur_q =
            args.query_start_loc.elem_i64(qsl.at([row + 1])).wrapping_sub(args.query_start_loc.elem_i64(qsl.at([row])));
        let (next_start, next_prev, cur_q) =
            crate::step::commit(start, prev, prev_q, accepted, cur_q, logical_window, ring_buffer_len);
        tr.ring_start.set_i64(rs.at([s]), next_start);
        tr.prev_num_accepted.set_i64(pa.at([s]), next_prev);
        tr.prev_query_len.set_i64(pq.at([s]), cur_q);
    }
}

pub use ssm_tensor::Precision;

/// `v <= 20 ? ln(1 + e^v) : v` (SEMANTICS.md rule 4).
pub fn softplus<F: Precision>(v: F) -> F {
    if v <= F::of(20.0) { v.exp().ln_1p() } else { v }
}

/// `checkpointing_ssu` in f32.
pub fn checkpointing_ssu(call: Planned<CheckpointingSsuArgs<'_>>) {
    let (args, plan) = call.into_parts();
    let plan = &plan;
    run::<f32>(plan, args)
}

/// `checkpointing_ssu` with f64 arithmetic (stores round to each tensor's dtype; `dt_cache`
/// stores f32).
pub fn checkpointing_ssu_f64(call: Planned<CheckpointingSsuArgs<'_>>) {
    let (args, plan) = call.into_parts();
    let plan = &plan;
    run::<f64>(plan, args)
}

fn run<F: Precision>(p: &CheckpointingSsuPlan, mut args: CheckpointingSsuArgs<'_>) {
    let (hd, nd) = (p.dim, p.dstate);
    let ratio = p.heads_per_group();
    for row in 0..p.batch {
        let Some(slot) = p.slot(&args, row) else { continue };
        let (seq, tok0, n) = p.span(&args, row);
        if n == 0 {
            continue;
        }
        let k = args.prev_num_accepted_tokens.elem_i64(p.prev_num_accepted_tokens.at([slot])) as usize;
        let start = args.ring_start.elem_i64(p.ring_start.at([slot])) as usize;
        let flush = k + n > p.window;
        let mut new_dt = vec![vec![0f32; n]; p.heads];
        for h in 0..p.heads {
            let g = h / ratio;
            let a = F::of(args.a.elem_f32(p.a.at([h, 0])));
            let mut s: Vec<F> = (0..hd * nd)
                .map(|e| F::of(args.state.as_ref().elem_f32(p.state.at([slot, h, e / nd, e % nd]))))
                .collect();
            for j in 0..k {
                let r = (start + j) % p.ring_len;
                let dtj = F::of(args.dt_cache.as_ref().elem_f32(p.dt_cache.at([slot, h, r, 0])));
                let decay = (a * dtj).exp();
                for pp in 0..hd {
                    let xv = F::of(args.x_cache.as_ref().elem_f32(p.x_cache.at([slot, h, r, pp])));
                    for nn in 0..nd {
                        let bv = F::of(args.b_cache.as_ref().elem_f32(p.b_cache.at([slot, g, r, nn])));
                        s[pp * nd + nn] = s[pp * nd + nn] * decay + dtj * xv * bv;
                    }
                }
            }
            if flush {
                for e in 0..hd * nd {
                    args.state.set_f32(p.state.at([slot, h, e / nd, e % nd]), s[e].f32());
                }
            }
            for t in 0..n {
                let tok = tok0 + t;
                let mut dt = F::of(args.dt.elem_f32(p.dt.at([seq, tok, h, 0])));
                if let (Some(b), Some(bp)) = (&args.dt_bias, p.dt_bias) {
                    dt = dt + F::of(b.elem_f32(bp.at([h, 0])));
                }
                if p.dt_softplus {
                    dt = softplus(dt);
                }
                new_dt[h][t] = dt.f32();
                let decay = (a * dt).exp();
                for pp in 0..hd {
                    let xv = F::of(args.x.elem_f32(p.x.at([seq, tok, h, pp])));
                    let mut y = F::ZERO;
                    for nn in 0..nd {
                        let bv = F::of(args.b.elem_f32(p.b.at([seq, tok, g, nn])));
                        let cv = F::of(args.c.elem_f32(p.c.at([seq, tok, g, nn])));
                        let v = s[pp * nd + nn] * decay + dt * xv * bv;
                        s[pp * nd + nn] = v;
                        y = y + v * cv;
                    }
                    if let (Some(d), Some(dp)) = (&args.d, p.d) {
                        y = y + F::of(d.elem_f32(dp.at([h, pp]))) * xv;
                    }
                    if let (Some(z), Some(zp)) = (&args.z, p.z) {
                        let zv = F::of(z.elem_f32(zp.at([seq, tok, h, pp])));
                        y = y * zv * sigmoid(zv);
                    }
                    args.out.set_f32(p.out.at([seq, tok, h, pp]), y.f32());
                }
            }
        }
        // Append the new tokens after the live history, on both branches.
        for t in 0..n {
            let tok = tok0 + t;
            let r = (start + k + t) % p.ring_len;
            for h in 0..p.heads {
                for pp in 0..hd {
                    let xv = args.x.elem_f32(p.x.at([seq, tok, h, pp]));
                    args.x_cache.set_f32(p.x_cache.at([slot, h, r, pp]), xv);
                }
                args.dt_cache.set_f32(p.dt_cache.at([slot, h, r, 0]), new_dt[h][t]);
            }
            for g in 0..p.groups {
                for nn in 0..nd {
                    let bv = args.b.elem_f32(p.b.at([seq, tok, g, nn]));
                    args.b_cache.set_f32(p.b_cache.at([slot, g, r, nn]), bv);
                }
            }
        }
    }
}

fn sigmoid<F: Precision>(v: F) -> F {
    let one = F::of(1.0);
    one / (one + (F::ZERO - v).exp())
}
