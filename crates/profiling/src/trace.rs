//! Chrome trace-event JSON (opens in Perfetto and chrome://tracing): host threads with op spans and launch calls, one track per device with its kernels, flow arrows from launch to kernel.
use crate::profile::{KernelRecord, Profile};
use netcl_core_devices::{Error, Result};
use serde_json::{json, Value};
use std::path::Path;

/// The host process's pid in the trace; device `d` is `DEVICE_PID + d`.
pub const HOST_PID: u64 = 1;
pub const DEVICE_PID: u64 = 100;
/// The one track (tid) of a device: its in-order queue.
pub const QUEUE_TID: u64 = 1;

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

fn kernel_args(k: &KernelRecord) -> Value {
    let mut args = json!({
        "kernel": &*k.kernel,
        "global": k.global,
        "local": k.local,
    });
    if let Some(op) = k.op {
        args["op"] = json!(op);
    }
    if let Some(w) = k.work {
        args["bytes"] = json!(w.bytes);
        args["flops"] = json!(w.flops);
        if let Some(ns) = k.device_ns().filter(|&ns| ns > 0) {
            args["GB/s"] = json!(w.bytes as f64 / ns as f64);
            args["GFLOP/s"] = json!(w.flops as f64 / ns as f64);
        }
    }
    args
}

impl Profile {
    /// The profile as Chrome trace-event JSON: `{"traceEvents": [...]}` with complete ("X")
    /// events in microseconds on the host clock. Host spans and launch calls sit on pid 1, one
    /// tid per thread; each device's kernels on pid 100 + ordinal, tid 1; "M" events name the
    /// processes and threads; "s"/"f" flow events join each launch call to its kernel.
    pub fn chrome_trace_json(&self) -> String {
        let mut meta = vec![
            json!({"name": "process_name", "ph": "M", "pid": HOST_PID, "tid": 0,
                   "args": {"name": "netcl host"}}),
            json!({"name": "process_sort_index", "ph": "M", "pid": HOST_PID, "tid": 0,
                   "args": {"sort_index": 0}}),
        ];
        let mut host_tids: Vec<u32> = self
            .spans
            .iter()
            .map(|s| s.thread)
            .chain(self.kernels.iter().map(|k| k.thread))
            .collect();
        host_tids.sort_unstable();
        host_tids.dedup();
        for tid in &host_tids {
            let name = self
                .threads
                .iter()
                .find(|(t, _)| t == tid)
                .map_or_else(|| format!("thread {tid}"), |(_, n)| n.clone());
            meta.push(
                json!({"name": "thread_name", "ph": "M", "pid": HOST_PID, "tid": tid,
                             "args": {"name": name}}),
            );
        }
        for d in &self.devices {
            let pid = DEVICE_PID + d.ordinal as u64;
            meta.push(
                json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                             "args": {"name": format!("device {}", d.label)}}),
            );
            meta.push(
                json!({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                             "args": {"sort_index": 1 + d.ordinal}}),
            );
            meta.push(
                json!({"name": "thread_name", "ph": "M", "pid": pid, "tid": QUEUE_TID,
                             "args": {"name": "kernels (in-order queue)"}}),
            );
        }

        // (pid, tid, ts ns, dur ns, event): sorted so every track's events come in time order,
        // enclosing spans before the spans they contain.
        let mut slices: Vec<(u64, u64, u64, u64, Value)> = Vec::new();
        for s in &self.spans {
            let dur = s.end_ns - s.start_ns;
            slices.push((
                HOST_PID,
                s.thread as u64,
                s.start_ns,
                dur,
                json!({"name": s.name, "cat": s.category, "ph": "X", "ts": us(s.start_ns),
                       "dur": us(dur), "pid": HOST_PID, "tid": s.thread,
                       "args": {"depth": s.depth}}),
            ));
        }
        let mut flows = Vec::new();
        for (i, k) in self.kernels.iter().enumerate() {
            let label = k.label();
            let dur = k.dispatch_ns();
            slices.push((
                HOST_PID,
                k.thread as u64,
                k.host_start_ns,
                dur,
                json!({"name": format!("launch {label}"), "cat": "launch", "ph": "X",
                       "ts": us(k.host_start_ns), "dur": us(dur), "pid": HOST_PID,
                       "tid": k.thread, "args": kernel_args(k)}),
            ));
            let (Some(start), Some(ns)) = (k.device_start_ns, k.device_ns()) else {
                continue;
            };
            let pid = DEVICE_PID + k.device as u64;
            let mut args = kernel_args(k);
            args["queued_us"] = json!(us(start.saturating_sub(k.host_start_ns)));
            slices.push((
                pid,
                QUEUE_TID,
                start,
                ns,
                json!({"name": label, "cat": "kernel", "ph": "X", "ts": us(start),
                       "dur": us(ns), "pid": pid, "tid": QUEUE_TID, "args": args}),
            ));
            flows.push(
                json!({"name": "launch", "cat": "launch", "ph": "s", "id": i,
                              "ts": us(k.host_start_ns), "pid": HOST_PID, "tid": k.thread}),
            );
            flows.push(
                json!({"name": "launch", "cat": "launch", "ph": "f", "bp": "e", "id": i,
                              "ts": us(start), "pid": pid, "tid": QUEUE_TID}),
            );
        }
        slices.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)).then(b.3.cmp(&a.3)));
        let events: Vec<Value> = meta
            .into_iter()
            .chain(slices.into_iter().map(|s| s.4))
            .chain(flows)
            .collect();
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ns",
            "otherData": {
                "generator": "netcl-profiling",
                "clock": "host monotonic, microseconds since the profiler's first use",
                "dropped_records": self.dropped,
            },
        })
        .to_string()
    }

    /// Write [`Profile::chrome_trace_json`] to `path`, creating its folder.
    pub fn write_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        }
        std::fs::write(path, self.chrome_trace_json())
            .map_err(|e| Error::io(path.display().to_string(), e))
    }
}
