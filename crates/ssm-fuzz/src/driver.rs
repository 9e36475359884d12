//! The fuzz loop: for each template call (a golden vector's arguments, or a random case from
//! the property tests' generators), `iterations` mutated copies run on a CPU runtime. Each
//! must end in one of two ways:
//! - a typed refusal, after which every buffer of the call is bit-identical to before; or
//! - `Ok`, after which every buffer equals what the op crate's reference makes of the same
//!   call (so nothing outside the named slots and outputs changed either).
//!
//! A panic (caught), a refused call that had written, a disagreement with the reference, or a
//! hang (a watchdog aborts after [`FuzzConfig::hang_seconds`]) is a failure.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ssm_conformance::TargetError;
use ssm_conformance::reference::{Arithmetic, Reference};
use ssm_dispatch::{Config, Runtime};
use ssm_tensor::elem;

use crate::mutate::mutate_tensor;
use crate::ops::FuzzOp;
use crate::spec::{Buffers, TensorSpec, Views};

/// What a fuzz run does.
#[derive(Debug, Clone)]
pub struct FuzzConfig {
    /// Base seed; every case's seed derives from it, the op, the template and the iteration.
    pub seed: u64,
    /// Mutated calls per template.
    pub iterations: usize,
    /// Random templates per generator (on top of every golden vector).
    pub random_templates: usize,
    /// CPU threads of the runtime under test.
    pub threads: usize,
    /// Only this op (vLLM's name), or every op.
    pub op: Option<String>,
    /// Only the case with this label (`<template>#<iteration>`, as a failure prints it).
    pub only: Option<String>,
    /// A case running longer than this is a hang: the process prints it and aborts.
    pub hang_seconds: u64,
    /// Calls whose views describe more logical elements than this in all (broadcast views can
    /// describe billions over a few bytes) are legitimate work of that size: counted, not run.
    pub max_logical_elements: usize,
}

impl FuzzConfig {
    /// The defaults, overridden by `SSM_FUZZ_SEED`, `SSM_FUZZ_ITERATIONS`,
    /// `SSM_FUZZ_TEMPLATES`, `SSM_FUZZ_THREADS`, `SSM_FUZZ_OP`, `SSM_FUZZ_ONLY`,
    /// `SSM_FUZZ_HANG_S` and `SSM_FUZZ_MAX_ELEMENTS` (`SSM_FUZZ_VERBOSE` prints each case before it runs: the last line
    /// names the case that aborted a process; `SSM_FUZZ_BACKTRACE` adds a backtrace to each
    /// caught panic).
    ///
    /// # Panics
    /// If one of them is set but does not parse.
    pub fn from_env(iterations: usize, random_templates: usize) -> Self {
        fn num<T: std::str::FromStr>(name: &str, default: T) -> T {
            std::env::var(name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a number")))
        }
        FuzzConfig {
            seed: num("SSM_FUZZ_SEED", 0x5eed),
            iterations: num("SSM_FUZZ_ITERATIONS", iterations),
            random_templates: num("SSM_FUZZ_TEMPLATES", random_templates),
            threads: num("SSM_FUZZ_THREADS", 2),
            op: std::env::var("SSM_FUZZ_OP").ok(),
            only: std::env::var("SSM_FUZZ_ONLY").ok(),
            hang_seconds: num("SSM_FUZZ_HANG_S", 60),
            max_logical_elements: num("SSM_FUZZ_MAX_ELEMENTS", 1 << 28),
        }
    }
}

/// One failed case: enough to replay it (`SSM_FUZZ_SEED`, `SSM_FUZZ_OP`, `SSM_FUZZ_ONLY`).
#[derive(Debug, Clone)]
pub struct Failure {
    /// The op.
    pub op: &'static str,
    /// `<template>#<iteration>`.
    pub case: String,
    /// The mutations applied.
    pub mutations: Vec<String>,
    /// What went wrong.
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} [{}]: {}", self.op, self.case, self.mutations.join("; "), self.what)
    }
}

/// Per-op counts of a run.
#[derive(Debug, Clone, Default)]
pub struct OpCounts {
    /// Calls made.
    pub cases: usize,
    /// Calls whose views could not be built (the user's view constructor refused them).
    pub view_refused: usize,
    /// Calls the op refused with a typed error, having written nothing.
    pub refused: usize,
    /// Calls that ran and matched the reference.
    pub matched: usize,
    /// Calls that ran, of an op without a reference (the layer cores): nothing outside the
    /// call's buffers is checked for them, only that they did not panic or hang.
    pub unchecked: usize,
    /// Calls not run: their views describe more than `max_logical_elements`.
    pub huge: usize,
    /// Calls that failed.
    pub failed: usize,
}

/// The result of a run.
#[derive(Debug, Clone, Default)]
pub struct FuzzReport {
    /// Counts by op.
    pub per_op: BTreeMap<&'static str, OpCounts>,
    /// Every failure.
    pub failures: Vec<Failure>,
    /// Wall time.
    pub elapsed: Duration,
}

impl FuzzReport {
    /// One line per op and a total.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let mut total = OpCounts::default();
        for (op, c) in &self.per_op {
            s += &format!(
                "{op:<40} {:>7} cases: {:>6} view refused, {:>6} refused, {:>6} matched, {:>6} ran unchecked, {:>4} huge, {:>4} failed\n",
                c.cases, c.view_refused, c.refused, c.matched, c.unchecked, c.huge, c.failed
            );
            total.cases += c.cases;
            total.failed += c.failed;
        }
        s += &format!("{} cases, {} failed, {:.1} s\n", total.cases, total.failed, self.elapsed.as_secs_f64());
        s
    }
}

// ---- panics and hangs -------------------------------------------------------------------

static FUZZING: AtomicBool = AtomicBool::new(false);
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);
static CURRENT: Mutex<Option<(Instant, String)>> = Mutex::new(None);

/// Installs (once) a panic hook that records panics raised while a case runs instead of
/// printing them, and a watchdog thread that aborts the process on a hang.
fn install_guards(hang: Duration) {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if FUZZING.load(Ordering::SeqCst) {
                let mut last = LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner());
                last.get_or_insert_with(|| {
                    if std::env::var_os("SSM_FUZZ_BACKTRACE").is_some() {
                        format!("{info}\n{}", std::backtrace::Backtrace::force_capture())
                    } else {
                        info.to_string()
                    }
                });
            } else {
                previous(info);
            }
        }));
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some((start, case)) = cur
                    && start.elapsed() > hang
                {
                    eprintln!("fuzz: HANG: {case} ran for more than {} s; aborting", hang.as_secs());
                    std::process::abort();
                }
            }
        });
    });
}

/// Runs `f` as one guarded case: a panic becomes `Err(message)`.
fn guarded<T>(label: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    static VERBOSE: OnceLock<bool> = OnceLock::new();
    if *VERBOSE.get_or_init(|| std::env::var_os("SSM_FUZZ_VERBOSE").is_some()) {
        eprintln!("fuzz: {label}");
    }
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), label.to_string()));
    FUZZING.store(true, Ordering::SeqCst);
    let r = catch_unwind(AssertUnwindSafe(f));
    FUZZING.store(false, Ordering::SeqCst);
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = None;
    r.map_err(|_| {
        LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_else(|| "panic without a message".into())
    })
}

// ---- comparing -------------------------------------------------------------------------

/// The first element where the runtime's buffers differ from the reference's beyond the
/// tolerance: integers and flags exactly; floats (and a block-scaled i16 / i8 state's integers, whose
/// rounding follows the f32 state by a step) `|a − b| ≤ tol·(1 + |b| + max|b|/10)`, two diverged
/// values (non-finite, or past 1e4 from inputs of order 1) equal. After an extreme float input
/// (`loose`: NaN, infinity or 1e30 spread differently through a chunked and a sequential
/// evaluation) only the elements the reference left alone are compared, bit for bit: those it
/// left unchanged both in `want` and in `probe` (a second reference run from `before` with every
/// writable float element's lowest bit flipped), so that a value the reference computed equal to
/// the old one by chance (likely somewhere among thousands of bf16 elements) is not taken for
/// an element it never wrote. A scratch's contents are the backend's own and are not compared.
fn first_difference(
    specs: &[TensorSpec],
    before: &Buffers,
    got: &Buffers,
    want: &Buffers,
    loose: Option<&Probe>,
) -> Option<String> {
    for (t, (((s, b0), g), w)) in specs.iter().zip(&before.0).zip(&got.0).zip(&want.0).enumerate() {
        if g.bytes() == w.bytes() || s.name.ends_with("scratch") {
            continue;
        }
        let (gb, wb, bb) = (g.bytes(), w.bytes(), b0.bytes());
        let tol = match s.dtype {
            ssm_tensor::DType::F32 => 2e-3,
            // One step of 32767 each side of a row's largest value, a tenth of which is `scale`.
            ssm_tensor::DType::I16 => 1e-3,
            // One step of 127 each side (a tenth of 127 is `scale`: 0.1 · 13.7 covers a step).
            ssm_tensor::DType::I8 => 0.1,
            _ => 3e-2,
        };
        // Errors of a long evaluation scale with the largest value it produces.
        let scale = (0..s.memory_len())
            .filter(|_| !s.is_integer())
            .map(|i| elem::read_f64(wb, s.dtype, i).abs())
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max);
        let close = |a: f64, b: f64| {
            // Past 1e4 from inputs of order 1 a random delta rule without l2norm has diverged;
            // where both diverged, they agree.
            let blown = |v: f64| !v.is_finite() || v.abs() > 1e4;
            (blown(a) && blown(b)) || a == b || (a - b).abs() <= tol * (1.0 + b.abs() + 0.1 * scale)
        };
        for i in 0..s.memory_len() {
            let es = s.dtype.size();
            let r = i * es..(i + 1) * es;
            if s.is_integer() {
                let (a, b) = (elem::read_i64(gb, s.dtype, i), elem::read_i64(wb, s.dtype, i));
                if a != b {
                    return Some(format!("{}[{i}]: runtime {a}, reference {b}", s.name));
                }
                continue;
            }
            let (a, b, old) =
                (elem::read_f64(gb, s.dtype, i), elem::read_f64(wb, s.dtype, i), elem::read_f64(bb, s.dtype, i));
            if let Some(probe) = loose {
                // A NaN-poisoned output that the reference also made NaN looks untouched.
                if !old.is_nan() && wb[r.clone()] == bb[r.clone()] && probe.untouched(t, r) && !close(a, old) {
                    return Some(format!(
                        "{}[{i}]: written by the runtime ({old} -> {a}), not by the reference",
                        s.name
                    ));
                }
            } else if !close(a, b) {
                return Some(format!("{}[{i}]: runtime {a}, reference {b}", s.name));
            }
        }
    }
    None
}

/// A second reference run from perturbed buffers: which elements the reference leaves alone.
struct Probe {
    before: Buffers,
    after: Buffers,
}

impl Probe {
    /// `before` with the lowest bit of every writable float element flipped (inputs that are
    /// not written stay as they were, so the call's plan is the same).
    fn perturbed(specs: &[TensorSpec], before: &Buffers) -> Buffers {
        let mut b = before.clone();
        for (s, t) in specs.iter().zip(b.0.iter_mut()) {
            if s.present && s.writable && s.dtype.is_float() {
                let es = s.dtype.size();
                for e in t.bytes_mut().chunks_exact_mut(es) {
                    e[0] ^= 1;
                }
            }
        }
        b
    }

    /// Whether the bytes `r` of tensor `t` came out of the probe run as they went in.
    fn untouched(&self, t: usize, r: std::ops::Range<usize>) -> bool {
        self.before.0[t].bytes()[r.clone()] == self.after.0[t].bytes()[r]
    }
}

// ---- the loop ---------------------------------------------------------------------------

/// Runs the fuzz loop: every template of every op (or of `config.op`).
pub struct Fuzzer {
    config: FuzzConfig,
    rt: Runtime,
    reference: Reference,
    report: Mutex<FuzzReport>,
}

fn mix(mut h: u64, parts: &[&[u8]]) -> u64 {
    for p in parts {
        for &b in *p {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        h = h.rotate_left(29) ^ 0x9e37_79b9_7f4a_7c15;
    }
    h
}

impl Fuzzer {
    /// A fuzzer over a CPU runtime with `config.threads` threads and ReplaySSM enabled.
    ///
    /// # Panics
    /// If the CPU runtime cannot start.
    pub fn new(config: FuzzConfig) -> Self {
        install_guards(Duration::from_secs(config.hang_seconds));
        // ReplaySSM on, so that `checkpointing_ssu` runs (it changes nothing for the other ops).
        let cfg = Config { replayssm: true, ..Config::cpu(Some(config.threads)) };
        let rt = Runtime::new(&cfg).expect("a CPU runtime");
        Fuzzer { config, rt, reference: Reference(Arithmetic::F32), report: Mutex::new(FuzzReport::default()) }
    }

    fn wants(&self, op: &str) -> bool {
        self.config.op.as_deref().is_none_or(|o| o == op)
    }

    /// `iterations` mutated calls of `template`, labelled `label`.
    pub fn fuzz<O: FuzzOp>(&self, label: &str, template: &O::At<'_>) {
        if !self.wants(O::NAME) {
            return;
        }
        let base = O::specs(template);
        for it in 0..self.config.iterations {
            let case = format!("{label}#{it}");
            if self.config.only.as_deref().is_some_and(|o| o != case) {
                continue;
            }
            let outcome = self.one::<O>(&case, template, &base);
            let mut report = self.report.lock().unwrap_or_else(|e| e.into_inner());
            let counts = report.per_op.entry(O::NAME).or_default();
            counts.cases += 1;
            match outcome {
                Outcome::ViewRefused => counts.view_refused += 1,
                Outcome::Refused => counts.refused += 1,
                Outcome::Matched => counts.matched += 1,
                Outcome::Unchecked => counts.unchecked += 1,
                Outcome::Huge => counts.huge += 1,
                Outcome::Failed(f) => {
                    counts.failed += 1;
                    report.failures.push(f);
                }
            }
        }
    }

    fn one<O: FuzzOp>(&self, case: &str, template: &O::At<'_>, base: &[TensorSpec]) -> Outcome {
        let mut rng = ChaCha8Rng::seed_from_u64(mix(self.config.seed, &[O::NAME.as_bytes(), case.as_bytes()]));
        let mut specs = base.to_vec();
        let mut mutations = Vec::new();
        let mut scalar_seeds = Vec::new();
        let mut loose = false;
        // One case in eight runs the template unchanged (the reference must agree there too).
        let k = if rng.random_bool(0.125) { 0 } else { rng.random_range(1..=3) };
        for _ in 0..k {
            if rng.random_bool(0.15) {
                scalar_seeds.push(rng.next_u64());
            } else if let Some(m) = mutate_tensor(&mut specs, &mut rng) {
                mutations.push(m.what);
                loose |= m.nonfinite;
            }
        }
        let scalars = |a: &mut O::At<'_>, out: &mut Vec<String>| -> bool {
            let mut extreme = false;
            let mut sc = O::scalars(a);
            for &s in &scalar_seeds {
                if sc.is_empty() {
                    break;
                }
                let mut r = ChaCha8Rng::seed_from_u64(s);
                let i = r.random_range(0..sc.len());
                sc[i].1.mutate(&mut r);
                extreme |= sc[i].1.extreme_float();
                out.push(format!("{} = {}", sc[i].0, sc[i].1.describe()));
            }
            extreme
        };
        let fail = |mutations: Vec<String>, what: String| {
            Outcome::Failed(Failure { op: O::NAME, case: case.to_string(), mutations, what })
        };

        let logical = specs
            .iter()
            .filter(|s| s.present)
            .map(|s| s.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d)))
            .fold(0usize, usize::saturating_add);
        if logical > self.config.max_logical_elements {
            return Outcome::Huge;
        }
        let mut got = Buffers::new(&specs);
        let before = got.clone();
        let ran = {
            // Building the views is the user's first call into the API: it must not panic either.
            let mut views = match guarded(case, || Views::new(&specs, &mut got)) {
                Ok(Ok(v)) => v,
                Ok(Err(_)) => return Outcome::ViewRefused,
                Err(panic) => return fail(mutations, format!("view construction panicked: {panic}")),
            };
            let mut args = O::respin(template, &mut views);
            views.finish();
            loose |= scalars(&mut args, &mut mutations);
            let label = format!("{} {case} [{}]", O::NAME, mutations.join("; "));
            guarded(&label, || O::run(&self.rt, args).map_err(|e| e.to_string()))
        };
        match ran {
            Err(panic) => fail(mutations, format!("runtime panicked: {panic}")),
            Ok(Err(e)) => {
                if got == before {
                    Outcome::Refused
                } else {
                    let which: Vec<_> = specs
                        .iter()
                        .zip(got.0.iter().zip(&before.0))
                        .filter(|(_, (g, b))| g != b)
                        .map(|(s, _)| s.name)
                        .collect();
                    fail(mutations, format!("refused after writing {which:?}: {e}"))
                }
            }
            Ok(Ok(())) => {
                // The same call on the reference, over `buffers`.
                let on_reference = |buffers: &mut Buffers| {
                    let mut views = Views::new(&specs, buffers).expect("the views were built once already");
                    let mut args = O::respin(template, &mut views);
                    views.finish();
                    scalars(&mut args, &mut Vec::new());
                    guarded(case, || O::run(&self.reference, args))
                };
                let mut want = before.clone();
                let reference = on_reference(&mut want);
                // After an extreme input, the reference once more from perturbed buffers
                // (`first_difference`): it must run as the first run did.
                let probe = loose.then(|| {
                    let before = Probe::perturbed(&specs, &before);
                    let mut after = before.clone();
                    let ran = on_reference(&mut after);
                    (Probe { before, after }, ran)
                });
                match (reference, probe) {
                    (Err(panic), _) | (_, Some((_, Err(panic)))) => {
                        fail(mutations, format!("reference panicked: {panic}"))
                    }
                    (Ok(Err(TargetError::Unsupported(_))), _) => Outcome::Unchecked,
                    (Ok(Err(e)), _) => fail(mutations, format!("the runtime ran a call the reference refused: {e}")),
                    (Ok(Ok(())), Some((_, Ok(Err(e))))) => {
                        fail(mutations, format!("the reference refused its probe run from perturbed states: {e}"))
                    }
                    (Ok(Ok(())), probe) => {
                        match first_difference(&specs, &before, &got, &want, probe.as_ref().map(|(p, _)| p)) {
                            None => Outcome::Matched,
                            Some(d) => fail(mutations, format!("differs from the reference: {d}")),
                        }
                    }
                }
            }
        }
    }

    /// Fuzzes every golden vector's call and `random_templates` random cases per generator.
    pub fn run(self) -> FuzzReport {
        let start = Instant::now();
        crate::templates::for_each_template(&self, self.config.seed, self.config.random_templates);
        let mut report = self.report.into_inner().unwrap_or_else(|e| e.into_inner());
        report.elapsed = start.elapsed();
        report
    }
}

enum Outcome {
    Unchecked,
    Huge,
    ViewRefused,
    Refused,
    Matched,
    Failed(Failure),
}

impl crate::templates::Sink for Fuzzer {
    fn take<O: FuzzOp>(&self, label: &str, template: &O::At<'_>) {
        self.fuzz::<O>(label, template);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(values: &[f32]) -> (TensorSpec, Buffers) {
        let mut memory = vec![0u8; 2 * values.len()];
        for (i, &v) in values.iter().enumerate() {
            elem::write_f32(&mut memory, ssm_tensor::DType::BF16, i, v);
        }
        let spec = TensorSpec {
            name: "initial_state",
            writable: true,
            optional: true,
            present: true,
            dtype: ssm_tensor::DType::BF16,
            device: ssm_tensor::Device::Cpu,
            shape: vec![values.len()],
            strides: vec![1],
            offset: 0,
            memory,
        };
        let b = Buffers::new(std::slice::from_ref(&spec));
        (spec, b)
    }

    /// After an extreme input, an element the reference computed equal to its old value by
    /// chance is not one it left alone (its probe run writes it); one it never writes is.
    #[test]
    fn loose_comparison_tells_a_chance_equal_value_from_an_untouched_one() {
        let (spec, before) = state(&[-0.0796, 0.5]);
        let specs = [spec];
        // The runtime made both NaN; the reference wrote element 0 with its old value and left
        // element 1 alone.
        let (_, got) = state(&[f32::NAN, f32::NAN]);
        let want = before.clone();
        // The probe run from perturbed buffers writes element 0 (the same computed value, not the
        // perturbed one) and leaves element 1 perturbed.
        let probe_before = Probe::perturbed(&specs, &before);
        let mut probe_after = probe_before.clone();
        elem::write_f32(probe_after.0[0].bytes_mut(), ssm_tensor::DType::BF16, 0, -0.0796);
        let probe = Probe { before: probe_before, after: probe_after };
        let d = first_difference(&specs, &before, &got, &want, Some(&probe));
        assert_eq!(d.as_deref(), Some("initial_state[1]: written by the runtime (0.5 -> NaN), not by the reference"));
        // Without the probe's evidence (both left alone), element 0 is reported first.
        let untouched = Probe { before: probe.before.clone(), after: probe.before.clone() };
        let d = first_difference(&specs, &before, &got, &want, Some(&untouched)).unwrap();
        assert!(d.starts_with("initial_state[0]: written by the runtime"), "{d}");
    }
}
