//! The environment's reading of each setting: one line per `NETCL_*` variable, with its default and its parse.
use super::{parse_bytes, Config, MatmulPrecision, Setting};
use crate::debug::DebugModes;
use std::path::{Path, PathBuf};

/// The most bytes a text corpus reads unless `NETCL_CORPUS_LIMIT` says otherwise.
pub const DEFAULT_CORPUS_LIMIT: u64 = 1 << 30;
/// The relay's chunk unless `NETCL_RELAY_CHUNK` says otherwise.
const DEFAULT_RELAY_CHUNK: usize = 4 << 20;

/// A variable lookup that remembers which variables were asked for.
pub(super) struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    names: Vec<&'static str>,
}

impl<'a> Env<'a> {
    pub(super) fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Env<'a> {
        Env {
            lookup,
            names: Vec::new(),
        }
    }

    /// The `NETCL_*` variables asked for so far.
    pub(super) fn names(&self) -> Vec<&'static str> {
        self.names
            .iter()
            .copied()
            .filter(|n| n.starts_with("NETCL_"))
            .collect()
    }

    fn var(&mut self, name: &'static str) -> Option<String> {
        self.names.push(name);
        (self.lookup)(name)
    }

    /// Set and not blank.
    fn text(&mut self, name: &'static str) -> Option<String> {
        self.var(name).filter(|v| !v.trim().is_empty())
    }

    /// On unless the variable is `0`.
    fn on_unless_0(&mut self, name: &'static str) -> bool {
        self.var(name).is_none_or(|v| v != "0")
    }

    /// A parse whose failure is an error naming the variable when the setting is read.
    fn setting<T>(
        &mut self,
        name: &'static str,
        parse: impl FnOnce(Option<String>) -> Result<T, String>,
    ) -> Setting<T> {
        Setting(parse(self.var(name)).map_err(|msg| (name, msg)))
    }
}

/// A byte count (blank or unset: `default`).
fn bytes(v: Option<String>, default: usize) -> Result<usize, String> {
    match v {
        Some(v) if !v.trim().is_empty() => parse_bytes(&v).map_err(|e| e.to_string()),
        _ => Ok(default),
    }
}

pub(super) fn parse(env: &mut Env) -> Config {
    Config {
        device: env.text("NETCL_DEVICE"),
        debug: env.setting("NETCL_DEBUG", |v| {
            v.map_or(Ok(DebugModes::default()), |v| DebugModes::parse(&v))
        }),
        require_opencl: env.var("NETCL_REQUIRE_OPENCL").is_some_and(|v| v == "1"),
        pool_limit: env.setting("NETCL_POOL_LIMIT", |v| match v {
            Some(v) if !v.trim().is_empty() => parse_bytes(&v).map(Some).map_err(|e| e.to_string()),
            _ => Ok(None),
        }),
        pool_exact: env.setting("NETCL_POOL_EXACT", |v| match v.as_deref() {
            Some("1") => Ok(true),
            Some("0") | Some("") | None => Ok(false),
            Some(v) => Err(format!("{v:?}: 1 (exact-size buffers) or 0")),
        }),
        cache_dir: match env.var("NETCL_CACHE_DIR") {
            Some(v) if v == "off" => None,
            Some(v) if !v.trim().is_empty() => Some(PathBuf::from(v)),
            _ => env
                .var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| env.var("HOME").map(|h| Path::new(&h).join(".cache")))
                .map(|d| d.join("netcl")),
        },
        tuning: env.var("NETCL_TUNING").map(PathBuf::from),
        tc_tile: env.var("NETCL_TC_TILE"),
        wg_tile: env.var("NETCL_WG_TILE"),
        gemm_async: env.var("NETCL_GEMM_ASYNC"),
        cpu_gemm: env.var("NETCL_CPU_GEMM"),
        gemm_split: env
            .var("NETCL_GEMM_SPLIT")
            .and_then(|v| v.trim().parse().ok()),
        matmul_precision: env
            .var("NETCL_MATMUL_PRECISION")
            .map_or(MatmulPrecision::Highest, |v| {
                v.parse().unwrap_or_else(|e| {
                    eprintln!("netcl: NETCL_MATMUL_PRECISION ignored: {e}");
                    MatmulPrecision::Highest
                })
            }),
        tensor_cores: env.on_unless_0("NETCL_TENSOR_CORES"),
        wgmma: env.on_unless_0("NETCL_WGMMA"),
        attention_tc: env.on_unless_0("NETCL_ATTENTION_TC"),
        attention_ds: env.on_unless_0("NETCL_ATTENTION_DS"),
        graph_queues: env
            .var("NETCL_GRAPH_QUEUES")
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1),
        graph_command_buffer: env.on_unless_0("NETCL_GRAPH_COMMAND_BUFFER"),
        graph_key: env.text_or_empty_path("NETCL_GRAPH_KEY"),
        profile: env.var("NETCL_PROFILE").is_some_and(|v| v.trim() == "1"),
        profile_dir: env
            .text_or_empty_path("NETCL_PROFILE_DIR")
            .unwrap_or_else(|| PathBuf::from("netcl-profile")),
        decode_replay: env.on_unless_0("NETCL_DECODE_REPLAY"),
        decode_block: env.on_unless_0("NETCL_DECODE_BLOCK"),
        relay_chunk: env.setting("NETCL_RELAY_CHUNK", |v| {
            bytes(v, DEFAULT_RELAY_CHUNK).map(|b| b.clamp(4096, 256 << 20))
        }),
        data_dir: env.text_or_empty_path("NETCL_DATA"),
        progress_plain: env.var("NETCL_PROGRESS").is_some_and(|v| v == "plain"),
        corpus_limit: env.setting("NETCL_CORPUS_LIMIT", |v| {
            bytes(v, DEFAULT_CORPUS_LIMIT as usize).map(|n| n as u64)
        }),
    }
}

impl Env<'_> {
    /// A path, unless unset or empty.
    fn text_or_empty_path(&mut self, name: &'static str) -> Option<PathBuf> {
        self.var(name).filter(|v| !v.is_empty()).map(PathBuf::from)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn with(pairs: &[(&str, &str)]) -> Config {
        Config::from_lookup(|name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_without_variables() {
        let c = with(&[]);
        assert!(c.tensor_cores && c.wgmma && c.attention_tc && c.attention_ds);
        assert!(c.decode_replay && c.decode_block && c.graph_command_buffer && !c.profile);
        assert_eq!(c.graph_queues, 1);
        assert_eq!(c.pool_limit.get().unwrap(), None);
        assert_eq!(c.relay_chunk.get().unwrap(), 4 << 20);
        assert_eq!(c.corpus_limit.get().unwrap(), 1 << 30);
        assert_eq!(c.cache_dir, None);
    }

    #[test]
    fn values_parse_and_bad_ones_are_errors_naming_the_variable() {
        let c = with(&[
            ("NETCL_TENSOR_CORES", "0"),
            ("NETCL_POOL_LIMIT", "2G"),
            ("NETCL_RELAY_CHUNK", "1K"),
            ("NETCL_GRAPH_QUEUES", "0"),
            ("NETCL_CACHE_DIR", "off"),
            ("NETCL_DEBUG", "nan,gemm"),
            ("NETCL_POOL_EXACT", "yes"),
            ("NETCL_CORPUS_LIMIT", "lots"),
        ]);
        assert!(!c.tensor_cores);
        assert_eq!(c.pool_limit.get().unwrap(), Some(2 << 30));
        assert_eq!(c.relay_chunk.get().unwrap(), 4096);
        assert_eq!(c.graph_queues, 1);
        assert_eq!(c.cache_dir, None);
        let d = c.debug.get().unwrap();
        assert!(d.nan && d.gemm && !d.sync);
        let e = c.pool_exact.get().unwrap_err().to_string();
        assert!(e.starts_with("NETCL_POOL_EXACT"), "{e}");
        let e = c.corpus_limit.get().unwrap_err().to_string();
        assert!(e.starts_with("NETCL_CORPUS_LIMIT"), "{e}");
        let e = with(&[("NETCL_DEBUG", "nope")]).debug.get().unwrap_err();
        assert!(e.to_string().contains("NETCL_DEBUG"), "{e}");
    }

    #[test]
    fn variables_are_named_once_each() {
        let names = Config::variables();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "{names:?}");
        assert!(names.contains(&"NETCL_DEVICE") && names.contains(&"NETCL_CORPUS_LIMIT"));
    }
}
