//! Token batches on every device: windows equal a host reference for the seed, shapes/dtypes, transfer counters, argument errors.
use netcl_core_devices::{test_devices, DType, Device};
use netcl_data::{TokenBatcher, TransferStats};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// A stream whose windows are easy to tell apart: token i is (i * 7 + 3) % 1000.
fn stream(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7 + 3) % 1000) as u32).collect()
}

/// The documented sampling rule, computed independently of the batcher.
fn reference(tokens: &[u32], b: usize, t: usize, seed: u64, batches: usize) -> Vec<Vec<usize>> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed);
    let hi = tokens.len() - t - 1;
    (0..batches)
        .map(|_| (0..b).map(|_| rng.random_range(0..=hi)).collect())
        .collect()
}

#[test]
fn batches_match_host_reference_on_every_device() {
    let (b, t, seed) = (4, 9, 77);
    let tokens = stream(500);
    let want = reference(&tokens, b, t, seed, 5);
    for device in test_devices().unwrap() {
        let mut batcher = TokenBatcher::new(tokens.clone(), b, t, seed, &device).unwrap();
        assert_eq!(batcher.shape(), (b, t));
        for (k, starts) in want.iter().enumerate() {
            let batch = batcher.next_batch().unwrap();
            assert_eq!(&batch.starts, starts, "{device} batch {k}");
            for x in [&batch.inputs, &batch.targets] {
                assert_eq!(x.shape(), [b, t]);
                assert_eq!(x.dtype(), DType::I32);
                assert!(x.is_contiguous());
                assert_eq!(x.device(), &device);
            }
            let (inputs, targets) = (
                batch.inputs.to_vec::<i32>().unwrap(),
                batch.targets.to_vec::<i32>().unwrap(),
            );
            for (r, &s) in starts.iter().enumerate() {
                let row: Vec<i32> = tokens[s..s + t + 1].iter().map(|&x| x as i32).collect();
                assert_eq!(
                    inputs[r * t..(r + 1) * t],
                    row[..t],
                    "{device} batch {k} row {r}"
                );
                assert_eq!(
                    targets[r * t..(r + 1) * t],
                    row[1..],
                    "{device} batch {k} row {r}"
                );
            }
            // Per-batch counters: ids only on OpenCL (inputs + targets), nothing on the host.
            // The reads above drained the queue, so no upload was still running when a pinned
            // buffer came up for reuse.
            let bytes = if device.is_host() { 0 } else { 2 * b * t * 4 } as u64;
            let one = TransferStats {
                batches: 1,
                h2d_bytes: bytes,
                host_syncs: 0,
            };
            assert_eq!(batch.stats, one, "{device} batch {k}");
        }
        // Totals include the batch prepared ahead.
        let total = batcher.stats();
        assert_eq!(total.batches, want.len() as u64 + 1);
        assert_eq!(total.h2d_bytes, total.batches * batch_bytes(&device, b, t));
        assert_eq!(total.host_syncs, 0);
    }
}

fn batch_bytes(device: &Device, b: usize, t: usize) -> u64 {
    if device.is_host() {
        0
    } else {
        (8 * b * t) as u64
    }
}

#[test]
fn windows_cover_the_stream_ends_and_seeds_differ() {
    // 12 tokens, T = 11: the only window is the whole stream.
    let tokens = stream(12);
    let mut one = TokenBatcher::new(tokens.clone(), 3, 11, 1, &Device::host()).unwrap();
    let batch = one.next_batch().unwrap();
    assert_eq!(batch.starts, [0, 0, 0]);
    let row: Vec<i32> = tokens[1..].iter().map(|&x| x as i32).collect();
    assert_eq!(batch.targets.to_vec::<i32>().unwrap()[..11], row[..]);
    // Without drawing from a device: many batches reach both ends of the start range.
    let tokens = stream(40);
    let mut a = TokenBatcher::new(tokens.clone(), 8, 5, 3, &Device::host()).unwrap();
    let mut b = TokenBatcher::new(tokens, 8, 5, 4, &Device::host()).unwrap();
    let (mut seen, mut differ) = (vec![false; 35], false);
    for _ in 0..50 {
        let (x, y) = (a.next_batch().unwrap(), b.next_batch().unwrap());
        differ |= x.starts != y.starts;
        for &s in &x.starts {
            seen[s] = true;
        }
    }
    assert!(differ);
    assert!(
        seen.iter().all(|&s| s),
        "every start 0..=34 drawn: {seen:?}"
    );
}

#[test]
fn a_loop_without_reads_syncs_rarely() {
    // Batches handed out back to back, nothing read: each upload is queued without waiting.
    for device in test_devices().unwrap() {
        let mut batcher = TokenBatcher::new(stream(2000), 8, 32, 5, &device).unwrap();
        let kept: Vec<_> = (0..12).map(|_| batcher.next_batch().unwrap()).collect();
        let s = batcher.stats();
        assert_eq!(s.batches, 13);
        assert_eq!(s.h2d_bytes, 13 * batch_bytes(&device, 8, 32));
        // A sync happens only when a pinned buffer's upload from three batches back is still
        // running: at most once per batch after the first three.
        assert!(s.host_syncs <= 10, "{device}: {s:?}");
        let last = kept.last().unwrap();
        assert_eq!(
            last.inputs.to_vec::<i32>().unwrap()[..32],
            stream(2000)[last.starts[0]..last.starts[0] + 32]
                .iter()
                .map(|&x| x as i32)
                .collect::<Vec<_>>()[..]
        );
    }
}

#[test]
fn bad_arguments_are_errors() {
    let host = Device::host();
    let err = TokenBatcher::new(stream(10), 2, 10, 0, &host)
        .unwrap_err()
        .to_string();
    assert!(err.contains("10 tokens"), "{err}");
    assert!(TokenBatcher::new(stream(10), 0, 3, 0, &host).is_err());
    assert!(TokenBatcher::new(stream(10), 2, 0, 0, &host).is_err());
    let err = TokenBatcher::new(vec![1, 2, u32::MAX], 1, 1, 0, &host)
        .unwrap_err()
        .to_string();
    assert!(err.contains("position 2"), "{err}");
    // A batch the host cannot hold (8 GB of window starts alone): an error, not an abort.
    let mut huge = TokenBatcher::new(stream(100), 1_000_000_000_000, 4, 0, &host).unwrap();
    let e = huge.next_batch().err().unwrap();
    assert!(
        matches!(e, netcl_core_devices::Error::OutOfMemory { .. }),
        "{e}"
    );
}
