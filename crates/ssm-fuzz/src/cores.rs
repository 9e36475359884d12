//! Template calls of the ops without golden vectors. The two layer cores: mixed batches (speculative sequences, decodes with a
//! padded row, prefills with and without initial state), as the cores' own tests in
//! `ssm-dispatch` build them; `checkpointing_ssu` over rings with history; and `copy_rows`.

use ssm_conv::{Activation, ConvStateLayout};
use ssm_dispatch::{GdnAttentionCoreArgs, GdnAttentionMetadata, Mamba2AttentionMetadata, Mamba2MixerCoreArgs};
use ssm_gdn::StateLayout;
use ssm_tensor::{DType, HostTensor};

/// `n` deterministic values in `[offset - scale, offset + scale)` (xorshift from `seed`).
pub fn values(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale + offset
        })
        .collect()
}

fn t(shape: &[usize], seed: u64, scale: f32, offset: f32) -> HostTensor {
    HostTensor::from_f32(DType::F32, shape.to_vec(), &values(shape.iter().product(), seed, scale, offset))
}

fn ints(v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::I32, vec![v.len()], v)
}

fn bools(v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::Bool, vec![v.len()], v)
}

/// One sequence of a layer-core batch ([`GdnCoreCase::batch`], [`Mamba2CoreCase::batch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreSeq {
    /// One token through `slot` (0: the pad slot), its state read (`num_computed_tokens > 0`).
    Decode {
        /// Its slot.
        slot: i64,
    },
    /// A speculative step of `1 + drafts` tokens through a row of `1 + drafts` slots (column 0:
    /// the state read and the conv rolling buffer; column t: the state after token t).
    Spec {
        /// The slot row (its first `1 + drafts` entries are used).
        slots: [i64; 3],
        /// Draft tokens.
        drafts: usize,
        /// Tokens the previous step accepted (`num_accepted_tokens`).
        accepted: i64,
    },
    /// `len` new tokens after `computed` (0: a fresh sequence, no initial state).
    Prefill {
        /// New tokens.
        len: usize,
        /// Its slot.
        slot: i64,
        /// Tokens computed before this step.
        computed: i64,
    },
}

impl CoreSeq {
    /// Tokens of this step.
    pub fn tokens(&self) -> usize {
        match *self {
            CoreSeq::Decode { .. } => 1,
            CoreSeq::Spec { drafts, .. } => 1 + drafts,
            CoreSeq::Prefill { len, .. } => len,
        }
    }

    /// The largest slot it names.
    fn max_slot(&self) -> i64 {
        match *self {
            CoreSeq::Decode { slot } | CoreSeq::Prefill { slot, .. } => slot,
            CoreSeq::Spec { slots, drafts, .. } => slots[..=drafts].iter().copied().max().unwrap_or(0),
        }
    }
}

/// Offsets `[0, l0, l0 + l1, …]` of `lens`.
fn starts_of(lens: impl IntoIterator<Item = usize>) -> Vec<i64> {
    std::iter::once(0)
        .chain(lens.into_iter().scan(0i64, |acc, l| {
            *acc += l as i64;
            Some(*acc)
        }))
        .collect()
}

/// The first batch row of each of `seqs`, their tokens laid out in order.
pub fn first_rows(seqs: &[CoreSeq]) -> Vec<usize> {
    starts_of(seqs.iter().map(CoreSeq::tokens)).iter().map(|&r| r as usize).collect()
}

/// The sequence counts of a GDN core batch (`GdnAttentionMetadata`'s scalar fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdnCounts {
    /// `num_prefills`, `num_prefill_tokens`.
    pub prefills: (usize, usize),
    /// `num_decodes`, `num_decode_tokens`.
    pub decodes: (usize, usize),
    /// `num_spec_decodes`, `num_spec_decode_tokens`.
    pub spec: (usize, usize),
}

impl GdnCounts {
    /// The counts of `seqs`.
    pub fn of(seqs: &[CoreSeq]) -> Self {
        let mut c = GdnCounts::default();
        for s in seqs {
            let n = s.tokens();
            let slot = match s {
                CoreSeq::Decode { .. } => &mut c.decodes,
                CoreSeq::Spec { .. } => &mut c.spec,
                CoreSeq::Prefill { .. } => &mut c.prefills,
            };
            slot.0 += 1;
            slot.1 += n;
        }
        c
    }

    /// Writes the counts into `m` (`num_actual_tokens` their sum).
    pub fn apply(&self, m: &mut GdnAttentionMetadata<'_>) {
        (m.num_prefills, m.num_prefill_tokens) = self.prefills;
        (m.num_decodes, m.num_decode_tokens) = self.decodes;
        (m.num_spec_decodes, m.num_spec_decode_tokens) = self.spec;
        m.num_actual_tokens = self.prefills.1 + self.decodes.1 + self.spec.1;
    }
}

/// The metadata tables of a GDN core batch, vLLM's `GDNAttentionMetadata` (non-speculative
/// sequences: decodes first, then prefills; speculative ones in their own rows), each `None`
/// where vLLM passes none: `[has_initial_state, spec_query_start_loc, non_spec_query_start_loc,
/// spec_state_indices_tensor ([n, 1 + drafts]), non_spec_state_indices_tensor, spec_token_indx,
/// non_spec_token_indx, num_accepted_tokens]`. `rows`: each sequence's first batch row (its
/// tokens follow it).
pub fn gdn_tables(seqs: &[CoreSeq], rows: &[usize]) -> [Option<HostTensor>; 8] {
    let spec: Vec<usize> = (0..seqs.len()).filter(|&i| matches!(seqs[i], CoreSeq::Spec { .. })).collect();
    let decodes = (0..seqs.len()).filter(|&i| matches!(seqs[i], CoreSeq::Decode { .. }));
    let other: Vec<usize> =
        decodes.chain((0..seqs.len()).filter(|&i| matches!(seqs[i], CoreSeq::Prefill { .. }))).collect();
    let token_rows = |list: &[usize]| -> Vec<i64> {
        list.iter().flat_map(|&i| (rows[i]..rows[i] + seqs[i].tokens()).map(|r| r as i64)).collect()
    };
    let some = |v: Vec<i64>| (!v.is_empty()).then(|| ints(&v));
    let has: Vec<i64> = other
        .iter()
        .map(|&i| match seqs[i] {
            CoreSeq::Prefill { computed, .. } => i64::from(computed > 0),
            _ => 1,
        })
        .collect();
    let width = spec.iter().map(|&i| seqs[i].tokens()).max().unwrap_or(0);
    let spec_slots: Vec<i64> = spec
        .iter()
        .flat_map(|&i| match seqs[i] {
            CoreSeq::Spec { slots, .. } => slots[..width].to_vec(),
            _ => unreachable!("speculative sequences only"),
        })
        .collect();
    let other_slots: Vec<i64> = other.iter().map(|&i| seqs[i].max_slot()).collect();
    let accepted: Vec<i64> = spec
        .iter()
        .map(|&i| match seqs[i] {
            CoreSeq::Spec { accepted, .. } => accepted,
            _ => unreachable!("speculative sequences only"),
        })
        .collect();
    [
        (!other.is_empty()).then(|| bools(&has)),
        (!spec.is_empty()).then(|| ints(&starts_of(spec.iter().map(|&i| seqs[i].tokens())))),
        (!other.is_empty()).then(|| ints(&starts_of(other.iter().map(|&i| seqs[i].tokens())))),
        (!spec.is_empty()).then(|| HostTensor::from_i64(DType::I32, vec![spec.len(), width], &spec_slots)),
        some(other_slots),
        some(token_rows(&spec)),
        // Without speculative sequences vLLM passes none: every row is the others'.
        if spec.is_empty() { None } else { some(token_rows(&other)) },
        some(accepted),
    ]
}

/// A Qwen3-Next layer step over a batch of [`CoreSeq`]s, tokens laid out in the batch's order.
/// [`GdnCoreCase::new`]: decode, 3-token speculative, prefill of 70 (resumed), speculative,
/// decode on the pad slot, fresh prefill of 5.
pub struct GdnCoreCase {
    mixed: HostTensor,
    a: HostTensor,
    b: HostTensor,
    weight: HostTensor,
    bias: HostTensor,
    a_log: HostTensor,
    dt_bias: HostTensor,
    conv: HostTensor,
    ssm: HostTensor,
    out: HostTensor,
    tables: [Option<HostTensor>; 8],
    counts: GdnCounts,
}

const GH: usize = 2;
const GK: usize = 16;
const GHV: usize = 4;
const GV: usize = 8;
const G_CONV: usize = 2 * GH * GK + GHV * GV;
/// The layer cores' conv-state columns: width − 1 + 2 drafts.
const CORE_STATE_LEN: usize = 5;

impl GdnCoreCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        use CoreSeq::*;
        Self::batch(
            &[
                Decode { slot: 7 },
                Spec { slots: [1, 2, 3], drafts: 2, accepted: 1 },
                Prefill { len: 70, slot: 9, computed: 4 },
                Spec { slots: [4, 5, 6], drafts: 2, accepted: 2 },
                Decode { slot: 0 },
                Prefill { len: 5, slot: 10, computed: 0 },
            ],
            seed,
        )
    }

    /// A step over `seqs` (at most 2 drafts each), values from `seed`; pools of at least 16
    /// slots.
    pub fn batch(seqs: &[CoreSeq], seed: u64) -> Self {
        let tokens: usize = seqs.iter().map(CoreSeq::tokens).sum();
        let slots = seqs.iter().map(|q| q.max_slot() as usize + 1).max().unwrap_or(0).max(16);
        let s = seed.wrapping_mul(16);
        GdnCoreCase {
            mixed: t(&[tokens, G_CONV], s + 1, 1.0, 0.0),
            a: t(&[tokens, GHV], s + 2, 2.0, 0.0),
            b: t(&[tokens, GHV], s + 3, 2.0, 0.0),
            weight: t(&[G_CONV, 4], s + 4, 0.5, 0.0),
            bias: t(&[G_CONV], s + 5, 0.1, 0.0),
            a_log: t(&[GHV], s + 6, 1.0, 0.0),
            dt_bias: t(&[GHV], s + 7, 0.5, 0.0),
            conv: t(&[slots, CORE_STATE_LEN, G_CONV], s + 8, 1.0, 0.0),
            ssm: t(&[slots, GHV, GV, GK], s + 9, 0.5, 0.0),
            out: HostTensor::filled(DType::F32, vec![tokens, GHV, GV], 7.0),
            tables: gdn_tables(seqs, &first_rows(seqs)),
            counts: GdnCounts::of(seqs),
        }
    }

    /// The core call over the case's tensors.
    pub fn args(&mut self) -> GdnAttentionCoreArgs<'_> {
        let [has, sq, nq, st, nst, si, nsi, acc] = self.tables.each_ref().map(|t| t.as_ref().map(HostTensor::view));
        let mut metadata = GdnAttentionMetadata {
            num_prefills: 0,
            num_prefill_tokens: 0,
            num_decodes: 0,
            num_decode_tokens: 0,
            num_spec_decodes: 0,
            num_spec_decode_tokens: 0,
            num_actual_tokens: 0,
            has_initial_state: has,
            spec_query_start_loc: sq,
            non_spec_query_start_loc: nq,
            spec_state_indices_tensor: st,
            non_spec_state_indices_tensor: nst,
            spec_token_indx: si,
            non_spec_token_indx: nsi,
            num_accepted_tokens: acc,
        };
        self.counts.apply(&mut metadata);
        GdnAttentionCoreArgs {
            mixed_qkv: self.mixed.view(),
            b: self.b.view(),
            a: self.a.view(),
            conv_weight: self.weight.view(),
            conv_bias: Some(self.bias.view()),
            activation: Activation::Silu,
            conv_state: self.conv.view_mut(),
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state: self.ssm.view_mut(),
            ssm_state_layout: StateLayout::VK,
            a_log: self.a_log.view(),
            dt_bias: self.dt_bias.view(),
            num_k_heads: GH,
            pad_slot_id: Some(0),
            metadata,
            core_attn_out: self.out.view_mut(),
        }
    }
}

/// The metadata tables of a Mamba2 core batch (vLLM's `Mamba2AttentionMetadata`; decodes, all
/// speculative (`CoreSeq::Spec`), before prefills), each `None` where vLLM passes none:
/// `[query_start_loc_p, has_initial_states_p, seq_idx_p, cu_chunk_seqlen_p,
/// last_chunk_indices_p, state_indices_tensor_p, state_indices_tensor_d ([n, 3]),
/// query_start_loc_d, num_accepted_tokens]`, the chunk metadata of chunk size `chunk`.
///
/// # Panics
/// If a `Decode` is given, or a decode follows a prefill.
pub fn mamba2_tables(seqs: &[CoreSeq], chunk: usize) -> [Option<HostTensor>; 9] {
    let split = seqs.iter().position(|s| matches!(s, CoreSeq::Prefill { .. })).unwrap_or(seqs.len());
    let (decodes, prefills) = seqs.split_at(split);
    let mut table = Vec::new();
    let mut accepted = Vec::new();
    for d in decodes {
        let CoreSeq::Spec { slots, drafts, accepted: a } = *d else { panic!("Mamba2 decodes are speculative: {d:?}") };
        table.extend((0..3).map(|c| if c <= drafts { slots[c] } else { 0 }));
        accepted.push(a);
    }
    let (mut lens, mut computed, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for p in prefills {
        let CoreSeq::Prefill { len, slot, computed: c } = *p else { panic!("a decode after the prefills: {p:?}") };
        lens.push(len);
        computed.push(c);
        slots.push(slot);
    }
    let starts = starts_of(lens.iter().copied());
    let meta = ssm_ssd::compute_chunk_metadata(&starts, &computed, chunk);
    let wide = |v: &[i32]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
    let p = !prefills.is_empty();
    let d = !decodes.is_empty();
    [
        p.then(|| ints(&starts)),
        p.then(|| bools(&computed.iter().map(|&c| i64::from(c > 0)).collect::<Vec<_>>())),
        p.then(|| wide(&meta.seq_idx)),
        p.then(|| wide(&meta.cu_chunk_seqlens)),
        p.then(|| wide(&meta.last_chunk_indices)),
        p.then(|| ints(&slots)),
        d.then(|| HostTensor::from_i64(DType::I32, vec![decodes.len(), 3], &table)),
        d.then(|| ints(&starts_of(decodes.iter().map(CoreSeq::tokens)))),
        d.then(|| ints(&accepted)),
    ]
}

/// The sequence counts of a Mamba2 core batch: `(num_prefills, num_prefill_tokens)`,
/// `(num_decodes, num_decode_tokens)` and `prep_initial_states`.
pub fn mamba2_counts(seqs: &[CoreSeq]) -> ((usize, usize), (usize, usize), bool) {
    let c = GdnCounts::of(seqs);
    let init = seqs.iter().any(|s| matches!(s, CoreSeq::Prefill { computed, .. } if *computed > 0));
    (c.prefills, (c.decodes.0 + c.spec.0, c.decodes.1 + c.spec.1), init)
}

const MH: usize = 4;
const MP: usize = 8;
const MG: usize = 2;
const MN: usize = 16;
const M_CONV: usize = MH * MP + 2 * MG * MN;
/// The Mamba2 core cases' SSD chunk size.
pub const MAMBA2_CHUNK: usize = 16;

/// A Mamba2 layer step over a batch of [`CoreSeq`]s (speculative decodes, then prefills; tokens
/// in the batch's order). [`Mamba2CoreCase::new`]: three speculative decodes (one on the pad
/// slot), then prefills of 5 (resumed at 13), 40 (resumed mid-chunk at 21) and 3 (pad slot)
/// tokens.
pub struct Mamba2CoreCase {
    xbc: HostTensor,
    dt: HostTensor,
    weight: HostTensor,
    bias: HostTensor,
    a: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    conv: HostTensor,
    ssm: HostTensor,
    out: HostTensor,
    tables: [Option<HostTensor>; 9],
    counts: ((usize, usize), (usize, usize), bool),
}

impl Mamba2CoreCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        use CoreSeq::*;
        Self::batch(
            &[
                Spec { slots: [1, 2, 3], drafts: 2, accepted: 1 },
                Spec { slots: [4, 5, 6], drafts: 2, accepted: 2 },
                Spec { slots: [0, 0, 0], drafts: 0, accepted: 1 },
                Prefill { len: 5, slot: 7, computed: 13 },
                Prefill { len: 40, slot: 8, computed: 21 },
                Prefill { len: 3, slot: 0, computed: 0 },
            ],
            seed,
        )
    }

    /// A step over `seqs` (speculative decodes of at most 2 drafts, then prefills), values
    /// from `seed`; pools of at least 16 slots.
    pub fn batch(seqs: &[CoreSeq], seed: u64) -> Self {
        let tokens: usize = seqs.iter().map(CoreSeq::tokens).sum();
        let slots = seqs.iter().map(|q| q.max_slot() as usize + 1).max().unwrap_or(0).max(16);
        let s = seed.wrapping_mul(16);
        Mamba2CoreCase {
            xbc: t(&[tokens, M_CONV], s + 1, 1.0, 0.0),
            dt: t(&[tokens, MH], s + 2, 1.0, -0.5),
            weight: t(&[M_CONV, 4], s + 3, 0.5, 0.0),
            bias: t(&[M_CONV], s + 4, 0.1, 0.0),
            a: t(&[MH], s + 5, 0.5, -1.0),
            d: t(&[MH], s + 6, 1.0, 0.0),
            dt_bias: t(&[MH], s + 7, 0.5, 0.0),
            conv: t(&[slots, CORE_STATE_LEN, M_CONV], s + 8, 1.0, 0.0),
            ssm: t(&[slots, MH, MP, MN], s + 9, 0.5, 0.0),
            out: HostTensor::filled(DType::F32, vec![tokens, MH, MP], 7.0),
            tables: mamba2_tables(seqs, MAMBA2_CHUNK),
            counts: mamba2_counts(seqs),
        }
    }

    /// The core call over the case's tensors.
    pub fn args(&mut self) -> Mamba2MixerCoreArgs<'_> {
        let [qsl, has, seq_idx, cu_chunk, last, slots_p, table_d, qsl_d, acc] =
            self.tables.each_ref().map(|t| t.as_ref().map(HostTensor::view));
        let ((num_prefills, num_prefill_tokens), (num_decodes, num_decode_tokens), prep_initial_states) = self.counts;
        Mamba2MixerCoreArgs {
            xbc: self.xbc.view(),
            dt: self.dt.view(),
            conv_weight: self.weight.view(),
            conv_bias: Some(self.bias.view()),
            activation: Activation::Silu,
            conv_state: self.conv.view_mut(),
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state: self.ssm.view_mut(),
            a: self.a.view(),
            d: Some(self.d.view()),
            dt_bias: Some(self.dt_bias.view()),
            num_groups: MG,
            pad_slot_id: Some(0),
            metadata: Mamba2AttentionMetadata {
                num_prefills,
                num_prefill_tokens,
                num_decodes,
                num_decode_tokens,
                query_start_loc_p: qsl,
                has_initial_states_p: has,
                prep_initial_states,
                chunk_size: MAMBA2_CHUNK,
                seq_idx_p: seq_idx,
                cu_chunk_seqlen_p: cu_chunk,
                last_chunk_indices_p: last,
                state_indices_tensor_p: slots_p,
                state_indices_tensor_d: table_d,
                query_start_loc_d: qsl_d,
                num_accepted_tokens: acc,
                checkpoint_offsets_p: None,
                checkpoint_state_indices_p: None,
                checkpoint_chunk_indices_p: None,
            },
            conv_out: None,
            out: self.out.view_mut(),
        }
    }
}

/// A ReplaySSM step: 3 packed sequences of 1–3 new tokens over rings of 8 with history
/// (`prev_num_accepted_tokens` 0–4, ring starts anywhere), one on the pad slot.
pub struct CheckpointCase {
    state: HostTensor,
    x_cache: HostTensor,
    b_cache: HostTensor,
    dt_cache: HostTensor,
    ring_start: HostTensor,
    prev: HostTensor,
    x: HostTensor,
    dt: HostTensor,
    a: HostTensor,
    b: HostTensor,
    c: HostTensor,
    out: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    slots: HostTensor,
    cu: HostTensor,
}

impl CheckpointCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        let (cache, h, g, p, n, l) = (6, 2, 1, 8, 8, 8);
        let lens = [1 + seed as usize % 3, 2, 3];
        let rows: usize = lens.iter().sum();
        let s = seed.wrapping_mul(16);
        CheckpointCase {
            state: t(&[cache, h, p, n], s + 1, 0.5, 0.0),
            x_cache: t(&[cache, h, l, p], s + 2, 1.0, 0.0),
            b_cache: t(&[cache, g, l, n], s + 3, 1.0, 0.0),
            dt_cache: t(&[cache, h, l], s + 4, 0.5, 0.5),
            ring_start: HostTensor::from_i64(DType::I64, vec![cache], &[0, 7, 1, 6, 0, 3]),
            prev: HostTensor::from_i64(DType::I64, vec![cache], &[0, 2, 4, 1, 3, 0]),
            x: t(&[rows, h, p], s + 5, 1.0, 0.0),
            dt: t(&[rows, h], s + 6, 1.0, 0.0),
            a: t(&[h], s + 7, 0.5, -1.0),
            b: t(&[rows, g, n], s + 8, 1.0, 0.0),
            c: t(&[rows, g, n], s + 9, 1.0, 0.0),
            out: HostTensor::filled(DType::F32, vec![rows, h, p], f32::NAN),
            d: t(&[h], s + 10, 1.0, 0.0),
            dt_bias: t(&[h], s + 11, 0.3, -1.0),
            slots: ints(&[2, 0, 4]),
            cu: ints(&[0, lens[0] as i64, (lens[0] + lens[1]) as i64, rows as i64]),
        }
    }

    /// The call over the case's tensors.
    pub fn args(&mut self) -> ssm_ring::CheckpointingSsuArgs<'_> {
        ssm_ring::CheckpointingSsuArgs {
            state: self.state.view_mut(),
            x_cache: self.x_cache.view_mut(),
            b_cache: self.b_cache.view_mut(),
            dt_cache: self.dt_cache.view_mut(),
            ring_start: self.ring_start.view(),
            prev_num_accepted_tokens: self.prev.view(),
            x: self.x.view(),
            dt: self.dt.view(),
            a: self.a.view(),
            b: self.b.view(),
            c: self.c.view(),
            out: self.out.view_mut(),
            d: Some(self.d.view()),
            z: None,
            dt_bias: Some(self.dt_bias.view()),
            dt_softplus: true,
            state_batch_indices: Some(self.slots.view()),
            pad_slot_id: Some(0),
            cu_seqlens: Some(self.cu.view()),
            max_seqlen: Some(3),
        }
    }
}

/// A `copy_rows` call as the GDN core makes them: token rows of a strided batch tensor gathered
/// into a dense buffer, or a dense buffer's rows scattered back into strided rows (distinct
/// rows, in a shuffled order); dtype, sizes and direction from `seed`.
pub struct RowsCase {
    src: HostTensor,
    dst: HostTensor,
    index: HostTensor,
    direction: ssm_tensor::RowDirection,
    /// Row length and row stride of the strided side.
    width: usize,
    pitch: usize,
}

impl RowsCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        use ssm_tensor::RowDirection;
        let dtype = [DType::F32, DType::BF16, DType::F16][seed as usize % 3];
        let (rows, width) = (5 + seed as usize % 11, 1 + (seed as usize / 3) % 37);
        let (n, pitch) = (1 + seed as usize % rows, width + seed as usize % 5);
        let direction = if seed.is_multiple_of(2) { RowDirection::Gather } else { RowDirection::Scatter };
        // Distinct rows (n ≤ rows), descending and wrapped around from a seed-chosen start.
        let index: Vec<i64> = (0..n).rev().map(|i| ((i + seed as usize) % rows) as i64).collect();
        let strided = HostTensor::from_f32(dtype, vec![rows, pitch], &values(rows * pitch, seed, 1.0, 0.0));
        let dense = HostTensor::from_f32(dtype, vec![n, width], &values(n * width, seed ^ 0x55, 1.0, 0.0));
        let (src, dst) = match direction {
            RowDirection::Gather => (strided, HostTensor::filled(dtype, vec![n, width], f32::NAN)),
            RowDirection::Scatter => (dense, strided),
        };
        RowsCase { src, dst, index: HostTensor::from_i64(DType::I64, vec![n], &index), direction, width, pitch }
    }

    /// The call over the case's tensors (the strided side as a `[rows, width]` view of its
    /// `[rows, pitch]` memory).
    pub fn args(&mut self) -> ssm_tensor::CopyRowsArgs<'_> {
        use ssm_tensor::RowDirection;
        let (w, p) = (self.width, self.pitch as isize);
        let rows = |t: &HostTensor| [t.shape[0], w];
        let (src, dst) = match self.direction {
            RowDirection::Gather => {
                let shape = rows(&self.src);
                (self.src.view().with_layout(&shape, &[p, 1], 0).expect("rows fit"), self.dst.view_mut())
            }
            RowDirection::Scatter => {
                let shape = rows(&self.dst);
                (self.src.view(), self.dst.view_mut().with_layout(&shape, &[p, 1], 0).expect("rows fit"))
            }
        };
        ssm_tensor::CopyRowsArgs { src, dst, index: self.index.view(), direction: self.direction }
    }
}
