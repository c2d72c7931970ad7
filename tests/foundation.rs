//! End-to-end checks of the foundation through the facade: device discovery as CI configures it, and one computation per device.
use netcl::prelude::*;

#[test]
fn pocl_with_two_pthread_devices_shows_two_opencl_devices() {
    let pocl_two = std::env::var("POCL_DEVICES")
        .map(|v| v.split_whitespace().count() >= 2)
        .unwrap_or(false);
    let required = netcl::Config::get().require_opencl;
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

/// Every file path the docs and the README name (in backticks, with a directory part and a file
/// extension) exists, from the repository root, from `crates/` or from a crate's `src/`.
#[test]
fn paths_named_in_the_docs_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut docs = vec![root.join("README.md")];
    let mut dirs = vec![root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            match p.extension().and_then(|x| x.to_str()) {
                _ if p.is_dir() => dirs.push(p),
                Some("md") => docs.push(p),
                _ => {}
            }
        }
    }
    let exts = [".rs", ".cl", ".md", ".py", ".json", ".toml", ".sh"];
    let mut bases = vec![root.clone(), root.join("crates")];
    for e in std::fs::read_dir(root.join("crates")).unwrap().flatten() {
        bases.push(e.path().join("src"));
    }
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        for (i, piece) in text.split('`').enumerate() {
            // Odd pieces are inside backticks; a path has no spaces and ends in a known extension.
            let p = piece.trim_end_matches([':', ',']);
            let looks = i % 2 == 1
                && p.contains('/')
                && !p.contains(char::is_whitespace)
                && !p.contains("://")
                && !p.starts_with(['/', '$', '.'])
                && !p.contains(['*', '<'])
                && !p.contains("X.")
                && exts.iter().any(|x| p.ends_with(x));
            if looks && !bases.iter().any(|b| b.join(p).exists()) {
                missing.push(format!(
                    "{}: {p}",
                    doc.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths that do not exist:\n{}",
        missing.join("\n")
    );
}
