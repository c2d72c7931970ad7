//! Device timestamps onto the host clock: per-launch bounds on the clock offset, a windowed lower envelope through them that follows clock drift, clamped so no kernel starts before its launch.
use crate::collect::RawTimes;
use crate::profile::{DeviceTrack, KernelRecord};

/// Device time per window of the envelope (ns): drift is tracked at this resolution.
const WINDOW_NS: u64 = 1_000_000_000;

/// What one launch says about a device's offset (host = device + offset) at device time `t`.
#[derive(Clone, Copy, Debug)]
struct Bound {
    t: u64,
    lo: i128,
    hi: i128,
}

/// The bound a launch gives. With a QUEUED timestamp: the command was queued during its launch
/// call, so the offset lies in [host_start - queued, host_end - queued]. Without: it cannot have
/// started before its launch call began, so the offset is at least host_start - start.
fn bound(k: &KernelRecord, r: &RawTimes) -> Bound {
    match r.queued {
        Some(q) => Bound {
            t: q,
            lo: k.host_start_ns as i128 - q as i128,
            hi: k.host_end_ns as i128 - q as i128,
        },
        None => Bound {
            t: r.start,
            lo: k.host_start_ns as i128 - r.start as i128,
            hi: i128::MAX,
        },
    }
}

/// The offset as a function of device time: through the tightest lower bound of each window,
/// linear between them, constant beyond the first and last.
struct Envelope {
    anchors: Vec<(u64, i128)>,
}

impl Envelope {
    /// The envelope of `bounds` (sorted by `t`, at least one).
    fn new(bounds: &[Bound]) -> Envelope {
        let t0 = bounds[0].t;
        let mut anchors: Vec<(u64, i128)> = Vec::new();
        let mut window = u64::MAX;
        for b in bounds {
            let w = (b.t - t0) / WINDOW_NS;
            match anchors.last_mut() {
                Some(last) if w == window => {
                    if b.lo > last.1 {
                        *last = (b.t, b.lo);
                    }
                }
                _ => {
                    anchors.push((b.t, b.lo));
                    window = w;
                }
            }
        }
        Envelope { anchors }
    }

    fn at(&self, t: u64) -> i128 {
        let a = &self.anchors;
        let i = a.partition_point(|&(at, _)| at <= t);
        if i == 0 {
            return a[0].1;
        }
        if i == a.len() {
            return a[i - 1].1;
        }
        let ((t0, o0), (t1, o1)) = (a[i - 1], a[i]);
        o0 + (o1 - o0) * (t - t0) as i128 / (t1 - t0).max(1) as i128
    }

    /// Parts per million between the first and last anchors (0 with one anchor).
    fn drift_ppm(&self) -> f64 {
        match (self.anchors.first(), self.anchors.last()) {
            (Some(&(t0, o0)), Some(&(t1, o1))) if t1 > t0 => {
                -((o1 - o0) as f64) / (t1 - t0) as f64 * 1e6
            }
            _ => 0.0,
        }
    }
}

/// Put device times on the host clock, per device. Each launch bounds the offset (see
/// [`bound`]); the offset at a kernel is the windowed lower envelope of those bounds, which
/// follows a drifting device clock, clamped into the kernel's own bounds, so no kernel starts
/// before it was enqueued. Within one window (short profiles) the offset is the smallest one
/// consistent with every launch, as with a fixed offset.
pub(crate) fn align_devices(
    mut kernels: Vec<KernelRecord>,
    raw: &[Option<RawTimes>],
    devices: &mut [DeviceTrack],
) -> Vec<KernelRecord> {
    for d in devices.iter_mut() {
        let mine = || {
            kernels
                .iter()
                .zip(raw)
                .filter_map(|(k, r)| Some((k, (*r)?)))
                .filter(|(k, _)| k.device == d.ordinal)
        };
        // Mixed QUEUED support cannot happen on one queue; treat a partial set as none.
        let all_queued = mine().all(|(_, r)| r.queued.is_some());
        let as_used = |r: &RawTimes| RawTimes {
            queued: r.queued.filter(|_| all_queued),
            ..*r
        };
        let mut bounds: Vec<Bound> = mine().map(|(k, r)| bound(k, &as_used(&r))).collect();
        if bounds.is_empty() {
            d.offset_ns = 0;
            continue;
        }
        bounds.sort_by_key(|b| b.t);
        let env = Envelope::new(&bounds);
        d.offset_ns = env.at(bounds[0].t);
        d.drift_ppm = env.drift_ppm();
        for (k, r) in kernels.iter_mut().zip(raw) {
            let Some(r) = r.filter(|_| k.device == d.ordinal) else {
                continue;
            };
            let b = bound(k, &as_used(&r));
            let offset = env.at(b.t).min(b.hi).max(b.lo);
            let to_host = |t: u64| (t as i128 + offset).max(0) as u64;
            k.device_start_ns = Some(to_host(r.start));
            k.device_end_ns = Some(to_host(r.end));
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn record(device: usize, host_start_ns: u64, host_end_ns: u64) -> KernelRecord {
        KernelRecord {
            kernel: Arc::from("k"),
            op: None,
            device,
            thread: 1,
            global: vec![1],
            local: vec![1],
            host_start_ns,
            host_end_ns,
            device_start_ns: None,
            device_end_ns: None,
            work: None,
        }
    }

    fn track(ordinal: usize) -> DeviceTrack {
        DeviceTrack {
            ordinal,
            label: format!("d{ordinal}"),
            offset_ns: 0,
            drift_ppm: 0.0,
        }
    }

    #[test]
    fn queued_times_pin_the_offset_between_launch_bounds() {
        // Device clock = host clock + 5_000_000; each command queued mid-launch.
        let shift = 5_000_000u64;
        let launches = [
            (100, 140, 120),
            (1_000, 1_010, 1_009),
            (2_000, 2_300, 2_001),
        ];
        let kernels: Vec<_> = launches.iter().map(|&(s, e, _)| record(1, s, e)).collect();
        let raw: Vec<_> = launches
            .iter()
            .map(|&(_, _, q)| {
                Some(RawTimes {
                    queued: Some(q + shift),
                    start: q + shift + 50,
                    end: q + shift + 80,
                })
            })
            .collect();
        let mut devices = [track(1)];
        let out = align_devices(kernels, &raw, &mut devices);
        // The tightest lower bound: launch 3 was queued 1 ns after it began, so the offset is within
        // 1 ns of the truth (never later than it).
        let true_offset = -(shift as i128);
        assert!(devices[0].offset_ns <= true_offset && devices[0].offset_ns >= true_offset - 1);
        for (k, &(s, _, q)) in out.iter().zip(&launches) {
            let start = k.device_start_ns.unwrap();
            assert!(start >= s);
            assert!((start as i128 - (q + 50) as i128).abs() <= 1, "{k:?}");
            assert_eq!(k.device_ns(), Some(30));
        }
    }

    #[test]
    fn without_queued_times_no_kernel_starts_before_its_launch() {
        let kernels = vec![record(2, 10, 20), record(2, 30, 40), record(3, 5, 6)];
        let raw = vec![
            Some(RawTimes {
                queued: None,
                start: 900,
                end: 950,
            }),
            Some(RawTimes {
                queued: None,
                start: 905,
                end: 990,
            }),
            None,
        ];
        let mut devices = [track(2), track(3)];
        let out = align_devices(kernels, &raw, &mut devices);
        // The second kernel is the binding one: it must start at its launch (30) at the earliest.
        assert_eq!(devices[0].offset_ns, 30 - 905);
        assert_eq!(out[0].device_start_ns, Some(900 - 875));
        assert_eq!(out[1].device_start_ns, Some(30));
        assert!(out
            .iter()
            .zip(&raw)
            .all(|(k, r)| r.is_none() || k.device_start_ns.unwrap() >= k.host_start_ns));
        // A launch without device times keeps none.
        assert_eq!((out[2].device_start_ns, out[2].device_ns()), (None, None));
    }

    #[test]
    fn a_drifting_device_clock_is_followed() {
        // Device clock = host * (1 + 40 ppm) + 7 ms over a minute: a fixed offset would be 2.4 ms
        // off at the end. Launches every 5 ms, each call 4 us, queued 1 us into the call.
        let device_of = |host: u64| host + host * 40 / 1_000_000 + 7_000_000;
        let (mut kernels, mut raw) = (vec![], vec![]);
        for i in 0..12_000u64 {
            let s = 1_000_000 + i * 5_000_000;
            kernels.push(record(0, s, s + 4_000));
            let q = device_of(s + 1_000);
            // The kernel runs 2 us after it was queued, for 3 us (device time).
            raw.push(Some(RawTimes {
                queued: Some(q),
                start: q + 2_000,
                end: q + 5_000,
            }));
        }
        let mut devices = [track(0)];
        let out = align_devices(kernels, &raw, &mut devices);
        let d = &devices[0];
        assert!((d.drift_ppm - 40.0).abs() < 0.5, "{}", d.drift_ppm);
        for (i, k) in out.iter().enumerate() {
            let s = 1_000_000 + i as u64 * 5_000_000;
            // True host time of the start: 1 us into the call + 2 us of device time (~2 us).
            let truth = (s + 3_000) as i128;
            let err = k.device_start_ns.unwrap() as i128 - truth;
            assert!(err.abs() <= 4_000, "launch {i}: off by {err} ns");
            assert!(k.device_start_ns.unwrap() >= k.host_start_ns, "launch {i}");
        }
    }
}
