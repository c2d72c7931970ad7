//! Lists every device netcl can use (the host and each OpenCL device) and the one it would pick.
//!
//!     cargo run --release --example devices
//!     NETCL_DEVICE=host cargo run --release --example devices
use netcl::prelude::*;

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    println!(
        "{:<14} {:<5} {:<44} {:<10} {:>4} {:>10} {:>8} {:>10} {:>6} {:>6}  {:<16} features",
        "device",
        "kind",
        "name",
        "driver",
        "CUs",
        "global",
        "local",
        "max alloc",
        "wg",
        "align",
        "OpenCL C"
    );
    for d in Device::all() {
        let i = d.info();
        let features: Vec<&str> = [
            ("fp16", i.fp16),
            ("fp64", i.fp64),
            ("subgroups", i.subgroups),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
        println!(
            "{:<14} {:<5} {:<44} {:<10} {:>4} {:>10} {:>8} {:>10} {:>6} {:>6}  {:<16} {}",
            d.spec(),
            d.kind().name(),
            i.name.chars().take(44).collect::<String>(),
            i.driver_version.chars().take(10).collect::<String>(),
            i.compute_units,
            mib(i.global_mem_bytes),
            format!("{} KiB", i.local_mem_bytes >> 10),
            mib(i.max_alloc_bytes),
            i.max_work_group_size,
            format!("{} B", i.base_addr_align_bytes),
            i.opencl_c_version.chars().take(16).collect::<String>(),
            features.join(" ")
        );
    }
    let status = Device::opencl_status();
    if !status.is_empty() {
        println!("no OpenCL device: {status}");
    }
    let sel = Device::select_best()?;
    println!("selected: {} ({})", sel.device.label(), sel.reason);
    Ok(())
}
