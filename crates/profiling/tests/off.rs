//! With the profiler off (no NETCL_PROFILE=1, no session) ops on every device record nothing.
use netcl_core_devices::test_devices;
use netcl_ops::{DType, Tensor};

#[test]
fn nothing_is_recorded_when_off() {
    if netcl_profiling::env_enabled() {
        eprintln!("NETCL_PROFILE=1 is set: the off test does not apply");
        return;
    }
    for dev in test_devices().unwrap() {
        let a = Tensor::ones(&[8, 8], DType::F32, &dev).unwrap();
        let b = a.matmul(&a).unwrap().add(&a).unwrap().softmax(1).unwrap();
        netcl_profiling::declare(1, 2);
        dev.synchronize().unwrap();
        assert_eq!(b.to_vec_f64().unwrap().len(), 64);
    }
    assert!(!netcl_profiling::enabled());
    assert!(!netcl_profiling::span("x").is_recording());
    assert!(netcl_profiling::Probe::begin().is_none());
    assert_eq!(netcl_profiling::stored_records(), (0, 0));
}
