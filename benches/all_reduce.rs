//! all_reduce bus bandwidth (nccl-tests' formula: 2(n-1)/n x bytes / time) over the OpenCL devices of the best kind present (the GPUs where there are any) for 1 KiB..1 GiB, against a device->host->device round trip of the same bytes on one device measured in the same run.
//!
//! `cargo bench -p netcl --bench all_reduce` (NETCL_BENCH_MAX_BYTES caps the largest size, default
//! 1 GiB, also capped by the devices' max allocation). Prints a markdown table.
use netcl::devices::opencl3::event::Event;
use netcl::distributed::{Group, ReduceOp};
use netcl::memory::{enqueue_read, enqueue_write, PinnedBuffer};
use netcl::prelude::*;
use std::time::Instant;

fn main() -> Result<()> {
    // The devices data-parallel training takes by default: the GPUs where there are any.
    let devices: Vec<Device> = netcl::distributed::parse_devices("all")?
        .into_iter()
        .filter(|d| d.is_opencl())
        .collect();
    if devices.len() < 2 {
        println!(
            "all_reduce bench: needs two OpenCL devices of one kind, found {}",
            devices.len()
        );
        return Ok(());
    }
    let n = devices.len();
    let cap = std::env::var("NETCL_BENCH_MAX_BYTES")
        .ok()
        .map(|v| netcl::memory::parse_bytes(&v))
        .transpose()?
        .unwrap_or(1 << 30)
        .min(
            devices
                .iter()
                .map(|d| d.info().max_alloc_bytes as usize)
                .min()
                .unwrap_or(0),
        );
    pcie_peer(&devices, cap.min(256 << 20))?;
    queue_overlap(&devices[0])?;
    host_memory_probe(&devices, cap.min(256 << 20))?;
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

/// Whether `dev` runs its copy and relay queues' work beside a long kernel on its compute
/// queue: when each finishes, from the start. (On NVIDIA the copy runs beside the GEMM and the
/// kernel waits for it, which is why the relay reduces on the host.)
fn queue_overlap(dev: &Device) -> Result<()> {
    let n = 8192;
    let a = Tensor::ones(&[n, n], DType::F32, dev)?;
    drop(a.matmul(&a)?); // warm-up: the GEMM's program
    let bytes = 64 << 20;
    let block = Pool::of(dev)?.alloc(bytes)?;
    let host = PinnedBuffer::new(dev, bytes)?;
    let prog = netcl::kernels::program(dev, &netcl::kernels::sources::COPY, "-DDT_F32")?;
    let cl = dev.cl("queue_overlap")?;
    // A kernel enqueued by hand on another queue (netcl launches kernels on the compute queue).
    let fill = |q: &netcl::devices::opencl3::command_queue::CommandQueue| -> Result<Event> {
        let mut k = netcl::kernels::Kernel::new(&prog, "fill")?;
        k.arg_mem(block.mem())?.arg(&1.0f32)?.arg(&1024u32)?;
        let (global, local) = ([1024usize], [256usize]);
        // SAFETY: every argument is set; the sizes describe a 1-d range.
        let ev = unsafe {
            netcl::devices::cl3::command_queue::enqueue_nd_range_kernel(
                q.get(),
                k.cl_kernel(),
                1,
                std::ptr::null(),
                global.as_ptr(),
                local.as_ptr(),
                0,
                std::ptr::null(),
            )
        }
        .map_err(|c| Error::opencl("clEnqueueNDRangeKernel", c))?;
        Ok(Event::new(ev))
    };
    fill(&cl.relay_queue)?
        .wait()
        .map_err(|e| Error::opencl("clWaitForEvents", e.0))?;
    dev.synchronize()?;
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let start = Instant::now();
    let c = a.matmul(&a)?;
    cl.queue
        .flush()
        .map_err(|e| Error::opencl("clFlush", e.0))?;
    // SAFETY: `host` and `block` outlive the copy, which is waited for below.
    let copy = unsafe {
        enqueue_read(
            &cl.copy_queue,
            block.mem(),
            0,
            host.as_slice().as_ptr().cast_mut(),
            bytes,
            false,
            &[],
        )?
    };
    let small = fill(&cl.relay_queue)?;
    cl.copy_queue
        .flush()
        .map_err(|e| Error::opencl("clFlush", e.0))?;
    cl.relay_queue
        .flush()
        .map_err(|e| Error::opencl("clFlush", e.0))?;
    copy.wait()
        .map_err(|e| Error::opencl("clWaitForEvents", e.0))?;
    let t_copy = ms(start);
    small
        .wait()
        .map_err(|e| Error::opencl("clWaitForEvents", e.0))?;
    let t_kernel = ms(start);
    dev.synchronize()?;
    let t_gemm = ms(start);
    drop(c);
    println!(
        "queue overlap on {dev}: an {n}^3 GEMM on the compute queue ends at {t_gemm:.1} ms; \
         beside it a 64 MiB device->host copy on the copy queue ends at {t_copy:.1} ms, \
         a small kernel on the relay queue at {t_kernel:.1} ms"
    );
    Ok(())
}

/// GB/s of `threads` host threads summing the `len` f32 at `ptr` (best of 3).
fn host_read_gbps(ptr: usize, len: usize, threads: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let start = Instant::now();
        let total: f32 = std::thread::scope(|s| {
            let per = len.div_ceil(threads);
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let (a, b) = ((t * per).min(len), ((t + 1) * per).min(len));
                        // SAFETY: the caller's buffer holds `len` f32, only read here.
                        let v = unsafe {
                            std::slice::from_raw_parts((ptr as *const f32).add(a), b - a)
                        };
                        v.iter().sum::<f32>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(total);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (len * 4) as f64 / best / 1e9
}

/// How fast the host reads pinned (CL_MEM_ALLOC_HOST_PTR) memory against ordinary memory, and
/// how fast devices copy from ordinary memory registered with CL_MEM_USE_HOST_PTR.
fn host_memory_probe(devices: &[Device], bytes: usize) -> Result<()> {
    use netcl::devices::opencl3::memory::{Buffer, CL_MEM_READ_WRITE, CL_MEM_USE_HOST_PTR};
    let len = bytes / 4;
    let pinned = PinnedBuffer::new(&devices[0], bytes)?;
    let ordinary = vec![1.0f32; len];
    for threads in [1, 8] {
        println!(
            "host read, {threads} thread(s): pinned {:.1} GB/s, ordinary {:.1} GB/s",
            host_read_gbps(pinned.as_slice().as_ptr() as usize, len, threads),
            host_read_gbps(ordinary.as_ptr() as usize, len, threads)
        );
    }
    let layout = std::alloc::Layout::from_size_align(bytes, 4096)
        .map_err(|e| Error::invalid("probe", e.to_string()))?;
    // SAFETY: a non-zero size; freed below.
    let host = unsafe { std::alloc::alloc_zeroed(layout) };
    let mut registered = Vec::new();
    for (d, dev) in devices.iter().enumerate().take(2) {
        let cl = dev.cl("probe")?;
        let block = Pool::of(dev)?.alloc(bytes)?;
        let up = || -> Result<Event> {
            // SAFETY: `host` outlives the copy, which is waited for.
            unsafe { enqueue_write(&cl.queue, block.mem(), 0, host, bytes, false, &[]) }
        };
        let before = copies_gbps(bytes, 3, &[&up])?;
        // SAFETY: `host` stays allocated while the buffer lives (dropped before the dealloc).
        let buf = unsafe {
            Buffer::<u8>::create(
                &cl.context,
                CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                bytes,
                host.cast(),
            )
        }
        .map_err(|e| Error::opencl("clCreateBuffer(USE_HOST_PTR)", e.0))?;
        registered.push(buf);
        let after = copies_gbps(bytes, 3, &[&up])?;
        println!("device {d}: host->device from ordinary memory {before:.1} GB/s; after registering it with CL_MEM_USE_HOST_PTR in this device's context {after:.1} GB/s");
    }
    drop(registered);
    // SAFETY: allocated above with this layout; no copy or buffer uses it any more.
    unsafe { std::alloc::dealloc(host, layout) };
    Ok(())
}
