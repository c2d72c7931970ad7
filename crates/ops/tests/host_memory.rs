//! The host backend's memory: requests it cannot grant are errors (never an abort or a wrapped count), NETCL_POOL_LIMIT covers what an op allocates, and reductions and softmax hold no copy of their input. One test, run alone in its binary: it sets the process-wide cap and reads the process's peak resident memory.
use netcl_core_devices::{DType, Device, Error};
use netcl_core_memory::{host_memory, set_host_limit};
use netcl_ops::testing::rss_added;
use netcl_ops::{Generator, Tensor};

const MIB: usize = 1 << 20;

fn oom(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { .. })
}

#[test]
fn host_allocations_are_fallible_counted_and_bounded() {
    let host = Device::host();
    let mut g = Generator::new(0);
    // Requests past the system or past usize: errors naming them.
    let e = Tensor::randn(&[1 << 40], DType::F32, &host, &mut g).unwrap_err();
    assert!(oom(&e), "{e}");
    let e = Tensor::randn(&[1 << 62, 64], DType::F32, &host, &mut g).unwrap_err();
    assert!(e.to_string().contains("more elements than memory"), "{e}");
    let one = Tensor::ones(&[1, 1], DType::F32, &host).unwrap();
    let huge = one.broadcast_to(&[65536, 65536]).unwrap();
    set_host_limit(Some(host_memory().0 + 256 * MIB));
    let e = huge.contiguous().unwrap_err();
    assert!(oom(&e) && e.to_string().contains("NETCL_POOL_LIMIT"), "{e}");

    // A reduction of a broadcast view reads it in place: no temporary at all.
    let wide = one.broadcast_to(&[8192, 8192]).unwrap();
    let (s, added) = rss_added(|| wide.sum_all().unwrap().to_vec::<f32>().unwrap());
    assert_eq!(s, [67_108_864.0]);
    assert!(
        added < 32 * MIB,
        "sum_all of a broadcast view added {added} B"
    );

    // softmax of 64 MiB: its output and row buffers, not f64 copies of the tensor.
    set_host_limit(None);
    let x = Tensor::randn(&[4096, 4096], DType::F32, &host, &mut g).unwrap();
    let size = 64 * MIB;
    let (y, added) = rss_added(|| x.softmax(1).unwrap());
    assert!(added < 2 * size, "softmax of {size} B added {added} B");
    let row = y
        .narrow(0, 7, 1)
        .unwrap()
        .sum_all()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0];
    assert!((row - 1.0).abs() < 1e-3, "{row}");
    drop(y);

    // Under a cap of what x holds plus one more copy: a transposed copy fits, a second not.
    set_host_limit(Some(host_memory().0 + size + MIB));
    let t = x.transpose(0, 1).unwrap().contiguous().unwrap();
    let e = x.transpose(0, 1).unwrap().contiguous().unwrap_err();
    assert!(oom(&e), "{e}");
    let e = x.softmax(0).unwrap_err();
    assert!(oom(&e), "{e}");
    drop(t);
    set_host_limit(None);

    // Decoding reads the cache's filled positions, not its whole capacity (64 MiB each here).
    let (hkv, s, hd) = (2, 1 << 20, 8);
    let cache = Tensor::zeros(&[1, hkv, s, hd], DType::F32, &host).unwrap();
    let q = Tensor::ones(&[1, 4 * hd], DType::F32, &host).unwrap();
    let at = Tensor::from_vec(vec![9i32], &[1], &host).unwrap();
    let (y, added) = rss_added(|| q.decode_attention(&cache, &cache, &at, None, 4).unwrap());
    assert_eq!(y.shape(), [1, 4 * hd]);
    assert!(added < 16 * MIB, "one decoding step added {added} B");
}
