//! Pool behaviour on every OpenCL device: reuse without driver calls, aligned sub-buffers, baseline after churn, OOM recovery, reuse after a second queue's work.
use netcl_core_devices::opencl3::event::Event;
use netcl_core_devices::opencl3::types::{cl_event, CL_NON_BLOCKING};
use netcl_core_devices::{cl3, opencl_test_devices, Error};
use netcl_core_memory::{read, write, Pool, SMALL_MAX};

const SIZES: [usize; 8] = [4, 100, 1000, 5000, 70_000, 600_000, 3_000_000, 9_000_000];

#[test]
fn steady_loop_makes_no_driver_allocations_after_warm_up() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        let step = || {
            let held: Vec<_> = SIZES.iter().map(|&s| pool.alloc(s).unwrap()).collect();
            let more: Vec<_> = SIZES
                .iter()
                .rev()
                .map(|&s| pool.alloc(s / 2 + 1).unwrap())
                .collect();
            drop(held);
            drop(more);
        };
        step();
        let warm = pool.stats();
        assert!(warm.driver_allocations > 0);
        for _ in 0..200 {
            step();
        }
        let after = pool.stats();
        assert_eq!(
            after.driver_allocations, warm.driver_allocations,
            "{dev}: {after}"
        );
        assert_eq!(after.hits - warm.hits, 200 * 2 * SIZES.len() as u64);
        assert_eq!(after.misses, warm.misses);
        assert_eq!(after.in_use, 0);
        assert_eq!(after.reserved, warm.reserved);
    }
}

#[test]
fn sub_buffers_are_aligned_disjoint_and_usable() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        let align = dev.info().base_addr_align_bytes;
        assert_eq!(pool.alignment() % align, 0);
        let sizes: Vec<usize> = (0..300).map(|i| 1 + (i * 7919) % 20_000).collect();
        let blocks: Vec<_> = sizes.iter().map(|&s| pool.alloc(s).unwrap()).collect();
        for b in &blocks {
            assert!(b.is_sub_buffer(), "{b:?} should come from a slab");
            assert_eq!(
                b.origin() % align,
                0,
                "{dev}: origin {} not aligned to {align}",
                b.origin()
            );
            assert!(b.capacity() >= b.len());
        }
        // Each block gets its own bytes; reading back proves the sub-buffers do not overlap.
        for (i, b) in blocks.iter().enumerate() {
            write(b, 0, &vec![(i % 251) as u8; b.len()]).unwrap();
        }
        for (i, b) in blocks.iter().enumerate() {
            let mut out = vec![0u8; b.len()];
            read(b, 0, &mut out).unwrap();
            assert!(
                out.iter().all(|&x| x == (i % 251) as u8),
                "{dev}: block {i} was overwritten"
            );
        }
        let big = pool.alloc(SMALL_MAX + 1).unwrap();
        assert!(!big.is_sub_buffer() && big.origin() == 0);
    }
}

#[test]
fn hundred_thousand_cycles_return_to_baseline() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        // Warm-up: the most blocks of each size the churn below can hold at once (7).
        let warm: Vec<_> = SIZES
            .iter()
            .flat_map(|&s| (0..7).map(move |_| s))
            .map(|s| pool.alloc(s).unwrap())
            .collect();
        drop(warm);
        let mut held = Vec::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut cycle = |held: &mut Vec<_>| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            held.push(
                pool.alloc(SIZES[(x % SIZES.len() as u64) as usize])
                    .unwrap(),
            );
            if held.len() > 6 {
                held.swap_remove((x >> 20) as usize % held.len());
            }
        };
        let base = pool.stats();
        for _ in 0..100_000 {
            cycle(&mut held);
        }
        held.clear();
        let end = pool.stats();
        assert_eq!(end.in_use, 0);
        assert_eq!(end.live_blocks, 0);
        assert_eq!(
            end.reserved, base.reserved,
            "{dev}: pool grew during churn: {base} -> {end}"
        );
        assert_eq!(end.driver_allocations, base.driver_allocations);
        pool.empty_cache();
        let empty = pool.stats();
        assert_eq!(
            (empty.reserved, empty.cached, empty.in_use),
            (0, 0, 0),
            "{empty}"
        );
        assert_eq!(empty.driver_frees, empty.driver_allocations);
    }
}

#[test]
fn out_of_memory_releases_cache_then_errors_and_pool_still_works() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        pool.set_limit(Some(8 << 20));
        // A cached 6 MiB block is released to make room for a 7 MiB one.
        drop(pool.alloc(6 << 20).unwrap());
        let seven = pool.alloc(7 << 20).unwrap();
        let s = pool.stats();
        assert_eq!(s.driver_frees, 1, "{s}");
        assert_eq!(s.reserved, 7 << 20);
        // Nothing left to release: a typed error carrying the size and the stats.
        match pool.alloc(4 << 20) {
            Err(Error::OutOfMemory {
                requested, stats, ..
            }) => {
                assert_eq!(requested, 4 << 20);
                assert!(stats.contains("in use"), "{stats}");
            }
            other => panic!("{dev}: expected OutOfMemory, got {other:?}"),
        }
        // Larger than the device can ever allocate.
        let huge = dev.info().max_alloc_bytes as usize * 2;
        let err = pool.alloc(huge).unwrap_err();
        assert!(
            matches!(err, Error::OutOfMemory { .. }) && err.to_string().contains(&huge.to_string()),
            "{err}"
        );
        // The pool is intact: the held block still works, and freeing it makes room again.
        write(&seven, 0, &[7u8; 64]).unwrap();
        drop(seven);
        let four = pool.alloc(4 << 20).unwrap();
        let mut back = [0u8; 16];
        write(&four, 100, &[42u8; 16]).unwrap();
        read(&four, 100, &mut back).unwrap();
        assert_eq!(back, [42u8; 16]);
        assert!(pool.stats().reserved <= 8 << 20);
    }
}

/// A command on the copy queue that writes `src` into `block` once `gate` (a user event) is set:
/// its event, still pending while the gate is closed.
fn gated_copy_write(
    dev: &netcl_core_devices::Device,
    block: &netcl_core_memory::Block,
    src: &[u8],
    gate: cl_event,
) -> Event {
    let cl = dev.cl("test").unwrap();
    // SAFETY: `src` outlives the command (the tests wait for it before returning); the write
    // stays inside the block.
    let ev = unsafe {
        cl3::command_queue::enqueue_write_buffer(
            cl.copy_queue.get(),
            block.mem(),
            CL_NON_BLOCKING,
            0,
            src.len(),
            src.as_ptr().cast(),
            1,
            &gate,
        )
    }
    .unwrap();
    cl.copy_queue.flush().unwrap();
    Event::new(ev)
}

fn user_event(dev: &netcl_core_devices::Device) -> Event {
    let cl = dev.cl("test").unwrap();
    Event::new(cl3::event::create_user_event(cl.context.get()).unwrap())
}

#[test]
fn a_block_used_on_the_copy_queue_is_reused_only_after_that_work_completes() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        let src = vec![9u8; 1000];
        let a = pool.alloc(1000).unwrap();
        let mem_a = a.mem();
        let gate = user_event(&dev);
        let copy = gated_copy_write(&dev, &a, &src, gate.get());
        a.record_use(&copy).unwrap();
        drop(a);
        let s = pool.stats();
        assert_eq!((s.pending_blocks, s.live_blocks), (1, 1), "{dev}: {s}");
        // The copy queue still owns a's memory: a new block of the same class is another one.
        let b = pool.alloc(1000).unwrap();
        assert_ne!(
            b.mem(),
            mem_a,
            "{dev}: block reused while the copy queue used it"
        );
        cl3::event::set_user_event_status(gate.get(), cl3::event::CL_COMPLETE).unwrap();
        copy.wait().unwrap();
        // Now it comes back: the next allocation of its class is a again, holding the copy.
        let c = pool.alloc(1000).unwrap();
        assert_eq!(c.mem(), mem_a, "{dev}: completed block not reused");
        let mut back = vec![0u8; 1000];
        read(&c, 0, &mut back).unwrap();
        assert_eq!(back, src);
        let s = pool.stats();
        assert_eq!((s.pending_blocks, s.live_blocks), (0, 2), "{dev}: {s}");
        // Work on the compute queue needs no record: a block dropped without one is reused at once.
        let mem_b = b.mem();
        drop(b);
        assert_eq!(pool.alloc(1000).unwrap().mem(), mem_b, "{dev}");
    }
}

#[test]
fn out_of_memory_waits_for_blocks_other_queues_still_use() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::new(&dev).unwrap();
        let big = 2 * SMALL_MAX;
        let a = pool.alloc(big).unwrap();
        pool.set_limit(Some(pool.stats().reserved));
        let (mem_a, allocations) = (a.mem(), pool.stats().driver_allocations);
        let src = vec![3u8; 4096];
        let gate = user_event(&dev);
        let copy = gated_copy_write(&dev, &a, &src, gate.get());
        a.record_use(&copy).unwrap();
        drop(a);
        // The only room is a's, still used by the copy queue: the allocation waits for it (the
        // gate opens on another thread) instead of failing.
        let raw_gate = gate.get() as usize;
        let opener = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            cl3::event::set_user_event_status(raw_gate as cl_event, cl3::event::CL_COMPLETE)
                .unwrap();
        });
        let b = pool.alloc(big).unwrap();
        opener.join().unwrap();
        assert_eq!(b.mem(), mem_a, "{dev}");
        let s = pool.stats();
        assert_eq!(s.driver_allocations, allocations, "{dev}: {s}");
        assert_eq!(s.pending_blocks, 0, "{dev}: {s}");
        let mut back = vec![0u8; 4096];
        read(&b, 0, &mut back).unwrap();
        assert_eq!(
            back, src,
            "{dev}: the copy finished before the block was handed out"
        );
    }
}

/// An exact pool (`NETCL_POOL_EXACT=1`, for memory checkers) hands out buffers of exactly the
/// bytes asked, never sub-buffers, and gives every one back to the driver when dropped.
#[test]
fn an_exact_pool_gives_buffers_of_the_size_asked() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::exact(&dev).unwrap();
        for bytes in [1usize, 4, 100, 5000, 600_000] {
            let b = pool.alloc(bytes).unwrap();
            let size = cl3::memory::get_mem_object_info(b.mem(), cl3::memory::CL_MEM_SIZE)
                .unwrap()
                .to_size();
            assert_eq!(size, bytes, "{dev}");
            assert!(!b.is_sub_buffer(), "{dev}");
            write(&b, 0, &vec![7u8; bytes]).unwrap();
            let mut back = vec![0u8; bytes];
            read(&b, 0, &mut back).unwrap();
            assert!(back.iter().all(|&x| x == 7), "{dev}");
        }
        let s = pool.stats();
        assert_eq!(
            (s.in_use, s.reserved, s.live_blocks),
            (0, 0, 0),
            "{dev}: {s:?}"
        );
        assert_eq!(s.driver_frees, s.driver_allocations, "{dev}: {s:?}");
    }
}
