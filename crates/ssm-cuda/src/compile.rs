//! Kernel specialisations and their compiled cubins, cached in memory and on disk.
//!
//! A [`KernelSpec`] is one kernel source plus the `-D` macros that specialise it. It is
//! compiled by NVRTC to a cubin for one [`Arch`]; the cubin is cached on disk under a key that
//! hashes the source, the full option list, the NVRTC version and the architecture, so a
//! changed kernel, option, compiler or device never reuses a stale binary. Writes go through a
//! temporary file and a rename (safe for concurrent processes); a failed write is only a
//! warning, because the cost is one more compilation next run.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ssm_tensor::DType;

use crate::CudaError;
use crate::nvrtc::{compile_cubin, nvrtc_version};

/// Helpers shared by every kernel (fp16/bf16 conversions, vector loads).
pub const COMMON_SOURCE: &str = include_str!("../kernels/common.cuh");
/// The selective state update kernel.
pub const SSU_SOURCE: &str = include_str!("../kernels/ssu.cu");
/// The gated-delta-rule kernels (gating and the recurrence).
pub const GDN_SOURCE: &str = include_str!("../kernels/gdn.cu");
/// The causal conv1d kernel (update and fn).
pub const CONV_SOURCE: &str = include_str!("../kernels/conv.cu");
/// The ReplaySSM ring-tracker kernel (advance, reset, commit).
pub const RING_TRACKERS_SOURCE: &str = include_str!("../kernels/ring_trackers.cu");
/// ReplaySSM's checkpointing SSU kernel.
pub const CHECKPOINTING_SSU_SOURCE: &str = include_str!("../kernels/checkpointing_ssu.cu");
/// The 16-byte copy kernel (bandwidth yardstick).
pub const COPY_SOURCE: &str = include_str!("../kernels/copy.cu");
/// `kernels/ssd.cu`: the SSD chunked prefill (four kernels).
pub const SSD_SOURCE: &str = include_str!("../kernels/ssd.cu");
/// `kernels/gdn_chunk.cu`: the GDN chunked prefill.
pub const GDN_CHUNK_SOURCE: &str = include_str!("../kernels/gdn_chunk.cu");

/// The kernels' C name of a storage dtype (`common.cuh`'s `f16_t` / `bf16_t` for the 16-bit
/// floats), as passed in `-D` macros.
pub(crate) fn c_type(t: DType) -> &'static str {
    match t {
        DType::F32 => "float",
        DType::F16 => "f16_t",
        DType::BF16 => "bf16_t",
        DType::I16 => "short",
        DType::I8 => "signed char",
        DType::I32 => "int",
        DType::I64 => "i64",
        DType::Bool => "unsigned char",
    }
}

/// The `NAME=0|1` macros of a key's flag bits: one per `(name, bit)` of `table`, in its order.
pub(crate) fn flag_defines<F>(flags: F, table: &[(&'static str, F)]) -> impl Iterator<Item = (&'static str, String)>
where
    F: Copy + std::ops::BitAnd<Output = F> + PartialEq + Default,
{
    table.iter().map(move |&(name, bit)| (name, u8::from(flags & bit != F::default()).to_string()))
}

/// Which kernel source a specialisation compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSource {
    /// `kernels/ssu.cu`.
    Ssu,
    /// `kernels/copy.cu`.
    Copy,
    /// `kernels/gdn.cu`.
    Gdn,
    /// `kernels/conv.cu`.
    Conv,
    /// `kernels/ring_trackers.cu`.
    RingTrackers,
    /// `kernels/checkpointing_ssu.cu`.
    CheckpointingSsu,
    /// `kernels/ssd.cu`.
    Ssd,
    /// `kernels/gdn_chunk.cu`.
    GdnChunk,
}

impl KernelSource {
    /// File name under `crates/ssm-cuda/kernels/`.
    pub fn file(self) -> &'static str {
        match self {
            KernelSource::Ssu => "ssu.cu",
            KernelSource::Copy => "copy.cu",
            KernelSource::Gdn => "gdn.cu",
            KernelSource::Conv => "conv.cu",
            KernelSource::RingTrackers => "ring_trackers.cu",
            KernelSource::CheckpointingSsu => "checkpointing_ssu.cu",
            KernelSource::Ssd => "ssd.cu",
            KernelSource::GdnChunk => "gdn_chunk.cu",
        }
    }

    /// Every kernel source.
    pub const ALL: [KernelSource; 8] = [
        KernelSource::Ssu,
        KernelSource::Copy,
        KernelSource::Gdn,
        KernelSource::Conv,
        KernelSource::RingTrackers,
        KernelSource::CheckpointingSsu,
        KernelSource::Ssd,
        KernelSource::GdnChunk,
    ];

    /// The kernel's own text (without `common.cuh`).
    pub fn body(self) -> &'static str {
        match self {
            KernelSource::Ssu => SSU_SOURCE,
            KernelSource::Copy => COPY_SOURCE,
            KernelSource::Gdn => GDN_SOURCE,
            KernelSource::Conv => CONV_SOURCE,
            KernelSource::RingTrackers => RING_TRACKERS_SOURCE,
            KernelSource::CheckpointingSsu => CHECKPOINTING_SSU_SOURCE,
            KernelSource::Ssd => SSD_SOURCE,
            KernelSource::GdnChunk => GDN_CHUNK_SOURCE,
        }
    }

    /// The translation unit NVRTC sees: the common helpers followed by the kernel, with
    /// `#line` markers (see [`translation_unit`]).
    pub fn text(self) -> String {
        translation_unit(COMMON_SOURCE, self.file(), self.body())
    }
}

/// Composes one translation unit from the common helpers and a kernel `body` read from
/// `file`. NVRTC has no include directory here, so `common.cuh` is pasted in front of the
/// kernel; a `#line 1 "common.cuh"` marker before it and a `#line 1 "<file>"` marker before the
/// body make every diagnostic name the real file and line. `#pragma once` is blanked in place
/// (the line stays, so the numbering does too).
pub fn translation_unit(common: &str, file: &str, body: &str) -> String {
    let common = common.replace("#pragma once", "");
    let newline = if common.ends_with('\n') { "" } else { "\n" };
    format!("#line 1 \"common.cuh\"\n{common}{newline}#line 1 \"{file}\"\n{body}")
}

/// A compute capability, e.g. `Arch { major: 9, minor: 0 }` for sm_90.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Arch {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

impl Arch {
    /// sm_80 (A100).
    pub const SM80: Arch = Arch { major: 8, minor: 0 };
    /// sm_90 (H100, H200).
    pub const SM90: Arch = Arch { major: 9, minor: 0 };

    /// `sm_XY`.
    pub fn sm(self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sm())
    }
}

/// One kernel specialisation: a source, its entry point and the macros that specialise it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelSpec {
    /// The source file.
    pub source: KernelSource,
    /// The `extern "C"` entry point.
    pub entry: &'static str,
    /// `-DNAME=VALUE` macros, in a fixed order.
    pub defines: Vec<(&'static str, String)>,
}

impl std::fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.source.file(), self.entry)?;
        for (k, v) in &self.defines {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

/// The macro by which a specialisation asks for Hopper's `wgmma` (`WGMMA_ASKED=1`): on sm_90
/// it is compiled for sm_90a, the target that has those instructions (its cubin runs on sm_90
/// devices only, which is where this compiler's cubins run). The kernel keeps its other form
/// where the target lacks them (common.cuh's `HAS_WGMMA`).
pub const WGMMA_ASKED: &str = "WGMMA_ASKED";

impl KernelSpec {
    /// The NVRTC target for `arch`: `sm_XY`, or `sm_90a` for a specialisation that asks for
    /// `wgmma` on sm_90.
    pub fn target(&self, arch: Arch) -> String {
        let wgmma = self.defines.iter().any(|(k, v)| *k == WGMMA_ASKED && v == "1");
        if wgmma && arch == Arch::SM90 { format!("{}a", arch.sm()) } else { arch.sm() }
    }

    /// The NVRTC options for `arch`: C++17, accurate math (no fast-math: `expf`/`logf` must
    /// stay close to the CPU reference), line info for profilers, and the macros.
    pub fn options(&self, arch: Arch) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", self.target(arch)),
            "-std=c++17".to_string(),
            "--device-as-default-execution-space".to_string(),
            "-lineinfo".to_string(),
        ];
        o.extend(self.defines.iter().map(|(k, v)| format!("-D{k}={v}")));
        o
    }

    /// The disk-cache key: a 128-bit hash of source, options, NVRTC version and arch.
    pub fn cache_key(&self, arch: Arch, nvrtc: (i32, i32)) -> String {
        let mut h = Fnv128::new();
        h.write(self.source.text().as_bytes());
        for o in self.options(arch) {
            h.write(o.as_bytes());
            h.write(&[0]);
        }
        h.write(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
        h.write(arch.sm().as_bytes());
        format!("{:032x}", h.finish())
    }
}

/// The 16-byte copy kernel used as the bandwidth yardstick.
pub fn copy_kernel_spec() -> KernelSpec {
    KernelSpec { source: KernelSource::Copy, entry: "copy_u128", defines: vec![("UNROLL", "4".into())] }
}

/// FNV-1a over 128 bits: stable across Rust versions and processes (unlike `DefaultHasher`).
struct Fnv128(u128);

impl Fnv128 {
    fn new() -> Self {
        Fnv128(0x6c62272e07bb014262b821756295c58d)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(0x0000000001000000000000000000013B);
        }
    }
    fn finish(&self) -> u128 {
        self.0
    }
}

/// Where compiled cubins are kept on disk: `$SSM_CUDA_CACHE_DIR` (the value `off` disables
/// the disk cache), else `$XDG_CACHE_HOME/ssm-kernels/cubin`, else `$HOME/.cache/ssm-kernels/cubin`.
pub fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("SSM_CUDA_CACHE_DIR") {
        Some(v) if v == "off" => None,
        Some(v) if !v.is_empty() => Some(PathBuf::from(v)),
        _ => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(|v| PathBuf::from(v).join("ssm-kernels/cubin"))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ssm-kernels/cubin"))),
    }
}

/// A compiled specialisation.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    /// The cubin.
    pub cubin: Arc<Vec<u8>>,
    /// NVRTC's log (empty when loaded from disk).
    pub log: String,
    /// Whether it came from the disk cache.
    pub from_disk: bool,
}

/// `f` over `items` on up to `available_parallelism` scoped threads, the results in the items'
/// order. NVRTC compiles independent programs concurrently, so a batch of specialisations takes
/// about the time of its slowest few instead of their sum.
pub fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        // A worker that panicked re-raises its panic here (scope's own rule), as a serial loop would.
        workers.into_iter().flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e))).collect()
    });
    done.sort_unstable_by_key(|&(i, _)| i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// Compiles specialisations for one architecture, with an in-memory and an on-disk cache.
#[derive(Debug)]
pub struct Compiler {
    arch: Arch,
    disk: Option<PathBuf>,
    memory: Mutex<HashMap<KernelSpec, CompiledKernel>>,
}

impl Compiler {
    /// A compiler for `arch` caching on disk under `disk` (`None`: memory only).
    pub fn new(arch: Arch, disk: Option<PathBuf>) -> Self {
        Compiler { arch, disk, memory: Mutex::new(HashMap::new()) }
    }

    /// The target architecture.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The cubin of `spec`: from memory, else from disk, else compiled (and stored in both).
    pub fn cubin(&self, spec: &KernelSpec) -> Result<CompiledKernel, CudaError> {
        if let Some(k) = self.memory.lock().unwrap_or_else(|e| e.into_inner()).get(spec) {
            return Ok(k.clone());
        }
        let nvrtc = nvrtc_version()?;
        let key = spec.cache_key(self.arch, nvrtc);
        let path = self.disk.as_ref().map(|d| d.join(format!("{key}.cubin")));
        let compiled = match path.as_ref().and_then(|p| std::fs::read(p).ok()).filter(|b| b.starts_with(b"\x7fELF")) {
            Some(cubin) => CompiledKernel { cubin: Arc::new(cubin), log: String::new(), from_disk: true },
            None => {
                let source = spec.source.text();
                let c = compile_cubin(&source, spec.source.file(), &spec.options(self.arch), &spec.to_string())?;
                if let Some(p) = &path {
                    store_atomically(p, &c.cubin);
                }
                CompiledKernel { cubin: Arc::new(c.cubin), log: c.log, from_disk: false }
            }
        };
        self.memory.lock().unwrap_or_else(|e| e.into_inner()).insert(spec.clone(), compiled.clone());
        Ok(compiled)
    }

    /// [`cubin`](Self::cubin) of every spec, compiled concurrently ([`parallel_map`]); the
    /// results in the specs' order.
    pub fn cubins(&self, specs: &[KernelSpec]) -> Vec<Result<CompiledKernel, CudaError>> {
        parallel_map(specs, |s| self.cubin(s))
    }
}

/// Per-kernel resources as ptxas reports them (NVRTC's log with `--ptxas-options=-v`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceUsage {
    /// Registers per thread.
    pub registers: u32,
    /// Stack frame bytes per thread.
    pub stack_bytes: u32,
    /// Spill store bytes.
    pub spill_stores: u32,
    /// Spill load bytes.
    pub spill_loads: u32,
    /// Static shared memory bytes per block.
    pub shared_bytes: u32,
    /// ptxas serialized the kernel's `wgmma` products (its advisory C7515: each product waits
    /// for the one before).
    pub wgmma_serialized: bool,
}

impl ResourceUsage {
    /// Parses ptxas' verbose lines ("Used 60 registers", "0 bytes stack frame, 0 bytes spill
    /// stores, 0 bytes spill loads", "… 1024 bytes smem"). Missing figures stay 0.
    pub fn from_ptxas_log(log: &str) -> Self {
        fn number_before(line: &str, unit: &str) -> Option<u32> {
            let i = line.find(unit)?;
            line[..i].trim_end().rsplit([' ', ',', ':']).next()?.parse().ok()
        }
        let mut u = ResourceUsage::default();
        for line in log.lines() {
            if let Some(v) = number_before(line, "registers") {
                u.registers = v;
            }
            if let Some(v) = number_before(line, "bytes stack frame") {
                u.stack_bytes = v;
            }
            if let Some(v) = number_before(line, "bytes spill stores") {
                u.spill_stores = v;
            }
            if let Some(v) = number_before(line, "bytes spill loads") {
                u.spill_loads = v;
            }
            if let Some(v) = number_before(line, "bytes smem") {
                u.shared_bytes = v;
            }
        }
        u
    }
}

/// What [`compile_with_report`] gives: the cubin, its resources and the whole NVRTC/ptxas log.
#[derive(Debug)]
pub struct CompileReport {
    /// The compiled module.
    pub cubin: Vec<u8>,
    /// The entry's resources, read from the log.
    pub usage: ResourceUsage,
    /// NVRTC's log with ptxas' verbose report (`--ptxas-options=-v`), every entry's section.
    pub log: String,
}

/// Compiles `spec` for `arch` without any cache and with ptxas' resource report: for
/// `cargo xtask build-kernels` (no GPU needed).
pub fn compile_with_report(spec: &KernelSpec, arch: Arch) -> Result<CompileReport, CudaError> {
    let mut options = spec.options(arch);
    options.push("--ptxas-options=-v".to_string());
    let c = compile_cubin(&spec.source.text(), spec.source.file(), &options, &spec.to_string())?;
    let mut usage = ResourceUsage::from_ptxas_log(&entry_section(&c.log, spec.entry));
    usage.wgmma_serialized = wgmma_serialized(&c.log, spec.entry);
    Ok(CompileReport { cubin: c.cubin, usage, log: c.log })
}

/// Whether ptxas' advisory C7515 (serialized `wgmma` products) names `entry`. The advisories
/// name their function and precede the entries' sections.
fn wgmma_serialized(log: &str, entry: &str) -> bool {
    let quoted = format!("'{entry}'");
    log.lines().any(|l| l.contains("C7515") && l.contains(&quoted))
}

/// The lines of a ptxas report about entry `entry` (from its "Compiling entry function" line to
/// the next one): a source with several kernels reports each; the whole log when `entry` is not
/// named in it.
fn entry_section(log: &str, entry: &str) -> String {
    let marker = format!("Compiling entry function '{entry}'");
    let Some(start) = log.find(&marker) else { return log.to_string() };
    let rest = &log[start + marker.len()..];
    let end = rest.find("Compiling entry function").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Writes `bytes` to `path` through a temporary file and a rename; failures are logged only.
fn store_atomically(path: &Path, bytes: &[u8]) {
    let result = (|| -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let tmp = dir.join(format!(
            ".{}.{}.{nanos}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
            std::process::id()
        ));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    })();
    if let Err(e) = result {
        log::warn!(
            "ssm-cuda: could not write the kernel cache file {}: {e} (it will be compiled again next run)",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> KernelSpec {
        KernelSpec { source: KernelSource::Copy, entry: "copy_u128", defines: vec![("UNROLL", "4".into())] }
    }

    #[test]
    fn parallel_map_keeps_the_items_order() {
        let items: Vec<u64> = (0..1000).collect();
        let seen = std::sync::atomic::AtomicUsize::new(0);
        let out = parallel_map(&items, |&i| {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            i * i
        });
        assert_eq!(out, items.iter().map(|i| i * i).collect::<Vec<_>>());
        assert_eq!(seen.into_inner(), 1000, "every item once");
        assert!(parallel_map(&[] as &[u8], |&b| b).is_empty());
        assert_eq!(parallel_map(&[7u8], |&b| b + 1), [8]);
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let s = spec();
        let k = s.cache_key(Arch::SM90, (13, 0));
        assert_eq!(k.len(), 32);
        assert_eq!(k, s.cache_key(Arch::SM90, (13, 0)), "stable");
        assert_ne!(k, s.cache_key(Arch::SM80, (13, 0)), "arch");
        assert_ne!(k, s.cache_key(Arch::SM90, (13, 1)), "nvrtc version");
        let mut s2 = s.clone();
        s2.defines[0].1 = "2".into();
        assert_ne!(k, s2.cache_key(Arch::SM90, (13, 0)), "options");
        let s3 = KernelSpec { source: KernelSource::Ssu, ..s };
        assert_ne!(k, s3.cache_key(Arch::SM90, (13, 0)), "source");
    }

    #[test]
    fn line_markers_map_every_line_to_its_file() {
        for source in KernelSource::ALL {
            let text = source.text();
            let lines: Vec<&str> = text.lines().collect();
            assert_eq!(lines[0], "#line 1 \"common.cuh\"");
            // Line n of common.cuh is line n + 1 of the unit; the pragma's line stays, blank.
            for (n, line) in COMMON_SOURCE.lines().enumerate() {
                assert_eq!(lines[n + 1], line.replace("#pragma once", ""), "common.cuh:{}", n + 1);
            }
            let marker = format!("#line 1 \"{}\"", source.file());
            let at = lines.iter().position(|l| *l == marker).expect("the kernel's marker");
            assert_eq!(at, COMMON_SOURCE.lines().count() + 1, "the kernel's marker follows common.cuh");
            assert!(lines[at + 1..].iter().copied().eq(source.body().lines()), "{} follows its marker", source.file());
        }
        assert_eq!(translation_unit("a", "k.cu", "b"), "#line 1 \"common.cuh\"\na\n#line 1 \"k.cu\"\nb");
    }

    #[test]
    fn error_bits_are_defined_once_and_mirror_device_errors() {
        use crate::DeviceErrors;
        let expected = [
            ("ERR_SLOT", DeviceErrors::SLOT),
            ("ERR_CU_SEQLENS", DeviceErrors::CU_SEQLENS),
            ("ERR_ACCEPTED", DeviceErrors::ACCEPTED),
            ("ERR_COLUMN", DeviceErrors::COLUMN),
            ("ERR_CURSOR", DeviceErrors::CURSOR),
            ("ERR_ROW", DeviceErrors::ROW),
        ];
        let defines: Vec<(String, u32)> = COMMON_SOURCE
            .lines()
            .filter_map(|l| l.strip_prefix("#define ERR_"))
            .map(|rest| {
                let (name, value) = rest.split_once(' ').expect("#define ERR_NAME VALUEu");
                (format!("ERR_{name}"), value.trim().trim_end_matches('u').parse().expect("a decimal bit"))
            })
            .collect();
        let expected: Vec<(String, u32)> = expected.iter().map(|(n, b)| (n.to_string(), *b)).collect();
        assert_eq!(defines, expected, "common.cuh's ERR_* = DeviceErrors' bits");
        let bits: Vec<u32> = expected.iter().map(|e| e.1).collect();
        assert!(bits.iter().all(|b| b.is_power_of_two()), "one bit each");
        assert_eq!(bits.iter().fold(0, |a, b| a | b).count_ones() as usize, bits.len(), "no two share a bit");
        for source in KernelSource::ALL {
            assert!(!source.body().contains("#define ERR_"), "{} defines no error bit of its own", source.file());
        }
    }

    #[test]
    fn the_serialization_advisory_is_read_per_entry() {
        let log = "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are \
                   serialized due to non wgmma instructions defining accumulator registers of a wgmma between \
                   start and end of the pipeline stage in the function 'ssd_scan_kernel' in line 13813\n\
                   ptxas info    : Compiling entry function 'ssd_cb_kernel' for 'sm_90a'";
        assert!(wgmma_serialized(log, "ssd_scan_kernel"));
        assert!(!wgmma_serialized(log, "ssd_cb_kernel"));
        assert!(!wgmma_serialized(log, "ssd_scan"));
    }

    #[test]
    fn wgmma_specialisations_target_sm_90a_on_sm_90_only() {
        let mut s = spec();
        s.defines.push((WGMMA_ASKED, "1".into()));
        assert!(s.options(Arch::SM90).contains(&"--gpu-architecture=sm_90a".to_string()));
        assert!(s.options(Arch::SM80).contains(&"--gpu-architecture=sm_80".to_string()));
        s.defines.last_mut().unwrap().1 = "0".into();
        assert!(s.options(Arch::SM90).contains(&"--gpu-architecture=sm_90".to_string()));
    }

    #[test]
    fn options_name_the_arch_and_every_macro() {
        let o = spec().options(Arch::SM80);
        assert!(o.contains(&"--gpu-architecture=sm_80".to_string()));
        assert!(o.contains(&"-DUNROLL=4".to_string()));
        assert_eq!(spec().to_string(), "copy.cu:copy_u128 UNROLL=4");
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : Compiling entry function 'ssu_kernel' for 'sm_90'\n\
                   ptxas info    : Function properties for ssu_kernel\n\
                   ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 60 registers, used 1 barriers, 2048 bytes smem, 872 bytes cmem[0]\n";
        let u = ResourceUsage::from_ptxas_log(log);
        assert_eq!(
            u,
            ResourceUsage {
                registers: 60,
                stack_bytes: 16,
                spill_stores: 8,
                spill_loads: 12,
                shared_bytes: 2048,
                wgmma_serialized: false
            }
        );
    }

    #[test]
    fn ptxas_report_is_read_for_the_entry() {
        let log = "ptxas info    : Compiling entry function 'a' for 'sm_90'\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem\n\
                   ptxas info    : Compiling entry function 'b' for 'sm_90'\n\
                   ptxas info    : Used 90 registers, used 1 barriers, 128 bytes smem\n";
        assert_eq!(ResourceUsage::from_ptxas_log(&entry_section(log, "a")).registers, 40);
        assert_eq!(ResourceUsage::from_ptxas_log(&entry_section(log, "b")).registers, 90);
        assert_eq!(ResourceUsage::from_ptxas_log(&entry_section(log, "c")).registers, 90, "whole log");
    }

    #[test]
    fn a_failed_cache_write_is_only_a_warning() {
        // A path under a regular file cannot be created; the call must return normally.
        let file = std::env::temp_dir().join(format!("ssm-cuda-not-a-dir-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        store_atomically(&file.join("sub/k.cubin"), b"\x7fELF");
        assert!(!file.join("sub/k.cubin").exists());
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn atomic_store_writes_the_bytes() {
        let dir = std::env::temp_dir().join(format!("ssm-cuda-cache-test-{}", std::process::id()));
        let p = dir.join("a.cubin");
        store_atomically(&p, b"\x7fELFdata");
        assert_eq!(std::fs::read(&p).unwrap(), b"\x7fELFdata");
        let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()).collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
