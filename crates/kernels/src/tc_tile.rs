//! The tensor-core GEMM's tiling (kernels/matmul_tc.cl): its fields, the `-D` options, the checks that it builds on a device, and `NETCL_TC_TILE`.
use netcl_core_devices::{Config, Device, Error, Result};
use serde::{Deserialize, Serialize};

/// matmul_tc.cl's tiling: a warp grid of `warps_m` x `warps_n`, each warp `mi` x `nj` mma tiles
/// (16 x 8 each), `kw` 32-bit words of K a step (`kw_mn` in products whose A is M-contiguous,
/// whose local tiles are swizzled; 0 or absent: `kw`), staged through registers, or through a
/// ring of `stages` (2-5) cp.async copies when `stages` > 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TcTile {
    pub warps_m: u32,
    pub warps_n: u32,
    pub mi: u32,
    pub nj: u32,
    pub kw: u32,
    #[serde(default)]
    pub kw_mn: u32,
    #[serde(default)]
    pub stages: u32,
}

impl TcTile {
    /// The fastest of the tilings measured on the H100 (docs/performance.md): 2 x 2 warps of
    /// 64 x 64, 32 words of K (16 where A is M-contiguous), register staging.
    pub const DEFAULT: TcTile = TcTile {
        warps_m: 2,
        warps_n: 2,
        mi: 4,
        nj: 8,
        kw: 32,
        kw_mn: 16,
        stages: 0,
    };

    /// A tiling with the same K step (`kw` words) for every product.
    pub const fn uniform(
        warps_m: u32,
        warps_n: u32,
        mi: u32,
        nj: u32,
        kw: u32,
        stages: u32,
    ) -> TcTile {
        TcTile {
            warps_m,
            warps_n,
            mi,
            nj,
            kw,
            kw_mn: kw,
            stages,
        }
    }

    /// Rows of C per work-group.
    pub fn rows(&self) -> usize {
        (self.warps_m * self.mi * 16) as usize
    }

    /// Columns of C per work-group.
    pub fn cols(&self) -> usize {
        (self.warps_n * self.nj * 8) as usize
    }

    /// Work-items per work-group.
    pub fn group(&self) -> usize {
        (32 * self.warps_m * self.warps_n) as usize
    }

    /// Words of K a step for a product whose A is M-contiguous (`a_mn`) or not.
    pub fn words(&self, a_mn: bool) -> u32 {
        if a_mn && self.kw_mn > 0 {
            self.kw_mn
        } else {
            self.kw
        }
    }

    /// The `-D` options of matmul_tc.cl (`a_mn`: A M-contiguous, swizzled tiles).
    pub fn options(&self, a_mn: bool) -> String {
        let mut o = format!(
            "-DWARPS_M={} -DWARPS_N={} -DWMI={} -DWNJ={} -DKW={}",
            self.warps_m,
            self.warps_n,
            self.mi,
            self.nj,
            self.words(a_mn)
        );
        if self.stages > 0 {
            o += &format!(" -DASYNC={}", self.stages);
        }
        if a_mn {
            o += " -DMN_SWIZZLE";
        }
        o
    }

    /// Checks that the tiling builds on `device`: whole warps, an even `nj`, tile sides whose
    /// 16-byte chunk counts (rows / 8, columns / 8) are powers of two (the swizzle), K steps of 8
    /// to 64 words, every work-item staging whole 16-byte vectors, 0 or 2-5 stages, and the
    /// work-group size and local memory (the largest of the padded and swizzled layouts) within
    /// the device's limits.
    pub fn check(&self, device: &Device) -> Result<()> {
        let info = device.info();
        let group = self.group();
        let fields = [self.warps_m, self.warps_n, self.mi, self.nj];
        let kws = [self.words(false), self.words(true)];
        let whole = |kw: u32| {
            let vectors = |side: usize| side * kw as usize / 4;
            vectors(self.rows()) % group == 0 && vectors(self.cols()) % group == 0
        };
        // Words a stage of one operand's tile takes at most: rows along K padded by 4 words
        // (side x (kw + 4)), or rows of K padded by 4 words (2 kw x (side / 2 + 4)).
        let tile = |side: usize, kw: usize| kw * side + 4 * side.max(2 * kw);
        let local = |kw: u32| {
            let words = tile(self.rows(), kw as usize) + tile(self.cols(), kw as usize);
            (self.stages.max(1) as usize) * words * 4
        };
        let bytes = kws.iter().map(|&kw| local(kw)).max().unwrap_or(0);
        let ok = fields.iter().all(|&f| f > 0)
            && self.nj.is_multiple_of(2)
            && (self.rows() / 8).is_power_of_two()
            && (self.cols() / 8).is_power_of_two()
            && kws
                .iter()
                .all(|&kw| (8..=64).contains(&kw) && kw.is_multiple_of(8) && whole(kw))
            && (self.stages == 0 || (2..=5).contains(&self.stages));
        if !ok || group > info.max_work_group_size || bytes as u64 > info.local_mem_bytes {
            return Err(Error::invalid(
                "tensor-core tile",
                format!(
                    "{self:?} does not fit {device} ({group} work-items of at most {}, {bytes} B \
                     local memory of {})",
                    info.max_work_group_size, info.local_mem_bytes
                ),
            ));
        }
        Ok(())
    }

    /// [`Config::tc_tile`]: `NETCL_TC_TILE=warps_m,warps_n,mi,nj,kw,stages` (`kw` for every
    /// product; `stages` 1, the old "cp.async on", means 2), if set and well formed (else
    /// reported on stderr and ignored).
    pub fn from_config() -> Option<TcTile> {
        let v = Config::get().tc_tile.clone()?;
        let f: Vec<u32> = v.split(',').filter_map(|x| x.trim().parse().ok()).collect();
        match f[..] {
            [warps_m, warps_n, mi, nj, kw, stages] => {
                let stages = if stages == 1 { 2 } else { stages };
                Some(TcTile::uniform(warps_m, warps_n, mi, nj, kw, stages))
            }
            _ => {
                eprintln!("netcl: NETCL_TC_TILE={v:?} ignored (want six numbers)");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netcl_core_devices::test_devices;

    #[test]
    fn tilings_that_cannot_build_are_rejected_naming_the_tile() {
        let host = Device::host();
        let err = TcTile::DEFAULT.check(&host).unwrap_err().to_string();
        assert!(
            err.contains("tensor-core tile") && err.contains("warps_m"),
            "{err}"
        );
        for dev in test_devices().unwrap().iter().filter(|d| d.is_opencl()) {
            // The default needs 128 work-items and (128 + 128) x 36 words of local memory.
            let fits = dev.info().max_work_group_size >= 128 && dev.info().local_mem_bytes >= 36864;
            assert_eq!(TcTile::DEFAULT.check(dev).is_ok(), fits, "{dev}");
            let bad = [
                TcTile {
                    nj: 3,
                    ..TcTile::DEFAULT
                },
                TcTile {
                    kw: 12,
                    ..TcTile::DEFAULT
                },
                TcTile {
                    kw_mn: 72,
                    ..TcTile::DEFAULT
                },
                TcTile {
                    stages: 1,
                    ..TcTile::DEFAULT
                },
                TcTile {
                    warps_m: 0,
                    ..TcTile::DEFAULT
                },
                // 2 x 1 warps of 16 x 16: 32 rows of 8 words are 64 vectors for 64 work-items,
                // but 16 columns give 32: not a whole number per work-item.
                TcTile {
                    warps_m: 2,
                    warps_n: 1,
                    mi: 1,
                    nj: 2,
                    kw: 8,
                    kw_mn: 8,
                    stages: 0,
                },
            ];
            for t in bad {
                assert!(t.check(dev).is_err(), "{t:?} on {dev}");
            }
        }
        assert_eq!(
            TcTile::DEFAULT.options(false),
            "-DWARPS_M=2 -DWARPS_N=2 -DWMI=4 -DWNJ=8 -DKW=32"
        );
        assert!(TcTile::DEFAULT
            .options(true)
            .ends_with("-DKW=16 -DMN_SWIZZLE"));
        let ring = TcTile {
            stages: 3,
            ..TcTile::DEFAULT
        };
        assert!(ring.options(false).ends_with("-DASYNC=3"));
    }
}
