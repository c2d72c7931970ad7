//! Per-op benches: the host cost of one eager op next to a raw clEnqueueNDRangeKernel, the profiler off vs on, GEMM, elementwise bandwidth, softmax, layer_norm, conv2d.
//!
//! Device: `NETCL_DEVICE`, else the best one (a GPU, else the first OpenCL device). On CPU
//! devices (PoCL) and the host the large sizes are skipped so the run stays short.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use netcl::devices::opencl3::command_queue::{CommandQueue, CL_QUEUE_PROFILING_ENABLE};
use netcl::devices::opencl3::types::{cl_command_queue, cl_event, cl_kernel};
use netcl::kernels::decl::Use::{In, Out, Value};
use netcl::kernels::{program, Kernel, Source};
use netcl::ops::Conv2dParams;
use netcl::prelude::*;
use netcl::profiling::Profiler;
use netcl::DeviceKind;
use std::hint::black_box;
use std::ptr;
use std::time::{Duration, Instant};

/// The trivial kernel the eager `add` is compared with: the same work, four arguments.
const ADD_SOURCE: Source = Source {
    name: "bench_add.cl",
    text: "__kernel void bench_add(__global float* o, __global const float* a,
                                    __global const float* b, uint n) {
               uint i = get_global_id(0);
               if (i < n) o[i] = a[i] + b[i];
           }",
    kernels: netcl::kernels::kernels![bench_add(o: Out, a: In, b: In, n: Value("uint"))],
};

/// Elements of the small op whose host cost is measured (4 work-groups of 256).
const SMALL: usize = 1024;
/// Enqueues between synchronisations (the wait is not timed) in the host-cost benches.
const BATCH: u64 = 256;

fn device() -> Device {
    Device::best().expect("NETCL_DEVICE names a device")
}

fn big(dev: &Device) -> bool {
    matches!(dev.kind(), DeviceKind::Gpu | DeviceKind::Accelerator)
}

/// Host time of `iters` calls of `enqueue`, synchronising every [`BATCH`] calls outside the
/// timed part (so the queue stays short); `between` runs untimed after each batch.
fn host_cost(
    dev: &Device,
    iters: u64,
    mut enqueue: impl FnMut(),
    mut between: impl FnMut(),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    dev.synchronize().unwrap();
    while done < iters {
        let n = BATCH.min(iters - done);
        let t = Instant::now();
        for _ in 0..n {
            enqueue();
        }
        total += t.elapsed();
        dev.synchronize().unwrap();
        between();
        done += n;
    }
    total
}

/// Wall time of `iters` calls of `op` from an idle device until the device is idle again
/// (steady-state throughput: launches overlap execution, one sync at the end).
fn device_time(dev: &Device, iters: u64, mut op: impl FnMut()) -> Duration {
    dev.synchronize().unwrap();
    let t = Instant::now();
    for _ in 0..iters {
        op();
    }
    dev.synchronize().unwrap();
    t.elapsed()
}

/// `clEnqueueNDRangeKernel` straight through the OpenCL runtime (no checks), asking for an
/// event (released at once) when `event`.
fn raw_enqueue_event(
    queue: cl_command_queue,
    kernel: cl_kernel,
    global: usize,
    local: usize,
    event: bool,
) {
    let lib = netcl::devices::cl3::load_library()
        .as_ref()
        .expect("OpenCL runtime");
    let mut ev: cl_event = ptr::null_mut();
    // The kernel's arguments are set and its buffers outlive the bench.
    let status = lib.clEnqueueNDRangeKernel(
        queue,
        kernel,
        1,
        ptr::null(),
        &global,
        &local,
        0,
        ptr::null(),
        if event { &mut ev } else { ptr::null_mut() },
    );
    assert_eq!(status, Some(0), "clEnqueueNDRangeKernel");
    if event {
        // SAFETY: the event was just created and is released once.
        unsafe { netcl::devices::cl3::event::release_event(ev) }.unwrap();
    }
}

/// `clEnqueueNDRangeKernel` with no event and no checks.
fn raw_enqueue(queue: cl_command_queue, kernel: cl_kernel, global: usize, local: usize) {
    raw_enqueue_event(queue, kernel, global, local, false)
}

fn full(shape: &[usize], value: f64, dev: &Device) -> Tensor {
    Tensor::full(shape, value, DType::F32, dev).unwrap()
}

/// (a) and (b): the host cost of one small eager op and what lies under it, and the profiler's.
fn dispatch(c: &mut Criterion) {
    let dev = device();
    if !dev.is_opencl() {
        eprintln!("dispatch benches need an OpenCL device ({dev})");
        return;
    }
    let cl = dev.cl("bench").unwrap();
    let (a, b) = (full(&[SMALL], 1.0, &dev), full(&[SMALL], 2.0, &dev));
    // The raw kernel's buffers: o, a, b.
    let pool = Pool::of(&dev).unwrap();
    let bufs: Vec<_> = (0..3).map(|_| pool.alloc(4 * SMALL).unwrap()).collect();
    let prog = program(&dev, &ADD_SOURCE, DType::F32.build_option()).unwrap();
    let set_args = |k: &mut Kernel| {
        for buf in &bufs {
            k.arg_mem(buf.mem()).unwrap();
        }
        k.arg(&(SMALL as u32)).unwrap();
    };
    let mut kernel = Kernel::new(&prog, "bench_add").unwrap();
    set_args(&mut kernel);
    let raw = kernel.cl_kernel();
    // One checked launch (resets the Kernel's argument count; the cl_kernel keeps its arguments).
    kernel.launch(&[SMALL], &[256]).unwrap();
    let plain_queue = CommandQueue::create_default_with_properties(&cl.context, 0, 0).unwrap();
    let profiling_queue =
        CommandQueue::create_default_with_properties(&cl.context, CL_QUEUE_PROFILING_ENABLE, 0)
            .unwrap();
    // The eager op is right before it is timed.
    let sum = a.add(&b).unwrap().to_vec::<f32>().unwrap();
    assert!(sum.iter().all(|&v| v == 3.0));

    let mut g = c.benchmark_group(format!("dispatch/{}", dev.spec()));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("raw_clEnqueueNDRangeKernel", |bch| {
        bch.iter_custom(|n| {
            host_cost(
                &dev,
                n,
                || raw_enqueue(cl.queue.get(), raw, SMALL, 256),
                || {},
            )
        })
    });
    // What every launch paid before the profiler hook (cl3's wrapper always asks for an event).
    g.bench_function("raw_clEnqueueNDRangeKernel_with_event", |bch| {
        bch.iter_custom(|n| {
            let q = cl.queue.get();
            host_cost(
                &dev,
                n,
                || raw_enqueue_event(q, raw, SMALL, 256, true),
                || {},
            )
        })
    });
    g.bench_function("netcl_Kernel_launch", |bch| {
        bch.iter_custom(|n| {
            host_cost(
                &dev,
                n,
                || {
                    set_args(&mut kernel);
                    kernel.launch(&[SMALL], &[256]).unwrap();
                },
                || {},
            )
        })
    });
    g.bench_function("eager_add", |bch| {
        bch.iter_custom(|n| host_cost(&dev, n, || drop(a.add(&b).unwrap()), || {}))
    });
    g.finish();

    // Queues always have CL_QUEUE_PROFILING_ENABLE (so a session can start any time): its
    // cost on a raw enqueue without an event, next to a queue without it.
    let mut g = c.benchmark_group(format!("queue_profiling/{}", dev.spec()));
    g.measurement_time(Duration::from_secs(3));
    for (name, queue) in [
        ("plain_queue", &plain_queue),
        ("profiling_queue", &profiling_queue),
    ] {
        g.bench_function(name, |bch| {
            bch.iter_custom(|n| {
                let mut t = Duration::ZERO;
                let mut done = 0;
                while done < n {
                    let k = BATCH.min(n - done);
                    let start = Instant::now();
                    for _ in 0..k {
                        raw_enqueue(queue.get(), raw, SMALL, 256);
                    }
                    t += start.elapsed();
                    queue.finish().unwrap();
                    done += k;
                }
                t
            })
        });
    }
    g.finish();

    // (b) The profiler compiled in: off (the default), on, and the off hooks alone.
    let mut g = c.benchmark_group(format!("profiler/{}", dev.spec()));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("eager_add_profiler_off", |bch| {
        assert!(
            !netcl::profiling::enabled(),
            "unset NETCL_PROFILE for this bench"
        );
        bch.iter_custom(|n| host_cost(&dev, n, || drop(a.add(&b).unwrap()), || {}))
    });
    g.bench_function("eager_add_profiler_on", |bch| {
        bch.iter_custom(|n| {
            let mut session = Some(Profiler::start());
            let t = host_cost(
                &dev,
                n,
                || drop(a.add(&b).unwrap()),
                // Restarting the session empties the store (untimed).
                || {
                    session.take();
                    session = Some(Profiler::start());
                },
            );
            drop(session);
            t
        })
    });
    // What an op pays for the profiler when it is off: a span, a declaration and the launch
    // probe (the three checks on the path of one eager op).
    g.bench_function("hooks_off_per_op", |bch| {
        bch.iter(|| {
            let s = netcl::profiling::span(black_box("add"));
            netcl::profiling::declare(black_box(12), black_box(1));
            let p = netcl::profiling::Probe::begin();
            black_box((&s, p.is_some()));
        })
    });
    g.finish();
}

/// What a recorded op pays for the debug mode when it is off: one small `Var` add recorded on a
/// tape (the tape is replaced, untimed, after every batch), on any device.
fn autograd_dispatch(c: &mut Criterion) {
    let dev = device();
    let (a, b) = (full(&[SMALL], 1.0, &dev), full(&[SMALL], 2.0, &dev));
    let mut g = c.benchmark_group(format!("autograd_dispatch/{}", dev.spec()));
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("var_add_recorded", |bch| {
        bch.iter_custom(|n| {
            let fresh = || {
                let tape = Tape::new();
                let x = tape.leaf(&a).unwrap();
                (tape, x)
            };
            let graph = std::cell::RefCell::new(fresh());
            let y = Var::constant(b.clone());
            host_cost(
                &dev,
                n,
                || drop(graph.borrow().1.add(&y).unwrap()),
                || *graph.borrow_mut() = fresh(),
            )
        })
    });
    // The same op checked for NaN/Inf (one sum and a scalar read) and its site captured.
    g.bench_function("var_add_recorded_debug_nan", |bch| {
        let _on = netcl::debug::DebugGuard::anomaly();
        let tape = Tape::new();
        let x = tape.leaf(&a).unwrap();
        let y = Var::constant(b.clone());
        bch.iter(|| drop(x.add(&y).unwrap()))
    });
    // The debug hooks alone, off: what every recorded op and every launch pays.
    g.bench_function("debug_hooks_off_per_op", |bch| {
        bch.iter(|| {
            black_box(netcl::debug::nan_checks().unwrap());
            black_box(netcl::debug::sync_launches().unwrap());
        })
    });
    g.finish();
}

/// (c) Throughput of the main ops.
fn ops(c: &mut Criterion) {
    let dev = device();
    let large = big(&dev);
    let spec = dev.spec();

    let mut g = c.benchmark_group(format!("gemm/{spec}"));
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    let sizes: &[usize] = if large {
        &[512, 1024, 2048, 4096]
    } else {
        &[512]
    };
    for &n in sizes {
        let (a, b) = (full(&[n, n], 0.5, &dev), full(&[n, n], 0.25, &dev));
        g.throughput(Throughput::Elements(2 * (n * n * n) as u64));
        g.bench_with_input(BenchmarkId::new("f32", n), &n, |bch, _| {
            bch.iter_custom(|it| device_time(&dev, it, || drop(a.matmul(&b).unwrap())))
        });
    }
    g.finish();

    let n = if large { 1 << 24 } else { 1 << 20 };
    let (x, y) = (full(&[n], 1.0, &dev), full(&[n], 2.0, &dev));
    let mut g = c.benchmark_group(format!("elementwise/{spec}"));
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes(3 * 4 * n as u64));
    g.bench_function(BenchmarkId::new("add_f32", n), |bch| {
        bch.iter_custom(|it| device_time(&dev, it, || drop(x.add(&y).unwrap())))
    });
    g.throughput(Throughput::Bytes(2 * 4 * n as u64));
    g.bench_function(BenchmarkId::new("gelu_f32", n), |bch| {
        bch.iter_custom(|it| device_time(&dev, it, || drop(x.gelu().unwrap())))
    });
    g.finish();

    let (rows, cols) = if large { (8192, 1024) } else { (256, 1024) };
    let x = full(&[rows, cols], 0.5, &dev);
    let (w, bias) = (full(&[cols], 1.0, &dev), full(&[cols], 0.0, &dev));
    let mut g = c.benchmark_group(format!("rows/{spec}"));
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Bytes(2 * 4 * (rows * cols) as u64));
    let id = format!("{rows}x{cols}");
    g.bench_function(BenchmarkId::new("softmax", &id), |bch| {
        bch.iter_custom(|it| device_time(&dev, it, || drop(x.softmax(1).unwrap())))
    });
    g.bench_function(BenchmarkId::new("layer_norm", &id), |bch| {
        bch.iter_custom(|it| {
            device_time(&dev, it, || {
                drop(x.layer_norm(&[cols], Some(&w), Some(&bias), 1e-5).unwrap())
            })
        })
    });
    g.finish();

    // (N, C, H, W) * (Cout, C, 3, 3), padding 1.
    let (n, ch, hw) = if large { (32, 64, 32) } else { (4, 16, 16) };
    let x = full(&[n, ch, hw, hw], 0.5, &dev);
    let w = full(&[ch, ch, 3, 3], 0.1, &dev);
    let params = Conv2dParams {
        padding: (1, 1),
        ..Conv2dParams::default()
    };
    let mut g = c.benchmark_group(format!("conv2d/{spec}"));
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(2 * (n * ch * hw * hw * ch * 9) as u64));
    g.bench_function(
        BenchmarkId::new("3x3", format!("{n}x{ch}x{hw}x{hw}")),
        |bch| {
            bch.iter_custom(|it| {
                device_time(&dev, it, || drop(x.conv2d(&w, None, params).unwrap()))
            })
        },
    );
    g.finish();
}

criterion_group!(benches, dispatch, autograd_dispatch, ops);
criterion_main!(benches);
