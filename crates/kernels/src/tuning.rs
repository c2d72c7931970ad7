//! Tuning data per device (GEMM tile sizes, the tensor-core tiling, the GEMM planner's costs and thresholds): the user's autotuned file first, then kernels/tuning.json, then defaults by device kind.
use crate::gemm_tuning::PlanTuning;
use crate::tc_tile::TcTile;
use netcl_core_devices::{Config, Device, DeviceKind, Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// GEMM tiling: a work-group computes a `bm` x `bn` tile of C, stepping `bk` along K; each
/// work-item computes `wm` x `wn` outputs (so work-groups are (bn/wn) x (bm/wm) items).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmTile {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    pub wm: u32,
    pub wn: u32,
}

impl GemmTile {
    /// A `bm` x `bn` output tile stepping `bk` along K, `wm` x `wn` outputs per work-item.
    pub const fn new(bm: u32, bn: u32, bk: u32, wm: u32, wn: u32) -> GemmTile {
        GemmTile { bm, bn, bk, wm, wn }
    }

    /// This tile with its columns (`cols`) or rows halved, and the per-item block along that side
    /// halved too, but not below `least` (nor raised where it already was).
    fn halved(self, cols: bool, least: u32) -> GemmTile {
        let half = |w: u32| (w / 2).max(least.min(w));
        match cols {
            true => GemmTile {
                bn: self.bn / 2,
                wn: half(self.wn),
                ..self
            },
            false => GemmTile {
                bm: self.bm / 2,
                wm: half(self.wm),
                ..self
            },
        }
    }

    /// Work-group size (along n, along m).
    pub fn local(&self) -> [usize; 2] {
        [(self.bn / self.wn) as usize, (self.bm / self.wm) as usize]
    }

    /// The `-D` options of kernels/matmul_tiled.cl.
    pub fn options(&self) -> String {
        format!(
            "-DBM={} -DBN={} -DBK={} -DWM={} -DWN={}",
            self.bm, self.bn, self.bk, self.wm, self.wn
        )
    }

    /// This tile, shrunk while an `m` x `n` x `batch` GEMM would leave compute units idle, so
    /// that small GEMMs (a 256-row batch through a 1024-wide layer) fill the device. Where both
    /// sides fill a tile, first one side at a time (the wider, columns on a tie) with the
    /// per-item block halved only down to 4 and the work-group kept at 128 items or more (larger
    /// per-item blocks keep the MLP's 256 x 1024 x 784 product faster; netcl-bench's train
    /// suite). Then tile and per-item block halved together (the
    /// work-group keeps its size). Seven eighths of a wave counts as a full one. A side at most
    /// half a tile long halves the tile along it first where the device is full anyway.
    pub fn fit(self, m: usize, n: usize, batch: usize, compute_units: usize) -> GemmTile {
        let groups = |t: &GemmTile| m.div_ceil(t.bm as usize) * n.div_ceil(t.bn as usize) * batch;
        let short = |t: &GemmTile| 8 * groups(t) < 7 * compute_units;
        let mut t = self;
        // A side at most half a tile where the product fills the device anyway (attention's
        // dq = ds k, N = head dim 64 against 128-wide tiles): that side halved, with its block.
        while !short(&t) && 2 * n <= t.bn as usize && t.bn >= 64 && t.wn >= 2 {
            t = t.halved(true, 1);
        }
        while !short(&t) && 2 * m <= t.bm as usize && t.bm >= 64 && t.wm >= 2 {
            t = t.halved(false, 1);
        }
        while short(&t) && m >= 128 && n >= 128 {
            let next = t.halved(t.bn >= t.bm, 4);
            let [x, y] = next.local();
            if next.bm < 32
                || next.bn < 32
                || x * y < 128
                || next.bn % next.wn + next.bm % next.wm != 0
            {
                break;
            }
            t = next;
        }
        while short(&t) && t.bm >= 64 && t.bn >= 64 && t.wm >= 2 && t.wn >= 2 {
            t = t.halved(true, 1).halved(false, 1);
        }
        t
    }

    /// Checks the tile divides evenly and fits `device` (work-group size and local memory for
    /// elements of `acc_bytes`).
    pub fn check(&self, device: &Device, acc_bytes: usize) -> Result<()> {
        let info = device.info();
        let ok = [self.bm, self.bn, self.bk, self.wm, self.wn]
            .iter()
            .all(|&x| x > 0)
            && self.bm.is_multiple_of(self.wm)
            && self.bn.is_multiple_of(self.wn);
        let threads = self.local()[0] * self.local()[1];
        let local = self.bk as usize * (self.bm + self.bn + 8) as usize * acc_bytes;
        if !ok || threads > info.max_work_group_size || local as u64 > info.local_mem_bytes {
            return Err(Error::invalid(
                "gemm tile",
                format!(
                    "{self:?} does not fit {device} ({threads} work-items of at most {}, {local} B local memory of {})",
                    info.max_work_group_size, info.local_mem_bytes
                ),
            ));
        }
        Ok(())
    }
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TuningEntry {
    /// A substring of the device name (the autotuner writes the full name).
    #[serde(rename = "match")]
    pub pattern: String,
    /// Driver version the values were measured with (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    pub gemm: GemmTile,
    /// The tensor-core GEMM's tiling (devices with tensor cores).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tc: Option<TcTile>,
    /// The GEMM planner's costs and thresholds (absent: the defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanTuning>,
}

/// The newest tuning-table schema: 2 added the planner's data (`plan`); tables of schema 1 still
/// read.
pub const SCHEMA: u32 = 2;

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct TuningTable {
    pub schema: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    pub devices: Vec<TuningEntry>,
}

impl TuningTable {
    pub fn parse(text: &str, origin: &str) -> Result<TuningTable> {
        let t: TuningTable = serde_json::from_str(text)
            .map_err(|e| Error::format(origin, format!("not a tuning table: {e}")))?;
        if !(1..=SCHEMA).contains(&t.schema) {
            return Err(Error::format(
                origin,
                format!("tuning schema {} (expected 1 to {SCHEMA})", t.schema),
            ));
        }
        Ok(t)
    }

    fn find(&self, name: &str) -> Option<&TuningEntry> {
        self.devices
            .iter()
            .find(|e| name.to_lowercase().contains(&e.pattern.to_lowercase()))
    }
}

/// The shipped table (kernels/tuning.json).
pub fn builtin_table() -> TuningTable {
    TuningTable::parse(
        include_str!("../../../kernels/tuning.json"),
        "kernels/tuning.json",
    )
    .expect("kernels/tuning.json is valid (checked by a test)")
}

/// Where the autotuner writes: [`Config::tuning`] (`NETCL_TUNING`), else `tuning.json` in the
/// kernel cache directory.
pub fn user_table_path() -> Option<PathBuf> {
    Config::get()
        .tuning
        .clone()
        .or_else(|| crate::cache_dir().map(|d| d.join("tuning.json")))
}

/// The tiles chosen for a device.
#[derive(Clone)]
struct Choice {
    gemm: GemmTile,
    tc: TcTile,
    plan: Arc<PlanTuning>,
}

/// The GEMM tile for `device`: its entry in the user's table, else in the shipped table, else a
/// default by device kind. Read once per device and process (`reset_tuning` forgets).
pub fn gemm_tile(device: &Device) -> GemmTile {
    choice(device).gemm
}

/// The tensor-core tiling for `device`: `NETCL_TC_TILE`, else the user's table's entry, else the
/// shipped table's, else `TcTile::DEFAULT`; one that does not fit the device is skipped. Read
/// once per device and process (`reset_tuning` forgets).
pub fn tc_tile(device: &Device) -> TcTile {
    choice(device).tc
}

/// The GEMM planner's data for `device`: the user's table's entry, else the shipped table's,
/// else the defaults, with the environment's overrides (`PlanTuning::with_env`). Read once per
/// device and process (`reset_tuning` forgets).
pub fn plan_tuning(device: &Device) -> Arc<PlanTuning> {
    choice(device).plan
}

fn choice(device: &Device) -> Choice {
    let mut cache = CHOICES
        .get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    cache
        .entry(device.ordinal())
        .or_insert_with(|| choose(device))
        .clone()
}

fn choose(device: &Device) -> Choice {
    let name = device.info().name.clone();
    let user = user_table_path()
        .and_then(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))
        .and_then(
            |(p, t)| match TuningTable::parse(&t, &p.display().to_string()) {
                Ok(t) => t.find(&name).cloned(),
                Err(e) => {
                    log::warn!("ignoring {e}");
                    None
                }
            },
        );
    let builtin = builtin_table().find(&name).cloned();
    let entries = [user, builtin];
    let gemm = entries
        .iter()
        .flatten()
        .map(|e| e.gemm)
        .find(|t| t.check(device, 4).is_ok())
        .unwrap_or(match device.info().kind {
            DeviceKind::Gpu => GemmTile {
                bm: 64,
                bn: 64,
                bk: 16,
                wm: 4,
                wn: 4,
            },
            // CPUs (PoCL): 16 work-items of 8x8 outputs (netcl-autotune's best on PoCL 3.1).
            _ => GemmTile {
                bm: 32,
                bn: 32,
                bk: 16,
                wm: 8,
                wn: 8,
            },
        });
    let env = TcTile::from_config()
        .into_iter()
        .map(|t| ("NETCL_TC_TILE", t));
    let table = (entries.iter().flatten()).filter_map(|e| e.tc.map(|t| ("the tuning table", t)));
    let tc = env
        .chain(table)
        .find(|(origin, t)| match t.check(device) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("netcl: ignoring {origin}'s tensor-core tiling: {e}");
                false
            }
        })
        .map_or(TcTile::DEFAULT, |(_, t)| t);
    let plan = entries
        .iter()
        .flatten()
        .find_map(|e| e.plan.clone())
        .unwrap_or_default()
        .with_env();
    Choice {
        gemm,
        tc,
        plan: Arc::new(plan),
    }
}

static CHOICES: OnceLock<Mutex<HashMap<usize, Choice>>> = OnceLock::new();

/// Forget the tiles chosen so far (after the autotuner wrote a new table).
pub fn reset_tuning() {
    if let Some(c) = CHOICES.get() {
        c.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
    GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times the tuning was forgotten (`reset_tuning`): what was derived from it before
/// (cached plans) is stale once this changes.
pub fn tuning_generation() -> u64 {
    GENERATION.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_bad_tables_are_errors() {
        let t = builtin_table();
        let h200 = t.find("NVIDIA H200").expect("an H200 entry");
        assert_eq!(h200.tc, Some(TcTile::DEFAULT));
        assert!(TuningTable::parse("{}", "x.json").is_err());
        assert!(TuningTable::parse(r#"{"schema": 3, "devices": []}"#, "x.json").is_err());
        // Schema 1 (no planner data) still reads; a partial `plan` takes the defaults for the rest.
        let old = r#"{"schema": 1, "devices": [{"match": "x", "gemm":
            {"bm": 64, "bn": 64, "bk": 16, "wm": 4, "wn": 4}}]}"#;
        assert!(TuningTable::parse(old, "x.json").unwrap().devices[0]
            .plan
            .is_none());
        let partial = r#"{"schema": 2, "devices": [{"match": "x", "gemm":
            {"bm": 64, "bn": 64, "bk": 16, "wm": 4, "wn": 4},
            "plan": {"skinny": {"max_rows": 8, "max_k": 1024, "max_few": 4096, "decode_rows": 2}}}]}"#;
        let plan = TuningTable::parse(partial, "x.json").unwrap().devices[0]
            .plan
            .clone()
            .unwrap();
        assert_eq!(plan.skinny.max_rows, 8);
        assert_eq!(plan.split, PlanTuning::default().split);
    }

    #[test]
    fn the_planner_defaults_are_the_shipped_h100_calibration() {
        let t = builtin_table();
        let h100 = t.find("NVIDIA H100 80GB HBM3").expect("an H100 entry");
        assert_eq!(h100.plan.as_ref(), Some(&PlanTuning::default()));
    }

    #[test]
    fn small_products_get_smaller_tiles_that_fill_the_device() {
        let tile = |bm, bn, wm, wn| GemmTile::new(bm, bn, 16, wm, wn);
        let big = tile(128, 128, 8, 8);
        // (m, n, batch) on 132 compute units -> the fitted tile.
        for ((m, n, batch), want) in [
            ((8192, 768, 1), big),
            ((256, 1024, 1), tile(64, 32, 4, 4)),
            ((1024, 1024, 1), tile(128, 64, 8, 4)),
            ((1024, 784, 1), tile(64, 64, 4, 4)),
            ((256, 1024, 4), tile(128, 64, 8, 4)),
            ((512, 64, 192), tile(128, 64, 8, 4)),
            // A side shorter than a tile: tile and per-item block halved together.
            ((256, 10, 1), tile(32, 32, 2, 2)),
            ((10, 1024, 1), tile(32, 32, 2, 2)),
        ] {
            let got = big.fit(m, n, batch, 132);
            assert_eq!(got, want, "{m} x {n} x {batch}");
            let [x, y] = got.local();
            assert!(x * y >= 128 && got.bm % got.wm == 0 && got.bn % got.wn == 0);
        }
    }
}
