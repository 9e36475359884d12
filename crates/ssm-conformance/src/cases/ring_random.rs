//! Random ReplaySSM calls as owned host tensors: `checkpointing_ssu` over random rings (cursors
//! anywhere legal, so both the flush and the no-write branch), forms (one-token, dense, varlen
//! with empty sequences), pads, groups, odd sizes and pool dtypes; and tracker calls with
//! duplicate, pad and out-of-range slots over more rows than one kernel chunk. The one generator
//! of every backend's ReplaySSM property tests (the GPU tests run it against the reference).

use ssm_ring::{CheckpointingSsuArgs, CommitRingTrackersArgs, RingTrackers, UpdateRingTrackersArgs};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{DType, HostTensor, Run};

use crate::gdn_random::SplitMix;

/// How the new tokens of a call are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `x` `[batch, H, P]`.
    OneToken,
    /// `x` `[batch, T, H, P]`.
    Dense,
    /// `x` `[total, H, P]` with `cu_seqlens` (empty sequences allowed).
    Varlen,
    /// `x` `[1, total, H, P]` with `cu_seqlens`.
    Varlen4,
}

/// The shape of one random `checkpointing_ssu` call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CkptSpec {
    /// Sequences.
    pub seqs: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Groups `G` (divides `H`).
    pub groups: usize,
    /// Head dim `P`.
    pub dim: usize,
    /// State size `N`.
    pub dstate: usize,
    /// Tokens per window `T`.
    pub tokens: usize,
    /// Logical window `W >= T`; the ring has `L = W + T` rows.
    pub window: usize,
    /// Token layout.
    pub form: Form,
    /// Checkpoint dtype.
    pub state: DType,
    /// `x_cache` / `B_cache` dtype.
    pub cache: DType,
    /// x / B / C / z / out dtype.
    pub io: DType,
    /// Dtype of the slot table, `cu_seqlens` and the cursors.
    pub index: DType,
    /// A slot table (else row `b` uses slot `b`).
    pub table: bool,
    /// Pad value 0 with some pad rows (needs `table`).
    pub pads: bool,
    /// `z`, `D` (per head or per head-dim), `dt_bias`, softplus.
    pub z: bool,
    /// `D`: 0 none, 1 `[H]`, 2 `[H, P]`.
    pub d: u8,
    /// `dt_bias`.
    pub dt_bias: bool,
    /// Softplus on dt.
    pub softplus: bool,
}

impl CkptSpec {
    /// A Mamba2-2.7B-like decode (dim 64, dstate 128, one group) of `seqs` sequences with
    /// `heads` heads, `T` tokens and window 16.
    pub fn mamba2(seqs: usize, heads: usize, tokens: usize, state: DType) -> Self {
        CkptSpec {
            seqs,
            heads,
            groups: 1,
            dim: 64,
            dstate: 128,
            tokens,
            window: 16,
            form: if tokens == 1 { Form::OneToken } else { Form::Dense },
            state,
            cache: DType::BF16,
            io: DType::BF16,
            index: DType::I32,
            table: true,
            pads: true,
            z: true,
            d: 1,
            dt_bias: true,
            softplus: true,
        }
    }

    /// The `i`-th point of the property matrix: odd dims and dstates (past one warp's lanes),
    /// groups, every form, f32/bf16/f16 pools and io, i32/i64 indices, optional tensors on
    /// and off.
    pub fn matrix(i: usize) -> Self {
        let dims = [(64, 128), (3, 5), (12, 40), (8, 16), (33, 64), (5, 96), (16, 33)];
        let (dim, dstate) = dims[i % dims.len()];
        let heads = [1, 2, 4, 6][i % 4];
        let groups = if heads % 2 == 0 && i % 3 == 1 {
            heads / 2
        } else if i % 3 == 2 {
            heads
        } else {
            1
        };
        let form = [Form::OneToken, Form::Dense, Form::Varlen, Form::Varlen4][(i / 2) % 4];
        let tokens = if form == Form::OneToken { 1 } else { 1 + i % 4 };
        let dtypes = [DType::F32, DType::BF16, DType::F16];
        CkptSpec {
            seqs: 1 + (i * 5) % 7,
            heads,
            groups,
            dim,
            dstate,
            tokens,
            window: tokens + (i * 3) % 6,
            form,
            state: dtypes[(i / 3) % 3],
            cache: dtypes[(i / 2) % 3],
            io: dtypes[i % 3],
            index: if i.is_multiple_of(4) { DType::I64 } else { DType::I32 },
            table: i % 5 != 4,
            pads: i % 5 != 4 && !i.is_multiple_of(3),
            z: i % 3 == 1,
            d: (i % 3) as u8,
            dt_bias: i % 4 != 2,
            softplus: i % 6 != 5,
        }
    }

    /// Ring rows `L = W + T`.
    pub fn ring_len(&self) -> usize {
        self.window + self.tokens
    }
}

/// Owned host tensors of one random `checkpointing_ssu` call.
#[derive(Debug, Clone)]
pub struct CkptCase {
    /// What was drawn.
    pub spec: CkptSpec,
    /// `[cache, H, P, N]`.
    pub state: HostTensor,
    /// `[cache, H, L, P]`.
    pub x_cache: HostTensor,
    /// `[cache, G, L, N]`.
    pub b_cache: HostTensor,
    /// `[cache, H, L]` f32.
    pub dt_cache: HostTensor,
    /// `[cache]`.
    pub ring_start: HostTensor,
    /// `[cache]`.
    pub prev_num: HostTensor,
    /// New tokens' x.
    pub x: HostTensor,
    /// New tokens' raw dt (per head).
    pub dt: HostTensor,
    /// `[H]` f32, negative.
    pub a: HostTensor,
    /// New tokens' B.
    pub b: HostTensor,
    /// New tokens' C.
    pub c: HostTensor,
    /// Gate.
    pub z: Option<HostTensor>,
    /// `[H]` or `[H, P]`.
    pub d: Option<HostTensor>,
    /// `[H]`.
    pub dt_bias: Option<HostTensor>,
    /// `[seqs]`.
    pub sbi: Option<HostTensor>,
    /// `[seqs + 1]`.
    pub cu: Option<HostTensor>,
    /// Output, poisoned with NaN.
    pub out: HostTensor,
    /// Tokens per sequence.
    pub lens: Vec<usize>,
}

impl CkptCase {
    /// Draws a call of shape `s` from `seed`.
    pub fn random(s: CkptSpec, seed: u64) -> Self {
        let mut r = SplitMix::new(seed);
        let (h, g, p, n, t, l) = (s.heads, s.groups, s.dim, s.dstate, s.tokens, s.ring_len());
        let varlen = matches!(s.form, Form::Varlen | Form::Varlen4);
        let lens: Vec<usize> = (0..s.seqs).map(|_| if varlen { r.below(t + 1) } else { t }).collect();
        let total: usize = lens.iter().sum();
        let lead: Vec<usize> = match s.form {
            Form::OneToken => vec![s.seqs],
            Form::Dense => vec![s.seqs, t],
            Form::Varlen => vec![total],
            Form::Varlen4 => vec![1, total],
        };
        let shape = |tail: &[usize]| -> Vec<usize> { lead.iter().chain(tail).copied().collect() };
        // Slot 0 is the pad value (when pads are on); each sequence has its own slot.
        let cache = s.seqs + 3;
        let free = r.perm(cache - 1);
        let mut table: Vec<i64> = (0..s.seqs).map(|i| if s.table { 1 + free[i] as i64 } else { i as i64 }).collect();
        if s.pads {
            for e in table.iter_mut() {
                if r.below(4) == 0 {
                    *e = 0;
                }
            }
        }
        let starts: Vec<i64> = (0..cache).map(|_| r.below(l) as i64).collect();
        let ks: Vec<i64> = (0..cache).map(|_| r.below(s.window + 1) as i64).collect();
        let cu = varlen.then(|| {
            let mut cu = vec![0i64];
            for len in &lens {
                cu.push(cu.last().unwrap() + *len as i64);
            }
            HostTensor::from_i64(s.index, vec![s.seqs + 1], &cu)
        });
        let normal =
            |r: &mut SplitMix, dtype: DType, shape: &[usize], scale: f32| r.tensor(dtype, shape, -scale, scale);
        CkptCase {
            spec: s,
            state: normal(&mut r, s.state, &[cache, h, p, n], 0.5),
            x_cache: normal(&mut r, s.cache, &[cache, h, l, p], 1.0),
            b_cache: normal(&mut r, s.cache, &[cache, g, l, n], 1.0),
            dt_cache: r.tensor(DType::F32, &[cache, h, l], 0.01, 0.5),
            ring_start: HostTensor::from_i64(s.index, vec![cache], &starts),
            prev_num: HostTensor::from_i64(s.index, vec![cache], &ks),
            x: normal(&mut r, s.io, &shape(&[h, p]), 1.0),
            dt: r.tensor(DType::F32, &shape(&[h]), -1.0, 0.5),
            a: r.tensor(DType::F32, &[h], -2.0, -0.2),
            b: normal(&mut r, s.io, &shape(&[g, n]), 1.0),
            c: normal(&mut r, s.io, &shape(&[g, n]), 1.0),
            z: s.z.then(|| normal(&mut r, s.io, &shape(&[h, p]), 2.0)),
            d: match s.d {
                1 => Some(r.tensor(DType::F32, &[h], 0.5, 1.5)),
                2 => Some(r.tensor(DType::F32, &[h, p], 0.5, 1.5)),
                _ => None,
            },
            dt_bias: s.dt_bias.then(|| r.tensor(DType::F32, &[h], -1.5, 0.0)),
            sbi: s.table.then(|| HostTensor::from_i64(s.index, vec![s.seqs], &table)),
            cu,
            out: HostTensor::filled(s.io, shape(&[h, p]), f32::NAN),
            lens,
        }
    }

    /// The call over these tensors.
    pub fn args(&mut self) -> CheckpointingSsuArgs<'_> {
        let s = self.spec;
        CheckpointingSsuArgs {
            state: self.state.view_mut(),
            x_cache: self.x_cache.view_mut(),
            b_cache: self.b_cache.view_mut(),
            dt_cache: self.dt_cache.view_mut(),
            ring_start: self.ring_start.view(),
            prev_num_accepted_tokens: self.prev_num.view(),
            x: self.x.view(),
            dt: self.dt.view(),
            a: self.a.view(),
            b: self.b.view(),
            c: self.c.view(),
            out: self.out.view_mut(),
            d: self.d.as_ref().map(|t| t.view()),
            z: self.z.as_ref().map(|t| t.view()),
            dt_bias: self.dt_bias.as_ref().map(|t| t.view()),
            dt_softplus: s.softplus,
            state_batch_indices: self.sbi.as_ref().map(|t| t.view()),
            pad_slot_id: s.pads.then_some(0),
            cu_seqlens: self.cu.as_ref().map(|t| t.view()),
            max_seqlen: self.cu.is_some().then_some(s.tokens),
        }
    }

    /// Slots a sequence of this call may write (non-pad table entries of non-empty
    /// sequences); every other slot of every pool must stay bit-identical.
    pub fn writable_slots(&self) -> Vec<usize> {
        let slots: Vec<i64> = match &self.sbi {
            Some(t) => t.to_f64_vec().iter().map(|&v| v as i64).collect(),
            None => (0..self.spec.seqs as i64).collect(),
        };
        slots
            .iter()
            .zip(&self.lens)
            .filter(|&(&s, &len)| len > 0 && !(self.spec.pads && s == 0))
            .map(|(&s, _)| s as usize)
            .collect()
    }
}

/// Owned host tensors of one random tracker call (advance, reset or commit): `rows` requests
/// over `slots` cursors, with duplicate slots (applied in row order), the pad value and
/// out-of-range entries, garbage-sized counters included.
#[derive(Debug, Clone)]
pub struct TrackerCase {
    /// `ring_start`, `prev_num_accepted`, `prev_query_len`, each `[slots]`.
    pub trackers: [HostTensor; 3],
    /// `[rows]` or `[rows, 2]`.
    pub sbi: HostTensor,
    /// `[rows]` (commit).
    pub accepted: HostTensor,
    /// `[rows + 1]` (commit).
    pub qsl: HostTensor,
    /// `W`.
    pub window: i64,
    /// `L`.
    pub ring_len: i64,
    /// The pad value.
    pub pad: Option<i64>,
}

impl TrackerCase {
    /// Draws `rows` requests over `slots` cursors of `dtype` (index tables `index`) from `seed`.
    pub fn random(rows: usize, slots: usize, dtype: DType, index: DType, seed: u64) -> Self {
        let mut r = SplitMix::new(seed);
        let window = 1 + r.below(16) as i64;
        let ring_len = window + 1 + r.below(4) as i64;
        let cursor = |r: &mut SplitMix, hi: i64| -> Vec<i64> {
            (0..slots)
                .map(|_| match r.below(40) {
                    0 => i32::MAX as i64 - r.below(3) as i64,
                    1 => -(r.below(5) as i64) - 1,
                    _ => r.below(hi as usize + 1) as i64,
                })
                .collect()
        };
        let trackers = [
            HostTensor::from_i64(dtype, vec![slots], &cursor(&mut r, ring_len - 1)),
            HostTensor::from_i64(dtype, vec![slots], &cursor(&mut r, window)),
            HostTensor::from_i64(dtype, vec![slots], &cursor(&mut r, 4)),
        ];
        let pad = (r.below(3) != 0).then_some(-1);
        let column: Vec<i64> = (0..rows)
            .map(|_| match r.below(10) {
                0 => -1,
                1 => slots as i64 + r.below(3) as i64,
                // A small range makes duplicate slots common.
                2..=4 => r.below(slots.min(8)) as i64,
                _ => r.below(slots) as i64,
            })
            .collect();
        let sbi = if r.below(2) == 0 {
            HostTensor::from_i64(index, vec![rows], &column)
        } else {
            let two: Vec<i64> = column.iter().flat_map(|&s| [s, s + 1]).collect();
            HostTensor::from_i64(index, vec![rows, 2], &two)
        };
        let accepted: Vec<i64> = (0..rows).map(|_| r.below(5) as i64).collect();
        let mut qsl = vec![0i64];
        for _ in 0..rows {
            qsl.push(qsl.last().unwrap() + r.below(5) as i64);
        }
        TrackerCase {
            trackers,
            sbi,
            accepted: HostTensor::from_i64(index, vec![rows], &accepted),
            qsl: HostTensor::from_i64(index, vec![rows + 1], &qsl),
            window,
            ring_len,
            pad,
        }
    }

    /// The advance call (`reset`: the reset call instead).
    pub fn update_args(&mut self, reset: bool) -> UpdateRingTrackersArgs<'_> {
        let (window, ring_len, pad) = (self.window, self.ring_len, self.pad);
        let sbi = self.sbi.view();
        let trackers = tracker_views(&mut self.trackers);
        if reset {
            UpdateRingTrackersArgs::reset(trackers, sbi, pad)
        } else {
            UpdateRingTrackersArgs {
                trackers,
                state_batch_indices: sbi,
                logical_window: Some(window),
                ring_buffer_len: Some(ring_len),
                pad_slot_id: pad,
            }
        }
    }

    /// The commit call.
    pub fn commit_args(&mut self) -> CommitRingTrackersArgs<'_> {
        let (window, ring_len, pad) = (self.window, self.ring_len, self.pad);
        CommitRingTrackersArgs {
            trackers: tracker_views(&mut self.trackers),
            state_batch_indices: self.sbi.view(),
            num_accepted_tokens: self.accepted.view(),
            query_start_loc: self.qsl.view(),
            logical_window: window,
            ring_buffer_len: ring_len,
            pad_slot_id: pad,
        }
    }
}

/// Tolerance of a ReplaySSM result stored as `dtype` against the f64 reference.
pub fn tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (1e-3, 1e-3),
        DType::F16 => (4e-3, 4e-3),
        _ => (3.2e-2, 1.6e-2),
    }
}

fn close(what: &str, got: &HostTensor, want: &HostTensor, (atol, rtol): (f64, f64)) -> Result<(), String> {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    for (i, (&g, &w)) in g.iter().zip(&w).enumerate() {
        if g.is_nan() || w.is_nan() {
            if !(g.is_nan() && w.is_nan()) {
                return Err(format!("{what}[{i}]: got {g}, want {w} (one is unwritten)"));
            }
        } else if (g - w).abs() > atol + rtol * w.abs() {
            return Err(format!("{what}[{i}]: got {g}, want {w}"));
        }
    }
    Ok(())
}

/// Checks a backend's run of `base` (`got`) against the f64 reference's (`want`): outputs and
/// stored checkpoints within [`tolerance`], ring rows exact (dt within 1e-6), unwritten outputs
/// still NaN, and every slot outside [`CkptCase::writable_slots`] bit-identical in every pool.
pub fn check_ckpt(base: &CkptCase, got: &CkptCase, want: &CkptCase) -> Result<(), String> {
    close("out", &got.out, &want.out, tolerance(want.out.dtype))?;
    close("state", &got.state, &want.state, tolerance(want.state.dtype))?;
    close("x_cache", &got.x_cache, &want.x_cache, (0.0, 0.0))?;
    close("B_cache", &got.b_cache, &want.b_cache, (0.0, 0.0))?;
    close("dt_cache", &got.dt_cache, &want.dt_cache, (1e-6, 1e-6))?;
    let writable = base.writable_slots();
    for (what, before, after) in [
        ("state", &base.state, &got.state),
        ("x_cache", &base.x_cache, &got.x_cache),
        ("B_cache", &base.b_cache, &got.b_cache),
        ("dt_cache", &base.dt_cache, &got.dt_cache),
    ] {
        let per = before.bytes().len() / before.shape[0];
        for slot in (0..before.shape[0]).filter(|s| !writable.contains(s)) {
            let r = slot * per..(slot + 1) * per;
            if before.bytes()[r.clone()] != after.bytes()[r] {
                return Err(format!("{what}: slot {slot} was written, but no sequence uses it"));
            }
        }
    }
    Ok(())
}

/// 40 one-token decode steps of a Mamba2-like layer on `backend` (host tensors): 3 live
/// sequences and a pad row, window 4 (a flush every few steps), f32 checkpoint and bf16 rings.
/// Each step runs `checkpointing_ssu` then the tracker advance on the ReplaySSM pools, and the
/// plain `selective_state_update` (f32 state) on the same tokens on a second pool. The outputs
/// of every live row must agree within the [`tolerance`] of their bf16 storage, and the pad row
/// must write nothing. Returns the largest absolute difference seen.
pub fn replayssm_decode_vs_plain_ssu<B, E>(backend: &B, seed: u64) -> Result<f64, String>
where
    B: for<'a> Run<CheckpointingSsuArgs<'a>, Error = E>
        + for<'a> Run<UpdateRingTrackersArgs<'a>, Error = E>
        + for<'a> Run<SelectiveStateUpdateArgs<'a>, Error = E>,
    E: std::fmt::Display,
{
    let mut spec = CkptSpec::mamba2(4, 3, 1, DType::F32);
    spec.window = 4;
    spec.z = false;
    let mut case = CkptCase::random(spec, seed);
    // Three live rows and the pad row (slot 0); empty rings at the start.
    let table = [3i64, 1, 0, 5];
    case.sbi = Some(HostTensor::from_i64(spec.index, vec![4], &table));
    let cache = case.state.shape[0];
    case.ring_start = HostTensor::from_i64(spec.index, vec![cache], &vec![0; cache]);
    case.prev_num = HostTensor::from_i64(spec.index, vec![cache], &vec![0; cache]);
    let mut trackers = [case.ring_start.clone(), case.prev_num.clone(), case.prev_num.clone()];
    let mut plain = case.state.clone();
    let (h, p, n, g) = (spec.heads, spec.dim, spec.dstate, spec.groups);
    let mut r = SplitMix::new(seed ^ 0x5eed);
    let mut worst = 0f64;
    let (atol, rtol) = tolerance(spec.io);
    let err = |what: &str, e: &dyn std::fmt::Display| format!("{what}: {e}");
    for step in 0..40 {
        case.x = r.tensor(spec.io, &[4, h, p], -1.0, 1.0);
        case.dt = r.tensor(DType::F32, &[4, h], -1.0, 0.5);
        case.b = r.tensor(spec.io, &[4, g, n], -1.0, 1.0);
        case.c = r.tensor(spec.io, &[4, g, n], -1.0, 1.0);
        case.out = HostTensor::filled(spec.io, vec![4, h, p], f32::NAN);
        case.ring_start = trackers[0].clone();
        case.prev_num = trackers[1].clone();
        let call = ssm_ring::plan(case.args()).map_err(|e| err("checkpointing_ssu plan", &e))?;
        backend.run(call).map_err(|e| err("checkpointing_ssu", &e))?;
        let update = UpdateRingTrackersArgs {
            trackers: tracker_views(&mut trackers),
            state_batch_indices: case.sbi.as_ref().expect("a table").view(),
            logical_window: Some(spec.window as i64),
            ring_buffer_len: Some(spec.ring_len() as i64),
            pad_slot_id: Some(0),
        };
        backend.run(ssm_ring::plan(update).map_err(|e| err("tracker plan", &e))?).map_err(|e| err("trackers", &e))?;
        // The plain SSU: tied dt / A / dt_bias / D broadcast over the head dim and dstate.
        let mut out = HostTensor::filled(spec.io, vec![4, h, p], f32::NAN);
        let ssu = SelectiveStateUpdateArgs {
            d: case.d.as_ref().map(|d| tied(d, &[h, p], &[1, 0])),
            dt_bias: case.dt_bias.as_ref().map(|b| tied(b, &[h, p], &[1, 0])),
            dt_softplus: spec.softplus,
            state_batch_indices: case.sbi.as_ref().map(|t| t.view()),
            pad_slot_id: Some(0),
            ..SelectiveStateUpdateArgs::new(
                plain.view_mut(),
                case.x.view(),
                tied(&case.dt, &[4, h, p], &[h as isize, 1, 0]),
                tied(&case.a, &[h, p, n], &[1, 0, 0]),
                case.b.view(),
                case.c.view(),
                out.view_mut(),
            )
        };
        backend.run(ssm_ssu::plan(ssu).map_err(|e| err("ssu plan", &e))?).map_err(|e| err("ssu", &e))?;
        let (got, want) = (case.out.to_f64_vec(), out.to_f64_vec());
        for (row, &slot) in table.iter().enumerate() {
            for i in row * h * p..(row + 1) * h * p {
                if slot == 0 {
                    if !got[i].is_nan() {
                        return Err(format!("step {step}: the pad row wrote out[{i}]"));
                    }
                    continue;
                }
                let d = (got[i] - want[i]).abs();
                worst = worst.max(d);
                if d.is_nan() || d > atol + rtol * want[i].abs() {
                    return Err(format!(
                        "step {step} row {row}: out[{i}] = {}, the plain SSU gives {}",
                        got[i], want[i]
                    ));
                }
            }
        }
    }
    Ok(worst)
}

/// `t` seen as `shape` with `strides` (a broadcast of a per-head tensor).
fn tied<'t>(t: &'t HostTensor, shape: &[usize], strides: &[isize]) -> ssm_tensor::TensorRef<'t> {
    t.view().with_layout(shape, strides, 0).expect("a broadcast of a per-head tensor")
}

fn tracker_views(t: &mut [HostTensor; 3]) -> RingTrackers<'_> {
    let [rs, pa, pq] = t;
    RingTrackers { ring_start: rs.view_mut(), prev_num_accepted: pa.view_mut(), prev_query_len: pq.view_mut() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_matrix_point_plans_and_runs_on_the_reference() {
        for i in 0..42 {
            let spec = CkptSpec::matrix(i);
            let mut c = CkptCase::random(spec, i as u64);
            let call = ssm_ring::plan(c.args()).unwrap_or_else(|e| panic!("{i} {spec:?}: {e}"));
            ssm_ring::reference::checkpointing_ssu(call);
        }
        let mut c = CkptCase::random(CkptSpec::mamba2(3, 2, 4, DType::F32), 7);
        ssm_ring::reference::checkpointing_ssu(ssm_ring::plan(c.args()).unwrap());
    }

    #[test]
    fn tracker_cases_plan_in_every_mode() {
        for seed in 0..6 {
            let mut c = TrackerCase::random(300, 40, [DType::I32, DType::I64][seed % 2], DType::I64, seed as u64);
            ssm_ring::reference::update_replayssm_ring_trackers(ssm_ring::plan(c.update_args(false)).unwrap());
            ssm_ring::reference::update_replayssm_ring_trackers(ssm_ring::plan(c.update_args(true)).unwrap());
            ssm_ring::reference::commit_replayssm_ring_trackers(ssm_ring::plan(c.commit_args()).unwrap());
        }
    }
}
