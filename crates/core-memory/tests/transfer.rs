//! Host<->device copies on every OpenCL device: staged, pinned, non-blocking, device-to-device.
use netcl_core_devices::opencl_test_devices;
use netcl_core_memory::{copy, read, read_async, write, write_async, PinnedBuffer, Pool};

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

#[test]
fn tensor_of_256_mib_round_trips_through_pinned_staging() {
    for dev in opencl_test_devices().unwrap() {
        let len = 256 << 20;
        let data = pattern(len + 12_345, 3);
        let pool = Pool::of(&dev).unwrap();
        let block = pool.alloc(data.len()).unwrap();
        write(&block, 0, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        read(&block, 0, &mut back).unwrap();
        assert!(back == data, "{dev}: 256 MiB round trip differs");
        // An unaligned window in the middle.
        let mut mid = vec![0u8; 3 << 20];
        read(&block, 777, &mut mid).unwrap();
        assert!(mid[..] == data[777..777 + (3 << 20)]);
    }
}

#[test]
fn non_blocking_copies_keep_host_memory_until_done() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::of(&dev).unwrap();
        let data = pattern(5 << 20, 9);
        let block = pool.alloc(data.len()).unwrap();
        let pending = write_async(&block, 0, data.clone()).unwrap();
        let returned = pending.wait().unwrap();
        assert!(*returned == data);
        // Zero-length copies are no-ops, not OpenCL errors.
        write_async(&block, 0, Vec::<u8>::new())
            .unwrap()
            .wait()
            .unwrap();
        assert!(read_async(&block, 0, 0).unwrap().wait().unwrap().is_empty());
        write(&block, 0, &[]).unwrap();
        read(&block, 0, &mut []).unwrap();
        let back = read_async(&block, 1, data.len() - 1)
            .unwrap()
            .wait()
            .unwrap();
        assert!(back[..] == data[1..]);
        // Data stored inline (an array) is boxed before its address goes to the device.
        write_async(&block, 64, [9u8; 1000])
            .unwrap()
            .wait()
            .unwrap();
        let mut nine = vec![0u8; 1000];
        read(&block, 64, &mut nine).unwrap();
        assert!(nine.iter().all(|&b| b == 9));
        // Dropping a pending write without waiting still completes it before the memory goes.
        drop(write_async(&block, 0, vec![5u8; 4096]).unwrap());
        let mut head = vec![0u8; 4096];
        read(&block, 0, &mut head).unwrap();
        assert!(head.iter().all(|&b| b == 5));
        // Out-of-range requests are errors, not enqueues.
        assert!(write_async(&block, data.len() - 3, vec![0u8; 4]).is_err());
        assert!(read_async(&block, 0, data.len() + 1).is_err());
    }
}

#[test]
fn pinned_buffers_and_device_copies() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::of(&dev).unwrap();
        let data = pattern(3 << 20, 11);
        let mut pinned = PinnedBuffer::new(&dev, data.len()).unwrap();
        pinned.as_mut_slice().copy_from_slice(&data);
        let a = pool.alloc(data.len()).unwrap();
        let b = pool.alloc(data.len()).unwrap();
        let mut pinned = pinned.write_to(&a, 0, data.len()).unwrap().wait().unwrap();
        copy(&a, 1000, &b, 0, data.len() - 1000).unwrap();
        pinned.as_mut_slice().fill(0);
        let pinned = pinned
            .read_from(&b, 0, data.len() - 1000)
            .unwrap()
            .wait()
            .unwrap();
        assert!(pinned.as_slice()[..data.len() - 1000] == data[1000..]);
        // A pending copy that is dropped unwaited still completes before the buffer goes.
        drop(pinned.read_from(&a, 0, 4096).unwrap());
        let small = PinnedBuffer::new(&dev, 16).unwrap();
        assert!(small.write_to(&a, 10, data.len()).is_err());
        assert!(copy(&a, 0, &b, 1, data.len()).is_err());
    }
}
