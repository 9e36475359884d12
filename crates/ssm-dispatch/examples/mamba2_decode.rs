//! A Mamba2 layer's decode loop on the CPU, the way an engine calls it: a state pool shared by
//! all requests and addressed through slot tables, a pad row in the batch, one
//! `causal_conv1d_update` and one `selective_state_update` per step. The conv output feeds the
//! SSU through strided views, with no copies. A speculative step follows: 3 tokens per
//! sequence, each token's state stored in its own slot, and the accepted count picking the
//! starting state.
//!
//!     cargo run --release -p ssm-dispatch --example mamba2_decode [-- STEPS]

use std::time::Instant;

use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::{Config, Runtime};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{TensorMut, TensorRef, bf16};

/// Mamba2-2.7B's per-layer sizes, with fewer heads to keep the example quick.
const HEADS: usize = 16;
const DIM: usize = 64;
const DSTATE: usize = 128;
const GROUPS: usize = 1;
const WIDTH: usize = 4;
/// Channels of the conv: x, then B, then C (vLLM's `xBC`).
const CONV_DIM: usize = HEADS * DIM + 2 * GROUPS * DSTATE;
const SLOTS: usize = 64;
const BATCH: usize = 8;
/// vLLM's null block: a batch row with this slot is padding and touches no state.
const PAD: i32 = -1;

/// A deterministic value in [-1, 1) (no `rand` needed).
fn noise(i: usize, salt: u64) -> f32 {
    let mut h = (i as u64 ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 31;
    (h >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

fn filled(n: usize, salt: u64, scale: f32) -> Vec<bf16> {
    (0..n).map(|i| bf16::from_f32(noise(i, salt) * scale)).collect()
}

/// The layer's weights and its two state pools.
struct Layer {
    conv_weight: Vec<bf16>,
    conv_bias: Vec<bf16>,
    a: Vec<f32>,
    d: Vec<f32>,
    dt_bias: Vec<f32>,
    conv_state: Vec<bf16>,
    ssm_state: Vec<f32>,
}

impl Layer {
    fn new() -> Self {
        Layer {
            conv_weight: filled(CONV_DIM * WIDTH, 1, 0.5),
            conv_bias: filled(CONV_DIM, 2, 0.1),
            a: (0..HEADS).map(|h| -(1.0 + h as f32 / HEADS as f32)).collect(),
            d: vec![1.0; HEADS],
            dt_bias: (0..HEADS).map(|h| noise(h, 3) * 0.5).collect(),
            conv_state: vec![bf16::ZERO; SLOTS * (WIDTH - 1) * CONV_DIM],
            ssm_state: vec![0.0; SLOTS * HEADS * DIM * DSTATE],
        }
    }

    /// One decode step for `rows` tokens: conv over `xbc` into `conv_out`, then the SSU reading
    /// x, B and C out of `conv_out`. `ssu_tables` sets the slot table (1-D, or 2-D with the
    /// speculative companions).
    fn step(
        &mut self,
        rt: &Runtime,
        xbc: &[bf16],
        conv_slots: &[i32],
        conv_out: &mut [bf16],
        dt: &[bf16],
        ssu_tables: SsuTables<'_>,
        out: &mut [bf16],
    ) -> Result<(), Box<dyn std::error::Error>> {
        let rows = dt.len() / HEADS;
        let batch = conv_slots.len();
        // The conv runs once per sequence here (its speculative rolling buffer is another
        // route); in the speculative step it sees the sequences' first tokens only.
        rt.causal_conv1d_update(CausalConv1dUpdateArgs {
            x: TensorRef::from_slice(&xbc[..batch * CONV_DIM], &[batch, CONV_DIM])?,
            conv_state: TensorMut::from_slice(&mut self.conv_state, &[SLOTS, WIDTH - 1, CONV_DIM])?,
            conv_state_layout: ConvStateLayout::StateLenDim,
            weight: TensorRef::from_slice(&self.conv_weight, &[CONV_DIM, WIDTH])?,
            bias: Some(TensorRef::from_slice(&self.conv_bias, &[CONV_DIM])?),
            activation: Activation::Silu,
            conv_state_indices: Some(TensorRef::from_slice(conv_slots, &[batch])?),
            num_accepted_tokens: None,
            query_start_loc: None,
            pad_slot_id: Some(PAD as i64),
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: TensorMut::from_slice(&mut conv_out[..batch * CONV_DIM], &[batch, CONV_DIM])?,
        })?;
        // x, B and C are column ranges of the conv output: strided views, no copies. A
        // speculative step's later tokens read the rows after the batch's first tokens.
        let conv_out = &conv_out[..rows * CONV_DIM];
        let row = CONV_DIM as isize;
        let view = |shape: &[usize], strides: &[isize], offset: usize| {
            TensorRef::from_slice(conv_out, &[conv_out.len()])?.with_layout(shape, strides, offset)
        };
        let (h, p, n) = (HEADS as isize, DIM as isize, DSTATE as isize);
        rt.selective_state_update(SelectiveStateUpdateArgs {
            d: Some(TensorRef::from_slice(&self.d, &[HEADS])?.with_layout(&[HEADS, DIM], &[1, 0], 0)?),
            dt_bias: Some(TensorRef::from_slice(&self.dt_bias, &[HEADS])?.with_layout(&[HEADS, DIM], &[1, 0], 0)?),
            dt_softplus: true,
            state_batch_indices: Some(TensorRef::from_slice(ssu_tables.slots, &ssu_tables.shape)?),
            pad_slot_id: Some(PAD as i64),
            num_accepted_tokens: ssu_tables.accepted.map(|a| TensorRef::from_slice(a, &[a.len()])).transpose()?,
            cu_seqlens: ssu_tables.cu_seqlens.map(|c| TensorRef::from_slice(c, &[c.len()])).transpose()?,
            ..SelectiveStateUpdateArgs::new(
                TensorMut::from_slice(&mut self.ssm_state, &[SLOTS, HEADS, DIM, DSTATE])?,
                view(&[rows, HEADS, DIM], &[row, p, 1], 0)?,
                TensorRef::from_slice(dt, &[rows, HEADS])?.with_layout(&[rows, HEADS, DIM], &[h, 1, 0], 0)?,
                TensorRef::from_slice(&self.a, &[HEADS])?.with_layout(&[HEADS, DIM, DSTATE], &[1, 0, 0], 0)?,
                view(&[rows, GROUPS, DSTATE], &[row, n, 1], HEADS * DIM)?,
                view(&[rows, GROUPS, DSTATE], &[row, n, 1], HEADS * DIM + GROUPS * DSTATE)?,
                TensorMut::from_slice(out, &[rows, HEADS, DIM])?,
            )
        })?;
        Ok(())
    }
}

/// The SSU's slot table: `[batch]` for decode, `[batch, T]` with the accepted counts and
/// `cu_seqlens` for a speculative step.
struct SsuTables<'a> {
    slots: &'a [i32],
    shape: Vec<usize>,
    accepted: Option<&'a [i32]>,
    cu_seqlens: Option<&'a [i32]>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = std::env::args().nth(1).map(|s| s.parse()).transpose()?.unwrap_or(64);
    let rt = Runtime::new(&Config::cpu(None))?;
    let mut layer = Layer::new();

    // Requests live in scattered slots; row 5 of the batch is padding.
    let slots: Vec<i32> = (0..BATCH).map(|b| if b == 5 { PAD } else { (b * 4 + 1) as i32 }).collect();
    let mut conv_out = vec![bf16::ZERO; BATCH * 3 * CONV_DIM];
    let mut out = vec![bf16::ZERO; BATCH * 3 * HEADS * DIM];

    let t0 = Instant::now();
    for step in 0..steps {
        let xbc = filled(BATCH * CONV_DIM, 100 + step as u64, 1.0);
        let dt = filled(BATCH * HEADS, 200 + step as u64, 1.0);
        let tables = SsuTables { slots: &slots, shape: vec![BATCH], accepted: None, cu_seqlens: None };
        layer.step(&rt, &xbc, &slots, &mut conv_out, &dt, tables, &mut out[..BATCH * HEADS * DIM])?;
    }
    let secs = t0.elapsed().as_secs_f64();
    rt.check()?;
    let live = BATCH - 1;
    println!(
        "decode: {steps} steps × {BATCH} rows ({live} live, 1 pad) of a {HEADS}-head Mamba2 layer: {:.0} tokens/s ({:.1} µs/step)",
        (steps * live) as f64 / secs,
        secs * 1e6 / steps as f64
    );
    let untouched = |slot: usize| {
        layer.ssm_state[slot * HEADS * DIM * DSTATE..(slot + 1) * HEADS * DIM * DSTATE].iter().all(|&v| v == 0.0)
    };
    println!("slot 0 (no request) untouched: {}; slot 1 (row 0) updated: {}", untouched(0), !untouched(1));

    // A speculative step: 3 draft tokens per sequence. Token t's state goes to column t of the
    // sequence's row of the table; the start state is column accepted − 1 of the previous
    // step's row (here every sequence accepted 1 token, so column 0: its decode slot).
    const T: usize = 3;
    let table: Vec<i32> = slots
        .iter()
        .enumerate()
        .flat_map(|(b, &s)| {
            // Draft slots come from a range no sequence reads this step (the plan refuses a
            // table where one sequence writes a slot another reads).
            let draft = [s, (32 + 2 * b) as i32, (33 + 2 * b) as i32];
            draft.map(|d| if s == PAD { PAD } else { d })
        })
        .collect();
    let accepted = vec![1i32; BATCH];
    let cu: Vec<i32> = (0..=BATCH as i32).map(|b| b * T as i32).collect();
    let xbc = filled(BATCH * T * CONV_DIM, 300, 1.0);
    let dt = filled(BATCH * T * HEADS, 301, 1.0);
    let reps = 8;
    let t0 = Instant::now();
    for _ in 0..reps {
        let tables =
            SsuTables { slots: &table, shape: vec![BATCH, T], accepted: Some(&accepted), cu_seqlens: Some(&cu) };
        layer.step(&rt, &xbc, &slots, &mut conv_out, &dt, tables, &mut out)?;
    }
    rt.check()?;
    println!(
        "speculative step: {BATCH} × {T} tokens, {:.1} µs per step (mean of {reps}); sequence 0's draft states in slots {:?}",
        t0.elapsed().as_secs_f64() * 1e6 / reps as f64,
        &table[..T]
    );
    Ok(())
}
