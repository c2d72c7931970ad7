//! netcl's settings on one type: [`Config`], read once from the `NETCL_*` environment variables, settable from code for the whole process.
mod bytes;
mod env;

pub use bytes::parse_bytes;
pub use env::DEFAULT_CORPUS_LIMIT;

use crate::debug::DebugModes;
use crate::error::{Error, Result};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, OnceLock, RwLock};

/// Every library setting of netcl, one field each, named by its environment variable.
///
/// The process's settings are [`Config::get`]: the environment's, read once at the first call
/// ([`Config::from_env`]), until code replaces them with [`Config::set`] or [`Config::update`].
/// Readers take the current value when they act, so a change applies to what runs after it;
/// where a setting is read into longer-lived state, the field says so. A value the environment
/// gives that does not parse is, for the fields of type [`Setting`], an error naming the variable
/// whenever that setting is read (until code sets the field); other fields report it on stderr
/// and keep their default, as noted on each.
///
/// ```
/// use netcl_core_devices::Config;
/// Config::update(|c| c.tensor_cores = false);
/// assert!(!Config::get().tensor_cores);
/// ```
#[derive(Clone, Debug)]
pub struct Config {
    /// `NETCL_DEVICE`: the device `Device::best` picks (`host`, `cpu`, `gpu`, `gpu:1`,
    /// `opencl:P:D`); `None`: a GPU, else any OpenCL device, else the host.
    pub device: Option<String>,
    /// `NETCL_DEBUG=nan,sync,gemm` (or `all`: nan and sync): NaN/Inf checks on every op and
    /// backward rule, a queue finish after every launch, each distinct GEMM plan printed once.
    pub debug: Setting<DebugModes>,
    /// `NETCL_REQUIRE_OPENCL=1`: the test device lists fail instead of skipping OpenCL when no
    /// OpenCL device is present (a switch for test suites).
    pub require_opencl: bool,
    /// `NETCL_POOL_LIMIT` (bytes, or with K/M/G): cap on the bytes each device pool holds from
    /// the driver (read when the pool is made) and on the bytes host tensors hold.
    pub pool_limit: Setting<Option<usize>>,
    /// `NETCL_POOL_EXACT=1`: device pools hand out buffers of exactly the bytes asked (for memory
    /// checkers such as Oclgrind; read when the pool is made).
    pub pool_exact: Setting<bool>,
    /// `NETCL_CACHE_DIR`: where compiled kernel binaries (and the tuning table, the graph key) are
    /// kept; default `$XDG_CACHE_HOME/netcl`, else `$HOME/.cache/netcl`; `off` (`None`) disables.
    pub cache_dir: Option<PathBuf>,
    /// `NETCL_TUNING`: the GEMM tuning table read and written by the autotuner; `None`:
    /// `tuning.json` in [`Config::cache_dir`]. Read per device at its first product.
    pub tuning: Option<PathBuf>,
    /// `NETCL_TC_TILE=warps_m,warps_n,mi,nj,kw,stages`: the tensor-core GEMM's tiling for every
    /// product (parsed by netcl-kernels; malformed: reported on stderr and ignored).
    pub tc_tile: Option<String>,
    /// `NETCL_WG_TILE=tbn,stages[,persistent[,ws]]`: the `wgmma` GEMM's tiling for every product
    /// (parsed by netcl-kernels; malformed: reported on stderr and ignored).
    pub wg_tile: Option<String>,
    /// `NETCL_GEMM_ASYNC`: `0` turns the pipelined f32 GEMM off; `stages[,k step[,registers]]`
    /// tunes it (parsed by netcl-kernels).
    pub gemm_async: Option<String>,
    /// `NETCL_CPU_GEMM`: `0` sends CPU OpenCL devices to the portable GEMM;
    /// `rm,nv,rmt,rn,group` changes matmul_cpu.cl's blocking (parsed by netcl-kernels).
    pub cpu_gemm: Option<String>,
    /// `NETCL_GEMM_SPLIT=S`: split the K of every product S divides into S chunks (1: none), for
    /// measuring split-K.
    pub gemm_split: Option<u32>,
    /// `NETCL_MATMUL_PRECISION` (`highest` or `high`): the process's default f32 matmul
    /// precision (a bad value is reported on stderr and ignored).
    pub matmul_precision: MatmulPrecision,
    /// `NETCL_TENSOR_CORES=0` (`false`): never use the tensor-core GEMM, even where its probe passes.
    pub tensor_cores: bool,
    /// `NETCL_WGMMA=0` (`false`): tensor-core products through `mma.sync` instead of Hopper's `wgmma`.
    pub wgmma: bool,
    /// `NETCL_ATTENTION_TC=0` (`false`): bf16/f16 fused attention keeps its portable kernels.
    pub attention_tc: bool,
    /// `NETCL_ATTENTION_DS=0` (`false`): the f32/f64 fused attention backward computes dq in its
    /// own kernel instead of from the scores' gradients and a GEMM.
    pub attention_ds: bool,
    /// `NETCL_GRAPH_QUEUES`: queues a graph replay spreads over unless `Graph::use_queues` says
    /// otherwise (default 1; 0 or a non-number: 1).
    pub graph_queues: usize,
    /// `NETCL_GRAPH_COMMAND_BUFFER=0` (`false`): replays enqueue step by step even where the
    /// device has cl_khr_command_buffer.
    pub graph_command_buffer: bool,
    /// `NETCL_GRAPH_KEY`: the file of the key that seals graph files; `None`: `graph.key` in
    /// [`Config::cache_dir`].
    pub graph_key: Option<PathBuf>,
    /// `NETCL_PROFILE=1`: profile the whole process (summary on stderr and trace at exit; read
    /// when the profiler is first consulted).
    pub profile: bool,
    /// `NETCL_PROFILE_DIR`: where `NETCL_PROFILE=1` writes `trace.json` (default `netcl-profile`).
    pub profile_dir: PathBuf,
    /// `NETCL_DECODE_REPLAY=0` (`false`): Llama decoding runs every step eagerly instead of
    /// replaying the first step's capture.
    pub decode_replay: bool,
    /// `NETCL_DECODE_BLOCK=0` (`false`): Llama decoding runs each block as five kernels instead
    /// of one persistent `decode_block` kernel.
    pub decode_block: bool,
    /// `NETCL_RELAY_CHUNK` (bytes, 4 KiB to 256 MiB; default 4M): chunk size of the collectives'
    /// device relay between OpenCL ranks (the same on every rank; read once per process).
    pub relay_chunk: Setting<usize>,
    /// `NETCL_DATA`: the folder with the Fashion-MNIST IDX files.
    pub data_dir: Option<PathBuf>,
    /// `NETCL_PROGRESS=plain`: plain progress lines instead of a bar on a terminal.
    pub progress_plain: bool,
    /// `NETCL_CORPUS_LIMIT` (bytes, or with K/M/G; default 1 GiB): the most bytes a text corpus reads.
    pub corpus_limit: Setting<u64>,
}

/// A setting whose environment value may have failed to parse: reading it then is an error
/// naming the variable. `value.into()` sets one from code.
#[derive(Clone, Debug)]
pub struct Setting<T>(std::result::Result<T, (&'static str, String)>);

impl<T: Clone> Setting<T> {
    /// The value, or the error naming the variable whose value did not parse.
    pub fn get(&self) -> Result<T> {
        self.0
            .clone()
            .map_err(|(var, msg)| Error::invalid(var, msg))
    }
}

impl<T> From<T> for Setting<T> {
    fn from(v: T) -> Setting<T> {
        Setting(Ok(v))
    }
}

fn current() -> &'static RwLock<Arc<Config>> {
    static CURRENT: OnceLock<RwLock<Arc<Config>>> = OnceLock::new();
    CURRENT.get_or_init(|| RwLock::new(Arc::new(Config::from_env())))
}

impl Config {
    /// The process's settings now (the environment's, unless code set them).
    pub fn get() -> Arc<Config> {
        current().read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the process's settings.
    pub fn set(config: Config) {
        *current().write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
    }

    /// Changes the process's settings in place: `Config::update(|c| c.tensor_cores = false)`.
    /// Concurrent updates apply one after the other; `change` must not call `Config` itself (it
    /// runs under the settings' write lock).
    pub fn update(change: impl FnOnce(&mut Config)) {
        let mut lock = current().write().unwrap_or_else(|e| e.into_inner());
        change(Arc::make_mut(&mut lock));
    }

    /// The settings the environment gives (read now).
    pub fn from_env() -> Config {
        Config::from_lookup(|name| std::env::var(name).ok())
    }

    /// The settings `lookup` gives, a variable's name to its value (`None`: unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Config {
        env::parse(&mut env::Env::new(&lookup))
    }

    /// The names of the `NETCL_*` variables a [`Config`] reads, in field order.
    pub fn variables() -> Vec<&'static str> {
        let lookup = |_: &str| None;
        let mut env = env::Env::new(&lookup);
        env::parse(&mut env);
        env.names()
    }
}

impl Default for Config {
    /// Every setting's default, as with no `NETCL_*` variable set (and no kernel cache folder).
    fn default() -> Config {
        Config::from_lookup(|_| None)
    }
}

/// How f32 matrix products may be computed (PyTorch's `set_float32_matmul_precision`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Exact f32 multiply-adds (the default).
    Highest,
    /// TF32 tensor cores where the device has them (inputs cut to 10 mantissa bits: rounded to
    /// nearest through mma.sync, truncated by Hopper's wgmma; f32 accumulation: about 1e-3
    /// relative error); exact f32 elsewhere.
    High,
}

impl FromStr for MatmulPrecision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "highest" => Ok(MatmulPrecision::Highest),
            "high" => Ok(MatmulPrecision::High),
            _ => Err(Error::invalid(
                "matmul precision",
                format!("{s:?} is not `highest` or `high`"),
            )),
        }
    }
}
