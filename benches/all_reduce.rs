//! all_reduce bus bandwidth over every OpenCL device (nccl-tests' formula: 2(n-1)/n x bytes / time) for 1 KiB..1 GiB, against a device->host->device round trip of the same bytes on one device measured in the same run.
//!
//! `cargo bench -p netcl --bench all_reduce` (NETCL_BENCH_MAX_BYTES caps the largest size, default
//! 1 GiB, also capped by the devices' max allocation). Prints a markdown table.
use netcl::devices::opencl3::event::Event;
use netcl::distributed::{Group, ReduceOp};
use netcl::memory::{enqueue_read, enqueue_write, PinnedBuffer};
use netcl::prelude::*;
use std::time::Instant;

fn main() -> Result<()> {
    let devices = Device::opencl_devices();
    if devices.len() < 2 {
        println!(
            "all_reduce bench: needs two OpenCL devices, found {}",
            devices.len()
        );
        return Ok(());
    }
    let n = devices.len();
    let cap = std::env::var("NETCL_BENCH_MAX_BYTES")
        .ok()
        .and_then(|v| netcl::memory::parse_bytes(&v).ok())
        .unwrap_or(1 << 30)
        .min(
            devices
                .iter()
                .map(|d| d.info().max_alloc_bytes as usize)
                .min()
                .unwrap_or(0),
        );
    pcie_peer(&devices, cap.min(256 << 20))?;
    println!("all_reduce (sum, f32) over {n} devices: {}", devices[0]);
    println!("| bytes | time (ms) | bus bandwidth (GB/s) | round trip on one device (ms) | all_reduce / round trip |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    let group = Group::new(devices.clone())?;
    let mut bytes = 1usize << 10;
    while bytes <= cap {
        let elems = bytes / 4;
        // Repetitions: enough for ~0.2 s of small sizes, at least 3.
        let reps = ((256 << 20) / bytes).clamp(3, 200);
        let times = group.run(|comm| {
            let t = Tensor::full(&[elems], 1.0, DType::F32, comm.device())?;
            comm.all_reduce(&t, ReduceOp::Sum)?; // warm-up: staging buffers, first copies
            comm.barrier()?;
            let start = Instant::now();
            for _ in 0..reps {
                comm.all_reduce(&t, ReduceOp::Sum)?;
            }
            comm.device().synchronize()?;
            comm.barrier()?;
            Ok(start.elapsed().as_secs_f64() / reps as f64)
        })?;
        let secs = times.iter().cloned().fold(0.0, f64::max);
        let busbw = 2.0 * (n as f64 - 1.0) / n as f64 * bytes as f64 / secs / 1e9;
        // The peer: the same bytes device -> host -> device on one device (what any host-relayed
        // collective must at least move per rank).
        let dev = &devices[0];
        let t = Tensor::full(&[elems], 1.0, DType::F32, dev)?;
        let start = Instant::now();
        for _ in 0..reps {
            let host = t.to_vec::<f32>()?;
            drop(Tensor::from_vec(host, &[elems], dev)?);
        }
        dev.synchronize()?;
        let round = start.elapsed().as_secs_f64() / reps as f64;
        println!(
            "| {bytes} | {:.3} | {busbw:.2} | {:.3} | {:.2} |",
            secs * 1e3,
            round * 1e3,
            secs / round
        );
        bytes *= 4;
    }
    Ok(())
}

/// GB/s of `bytes` moved by `copies` (each a closure enqueueing one non-blocking copy), all
/// started together: the best of `reps` rounds.
fn copies_gbps(bytes: usize, reps: usize, copies: &[&dyn Fn() -> Result<Event>]) -> Result<f64> {
    let mut best = f64::MAX;
    for _ in 0..reps {
        let start = Instant::now();
        let events = copies.iter().map(|c| c()).collect::<Result<Vec<_>>>()?;
        for e in &events {
            e.wait()
                .map_err(|e| Error::opencl("clWaitForEvents", e.0))?;
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    Ok(bytes as f64 / best / 1e9)
}

/// One device's side of the peer measurement: a device block and a pinned buffer per direction.
struct Lane {
    dev: Device,
    up: (netcl::memory::Block, PinnedBuffer),
    down: (netcl::memory::Block, PinnedBuffer),
}

impl Lane {
    fn new(dev: &Device, bytes: usize) -> Result<Lane> {
        let pool = Pool::of(dev)?;
        let pinned = |v: u8| -> Result<PinnedBuffer> {
            let mut p = PinnedBuffer::new(dev, bytes)?;
            p.as_mut_slice().fill(v);
            Ok(p)
        };
        Ok(Lane {
            dev: dev.clone(),
            up: (pool.alloc(bytes)?, pinned(1)?),
            down: (pool.alloc(bytes)?, pinned(2)?),
        })
    }

    /// Host -> device from `host` (this lane's pinned memory or another device's) on the
    /// compute queue.
    fn up(&self, host: &PinnedBuffer) -> Result<Event> {
        let cl = self.dev.cl("peer")?;
        let len = host.len().min(self.up.0.len());
        // SAFETY: the pinned buffers and blocks outlive every copy (each is waited for).
        unsafe {
            enqueue_write(
                &cl.queue,
                self.up.0.mem(),
                0,
                host.as_slice().as_ptr(),
                len,
                false,
                &[],
            )
        }
    }

    /// Device -> host into `host` on the copy queue.
    fn down(&self, host: &PinnedBuffer) -> Result<Event> {
        let cl = self.dev.cl("peer")?;
        let len = host.len().min(self.down.0.len());
        // SAFETY: as in `up`; nothing reads `host` while the copy runs.
        unsafe {
            enqueue_read(
                &cl.copy_queue,
                self.down.0.mem(),
                0,
                host.as_slice().as_ptr().cast_mut(),
                len,
                false,
                &[],
            )
        }
    }
}

/// The peer a host relay is measured against: pinned host <-> device copies of `bytes` on each
/// device alone and both directions at once, both directions of every device at once (the
/// ceiling of a relay whose ranks all copy at the same time), and copies from host memory pinned
/// by another device's context (what the relay's shared slots rely on).
fn pcie_peer(devices: &[Device], bytes: usize) -> Result<()> {
    let reps = 5;
    let lanes = devices
        .iter()
        .map(|d| Lane::new(d, bytes))
        .collect::<Result<Vec<_>>>()?;
    println!(
        "pinned PCIe peer, {} MiB per copy (GB/s, best of {reps}):",
        bytes >> 20
    );
    for (d, l) in lanes.iter().enumerate() {
        let h2d = copies_gbps(bytes, reps, &[&|| l.up(&l.up.1)])?;
        let d2h = copies_gbps(bytes, reps, &[&|| l.down(&l.down.1)])?;
        let both = copies_gbps(bytes, reps, &[&|| l.up(&l.up.1), &|| l.down(&l.down.1)])?;
        println!("  device {d}: host->device {h2d:.1}, device->host {d2h:.1}, both at once {both:.1} each way");
    }
    let all: Vec<Box<dyn Fn() -> Result<Event> + '_>> = lanes
        .iter()
        .flat_map(|l| {
            let u: Box<dyn Fn() -> Result<Event>> = Box::new(move || l.up(&l.up.1));
            let w: Box<dyn Fn() -> Result<Event>> = Box::new(move || l.down(&l.down.1));
            [u, w]
        })
        .collect();
    let refs: Vec<&dyn Fn() -> Result<Event>> = all.iter().map(|b| b.as_ref()).collect();
    let every = copies_gbps(bytes, reps, &refs)?;
    println!("  every device, both directions at once: {every:.1} GB/s per copy (the relay's ceiling on its bus bandwidth with two ranks)");
    if let [a, b, ..] = &lanes[..] {
        let h2d = copies_gbps(bytes, reps, &[&|| b.up(&a.up.1)])?;
        let d2h = copies_gbps(bytes, reps, &[&|| b.down(&a.down.1)])?;
        println!("  device 1 with device 0's pinned memory: host->device {h2d:.1}, device->host {d2h:.1}");
    }
    Ok(())
}
