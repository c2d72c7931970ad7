//! End-to-end checks of the foundation through the facade: device discovery as CI configures it, and one computation per device.
use netcl::prelude::*;

#[test]
fn pocl_with_two_pthread_devices_shows_two_opencl_devices() {
    let pocl_two = std::env::var("POCL_DEVICES")
        .map(|v| v.split_whitespace().count() >= 2)
        .unwrap_or(false);
    let required = std::env::var("NETCL_REQUIRE_OPENCL")
        .map(|v| v == "1")
        .unwrap_or(false);
    let cl = Device::opencl_devices();
    if required {
        assert!(
            !cl.is_empty(),
            "NETCL_REQUIRE_OPENCL=1 but no OpenCL device: {}",
            Device::opencl_status()
        );
    }
    if pocl_two
        && cl
            .iter()
            .any(|d| d.info().platform.contains("Portable Computing Language"))
    {
        let pocl = cl
            .iter()
            .filter(|d| d.info().platform.contains("Portable Computing Language"))
            .count();
        assert!(pocl >= 2, "POCL_DEVICES asks for two devices, found {pocl}");
    }
    // Every device has sane capabilities.
    for d in Device::all() {
        let i = d.info();
        assert!(
            i.compute_units >= 1 && i.max_work_group_size >= 1 && i.base_addr_align_bytes >= 1,
            "{d}: {i:?}"
        );
        if d.is_opencl() {
            assert!(
                i.local_mem_bytes > 0 && i.max_alloc_bytes > 0 && !i.opencl_c_version.is_empty(),
                "{d}: {i:?}"
            );
        }
    }
}

#[test]
fn the_best_device_computes_what_the_host_computes() {
    let best = Device::best().unwrap();
    let host = Device::host();
    let mut g = Generator::new(5);
    let x = Tensor::randn(&[64, 33], DType::F32, &host, &mut g).unwrap();
    let y = Tensor::rand(&[33], DType::F32, &host, &mut g).unwrap();
    let expected = x
        .transpose(0, 1)
        .unwrap()
        .mul(&y.unsqueeze(1).unwrap())
        .unwrap()
        .add(&y.unsqueeze(1).unwrap())
        .unwrap();
    let (xd, yd) = (x.to_device(&best).unwrap(), y.to_device(&best).unwrap());
    let got = xd
        .transpose(0, 1)
        .unwrap()
        .mul(&yd.unsqueeze(1).unwrap())
        .unwrap()
        .add(&yd.unsqueeze(1).unwrap())
        .unwrap();
    assert_eq!(
        got.to_vec::<f32>().unwrap(),
        expected.to_vec::<f32>().unwrap()
    );
    best.synchronize().unwrap();
}
