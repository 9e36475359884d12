//! The template calls every check starts from: each golden vector's arguments in each variant
//! (as the conformance harness maps them), and random cases from the property tests'
//! generators (odd sizes, pads, aliasing tables, speculative routes).

use std::sync::Mutex;

use ssm_conformance::cases::{conv, ssd, ssu};
use ssm_conformance::gdn_random::{RecurrentCase, RecurrentSpec};
use ssm_conformance::{Target, TargetError};

use crate::ops::{self, FuzzOp};

/// Something that takes template calls: the fuzzer, or a recorder of results.
pub trait Sink: Sync {
    /// Takes one template call, labelled `label` (`<vector>:<variant>` or `<generator><i>`).
    fn take<O: FuzzOp>(&self, label: &str, template: &O::At<'_>);
}

/// Hands every template to `sink`: every golden vector in every variant, then `random` cases
/// of each generator drawn from `seed`.
pub fn for_each_template(sink: &impl Sink, seed: u64, random: usize) {
    let target = Templates { sink, label: Mutex::new(String::new()) };
    for case in ssm_conformance::shared_cases() {
        for &variant in ssm_conformance::Variant::of(&case.op) {
            *target.label.lock().unwrap_or_else(|e| e.into_inner()) = format!("{}:{variant:?}", case.name);
            let _ = ssm_conformance::run_case_variant(&target, case, variant);
        }
    }
    // The layer cores, `checkpointing_ssu` and `copy_rows` (no golden vectors): a template each,
    // and one per random draw.
    for i in 0..=random {
        let s = seed.wrapping_add(i as u64);
        sink.take::<ops::GdnCore>(&format!("gdn-core{i}"), &crate::cores::GdnCoreCase::new(s).args());
        sink.take::<ops::Mamba2Core>(&format!("mamba2-core{i}"), &crate::cores::Mamba2CoreCase::new(s).args());
        sink.take::<ops::Checkpoint>(&format!("checkpoint{i}"), &crate::cores::CheckpointCase::new(s).args());
        sink.take::<ops::CopyRows>(&format!("copy-rows{i}"), &crate::cores::RowsCase::new(s).args());
    }
    let mut rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed);
    for i in 0..random {
        let s = seed.wrapping_add(i as u64);
        let mut case = ssu::Case::build(ssu::Spec::draw(&mut rng, i), s);
        sink.take::<ops::Ssu>(&format!("ssu-random{i}"), &case.args());

        let dtype = conv::FLOATS[i % 3];
        let mode = conv::MODES[i % conv::MODES.len()];
        let mut case = conv::Case::random(dtype, mode, s);
        if mode == conv::Mode::Prefill {
            sink.take::<ops::ConvFn>(&format!("conv-random{i}"), &case.fn_args());
        } else {
            sink.take::<ops::ConvUpdate>(&format!("conv-random{i}"), &case.update_args());
        }

        let mut case = RecurrentCase::random(RecurrentSpec::matrix(i), s);
        sink.take::<ops::GdnRecurrent>(&format!("gdn-random{i}"), &case.recurrent_args());
        let mut case = RecurrentCase::random(RecurrentSpec::matrix(i), s);
        sink.take::<ops::GdnSigmoid>(&format!("gdn-random{i}"), &case.sigmoid_args());
        // An SSD prefill through a pool with prefix-caching checkpoints (the golden vectors
        // have neither).
        let mut case_rng = <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(s);
        let batch = 1 + i % 3;
        let seqlens = (0..batch).map(|b| 3 + (b * 7 + i) % 20).collect();
        let computed = (0..batch).map(|b| (b * 5 + i) % 9).collect();
        let pr = ssd::Problem::random(&mut case_rng, seqlens, computed, i % 2 == 0);
        let per = pr.heads * pr.dim * pr.dstate;
        let mut pool = ssd::Pool::random(&mut case_rng, batch, per);
        pool.add_checkpoints(&mut case_rng, &pr, per);
        pr.run_pooled_with(false, Some(&mut pool), |a| sink.take::<ops::Ssd>(&format!("ssd-random{i}"), &a));
    }
}

/// The conformance harness hands each golden vector's call, in each variant, to this target,
/// which passes it on as a template (and answers "unsupported", so nothing else runs).
struct Templates<'s, S> {
    sink: &'s S,
    label: Mutex<String>,
}

macro_rules! templates {
    ($($method:ident: $op:ty => $args:ty),* $(,)?) => {
        impl<S: Sink> Target for Templates<'_, S> {
            fn label(&self) -> String {
                "templates".into()
            }
            $(fn $method(&self, args: $args) -> Result<(), TargetError> {
                let label = self.label.lock().unwrap_or_else(|e| e.into_inner()).clone();
                self.sink.take::<$op>(&label, &args);
                Err(TargetError::unsupported())
            })*
        }
    };
}

templates! {
    selective_state_update: ops::Ssu => ssm_ssu::SelectiveStateUpdateArgs<'_>,
    causal_conv1d_update: ops::ConvUpdate => ssm_conv::CausalConv1dUpdateArgs<'_>,
    causal_conv1d_fn: ops::ConvFn => ssm_conv::CausalConv1dFnArgs<'_>,
    mamba_chunk_scan_combined_varlen: ops::Ssd => ssm_ssd::MambaChunkScanCombinedVarlenArgs<'_>,
    update_replayssm_ring_trackers: ops::RingUpdate => ssm_ring::UpdateRingTrackersArgs<'_>,
    commit_replayssm_ring_trackers: ops::RingCommit => ssm_ring::CommitRingTrackersArgs<'_>,
    fused_gdn_gating: ops::GdnGating => ssm_gdn::FusedGdnGatingArgs<'_>,
    fused_recurrent_gated_delta_rule: ops::GdnRecurrent => ssm_gdn::FusedRecurrentGatedDeltaRuleArgs<'_>,
    fused_sigmoid_gating_delta_rule_update: ops::GdnSigmoid => ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs<'_>,
    chunk_gated_delta_rule: ops::GdnChunk => ssm_gdn::ChunkGatedDeltaRuleArgs<'_>,
}

/// Runs `template` once on `target` over fresh copies of its memory and returns every
/// argument's memory afterwards (or the refusal's message).
pub fn run_copy<O: FuzzOp>(target: &dyn Target, template: &O::At<'_>) -> Result<crate::spec::Buffers, String> {
    let specs = O::specs(template);
    let mut bufs = crate::spec::Buffers::new(&specs);
    {
        let mut views = crate::spec::Views::new(&specs, &mut bufs).map_err(|(n, e)| format!("{n}: {e}"))?;
        let args = O::respin(template, &mut views);
        views.finish();
        O::run(target, args).map_err(|e| e.to_string())?;
    }
    Ok(bufs)
}

/// Each template's result on a target, by `<op> <label>`, sorted.
pub type Results = Vec<(String, Result<crate::spec::Buffers, String>)>;

/// Runs every template (or, with `share = (k, n)`, every `n`-th from the `k`-th) on `target`
/// over fresh memory and keeps the results: the record that determinism and concurrency
/// checks compare.
pub fn record(target: &(dyn Target + Sync), seed: u64, random: usize, share: (usize, usize)) -> Results {
    struct Recorder<'r> {
        target: &'r (dyn Target + Sync),
        share: (usize, usize),
        seen: std::sync::atomic::AtomicUsize,
        results: Mutex<Results>,
    }
    impl Sink for Recorder<'_> {
        fn take<O: FuzzOp>(&self, label: &str, template: &O::At<'_>) {
            let i = self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i % self.share.1 == self.share.0 {
                let r = run_copy::<O>(self.target, template);
                self.results.lock().unwrap_or_else(|e| e.into_inner()).push((format!("{} {label}", O::NAME), r));
            }
        }
    }
    let rec = Recorder { target, share, seen: Default::default(), results: Mutex::new(Vec::new()) };
    for_each_template(&rec, seed, random);
    let mut r = rec.results.into_inner().unwrap_or_else(|e| e.into_inner());
    r.sort_by(|a, b| a.0.cmp(&b.0));
    r
}

/// The calls whose results differ (bit for bit) between two records of the same templates.
///
/// # Panics
/// If the records are not of the same calls.
pub fn differing(want: &Results, got: &Results) -> Vec<String> {
    assert_eq!(want.len(), got.len(), "records of different template sets");
    want.iter()
        .zip(got)
        .filter(|((n, w), (n2, g))| {
            assert_eq!(n, n2, "records of different template sets");
            w != g
        })
        .map(|(w, _)| w.0.clone())
        .collect()
}
