//! Building programs: from an on-disk binary when one matches, else from source; cached per device in memory.
use crate::disk_cache::{self, Key};
use crate::sources::{prelude, Source, COMMON};
use netcl_core_devices::opencl3::program::Program as ClProgram;
use netcl_core_devices::{ClResultExt, Device, Error, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A built program for one device.
pub struct Program {
    pub(crate) inner: ClProgram,
    /// Unique in this process; keys the per-thread kernel objects.
    pub(crate) id: u64,
    pub source: Source,
    pub options: String,
    pub device: Device,
    /// Where the executable came from.
    pub origin: Origin,
}

/// Where a program's executable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Compiled from OpenCL C (and stored on disk, when a cache directory is set).
    Source,
    /// Loaded from a binary in the disk cache.
    DiskCache,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn check_options(device: &Device, source: &Source, options: &str) -> Result<()> {
    if options.contains('\0') {
        return Err(Error::invalid(
            "build program",
            format!("options for {} contain a NUL byte", source.name),
        ));
    }
    if (options.contains("-DDT_F64") || options.contains("-DNETCL_FP64")) && !device.info().fp64 {
        return Err(Error::dtype(
            source.name,
            format!("{device} does not support f64 (no cl_khr_fp64)"),
        ));
    }
    Ok(())
}

/// The text a program of `source` is built from: kernels/common.cl, its prelude (if any), its own.
fn program_text(source: &Source) -> String {
    match prelude(source) {
        "" => format!("{}\n{}", COMMON.text, source.text),
        p => format!("{}\n{p}\n{}", COMMON.text, source.text),
    }
}

/// The build flags the driver adds on its own, which change the binary as the options do: PoCL's
/// `POCL_EXTRA_BUILD_FLAGS` (test processes set `-cl-opt-disable`; without it in the key, their
/// unoptimised binaries were handed to later processes, 30x slower). Read as the driver reads it,
/// at build time.
fn driver_flags() -> String {
    std::env::var("POCL_EXTRA_BUILD_FLAGS").unwrap_or_default()
}

/// The disk cache's key of `source` (whose full text is `text`) built for `device` with `options`
/// while the driver adds `flags` ([`driver_flags`]).
fn cache_key(device: &Device, source: &Source, text: &str, options: &str, flags: &str) -> Key {
    let info = device.info();
    Key::new(&[
        "netcl-program-v1",
        source.name,
        text,
        options,
        &info.platform,
        &info.platform_version,
        &info.name,
        &info.driver_version,
        flags,
    ])
}

/// Build `source` (with kernels/common.cl in front) for `device` with `options`, through the
/// disk cache in `cache_dir` when given. A missing, corrupt or rejected binary rebuilds from source.
pub fn build(
    device: &Device,
    source: &Source,
    options: &str,
    cache_dir: Option<&Path>,
) -> Result<Program> {
    check_options(device, source, options)?;
    let verbose = verbose_build(device)?;
    let options = &format!("{options}{verbose}");
    let cl = device.cl(source.name)?;
    let text = program_text(source);
    let key = cache_key(device, source, &text, options, &driver_flags());
    let file = cache_dir.map(|d| disk_cache::path(d, source.name.trim_end_matches(".cl"), key));
    let make = |inner, origin| Program {
        inner,
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        source: *source,
        options: options.to_string(),
        device: device.clone(),
        origin,
    };
    if let Some(bin) = file.as_deref().and_then(|f| disk_cache::load(f, key)) {
        match ClProgram::create_and_build_from_binary(&cl.context, &[&bin], options) {
            Ok(p) => return Ok(make(p, Origin::DiskCache)),
            Err(e) => log::info!(
                "cached binary for {} rejected ({e}); rebuilding from source",
                source.name
            ),
        }
    }
    let mut program =
        ClProgram::create_from_source(&cl.context, &text).cl("clCreateProgramWithSource")?;
    let mut build_options = match sm90a_shared(options) {
        Some(_) => format!("{options} -DSM90A_STUB={SM90A_STUB}"),
        None => options.to_string(),
    };
    // Kernels may take another form on CPU devices, whose compilers run a work-group's items as
    // a loop (kernels/common.cl).
    if device.kind() == netcl_core_devices::DeviceKind::Cpu {
        build_options.push_str(" -DNETCL_CPU");
    }
    if let Err(e) = program.build(&[cl.id.id()], &build_options) {
        let log = program
            .get_build_log(cl.id.id())
            .unwrap_or_else(|_| format!("(no build log; error {})", e.0));
        return Err(Error::KernelBuild {
            file: source.name.to_string(),
            options: options.to_string(),
            log,
        });
    }
    if netcl_core_devices::debug::build_logs()? {
        let log = program.get_build_log(cl.id.id()).unwrap_or_default();
        eprintln!(
            "netcl build {} ({options}) on {device}:\n{log}",
            source.name
        );
    }
    if let Some(shared) = sm90a_shared(options) {
        let threads = sm90a_threads(options);
        program =
            sm90a_program(&cl.context, cl.id.id(), &program, shared, threads).map_err(|log| {
                Error::KernelBuild {
                    file: source.name.to_string(),
                    options: options.to_string(),
                    log,
                }
            })?;
    }
    if let Some(f) = &file {
        match program.get_binaries() {
            Ok(bins) if bins.len() == 1 && !bins[0].is_empty() => {
                disk_cache::store(f, key, &bins[0])
            }
            _ => log::info!("{}: the driver returned no binary to cache", source.name),
        }
    }
    Ok(make(program, Origin::Source))
}

/// The option that makes the compiler describe each kernel under `NETCL_DEBUG=build`: NVIDIA's
/// `-cl-nv-verbose` (registers, spills, local memory); nothing elsewhere or when off. A part of
/// the options, so such builds never come from or go to another build's cache entry.
fn verbose_build(device: &Device) -> Result<&'static str> {
    let nv = device.info().extensions.contains("cl_nv_compiler_options");
    Ok(if nv && netcl_core_devices::debug::build_logs()? {
        " -cl-nv-verbose"
    } else {
        ""
    })
}

/// The bytes of the one `__local` array of `-DSM90A_SHARED=<bytes>` programs, passed to them as
/// `-DSM90A_STUB` and found by `sm90a_program` in the PTX as `[40976]` (a size no other
/// declaration of theirs has) to be resized.
const SM90A_STUB: usize = 40976;

/// The local memory `-DSM90A_SHARED=<bytes>` asks for: such programs are rebuilt as sm_90a PTX.
pub(crate) fn sm90a_shared(options: &str) -> Option<usize> {
    option_value(options, "-DSM90A_SHARED=")
}

/// The work-group size `-DSM90A_THREADS=<n>` programs are launched with (their PTX says so).
pub(crate) fn sm90a_threads(options: &str) -> Option<usize> {
    option_value(options, "-DSM90A_THREADS=")
}

/// The number after `prefix` in `options` (e.g. `-DSM90A_THREADS=`: the work-group size an
/// sm_90a program is launched with).
fn option_value(options: &str, prefix: &str) -> Option<usize> {
    let rest = options
        .split_whitespace()
        .find_map(|o| o.strip_prefix(prefix))?;
    rest.parse().ok()
}

/// `program` (built from source as NVIDIA's sm_90 PTX) rebuilt as sm_90a PTX: Hopper's wgmma is
/// in sm_90a only, which NVIDIA's OpenCL compiler does not target. Sources write sm_90a
/// instructions as `//sm90a: ` comments in their inline PTX; here the comments become instructions
/// and the `SM90A_STUB`-byte local array takes `shared` bytes (OpenCL C caps local memory at
/// 48 KiB; the driver launches the PTX's static size). Errors come back as a build log.
fn sm90a_program(
    context: &netcl_core_devices::opencl3::context::Context,
    device: netcl_core_devices::cl3::types::cl_device_id,
    program: &ClProgram,
    shared: usize,
    threads: Option<usize>,
) -> std::result::Result<ClProgram, String> {
    let bins = program
        .get_binaries()
        .map_err(|e| format!("no PTX to patch: {e}"))?;
    let ptx = bins
        .first()
        .map(|b| String::from_utf8_lossy(b).into_owned());
    let text = sm90a_ptx(&ptx.unwrap_or_default(), shared, threads)?;
    // SAFETY: `device` is the context's device.
    let mut patched =
        unsafe { ClProgram::create_from_binary(context, &[device], &[text.as_bytes()]) }
            .map_err(|e| format!("clCreateProgramWithBinary (sm_90a PTX): {e}"))?;
    if let Err(e) = patched.build(&[device], "") {
        let log = patched.get_build_log(device).unwrap_or_default();
        return Err(format!("sm_90a PTX rejected ({e}): {log}"));
    }
    Ok(patched)
}

/// `ptx` (NVIDIA's sm_90 PTX of an sm_90a source) as sm_90a PTX, NUL-terminated: the `//sm90a: `
/// comments become instructions, the `SM90A_STUB`-byte local array takes `shared` bytes, and where
/// `threads` is given each entry states that work-group size and its register budget (the driver's
/// CL_KERNEL_WORK_GROUP_SIZE for such programs does not follow the PTX's .reqntid, and larger
/// groups failed to launch without the budget stated).
fn sm90a_ptx(
    ptx: &str,
    shared: usize,
    threads: Option<usize>,
) -> std::result::Result<String, String> {
    if !ptx.contains(".target sm_90,") {
        return Err("sm_90a programs need a device whose PTX targets sm_90".into());
    }
    let stub = format!("[{SM90A_STUB}]");
    let mut text = String::with_capacity(ptx.len());
    let (mut entry, mut sized) = (false, false);
    for line in ptx.lines() {
        if line.contains(".entry ") {
            (entry, sized) = (true, false);
        } else if entry && (line.contains(".reqntid") || line.contains(".maxntid")) {
            sized = true;
        } else if entry && line.trim() == "{" {
            entry = false;
            if let Some(n) = threads {
                if !sized {
                    text.push_str(&format!(".maxntid {n}, 1, 1\n"));
                }
                text.push_str(&format!(".maxnreg {}\n", (65536 / n).min(255) / 8 * 8));
            }
        }
        let line = line.replace(".target sm_90,", ".target sm_90a,");
        let line = line.replace("//sm90a: ", "");
        if shared > 0 && line.contains(".shared") && line.contains(&stub) {
            text.push_str(&line.replace(&stub, &format!("[{shared}]")));
        } else {
            text.push_str(&line);
        }
        text.push('\n');
    }
    text.push('\0');
    Ok(text)
}

/// (device ordinal, program name, options, the source text's address and length): two sources of
/// one name (netcl's own and one a graph file brought) never share, or replace each other's,
/// program. Source texts live for the process (`&'static`, never freed), so an address names one
/// text; hashing the text instead cost tens of microseconds a launch.
type ProgramKey = (usize, &'static str, String, (usize, usize));

/// Where programs for `device` keep their binaries: the disk cache, except under PoCL, which keeps
/// each kernel's build in its own cache (`POCL_CACHE_DIR`) and, asked for a program's binary,
/// compiles every kernel of the program, used or not.
pub fn binary_cache_dir(device: &Device) -> Option<std::path::PathBuf> {
    let pocl = device
        .info()
        .platform
        .contains("Portable Computing Language");
    disk_cache::default_dir().filter(|_| !pocl)
}

/// The program for (`device`, `source`, `options`), built once per process and cached in memory.
pub fn program(device: &Device, source: &Source, options: &str) -> Result<Arc<Program>> {
    static PROGRAMS: OnceLock<Mutex<HashMap<ProgramKey, Arc<Program>>>> = OnceLock::new();
    let programs = PROGRAMS.get_or_init(|| Mutex::new(HashMap::new()));
    let key = (
        device.ordinal(),
        source.name,
        options.to_string(),
        (source.text.as_ptr() as usize, source.text.len()),
    );
    let mut map = programs.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = map.get(&key) {
        return Ok(p.clone());
    }
    let p = Arc::new(build(
        device,
        source,
        options,
        binary_cache_dir(device).as_deref(),
    )?);
    log::debug!(
        "built {} [{}] for {} ({:?})",
        source.name,
        options,
        device,
        p.origin
    );
    map.insert(key, p.clone());
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm90a_ptx_uncomments_resizes_and_sizes_the_entry() {
        let ptx = format!(
            ".version 9.0\n.target sm_90, texmode_independent\n.entry k(\n.param .u32 n\n)\n.reqntid 384, 1, 1\n{{\n.shared .align 16 .b8 s[{SM90A_STUB}];\n//sm90a: wgmma.fence.sync.aligned;\nret;\n}}\n"
        );
        let out = sm90a_ptx(&ptx, 99000, Some(384)).unwrap();
        assert!(out.contains(".target sm_90a,") && !out.contains("sm_90,"));
        assert!(out.contains(".b8 s[99000];") && out.contains("\nwgmma.fence.sync.aligned;"));
        // The stated size stays, the register budget (65536 / 384, to a multiple of 8) comes
        // before the body.
        assert!(out.contains(".reqntid 384, 1, 1\n.maxnreg 168\n{") && !out.contains(".maxntid"));
        let bare = ptx.replace(".reqntid 384, 1, 1\n", "");
        let out = sm90a_ptx(&bare, 0, Some(320)).unwrap();
        assert!(out.contains(")\n.maxntid 320, 1, 1\n.maxnreg 200\n{"));
        assert!(
            out.contains(&format!("[{SM90A_STUB}]")),
            "no size given: the stub stays"
        );
        assert!(!sm90a_ptx(&ptx, 0, None).unwrap().contains(".maxnreg"));
        assert!(sm90a_ptx(".target sm_80, texmode_independent\n", 0, None).is_err());
    }
    use crate::sources::COPY;

    #[test]
    fn a_binary_the_driver_rejects_is_rebuilt_from_source() {
        let Ok(devices) = netcl_core_devices::opencl_test_devices() else {
            panic!("OpenCL required")
        };
        for dev in devices {
            let dir = tempfile::tempdir().unwrap();
            build(&dev, &COPY, "-DDT_F32", Some(dir.path())).unwrap();
            let file = std::fs::read_dir(dir.path())
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path();
            // A well-formed cache file around bytes that are no program binary.
            let text = program_text(&COPY);
            let key = cache_key(&dev, &COPY, &text, "-DDT_F32", &driver_flags());
            // PoCL's unoptimised builds (the tests') are cached apart from optimised ones.
            let plain = cache_key(&dev, &COPY, &text, "-DDT_F32", "");
            let unoptimised = cache_key(&dev, &COPY, &text, "-DDT_F32", "-cl-opt-disable");
            assert_ne!(plain, unoptimised);
            assert_eq!(disk_cache::path(dir.path(), "copy", key), file);
            disk_cache::store(&file, key, b"definitely not a binary");
            assert!(disk_cache::load(&file, key).is_some());
            let p = build(&dev, &COPY, "-DDT_F32", Some(dir.path())).unwrap();
            assert_eq!(p.origin, Origin::Source);
            assert_eq!(
                build(&dev, &COPY, "-DDT_F32", Some(dir.path()))
                    .unwrap()
                    .origin,
                Origin::DiskCache
            );
        }
    }
}
