//! Property tests on fresh random inputs (seeded, so failures reproduce):
//! - the CPU chunked prefill equals the token-by-token f64 recurrence for K ≠ V and uneven
//!   varlen batches (empty sequences, chunk-boundary lengths, pads, mixed initial states);
//! - speculative decode over 3 steps with accepted counts 1..=num_spec+1 equals replaying only
//!   the accepted tokens; invalid accepted counts give zeros and leave the state unchanged;
//! - the CPU recurrent kernels equal the f32 reference on random inputs with null slots, in
//!   both layouts, with outputs poisoned with NaN (every row that must be written is written, and
//!   rows of skipped sequences are not) and untouched slots bit-identical.

mod common;

use common::{ChunkCase, GatingCase, Gen, RecCase, close, ints, nan, zeros};
use ssm_cpu::{CpuBackend, Par};
use ssm_gdn::reference::Reference;
use ssm_gdn::{ChunkScratch, FusedSigmoidGatingDeltaRuleUpdateArgs, Planned, Run, StateLayout, plan};
use ssm_tensor::{DType, HostTensor};

fn backends() -> Vec<(&'static str, CpuBackend)> {
    vec![
        ("cpu-seq", CpuBackend::new(Par::Seq).unwrap()),
        ("cpu-2t", CpuBackend::new(Par::Threads(std::num::NonZeroUsize::new(2).unwrap())).unwrap()),
    ]
}

/// Slot bytes of a `[slots, …]` pool.
fn slot_bytes(b: &HostTensor, slot: usize) -> &[u8] {
    let per = b.bytes().len() / b.shape[0];
    &b.bytes()[slot * per..(slot + 1) * per]
}

fn assert_untouched(label: &str, before: &HostTensor, after: &HostTensor, touched: &[usize]) {
    for s in 0..before.shape[0] {
        if !touched.contains(&s) {
            assert_eq!(slot_bytes(before, s), slot_bytes(after, s), "{label}: untouched slot {s} changed");
        }
    }
}

fn layouts() -> [StateLayout; 2] {
    [StateLayout::VK, StateLayout::KV]
}

fn state_shape(layout: StateLayout, rows: usize, hv: usize, k: usize, v: usize) -> Vec<usize> {
    match layout {
        StateLayout::VK => vec![rows, hv, v, k],
        StateLayout::KV => vec![rows, hv, k, v],
    }
}

#[test]
fn chunked_prefill_equals_f64_recurrence() {
    let dims = [(16usize, 40usize), (72, 24), (8, 136), (40, 8)];
    let lens_pool = [0usize, 1, 5, 63, 64, 65, 130, 17];
    let mut rng = Gen::new(0x005e_edc4);
    for case in 0..8 {
        let (k, v) = dims[case % dims.len()];
        let h = 1 + rng.below(2);
        let hv = h * (1 + rng.below(3));
        let n = 2 + rng.below(3);
        let lens: Vec<usize> = (0..n).map(|_| lens_pool[rng.below(lens_pool.len())]).collect();
        let t: usize = lens.iter().sum();
        let mut cu = vec![0i64];
        for l in &lens {
            cu.push(cu.last().unwrap() + *l as i64);
        }
        let slots = n + 3;
        let perm = rng.perm(slots);
        let mut idx: Vec<i64> = perm[..n].iter().map(|&s| s as i64).collect();
        let pad_seq = rng.below(n + 1); // n = no pad
        if pad_seq < n {
            idx[pad_seq] = -1;
        }
        let has: Vec<i64> = (0..n).map(|_| rng.below(3).min(1) as i64).collect();
        let io = if case % 2 == 0 { DType::F32 } else { DType::BF16 };
        let layout = layouts()[case % 2];
        let decay_scale = if case % 3 == 0 { 3.0 } else { 0.3 };
        let mut base = ChunkCase {
            q: rng.normal_buf(io, &[1, t, h, k], 1.0),
            k: rng.normal_buf(io, &[1, t, h, k], 1.0),
            v: rng.normal_buf(io, &[1, t, hv, v], 1.0),
            g: rng.range_buf(DType::F32, &[1, t, hv], -decay_scale, -0.001),
            beta: rng.range_buf(io, &[1, t, hv], 0.05, 0.95),
            state: Some(rng.normal_buf(DType::F32, &state_shape(layout, slots, hv, k, v), 0.5)),
            indices: Some(ints(DType::I64, &[n], &idx)),
            has_initial_state: Some(ints(DType::Bool, &[n], &has)),
            pad_slot_id: Some(-1),
            inplace: true,
            final_state: Some(nan(DType::F32, &state_shape(layout, n, hv, k, v))),
            cu: Some(ints(DType::I32, &[n + 1], &cu)),
            o: nan(DType::F32, &[1, t, hv, v]),
            scratch: None,
            layout,
        };
        let mut want = base.clone();
        want.run(&Reference::F64).unwrap();
        for (label, be) in backends() {
            let mut got = base.clone();
            if case % 4 == 1 {
                let need = {
                    let args = got.args();
                    let p = ssm_tensor::Op::plan(&args).unwrap();
                    be.chunk_gated_delta_rule_scratch_size(&p)
                };
                got.scratch = Some(nan(DType::F32, &[need]));
            }
            got.run(&be).unwrap();
            let what = format!(
                "{label} case {case} K={k} V={v} H={h} HV={hv} lens={lens:?} idx={idx:?} has={has:?} {layout:?}"
            );
            close(&format!("{what} o"), &got.o, &want.o, 2e-4, 2e-3).unwrap();
            close(
                &format!("{what} final_state"),
                got.final_state.as_ref().unwrap(),
                want.final_state.as_ref().unwrap(),
                2e-4,
                2e-3,
            )
            .unwrap();
            close(&format!("{what} pool"), got.state.as_ref().unwrap(), want.state.as_ref().unwrap(), 2e-4, 2e-3)
                .unwrap();
            // Every non-pad sequence's rows are written; a pad sequence's rows stay NaN.
            for (s, l) in lens.iter().enumerate() {
                for tok in cu[s] as usize..cu[s] as usize + l {
                    for e in 0..hv * v {
                        let x = got.o.view().elem_f64(tok * hv * v + e);
                        assert_eq!(x.is_nan(), idx[s] == -1, "{what}: o row of token {tok}");
                    }
                }
            }
            let written: Vec<usize> = idx.iter().filter(|&&x| x >= 0).map(|&x| x as usize).collect();
            assert_untouched(&what, base.state.as_ref().unwrap(), got.state.as_ref().unwrap(), &written);
        }
        base.o = nan(DType::F32, &[1, t, hv, v]);
    }
}

/// One speculative step: every sequence runs `q_len` draft tokens from column `na − 1`.
struct SpecBatch {
    k: usize,
    v: usize,
    h: usize,
    hv: usize,
    q_len: usize,
    cols: usize,
}

impl SpecBatch {
    fn tokens(&self, rng: &mut Gen, t: usize) -> [HostTensor; 5] {
        let (h, hv, k, v) = (self.h, self.hv, self.k, self.v);
        [
            rng.normal_buf(DType::F32, &[1, t, h, k], 1.0),
            rng.normal_buf(DType::F32, &[1, t, h, k], 1.0),
            rng.normal_buf(DType::F32, &[1, t, hv, v], 1.0),
            rng.range_buf(DType::F32, &[1, t, hv], -0.8, -0.01),
            rng.range_buf(DType::F32, &[1, t, hv], 0.05, 0.95),
        ]
    }
}

/// Rows `lo..hi` along the token axis (axis 1) of a `[1, T, …]` buffer.
fn token_rows(b: &HostTensor, lo: usize, hi: usize) -> HostTensor {
    let per = b.view().numel() / b.shape[1];
    let es = b.dtype.size();
    let mut shape = b.shape.clone();
    shape[1] = hi - lo;
    HostTensor::from_bytes(b.dtype, shape, &b.bytes()[lo * per * es..hi * per * es])
}

fn concat_tokens(parts: &[HostTensor]) -> HostTensor {
    let mut shape = parts[0].shape.clone();
    shape[1] = parts.iter().map(|p| p.shape[1]).sum();
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.bytes().to_vec()).collect();
    HostTensor::from_bytes(parts[0].dtype, shape, &bytes)
}

/// Replays `tokens` (q, k, v, g, beta) from `s0` (one head-block state of shape `[1, …]`) with
/// the f64 reference; returns the outputs and the final state.
fn replay(tokens: &[HostTensor; 5], s0: &HostTensor, layout: StateLayout) -> (HostTensor, HostTensor) {
    let t = tokens[0].shape[1];
    let (hv, v) = (tokens[2].shape[2], tokens[2].shape[3]);
    let mut pool_shape = s0.shape.clone();
    pool_shape[0] = 2;
    let mut pool = zeros(DType::F32, &pool_shape);
    let per = s0.view().numel();
    for i in 0..per {
        pool.view_mut().set_f64(per + i, s0.view().elem_f64(i));
    }
    let mut c = RecCase {
        q: tokens[0].clone(),
        k: tokens[1].clone(),
        v: tokens[2].clone(),
        g: tokens[3].clone(),
        beta: Some(tokens[4].clone()),
        state: Some(pool),
        final_state: None,
        cu: Some(ints(DType::I32, &[2], &[0, t as i64])),
        ix: Some(ints(DType::I32, &[1], &[1])),
        na: None,
        o: nan(DType::F32, &[1, t, hv, v]),
        scale: None,
        l2norm: true,
        layout,
    };
    c.run(&Reference::F64).unwrap();
    let pool = c.state.unwrap();
    let mut st = s0.clone();
    for i in 0..per {
        st.view_mut().set_f64(i, pool.view().elem_f64(per + i));
    }
    (c.o, st)
}

#[test]
fn speculative_decode_equals_replaying_accepted_tokens() {
    let cfg = SpecBatch { k: 24, v: 16, h: 1, hv: 2, q_len: 3, cols: 3 };
    let num_seqs = 3;
    for layout in layouts() {
        for (label, be) in backends() {
            let mut rng = Gen::new(0x5bec + layout as u64);
            // Slot 0 is the null block; sequence n owns slots 1 + 3n .. 4 + 3n; a fourth, padded
            // sequence has null entries in every column.
            let slots = 1 + num_seqs * cfg.cols + 2;
            let shape = state_shape(layout, slots, cfg.hv, cfg.k, cfg.v);
            let mut pool = rng.normal_buf(DType::F32, &shape, 0.5);
            let table: Vec<i64> = (0..num_seqs)
                .flat_map(|n| (0..cfg.cols).map(move |c| (1 + n * cfg.cols + c) as i64))
                .chain([0, 0, 0])
                .collect();
            let per_slot = pool.view().numel() / slots;
            let block = |p: &HostTensor, slot: usize| {
                let mut sh = shape.clone();
                sh[0] = 1;
                HostTensor::from_f32(
                    DType::F32,
                    sh.clone(),
                    &(0..per_slot).map(|i| p.view().elem_f64(slot * per_slot + i) as f32).collect::<Vec<_>>(),
                )
            };
            // History per sequence: the initial state (column 0) and the accepted tokens so far.
            let s0: Vec<HostTensor> = (0..num_seqs).map(|n| block(&pool, table[n * cfg.cols] as usize)).collect();
            let mut history: Vec<Vec<[HostTensor; 5]>> = vec![Vec::new(); num_seqs];
            let mut accepted = vec![1i64; num_seqs + 1];
            for step in 0..3 {
                let t = (num_seqs + 1) * cfg.q_len;
                let toks = cfg.tokens(&mut rng, t);
                let before = pool.clone();
                let mut c = RecCase {
                    q: toks[0].clone(),
                    k: toks[1].clone(),
                    v: toks[2].clone(),
                    g: toks[3].clone(),
                    beta: Some(toks[4].clone()),
                    state: Some(pool.clone()),
                    final_state: None,
                    cu: Some(ints(
                        DType::I32,
                        &[num_seqs + 2],
                        &(0..=num_seqs + 1).map(|i| (i * cfg.q_len) as i64).collect::<Vec<_>>(),
                    )),
                    ix: Some(ints(DType::I32, &[num_seqs + 1, cfg.cols], &table)),
                    na: Some(ints(DType::I32, &[num_seqs + 1], &accepted)),
                    o: nan(DType::F32, &[1, t, cfg.hv, cfg.v]),
                    scale: None,
                    l2norm: true,
                    layout,
                };
                c.run(&be).unwrap();
                for n in 0..num_seqs {
                    let lo = n * cfg.q_len;
                    let drafts: [HostTensor; 5] = std::array::from_fn(|i| token_rows(&toks[i], lo, lo + cfg.q_len));
                    let mut all: Vec<[HostTensor; 5]> = history[n].clone();
                    all.push(drafts.clone());
                    let joined: [HostTensor; 5] =
                        std::array::from_fn(|i| concat_tokens(&all.iter().map(|x| x[i].clone()).collect::<Vec<_>>()));
                    let (o_ref, _) = replay(&joined, &s0[n], layout);
                    let tot = joined[0].shape[1];
                    let what = format!("{label} {layout:?} step {step} seq {n} accepted {}", accepted[n]);
                    close(
                        &format!("{what} o"),
                        &token_rows(&c.o, lo, lo + cfg.q_len),
                        &token_rows(&o_ref, tot - cfg.q_len, tot),
                        1e-5,
                        1e-4,
                    )
                    .unwrap();
                    // Column t holds the state after draft token t.
                    for col in 0..cfg.q_len {
                        let mut upto = history[n].clone();
                        upto.push(std::array::from_fn(|i| token_rows(&drafts[i], 0, col + 1)));
                        let joined: [HostTensor; 5] = std::array::from_fn(|i| {
                            concat_tokens(&upto.iter().map(|x| x[i].clone()).collect::<Vec<_>>())
                        });
                        let (_, st) = replay(&joined, &s0[n], layout);
                        let got = block(c.state.as_ref().unwrap(), table[n * cfg.cols + col] as usize);
                        close(&format!("{what} column {col}"), &got, &st, 1e-5, 1e-4).unwrap();
                    }
                    // Accept 1..=num_spec+1 tokens, a different count per sequence and step.
                    let a = ((n + step) % (cfg.cols)) + 1;
                    history[n].push(std::array::from_fn(|i| token_rows(&drafts[i], 0, a)));
                    accepted[n] = a as i64;
                }
                // The padded sequence: null read slot, nothing written (its o rows stay NaN).
                let lo = num_seqs * cfg.q_len;
                assert!(
                    token_rows(&c.o, lo, lo + cfg.q_len)
                        .bytes()
                        .chunks(4)
                        .all(|b| f32::from_le_bytes(b.try_into().unwrap()).is_nan())
                );
                let touched: Vec<usize> = table[..num_seqs * cfg.cols].iter().map(|&x| x as usize).collect();
                assert_untouched(label, &before, c.state.as_ref().unwrap(), &touched);
                pool = c.state.unwrap();
            }
        }
    }
}

#[test]
fn invalid_accepted_count_gives_zeros_and_keeps_the_state() {
    for layout in layouts() {
        for (label, be) in backends() {
            let mut rng = Gen::new(99);
            let (h, hv, k, v, cols) = (1, 2, 16, 8, 3);
            let pool = rng.normal_buf(DType::BF16, &state_shape(layout, 8, hv, k, v), 0.5);
            for bad in [0i64, 4, -3] {
                let mut c = RecCase {
                    q: rng.normal_buf(DType::F32, &[1, 5, h, k], 1.0),
                    k: rng.normal_buf(DType::F32, &[1, 5, h, k], 1.0),
                    v: rng.normal_buf(DType::F32, &[1, 5, hv, v], 1.0),
                    g: rng.range_buf(DType::F32, &[1, 5, hv], -0.8, -0.01),
                    beta: Some(rng.range_buf(DType::F32, &[1, 5, hv], 0.05, 0.95)),
                    state: Some(pool.clone()),
                    final_state: None,
                    cu: Some(ints(DType::I32, &[3], &[0, 3, 5])),
                    ix: Some(ints(DType::I32, &[2, cols], &[1, 2, 3, 4, 5, 6])),
                    na: Some(ints(DType::I32, &[2], &[bad, 2])),
                    o: nan(DType::F32, &[1, 5, hv, v]),
                    scale: None,
                    l2norm: true,
                    layout,
                };
                c.run(&be).unwrap();
                let o0 = token_rows(&c.o, 0, 3);
                assert!(
                    (0..o0.view().numel()).all(|i| o0.view().elem_f64(i) == 0.0),
                    "{label} accepted {bad}: o must be zeros"
                );
                assert!(
                    (0..2 * hv * v).all(|i| c.o.view().elem_f64(3 * hv * v + i).is_finite()),
                    "{label}: valid sequence written"
                );
                assert_untouched(label, &pool, c.state.as_ref().unwrap(), &[4, 5, 6]);
            }
        }
    }
}

/// A random recurrent call: decode rows, multi-token rows, empty rows and null slots.
fn random_recurrent(rng: &mut Gen, case: usize) -> (RecCase, Vec<i64>, Vec<usize>) {
    let dims = [(8usize, 12usize), (96, 40), (1024, 40), (20, 136), (64, 32)];
    let (k, v) = dims[case % dims.len()];
    let h = 1 + rng.below(2);
    let hv = h * (1 + rng.below(3));
    let n = 1 + rng.below(5);
    let multi = case % 3 == 2;
    let lens: Vec<usize> = (0..n).map(|_| if multi { rng.below(4) } else { rng.below(4).min(1) }).collect();
    let t: usize = lens.iter().sum::<usize>().max(1);
    let mut cu = vec![0i64];
    for l in &lens {
        cu.push(cu.last().unwrap() + *l as i64);
    }
    let layout = layouts()[case % 2];
    let cols = if multi { 3 } else { 1 };
    // Slot 0 is the null block; every sequence gets its own slots (one per column).
    let slots = cols * n + 2;
    let free = rng.perm(slots - 1);
    let mut table: Vec<i64> = (0..n * cols).map(|i| (1 + free[i]) as i64).collect();
    for s in 0..n {
        if rng.below(4) == 0 {
            table[s * cols] = [0, -1][rng.below(2)];
        }
        if multi && rng.below(4) == 0 {
            table[s * cols + 1] = 0;
        }
    }
    let state_dt = if case % 4 == 3 { DType::BF16 } else { DType::F32 };
    let io = if case.is_multiple_of(2) { DType::BF16 } else { DType::F32 };
    let headwise = case % 5 == 1;
    let ix = if multi { ints(DType::I64, &[n, cols], &table) } else { ints(DType::I32, &[n], &table) };
    let c = RecCase {
        q: rng.normal_buf(io, &[1, t, h, k], 1.0),
        k: rng.normal_buf(io, &[1, t, h, k], 1.0),
        v: rng.normal_buf(io, &[1, t, hv, v], 1.0),
        g: rng.range_buf(DType::F32, &[1, t, hv], -1.5, -0.001),
        beta: Some(if headwise {
            rng.range_buf(DType::F32, &[1, t, hv, v], 0.05, 0.95)
        } else {
            rng.range_buf(io, &[1, t, hv], 0.05, 0.95)
        }),
        state: Some(rng.normal_buf(state_dt, &state_shape(layout, slots, hv, k, v), 0.5)),
        final_state: None,
        cu: Some(ints(DType::I32, &[n + 1], &cu)),
        ix: Some(ix),
        na: None,
        o: nan(DType::F32, &[1, t, hv, v]),
        scale: if case % 2 == 1 { Some(0.3) } else { None },
        l2norm: case % 6 != 5,
        layout,
    };
    (c, table, lens)
}

#[test]
fn cpu_recurrent_matches_reference_with_null_slots() {
    let mut rng = Gen::new(0xdec0de);
    for case in 0..20 {
        let (base, table, lens) = random_recurrent(&mut rng, case);
        let cols = table.len() / lens.len();
        let mut want = base.clone();
        want.run(&Reference::F32).unwrap();
        let state_tol = if base.state.as_ref().unwrap().dtype == DType::BF16 { (1e-2, 1e-2) } else { (1e-5, 1e-4) };
        for (label, be) in backends() {
            let mut got = base.clone();
            got.run(&be).unwrap();
            let what = format!("{label} case {case} lens={lens:?} table={table:?} {:?}", base.layout);
            close(&format!("{what} o"), &got.o, &want.o, 1e-5, 1e-4).unwrap();
            close(
                &format!("{what} state"),
                got.state.as_ref().unwrap(),
                want.state.as_ref().unwrap(),
                state_tol.0,
                state_tol.1,
            )
            .unwrap();
            let mut touched = Vec::new();
            for (s, &l) in lens.iter().enumerate() {
                let skipped = table[s * cols] <= 0;
                if !skipped && l > 0 {
                    touched.extend(table[s * cols..(s + 1) * cols].iter().filter(|&&x| x > 0).map(|&x| x as usize));
                }
            }
            assert_untouched(&what, base.state.as_ref().unwrap(), got.state.as_ref().unwrap(), &touched);
        }
    }
}

/// The CPU backend's multi-token path for a K-major pool (several tokens from a slot, stored
/// back to the pool: read once, each token's state written to its column's slot) against the
/// same call with `final_state` (the tile path: the pool read-only, token t's state in row
/// bos + t), bit for bit: `o`, and each written slot against its `final_state` row. Column
/// blocks of every width the path takes (V = 128, 96, 64 and 24), f32 and bf16 state.
#[test]
fn kv_multi_token_path_equals_the_tile_path_bit_for_bit() {
    let mut rng = Gen::new(0x6b76);
    for (k, v) in [(128usize, 128usize), (20, 96), (64, 64), (40, 24)] {
        for state_dt in [DType::F32, DType::BF16] {
            let (h, hv, cols) = (1, 2, 4);
            let lens = [3usize, 4, 2];
            let n = lens.len();
            let t: usize = lens.iter().sum();
            let mut cu = vec![0i64];
            for l in lens {
                cu.push(cu.last().unwrap() + l as i64);
            }
            // Slot 0 is the null block: every token gets a slot of its own after it.
            let slots = n * cols + 1;
            let perm = rng.perm(slots - 1);
            let table: Vec<i64> = (0..n * cols).map(|i| 1 + perm[i] as i64).collect();
            let layout = StateLayout::KV;
            let multi = RecCase {
                q: rng.normal_buf(DType::BF16, &[1, t, h, k], 1.0),
                k: rng.normal_buf(DType::BF16, &[1, t, h, k], 1.0),
                v: rng.normal_buf(DType::BF16, &[1, t, hv, v], 1.0),
                g: rng.range_buf(DType::F32, &[1, t, hv], -1.0, -0.01),
                beta: Some(rng.range_buf(DType::F32, &[1, t, hv], 0.05, 0.95)),
                state: Some(rng.normal_buf(state_dt, &state_shape(layout, slots, hv, k, v), 0.5)),
                final_state: None,
                cu: Some(ints(DType::I32, &[n + 1], &cu)),
                ix: Some(ints(DType::I64, &[n, cols], &table)),
                na: None,
                o: nan(DType::F32, &[1, t, hv, v]),
                scale: None,
                l2norm: true,
                layout,
            };
            let mut tile = multi.clone();
            tile.final_state = Some(nan(state_dt, &state_shape(layout, t, hv, k, v)));
            for (label, be) in backends() {
                let what = format!("{label} K={k} V={v} {state_dt}");
                let (mut a, mut b) = (multi.clone(), tile.clone());
                a.run(&be).unwrap();
                b.run(&be).unwrap();
                assert_eq!(a.o.bytes(), b.o.bytes(), "{what}: o");
                let (pool, fin) = (a.state.as_ref().unwrap(), b.final_state.as_ref().unwrap());
                for (s, &l) in lens.iter().enumerate() {
                    for tok in 0..l {
                        let slot = table[s * cols + tok] as usize;
                        let row = (cu[s] as usize) + tok;
                        assert!(slot_bytes(pool, slot) == slot_bytes(fin, row), "{what}: seq {s} token {tok}");
                    }
                }
            }
        }
    }
}

#[test]
fn not_in_place_final_states_match_reference() {
    let mut rng = Gen::new(0xf1a1);
    for layout in layouts() {
        let (h, hv, k, v, t) = (2, 4, 40, 24, 7);
        let base = RecCase {
            q: rng.normal_buf(DType::BF16, &[1, t, h, k], 1.0),
            k: rng.normal_buf(DType::BF16, &[1, t, h, k], 1.0),
            v: rng.normal_buf(DType::BF16, &[1, t, hv, v], 1.0),
            g: rng.range_buf(DType::F32, &[1, t, hv], -1.0, -0.01),
            beta: None,
            state: Some(rng.normal_buf(DType::F32, &state_shape(layout, 4, hv, k, v), 0.5)),
            final_state: Some(nan(DType::BF16, &state_shape(layout, t, hv, k, v))),
            cu: Some(ints(DType::I32, &[4], &[0, 3, 3, 7])),
            ix: Some(ints(DType::I32, &[3, 2], &[2, 1, 0, 0, 3, 3])),
            na: Some(ints(DType::I32, &[3], &[2, 1, 1])),
            o: nan(DType::F32, &[1, t, hv, v]),
            scale: None,
            l2norm: true,
            layout,
        };
        let mut want = base.clone();
        want.run(&Reference::F32).unwrap();
        for (label, be) in backends() {
            let mut got = base.clone();
            got.run(&be).unwrap();
            close(&format!("{label} o"), &got.o, &want.o, 1e-5, 1e-4).unwrap();
            close(
                &format!("{label} final_state"),
                got.final_state.as_ref().unwrap(),
                want.final_state.as_ref().unwrap(),
                1e-2,
                1e-2,
            )
            .unwrap();
            assert_eq!(
                got.state.as_ref().unwrap().bytes(),
                base.state.as_ref().unwrap().bytes(),
                "{label}: pool is read-only"
            );
        }
    }
}

#[test]
fn sigmoid_gating_matches_reference_and_gating_plus_recurrent() {
    let mut rng = Gen::new(0x516);
    for layout in layouts() {
        let (h, hv, k, v, n) = (2, 4, 32, 48, 5);
        let (mut base, _, _) = random_recurrent(&mut rng, 0);
        base.q = rng.normal_buf(DType::BF16, &[1, n, h, k], 1.0);
        base.k = rng.normal_buf(DType::BF16, &[1, n, h, k], 1.0);
        base.v = rng.normal_buf(DType::BF16, &[1, n, hv, v], 1.0);
        base.state = Some(rng.normal_buf(DType::F32, &state_shape(layout, n + 2, hv, k, v), 0.5));
        base.cu = Some(ints(DType::I32, &[n + 1], &(0..=n as i64).collect::<Vec<_>>()));
        base.ix = Some(ints(DType::I32, &[n], &[3, 0, 1, 6, 2]));
        base.o = nan(DType::F32, &[1, n, hv, v]);
        base.layout = layout;
        let gating = GatingCase {
            a_log: rng.range_buf(DType::F32, &[hv], 0.0, 2.7),
            a: rng.normal_buf(DType::BF16, &[n, hv], 2.0),
            b: rng.normal_buf(DType::BF16, &[n, hv], 2.0),
            dt_bias: rng.normal_buf(DType::BF16, &[hv], 1.0),
        };
        let run = |c: &mut RecCase, be: &dyn Fn(Planned<FusedSigmoidGatingDeltaRuleUpdateArgs<'_>>)| {
            be(plan(gating.sigmoid_args(c.args())).unwrap());
        };
        let mut want = base.clone();
        run(&mut want, &|call| Reference::F32.run(call).unwrap());
        // The same call as fused_gdn_gating (g, β in f32) + fused_recurrent.
        let mut g = nan(DType::F32, &[1, n, hv]);
        let mut beta = nan(DType::F32, &[1, n, hv]);
        CpuBackend::new(Par::Seq).unwrap().run(plan(gating.args(&mut g, &mut beta)).unwrap()).unwrap();
        let mut split = base.clone();
        split.g = g;
        split.beta = Some(beta);
        split.run(&Reference::F32).unwrap();
        close("gating + recurrent o", &split.o, &want.o, 1e-5, 1e-4).unwrap();
        close("gating + recurrent state", split.state.as_ref().unwrap(), want.state.as_ref().unwrap(), 1e-6, 1e-5)
            .unwrap();
        for (label, be) in backends() {
            let mut got = base.clone();
            run(&mut got, &|call| be.run(call).unwrap());
            close(&format!("{label} o"), &got.o, &want.o, 1e-5, 1e-4).unwrap();
            close(&format!("{label} state"), got.state.as_ref().unwrap(), want.state.as_ref().unwrap(), 1e-5, 1e-4)
                .unwrap();
            assert_untouched(label, base.state.as_ref().unwrap(), got.state.as_ref().unwrap(), &[3, 1, 6, 2]);
        }
    }
}
