//! Host<->device bandwidth per OpenCL device: pinned (CL_MEM_ALLOC_HOST_PTR) and staged from pageable memory.
//!
//! Size: NETCL_BENCH_BYTES (default 1 GiB on GPUs, 256 MiB elsewhere).
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use netcl::memory::{read, write, PinnedBuffer, Pool};
use netcl::prelude::*;
use netcl::DeviceKind;
use std::time::Duration;

fn bench_bytes(dev: &Device) -> usize {
    std::env::var("NETCL_BENCH_BYTES")
        .ok()
        .map(|v| netcl::memory::parse_bytes(&v).expect("NETCL_BENCH_BYTES: a byte count"))
        .unwrap_or(if dev.kind() == DeviceKind::Gpu {
            1 << 30
        } else {
            256 << 20
        })
        .min(dev.info().max_alloc_bytes as usize)
}

fn transfer(c: &mut Criterion) {
    for dev in Device::opencl_devices() {
        let bytes = bench_bytes(&dev);
        let pool = Pool::of(&dev).expect("pool");
        let block = pool.alloc(bytes).expect("device block");
        let mut buf = PinnedBuffer::new(&dev, bytes).expect("pinned buffer");
        buf.as_mut_slice()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        // A pending copy owns the pinned buffer; each iteration takes it out and puts it back.
        let mut pinned = Some(buf);
        let mut cycle = |up: bool| {
            let p = pinned.take().expect("pinned buffer is back");
            let pending = if up {
                p.write_to(&block, 0, bytes)
            } else {
                p.read_from(&block, 0, bytes)
            };
            pinned = Some(pending.unwrap().wait().unwrap());
        };
        let mut pageable = vec![1u8; bytes];
        let mut group = c.benchmark_group(format!("transfer/{}", dev.spec()));
        group
            .throughput(Throughput::Bytes(bytes as u64))
            .sample_size(10)
            .measurement_time(Duration::from_secs(4));
        group.bench_function("pinned_host_to_device", |b| b.iter(|| cycle(true)));
        group.bench_function("pinned_device_to_host", |b| b.iter(|| cycle(false)));
        group.bench_function("staged_host_to_device", |b| {
            b.iter(|| write(&block, 0, &pageable).unwrap())
        });
        group.bench_function("staged_device_to_host", |b| {
            b.iter(|| read(&block, 0, &mut pageable).unwrap())
        });
        group.finish();
        // The round trip is correct, not only fast.
        cycle(true);
        read(&block, 0, &mut pageable).unwrap();
        assert!(
            pageable.iter().enumerate().all(|(i, &b)| b == i as u8),
            "round trip on {dev} corrupted data"
        );
    }
}

criterion_group!(benches, transfer);
criterion_main!(benches);
