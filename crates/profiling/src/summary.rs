//! The per-run summary table: per device, per kernel (count, total and mean device time, dispatch cost, GB/s, GFLOP/s, share), then host spans.
use crate::profile::Profile;
use std::collections::HashMap;
use std::fmt::Write;

#[derive(Default)]
struct KernelStats {
    calls: u64,
    timed: u64,
    device_ns: u64,
    dispatch_ns: u64,
    /// Declared work and the device time of the launches that declared it.
    bytes: u64,
    flops: u64,
    declared_ns: u64,
}

#[derive(Default)]
struct SpanStats {
    calls: u64,
    total_ns: u64,
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

fn us(ns: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        ns as f64 / 1e3 / n as f64
    }
}

/// `x` per ns is `x` G per s.
fn rate(amount: u64, ns: u64) -> String {
    if amount == 0 || ns == 0 {
        "-".into()
    } else {
        format!("{:.1}", amount as f64 / ns as f64)
    }
}

impl Profile {
    /// A plain-text table: per device, one row per kernel label (`kernel` or `kernel[op]`),
    /// sorted by total device time; then the host spans (inclusive time). GB/s and GFLOP/s use
    /// the declared bytes and flops over the device time of the launches that declared them.
    pub fn summary_table(&self) -> String {
        let mut out = String::new();
        let (first, last) = self.time_range();
        let _ = writeln!(
            out,
            "netcl profile: {} kernel launches on {} device(s), {} host spans, {:.3} ms wall{}",
            self.kernels.len(),
            self.devices.len(),
            self.spans.len(),
            ms(last.saturating_sub(first)),
            if self.dropped > 0 {
                format!(" ({} records dropped: store full)", self.dropped)
            } else {
                String::new()
            }
        );
        for dev in &self.devices {
            let mut stats: HashMap<String, KernelStats> = HashMap::new();
            for k in self.kernels.iter().filter(|k| k.device == dev.ordinal) {
                let s = stats.entry(k.label()).or_default();
                s.calls += 1;
                s.dispatch_ns += k.dispatch_ns();
                if let Some(ns) = k.device_ns() {
                    s.timed += 1;
                    s.device_ns += ns;
                    if let Some(w) = k.work {
                        s.bytes += w.bytes;
                        s.flops += w.flops;
                        s.declared_ns += ns;
                    }
                }
            }
            let busy: u64 = stats.values().map(|s| s.device_ns).sum();
            let calls: u64 = stats.values().map(|s| s.calls).sum();
            let _ = writeln!(
                out,
                "\n{}: {calls} launches, {:.3} ms device time",
                dev.label,
                ms(busy)
            );
            let _ = writeln!(
                out,
                "  {:<40} {:>7} {:>10} {:>10} {:>10} {:>8} {:>8} {:>6}",
                "kernel", "calls", "total ms", "mean us", "launch us", "GB/s", "GFLOP/s", "share"
            );
            let mut rows: Vec<_> = stats.into_iter().collect();
            rows.sort_by(|a, b| b.1.device_ns.cmp(&a.1.device_ns).then(a.0.cmp(&b.0)));
            for (label, s) in rows {
                let share = if busy == 0 {
                    0.0
                } else {
                    100.0 * s.device_ns as f64 / busy as f64
                };
                let _ = writeln!(
                    out,
                    "  {:<40} {:>7} {:>10.3} {:>10.2} {:>10.2} {:>8} {:>8} {:>5.1}%",
                    label,
                    s.calls,
                    ms(s.device_ns),
                    us(s.device_ns, s.timed),
                    us(s.dispatch_ns, s.calls),
                    rate(s.bytes, s.declared_ns),
                    rate(s.flops, s.declared_ns),
                    share
                );
            }
        }
        if !self.spans.is_empty() {
            let mut stats: HashMap<(&str, &str), SpanStats> = HashMap::new();
            for s in &self.spans {
                let e = stats.entry((s.category, s.name)).or_default();
                e.calls += 1;
                e.total_ns += s.end_ns - s.start_ns;
            }
            let mut rows: Vec<_> = stats.into_iter().collect();
            rows.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
            let _ = writeln!(out, "\nhost spans (inclusive time, all threads):");
            let _ = writeln!(
                out,
                "  {:<40} {:>7} {:>10} {:>10}",
                "span", "calls", "total ms", "mean us"
            );
            for ((cat, name), s) in rows {
                let _ = writeln!(
                    out,
                    "  {:<40} {:>7} {:>10.3} {:>10.2}",
                    format!("{cat}:{name}"),
                    s.calls,
                    ms(s.total_ns),
                    us(s.total_ns, s.calls)
                );
            }
        }
        out
    }

    /// Earliest and latest host-clock time in the profile (ns).
    pub(crate) fn time_range(&self) -> (u64, u64) {
        let starts = self
            .kernels
            .iter()
            .map(|k| k.host_start_ns)
            .chain(self.spans.iter().map(|s| s.start_ns));
        let ends = self
            .kernels
            .iter()
            .map(|k| k.device_end_ns.unwrap_or(k.host_end_ns).max(k.host_end_ns))
            .chain(self.spans.iter().map(|s| s.end_ns));
        (starts.min().unwrap_or(0), ends.max().unwrap_or(0))
    }
}
