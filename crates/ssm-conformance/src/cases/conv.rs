//! Random causal-conv1d calls (`causal_conv1d_update`, `causal_conv1d_fn`), the one generator
//! of the CPU property tests (`ssm-cpu/tests/conv_props.rs`, and the portable-lanes test in
//! `ssm-cpu/src/conv.rs`) and the GPU tests (`ssm-cuda/tests/gpu_conv.rs`).
//!
//! [`Case::random`] draws a call of a given [`Mode`] and dtype: odd dims (1 to 2056), widths
//! 2–4, both state layouts, token-major or dim-major (permuted-stride) `x`, pads 0 / −1 / none
//! with padded sequences, i32/i64 tables, empty sequences, the speculative rolling buffer with
//! accepted counts, prefix-caching columns, varlen prefill (short sequences and ones longer
//! than a 64-token chunk) with and without initial states and with prefix-caching checkpoints
//! (offsets inside the sequence, slots of their own or the pad), bias and silu on and off.
//! `out` is poisoned with NaN; slots are distinct per sequence, with spare slots nobody names.
//! [`Case::writes`] says, from the draw alone, what the call must write; [`assert_agrees`]
//! checks a backend's result against the reference's with it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_tensor::{DType, HostTensor, Planned, Run};

use super::StridedHost;

/// The float dtypes of the conv (x, weight, bias, state and out share one).
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The form of a drawn call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `causal_conv1d_update`, x `[batch, dim]`.
    Single,
    /// `causal_conv1d_update`, x `[batch, seqlen, dim]`, no speculation.
    Multi,
    /// `causal_conv1d_update`, packed varlen (`query_start_loc`), no speculation.
    Varlen,
    /// `causal_conv1d_update`, packed varlen with `num_accepted_tokens` (rolling buffer).
    SpecVarlen,
    /// `causal_conv1d_update`, x `[batch, seqlen, dim]` with `num_accepted_tokens`.
    Spec3d,
    /// `causal_conv1d_update`, one token per sequence, a `[batch, 3]` table with
    /// `initial_state_idx` / `block_idx_last_scheduled_token` (prefix caching).
    Apc,
    /// `causal_conv1d_fn` (varlen prefill, `has_initial_state`, sometimes checkpoints).
    Prefill,
}

/// Every mode, in order.
pub const MODES: [Mode; 7] =
    [Mode::Single, Mode::Multi, Mode::Varlen, Mode::SpecVarlen, Mode::Spec3d, Mode::Apc, Mode::Prefill];

/// What one sequence of a drawn call must write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqWrite {
    /// First token row of the sequence in `x`/`out` (rows count tokens over the leading axes).
    pub start: usize,
    /// Tokens of the sequence (every channel of these rows is written).
    pub len: usize,
    /// The state slot it writes.
    pub slot: usize,
    /// State columns `0..window` of that slot may change; the later ones keep their bits.
    pub window: usize,
}

/// Owned host tensors of one call, named as the arguments they become.
#[derive(Debug, Clone)]
pub struct Case {
    /// What was drawn.
    pub mode: Mode,
    /// Layout of `state`.
    pub layout: ConvStateLayout,
    /// `activation`.
    pub activation: Activation,
    /// `pad_slot_id`.
    pub pad: Option<i64>,
    /// `x` `[batch, dim]`, `[batch, seqlen, dim]` or `[tokens, dim]`, token- or dim-major.
    pub x: StridedHost,
    /// `weight` `[dim, width]`.
    pub weight: HostTensor,
    /// `bias` `[dim]`.
    pub bias: Option<HostTensor>,
    /// The state pool: `[slots, state_len, dim]` or `[slots, dim, state_len]` (by `layout`).
    pub state: HostTensor,
    /// `out`: `x`'s shape and strides over its own memory, poisoned with NaN.
    pub out: StridedHost,
    /// `conv_state_indices` / `cache_indices`: `[batch]`, or `[batch, 3]` in [`Mode::Apc`].
    pub indices: HostTensor,
    /// `num_accepted_tokens` `[batch]` (speculative modes).
    pub num_accepted_tokens: Option<HostTensor>,
    /// `query_start_loc` `[batch + 1]` (varlen modes).
    pub query_start_loc: Option<HostTensor>,
    /// `initial_state_idx` `[batch]` ([`Mode::Apc`]: column 0).
    pub initial_state_idx: Option<HostTensor>,
    /// `block_idx_last_scheduled_token` `[batch]` ([`Mode::Apc`]: column 1 or 2).
    pub block_idx_last_scheduled_token: Option<HostTensor>,
    /// `has_initial_state` `[batch]` (bool; read by [`Mode::Prefill`]).
    pub has_initial_state: HostTensor,
    /// `checkpoint_offsets` `[batch]` ([`Mode::Prefill`], in about half the draws).
    pub checkpoint_offsets: Option<HostTensor>,
    /// `checkpoint_state_indices` `[batch]`, with `checkpoint_offsets`.
    pub checkpoint_state_indices: Option<HostTensor>,
    /// What each sequence must write, as drawn (a test that edits the tables afterwards must
    /// not use it); a checkpoint is an entry of its own, with no tokens.
    pub writes: Vec<SeqWrite>,
}

/// Uniform values in `[-scale, scale)`, rounded into `dtype`.
fn random(dtype: DType, shape: &[usize], rng: &mut ChaCha8Rng, scale: f32) -> HostTensor {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| (rng.random::<f32>() * 2.0 - 1.0) * scale).collect();
    HostTensor::from_f32(dtype, shape.to_vec(), &v)
}

/// Token-major `x` of `shape` (the last axis is `dim`), or vLLM's dim-major storage seen
/// through permuted strides; with its NaN-poisoned `out` of the same layout.
fn x_and_out(dtype: DType, shape: &[usize], dim_major: bool, rng: &mut ChaCha8Rng) -> (StridedHost, StridedHost) {
    let rows: usize = shape[..shape.len() - 1].iter().product();
    let dim = shape[shape.len() - 1];
    let strides: Vec<isize> = match (shape.len(), dim_major) {
        (2, false) => vec![dim as isize, 1],
        (2, true) => vec![1, rows as isize],
        (_, false) => vec![(shape[1] * dim) as isize, dim as isize, 1],
        (_, true) => vec![(shape[1] * dim) as isize, 1, shape[1] as isize],
    };
    let n = (rows * dim).max(1);
    let x = StridedHost { memory: random(dtype, &[n], rng, 2.0), shape: shape.to_vec(), strides: strides.clone() };
    let out = StridedHost { memory: HostTensor::filled(dtype, vec![n], f32::NAN), shape: shape.to_vec(), strides };
    (x, out)
}

fn state_shape(layout: ConvStateLayout, slots: usize, state_len: usize, dim: usize) -> [usize; 3] {
    match layout {
        ConvStateLayout::StateLenDim => [slots, state_len, dim],
        ConvStateLayout::DimStateLen => [slots, dim, state_len],
    }
}

/// Tokens of each sequence of `mode` (`seqlen` for the dense modes).
fn draw_lens(rng: &mut ChaCha8Rng, mode: Mode, batch: usize, seqlen: usize, num_spec: usize) -> Vec<usize> {
    match mode {
        Mode::SpecVarlen => (0..batch).map(|_| rng.random_range(0..=num_spec + 1)).collect(),
        Mode::Varlen => (0..batch).map(|_| rng.random_range(0..=5)).collect(),
        // Short sequences of any length, and ones that run in several 64-token chunks.
        Mode::Prefill => (0..batch)
            .map(|_| {
                if rng.random_bool(0.5) {
                    rng.random_range(0..=40)
                } else {
                    [0, 1, 2, 3, 17, 64, 65, 200][rng.random_range(0..8)]
                }
            })
            .collect(),
        _ => vec![seqlen; batch],
    }
}

impl Case {
    /// Draws a call of `mode` with float dtype `dtype` from `seed`.
    pub fn random(dtype: DType, mode: Mode, seed: u64) -> Case {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dim = [1, 3, 7, 8, 13, 17, 33, 70, 300, 1024, 2056][rng.random_range(0..11)];
        let width = rng.random_range(2..=4usize);
        let batch = rng.random_range(1..=6usize);
        let layout = if rng.random_bool(0.5) { ConvStateLayout::StateLenDim } else { ConvStateLayout::DimStateLen };
        let activation = if rng.random_bool(0.5) { Activation::Silu } else { Activation::None };
        let pad = [Some(0i64), Some(-1), None][rng.random_range(0..3)];
        let index = if rng.random_bool(0.5) { DType::I32 } else { DType::I64 };
        let num_spec = rng.random_range(0..=3usize);
        let cols = if mode == Mode::Apc { 3 } else { 1 };
        // Slot 0 is reserved when it is the pad; a checkpoint slot per sequence in a prefill,
        // then three spare slots nobody names.
        let first = usize::from(pad == Some(0));
        let ck_slots = if mode == Mode::Prefill { batch } else { 0 };
        let slots = first + batch * cols + ck_slots + 3;
        let mut free: Vec<usize> = (first..slots).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, rng.random_range(0..=i));
        }
        let mut table: Vec<i64> = free[..batch * cols].iter().map(|&s| s as i64).collect();
        let mut is_pad = vec![false; batch];
        if let Some(p) = pad {
            for b in 0..batch {
                if rng.random_bool(0.25) {
                    // Column 0 is the one every mode reads (prefix caching reads column 0).
                    is_pad[b] = true;
                    table[b * cols] = p;
                }
            }
        }
        let spec = matches!(mode, Mode::SpecVarlen | Mode::Spec3d);
        let seqlen = match mode {
            Mode::Single | Mode::Apc => 1,
            Mode::Multi => rng.random_range(1..=4),
            Mode::Spec3d => num_spec + 1,
            _ => 0,
        };
        let lens = draw_lens(&mut rng, mode, batch, seqlen, num_spec);
        let state_len = width - 1 + if spec { num_spec } else { rng.random_range(0..=2) };
        let varlen = matches!(mode, Mode::Varlen | Mode::SpecVarlen | Mode::Prefill);
        let x_shape = match mode {
            Mode::Single | Mode::Apc => vec![batch, dim],
            Mode::Multi | Mode::Spec3d => vec![batch, seqlen, dim],
            _ => vec![lens.iter().sum(), dim],
        };
        let (x, out) = x_and_out(dtype, &x_shape, rng.random_bool(0.4), &mut rng);
        let weight = random(dtype, &[dim, width], &mut rng, 1.0);
        let bias = rng.random_bool(0.5).then(|| random(dtype, &[dim], &mut rng, 0.5));
        let state = random(dtype, &state_shape(layout, slots, state_len, dim), &mut rng, 2.0);
        let accepted =
            spec.then(|| (0..batch).map(|_| rng.random_range(1..=(state_len + 2 - width) as i64)).collect::<Vec<_>>());
        let starts: Vec<i64> = std::iter::once(0)
            .chain(lens.iter().scan(0i64, |end, &l| {
                *end += l as i64;
                Some(*end)
            }))
            .collect();
        // Read column 0, write column 1 or 2 (never the pad: pads sit in column 0).
        let write_col: Vec<i64> =
            (0..batch).map(|_| if mode == Mode::Apc { rng.random_range(1..=2) } else { 0 }).collect();
        let has_init: Vec<i64> = (0..batch).map(|_| i64::from(rng.random_bool(0.6))).collect();
        let mut writes: Vec<SeqWrite> = (0..batch)
            .filter(|&b| !is_pad[b] && lens[b] > 0)
            .map(|b| SeqWrite {
                start: if varlen { starts[b] as usize } else { b * seqlen },
                len: lens[b],
                slot: table[b * cols + write_col[b] as usize] as usize,
                window: if spec { width - 2 + lens[b] } else { width - 1 },
            })
            .collect();
        // Checkpoints: offsets inside the sequence (0: none), each into a slot of its own or the
        // pad; the entries of sequences without one hold a slot nobody else names.
        let checkpoints = (mode == Mode::Prefill && rng.random_bool(0.5)).then(|| {
            let ck_free = &free[batch * cols..batch * cols + ck_slots];
            let mut offsets = vec![0i64; batch];
            let mut ck_table = vec![0i64; batch];
            for b in 0..batch {
                ck_table[b] = ck_free[b] as i64;
                if lens[b] >= 2 && rng.random_bool(0.7) {
                    offsets[b] = rng.random_range(1..lens[b] as i64);
                    match pad {
                        Some(p) if rng.random_bool(0.2) => ck_table[b] = p,
                        _ if !is_pad[b] => writes.push(SeqWrite {
                            start: starts[b] as usize,
                            len: 0,
                            slot: ck_free[b],
                            window: width - 1,
                        }),
                        _ => {}
                    }
                }
            }
            (offsets, ck_table)
        });
        let ints = |v: &[i64], shape: &[usize]| HostTensor::from_i64(index, shape.to_vec(), v);
        Case {
            mode,
            layout,
            activation,
            pad,
            x,
            weight,
            bias,
            state,
            out,
            indices: ints(&table, &if cols == 1 { vec![batch] } else { vec![batch, cols] }),
            num_accepted_tokens: accepted.map(|a| ints(&a, &[batch])),
            query_start_loc: varlen.then(|| ints(&starts, &[batch + 1])),
            initial_state_idx: (mode == Mode::Apc).then(|| ints(&vec![0; batch], &[batch])),
            block_idx_last_scheduled_token: (mode == Mode::Apc).then(|| ints(&write_col, &[batch])),
            has_initial_state: HostTensor::from_i64(DType::Bool, vec![batch], &has_init),
            checkpoint_offsets: checkpoints.as_ref().map(|(o, _)| ints(o, &[batch])),
            checkpoint_state_indices: checkpoints.as_ref().map(|(_, t)| ints(t, &[batch])),
            writes,
        }
    }

    /// A decode call as models run it ([`Mode::Single`], token-major x, bias, silu): `batch`
    /// sequences on slots 2·b + 1 of a pool of 2·batch + 2 slots of `width − 1` columns, an i32
    /// table, pad −1 on the last sequence.
    pub fn decode(dtype: DType, dim: usize, width: usize, batch: usize, layout: ConvStateLayout, seed: u64) -> Case {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let slots = 2 * batch + 2;
        let (x, out) = x_and_out(dtype, &[batch, dim], false, &mut rng);
        let weight = random(dtype, &[dim, width], &mut rng, 1.0);
        let bias = Some(random(dtype, &[dim], &mut rng, 0.5));
        let state = random(dtype, &state_shape(layout, slots, width - 1, dim), &mut rng, 2.0);
        let table: Vec<i64> = (0..batch).map(|b| if b + 1 == batch { -1 } else { 2 * b as i64 + 1 }).collect();
        let writes =
            (0..batch - 1).map(|b| SeqWrite { start: b, len: 1, slot: 2 * b + 1, window: width - 1 }).collect();
        Case {
            mode: Mode::Single,
            layout,
            activation: Activation::Silu,
            pad: Some(-1),
            x,
            weight,
            bias,
            state,
            out,
            indices: HostTensor::from_i64(DType::I32, vec![batch], &table),
            num_accepted_tokens: None,
            query_start_loc: None,
            initial_state_idx: None,
            block_idx_last_scheduled_token: None,
            has_initial_state: HostTensor::from_i64(DType::Bool, vec![batch], &vec![1; batch]),
            checkpoint_offsets: None,
            checkpoint_state_indices: None,
            writes,
        }
    }

    /// Channels.
    pub fn dim(&self) -> usize {
        self.weight.shape[0]
    }

    /// Kernel width.
    pub fn width(&self) -> usize {
        self.weight.shape[1]
    }

    /// Slots of the state pool.
    pub fn slots(&self) -> usize {
        self.state.shape[0]
    }

    /// State columns per slot.
    pub fn state_len(&self) -> usize {
        match self.layout {
            ConvStateLayout::StateLenDim => self.state.shape[1],
            ConvStateLayout::DimStateLen => self.state.shape[2],
        }
    }

    /// The element of `out`'s (and `x`'s) memory that holds token row `row`, channel `ch`.
    pub fn out_element(&self, row: usize, ch: usize) -> usize {
        let (shape, s) = (&self.out.shape, &self.out.strides);
        let e = if shape.len() == 3 {
            (row / shape[1]) as isize * s[0] + (row % shape[1]) as isize * s[1] + ch as isize * s[2]
        } else {
            row as isize * s[0] + ch as isize * s[1]
        };
        e as usize
    }

    /// The element of the state pool that holds column `col`, channel `ch` of `slot`.
    pub fn state_element(&self, slot: usize, col: usize, ch: usize) -> usize {
        let (state_len, dim) = (self.state_len(), self.dim());
        match self.layout {
            ConvStateLayout::StateLenDim => (slot * state_len + col) * dim + ch,
            ConvStateLayout::DimStateLen => (slot * dim + ch) * state_len + col,
        }
    }

    /// The `causal_conv1d_update` call over these tensors.
    pub fn update_args(&mut self) -> CausalConv1dUpdateArgs<'_> {
        CausalConv1dUpdateArgs {
            x: self.x.view(),
            conv_state: self.state.view_mut(),
            conv_state_layout: self.layout,
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            activation: self.activation,
            conv_state_indices: Some(self.indices.view()),
            num_accepted_tokens: self.num_accepted_tokens.as_ref().map(|a| a.view()),
            query_start_loc: self.query_start_loc.as_ref().map(|s| s.view()),
            pad_slot_id: self.pad,
            block_idx_last_scheduled_token: self.block_idx_last_scheduled_token.as_ref().map(|l| l.view()),
            initial_state_idx: self.initial_state_idx.as_ref().map(|i| i.view()),
            out: self.out.view_mut(),
        }
    }

    /// The `causal_conv1d_fn` call over these tensors.
    ///
    /// # Panics
    /// Unless the case has `query_start_loc` (the varlen modes).
    pub fn fn_args(&mut self) -> CausalConv1dFnArgs<'_> {
        CausalConv1dFnArgs {
            x: self.x.view(),
            weight: self.weight.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            conv_states: self.state.view_mut(),
            conv_state_layout: self.layout,
            query_start_loc: self.query_start_loc.as_ref().expect("a varlen case").view(),
            cache_indices: Some(self.indices.view()),
            has_initial_state: Some(self.has_initial_state.view()),
            activation: self.activation,
            pad_slot_id: self.pad,
            checkpoint_offsets: self.checkpoint_offsets.as_ref().map(|o| o.view()),
            checkpoint_state_indices: self.checkpoint_state_indices.as_ref().map(|t| t.view()),
            out: self.out.view_mut(),
        }
    }

    /// Plans the case's call (`causal_conv1d_fn` in [`Mode::Prefill`], else
    /// `causal_conv1d_update`) on the host and runs it on `backend`.
    ///
    /// # Panics
    /// If the host plan refuses the call (drawn calls always plan; edited ones may not).
    pub fn run_on<B, E>(&mut self, backend: &B) -> Result<(), E>
    where
        B: for<'a> Run<CausalConv1dUpdateArgs<'a>, Error = E> + for<'a> Run<CausalConv1dFnArgs<'a>, Error = E>,
    {
        if self.mode == Mode::Prefill {
            backend.run(Planned::new(self.fn_args()).expect("the drawn call plans"))
        } else {
            backend.run(Planned::new(self.update_args()).expect("the drawn call plans"))
        }
    }
}

/// The tolerance of `out` in `dtype` (relative to `1 + |want|`).
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        _ => 1e-2,
    }
}

/// Checks a backend's run (`got`) of the case `initial` against the reference's (`want`):
/// the state bit for bit over the whole pool (the update copies storage values); every row
/// [`Case::writes`] names written by both and within [`tolerance`], every other `out` element
/// still NaN in both; and every state column outside the written windows unchanged from
/// `initial` (the reference touches nothing else).
///
/// # Panics
/// On the first disagreement, with `ctx` in the message.
pub fn assert_agrees(ctx: &str, initial: &Case, want: &Case, got: &Case) {
    let es = want.state.dtype.size();
    for (e, (g, w)) in got.state.bytes().chunks(es).zip(want.state.bytes().chunks(es)).enumerate() {
        assert_eq!(g, w, "{ctx}: state element {e}");
    }
    let tol = tolerance(want.out.memory.dtype);
    let (g, w) = (got.out.memory.to_f64_vec(), want.out.memory.to_f64_vec());
    let mut written = vec![false; w.len()];
    for s in &initial.writes {
        for row in s.start..s.start + s.len {
            for ch in 0..initial.dim() {
                let e = initial.out_element(row, ch);
                written[e] = true;
                assert!(!w[e].is_nan() && !g[e].is_nan(), "{ctx}: out row {row} ch {ch} not written");
                assert!(
                    (g[e] - w[e]).abs() <= tol * (1.0 + w[e].abs()),
                    "{ctx}: out row {row} ch {ch}: {} vs {}",
                    g[e],
                    w[e]
                );
            }
        }
    }
    for (e, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
        assert!(g[e].is_nan() && w[e].is_nan(), "{ctx}: out element {e} written ({} / reference {})", g[e], w[e]);
    }
    for slot in 0..initial.slots() {
        // A slot is written by one sequence or one checkpoint (the plan's aliasing rule).
        let window = initial.writes.iter().find(|s| s.slot == slot).map_or(0, |s| s.window);
        for col in window..initial.state_len() {
            for ch in 0..initial.dim() {
                let e = initial.state_element(slot, col, ch);
                let (a, b) = (&want.state.bytes()[e * es..(e + 1) * es], &initial.state.bytes()[e * es..(e + 1) * es]);
                assert_eq!(a, b, "{ctx}: slot {slot} col {col} ch {ch} touched");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ssm_conv::reference::{Arithmetic, Reference};

    #[test]
    fn every_mode_plans_and_the_reference_writes_what_the_draw_says() {
        for (k, dtype) in FLOATS.into_iter().enumerate() {
            for seed in 0..6 {
                for mode in MODES {
                    let initial = Case::random(dtype, mode, 100 * k as u64 + seed);
                    let mut want = initial.clone();
                    want.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
                    // The reference against itself: its writes are exactly the drawn ones.
                    assert_agrees(&format!("{dtype} {mode:?} seed {seed}"), &initial, &want, &want.clone());
                }
            }
        }
        let initial = Case::decode(DType::BF16, 40, 4, 3, ConvStateLayout::DimStateLen, 5);
        let mut want = initial.clone();
        want.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
        assert_agrees("decode", &initial, &want, &want.clone());
    }

    /// The reference's checkpoint of sequence b at offset o is its own state after a call whose
    /// only tokens are b's first o (the others cut to nothing), from the same pool.
    #[test]
    fn a_checkpoint_is_the_state_after_its_prefix() {
        let mut checked = 0;
        for (k, dtype) in FLOATS.into_iter().enumerate() {
            for seed in 0..40 {
                let initial = Case::random(dtype, Mode::Prefill, 1000 * k as u64 + seed);
                let (Some(offsets), Some(ck)) = (&initial.checkpoint_offsets, &initial.checkpoint_state_indices) else {
                    continue;
                };
                let (offsets, ck) = (offsets.to_f64_vec(), ck.to_f64_vec());
                let starts = initial.query_start_loc.as_ref().expect("varlen").to_f64_vec();
                let table = initial.indices.to_f64_vec();
                let mut full = initial.clone();
                full.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
                for b in 0..offsets.len() {
                    let (o, slot, own) = (offsets[b] as i64, ck[b] as i64, table[b] as i64);
                    if o == 0 || Some(slot) == initial.pad || Some(own) == initial.pad {
                        continue;
                    }
                    let mut cut = initial.clone();
                    let s0 = starts[b] as i64;
                    let cut_starts: Vec<i64> = (0..starts.len()).map(|i| if i <= b { s0 } else { s0 + o }).collect();
                    let qsl = cut.query_start_loc.as_ref().expect("varlen");
                    cut.query_start_loc = Some(HostTensor::from_i64(qsl.dtype, qsl.shape.clone(), &cut_starts));
                    (cut.checkpoint_offsets, cut.checkpoint_state_indices) = (None, None);
                    cut.run_on(&Reference { precision: Arithmetic::F32 }).unwrap();
                    let es = dtype.size();
                    for col in 0..initial.width() - 1 {
                        for ch in 0..initial.dim() {
                            let (e, f) =
                                (full.state_element(slot as usize, col, ch), cut.state_element(own as usize, col, ch));
                            assert_eq!(
                                full.state.bytes()[e * es..(e + 1) * es],
                                cut.state.bytes()[f * es..(f + 1) * es],
                                "{dtype} seed {seed} seq {b} offset {o} col {col} ch {ch}"
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked >= 20, "only {checked} checkpoints drawn");
    }
}
