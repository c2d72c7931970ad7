//! Profiler sessions on every device: kernel records (names, sizes, device times after their launch, declared work), spans, summary, Chrome trace structure.
use netcl_autograd::Tape;
use netcl_core_devices::{test_devices, DeviceKind};
use netcl_ops::testing::random_tensor;
use netcl_ops::{DType, Device, Tensor};
use netcl_profiling::{Profile, Profiler, DEVICE_PID, HOST_PID, QUEUE_TID};
use std::sync::Mutex;

#[path = "common/trace_check.rs"]
mod trace_check;
use trace_check::check_trace;

/// The profiler is process-wide: tests that start sessions run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

const M: usize = 8;
const N: usize = 16;
const K: usize = 12;

/// matmul (M x K)(K x N), add and softmax on `dev`, then a sync.
fn run_ops(dev: &Device) {
    let a = random_tensor(DType::F32, &[M, K], -1.0, 1.0, 1)
        .to_device(dev)
        .unwrap();
    let b = random_tensor(DType::F32, &[K, N], -1.0, 1.0, 2)
        .to_device(dev)
        .unwrap();
    let c = a.matmul(&b).unwrap();
    let d = c.add(&c).unwrap();
    let s = d.softmax(1).unwrap();
    dev.synchronize().unwrap();
    // The ops ran (and ran right): softmax rows sum to 1.
    let v = s.to_vec_f64().unwrap();
    for row in v.chunks(N) {
        assert!(
            (row.iter().sum::<f64>() - 1.0).abs() < 1e-5,
            "{dev}: {row:?}"
        );
    }
}

/// The kernel computing run_ops's matmul on `dev`: CPU OpenCL devices have their own GEMM
/// (matmul_cpu.cl; B row-major is read in place for one block row of A), others matmul_tiled.cl's.
fn gemm_kernel(dev: &Device) -> &'static str {
    match dev.kind() {
        DeviceKind::Cpu => "matmul_cpu_nn",
        _ => "matmul_tiled",
    }
}

fn profile_ops() -> (Profile, Vec<Device>) {
    let devices = test_devices().unwrap();
    let p = Profiler::start();
    for dev in &devices {
        run_ops(dev);
    }
    (p.stop(), devices)
}

#[test]
fn kernel_records_on_every_opencl_device() {
    let _s = serial();
    let (profile, devices) = profile_ops();
    for dev in &devices {
        let on_dev: Vec<_> = profile
            .kernels
            .iter()
            .filter(|k| k.device == dev.ordinal())
            .collect();
        if dev.is_host() {
            assert!(on_dev.is_empty(), "host device launched kernels");
            continue;
        }
        let find = |op: &str| {
            on_dev
                .iter()
                .find(|k| k.op == Some(op))
                .unwrap_or_else(|| panic!("{dev}: no kernel of op {op} in {on_dev:#?}"))
        };
        let mm = find("matmul");
        assert_eq!(&*mm.kernel, gemm_kernel(dev));
        let w = mm.work.expect("matmul declares its work");
        assert_eq!(w.flops, (2 * M * N * K) as u64);
        assert_eq!(w.bytes, (4 * (M * K + K * N + M * N)) as u64);
        let add = find("add");
        assert_eq!(&*add.kernel, "fused_contig");
        assert_eq!(add.label(), "fused_contig[add]");
        let w = add.work.expect("add declares its work");
        assert_eq!((w.bytes, w.flops), ((3 * 4 * M * N) as u64, (M * N) as u64));
        let sm = find("softmax");
        assert!(sm.kernel.starts_with("softmax"), "{}", sm.kernel);
        assert!(sm.work.is_some_and(|w| w.bytes == (2 * 4 * M * N) as u64));
        for k in &on_dev {
            assert!(k.host_end_ns >= k.host_start_ns, "{k:?}");
            assert!(!k.global.is_empty() && k.global.len() == k.local.len());
            assert!(k
                .global
                .iter()
                .zip(&k.local)
                .all(|(g, l)| *l > 0 && g % l == 0));
            let (start, end) = (k.device_start_ns.unwrap(), k.device_end_ns.unwrap());
            assert!(end >= start, "{k:?}");
            // Aligned to the host clock: no kernel runs before its launch call began.
            assert!(start >= k.host_start_ns, "{k:?}");
        }
        // One in-order queue: kernels do not overlap, in launch order.
        for pair in on_dev.windows(2) {
            assert!(
                pair[1].device_start_ns >= pair[0].device_end_ns,
                "{pair:#?}"
            );
        }
    }
    // Every device (the host too) records the ops' host spans.
    for op in ["matmul", "add", "softmax"] {
        let n = profile.spans.iter().filter(|s| s.name == op).count();
        assert_eq!(n, devices.len(), "spans of {op}");
    }
    let track = profile
        .devices
        .iter()
        .map(|d| d.ordinal)
        .collect::<Vec<_>>();
    let want: Vec<usize> = devices
        .iter()
        .filter(|d| d.is_opencl())
        .map(|d| d.ordinal())
        .collect();
    assert_eq!(track, want);
}

#[test]
fn declarations_reach_the_next_launch_only() {
    let _s = serial();
    let Some(dev) = Device::opencl_devices().into_iter().next() else {
        return;
    };
    // Declared while the profiler is off: dropped (kept under NETCL_PROFILE=1).
    let early =
        netcl_profiling::env_enabled().then_some(netcl_profiling::Work { bytes: 7, flops: 8 });
    netcl_profiling::declare(7, 8);
    let p = Profiler::start();
    Tensor::zeros(&[64], DType::F32, &dev).unwrap();
    netcl_profiling::declare(123, 456);
    Tensor::zeros(&[64], DType::F32, &dev).unwrap();
    Tensor::zeros(&[64], DType::F32, &dev).unwrap();
    let profile = p.stop();
    let fills: Vec<_> = profile.kernels_named("fill").collect();
    assert_eq!(fills.len(), 3, "{:#?}", profile.kernels);
    assert_eq!(fills[0].work, early);
    assert_eq!(
        fills[1].work,
        Some(netcl_profiling::Work {
            bytes: 123,
            flops: 456
        })
    );
    assert_eq!(fills[2].work, None);
}

#[test]
fn many_launches_are_read_back_as_they_finish() {
    let _s = serial();
    let Some(dev) = Device::opencl_devices().into_iter().next() else {
        return;
    };
    let x = Tensor::ones(&[256], DType::F32, &dev).unwrap();
    let p = Profiler::start();
    for _ in 0..600 {
        x.add_scalar(1.0).unwrap();
    }
    let profile = p.stop();
    let adds: Vec<_> = profile
        .kernels
        .iter()
        .filter(|k| k.op == Some("add"))
        .collect();
    assert_eq!(adds.len(), 600);
    for pair in adds.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a.device_ns().is_some() && b.device_ns().is_some());
        assert!(b.host_start_ns >= a.host_end_ns);
        assert!(b.device_start_ns >= a.device_end_ns, "{a:?} {b:?}");
    }
}

#[test]
fn sessions_overlap_and_stop_turns_off() {
    let _s = serial();
    if netcl_profiling::env_enabled() {
        return;
    }
    let dev = Device::opencl_devices()
        .into_iter()
        .next()
        .unwrap_or_else(Device::host);
    // Made before the sessions: creating it is an op too (`full`).
    let x = Tensor::ones(&[32], DType::F32, &dev).unwrap();
    let outer = Profiler::start();
    x.exp().unwrap();
    let inner = Profiler::start();
    x.neg().unwrap();
    let inner = inner.stop();
    assert!(
        netcl_profiling::enabled(),
        "the outer session is still live"
    );
    x.relu().unwrap();
    let outer = outer.stop();
    assert!(!netcl_profiling::enabled());
    assert_eq!(netcl_profiling::stored_records(), (0, 0), "store cleared");
    let names = |p: &Profile| p.spans.iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(&inner), ["neg"]);
    assert_eq!(names(&outer), ["exp", "neg", "relu"]);
    assert!(!netcl_profiling::span("x").is_recording());
}

#[test]
fn summary_table_lists_kernels_by_device() {
    let _s = serial();
    let (profile, devices) = profile_ops();
    let table = profile.summary_table();
    for dev in devices.iter().filter(|d| d.is_opencl()) {
        assert!(table.contains(&dev.label()), "{table}");
    }
    for word in [
        "matmul",
        "fused_contig[add]",
        "GB/s",
        "GFLOP/s",
        "host spans",
        "op:softmax",
    ] {
        assert!(table.contains(word), "{word} missing in\n{table}");
    }
    // The share column of each device adds up to 100%.
    let mut shares = Vec::new();
    let mut current = None;
    for line in table.lines() {
        if line.contains(" launches, ") {
            if let Some(s) = current.take() {
                shares.push(s);
            }
            current = Some(0.0);
        } else if line.trim().is_empty() || line.starts_with("host spans") {
            if let Some(s) = current.take() {
                shares.push(s);
            }
        } else if let (Some(s), Some(pct)) = (current.as_mut(), line.trim().strip_suffix('%')) {
            *s += pct.rsplit(' ').next().unwrap().parse::<f64>().unwrap();
        }
    }
    if let Some(s) = current {
        shares.push(s);
    }
    assert_eq!(shares.len(), profile.devices.len(), "{table}");
    for s in shares {
        assert!((s - 100.0).abs() < 0.5, "shares add to {s}\n{table}");
    }
}

#[test]
fn chrome_trace_has_the_structure_perfetto_needs() {
    let _s = serial();
    let (profile, devices) = profile_ops();
    let xs = check_trace(&profile.chrome_trace_json());
    for dev in devices.iter().filter(|d| d.is_opencl()) {
        let pid = DEVICE_PID + dev.ordinal() as u64;
        let kernels: Vec<_> = xs
            .iter()
            .filter(|e| e["pid"] == pid && e["tid"] == QUEUE_TID)
            .collect();
        assert!(kernels.iter().all(|e| e["cat"] == "kernel"));
        // A kernel named after its op is labelled by its name alone, others `kernel[op]`.
        let label = match gemm_kernel(dev) {
            "matmul" => "matmul".to_string(),
            k => format!("{k}[matmul]"),
        };
        let mm = kernels
            .iter()
            .find(|e| e["name"] == *label)
            .unwrap_or_else(|| panic!("{dev}: no {label} on its track"));
        assert_eq!(mm["args"]["flops"], (2 * M * N * K) as u64);
        assert_eq!(mm["args"]["global"].as_array().unwrap().len(), 3);
    }
    for op in ["matmul", "add", "softmax"] {
        let on_host = xs
            .iter()
            .filter(|e| e["pid"] == HOST_PID && e["cat"] == "op" && e["name"] == op)
            .count();
        assert_eq!(on_host, devices.len(), "host spans of {op}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub/trace.json");
    profile.write_trace(&path).unwrap();
    check_trace(&std::fs::read_to_string(&path).unwrap());
}

#[test]
fn backward_pass_spans_nest_in_the_trace() {
    let _s = serial();
    for dev in test_devices().unwrap() {
        let x = random_tensor(DType::F32, &[4, 6], -1.0, 1.0, 3)
            .to_device(&dev)
            .unwrap();
        let w = random_tensor(DType::F32, &[6, 5], -1.0, 1.0, 4)
            .to_device(&dev)
            .unwrap();
        let p = Profiler::start();
        let tape = Tape::new();
        let wv = tape.leaf(&w).unwrap();
        let loss = netcl_autograd::Var::constant(x)
            .matmul(&wv)
            .unwrap()
            .relu()
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = tape.backward(&loss).unwrap();
        assert_eq!(grads.get(&wv).unwrap().shape(), [6, 5]);
        dev.synchronize().unwrap();
        let profile = p.stop();
        let back = profile
            .spans
            .iter()
            .find(|s| s.category == "backward" && s.name == "backward")
            .unwrap_or_else(|| panic!("{dev}: no backward span in {:#?}", profile.spans));
        let rules: Vec<_> = profile
            .spans
            .iter()
            .filter(|s| s.category == "backward" && s.name != "backward")
            .collect();
        assert!(rules.iter().any(|s| s.name == "matmul"), "{rules:#?}");
        for r in &rules {
            assert!(r.depth > back.depth && r.start_ns >= back.start_ns && r.end_ns <= back.end_ns);
        }
        let xs = check_trace(&profile.chrome_trace_json());
        if dev.is_opencl() {
            assert!(xs.iter().any(|e| e["cat"] == "kernel"), "{dev}: no kernels");
        }
    }
}
