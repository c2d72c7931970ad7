//! Checkpoint files: bit-exact round trips on every device, corruption and failed-save handling, check_against, numpy readability.
use netcl_core_devices::test_devices;
use netcl_nn::checkpoint::{
    check_against, json_path, load, npz_path, read_meta, save, Checkpoint, CheckpointInfo,
    SCHEMA_VERSION,
};
use netcl_ops::testing::{dtypes_for, random_view, Cases};
use netcl_ops::{with_host, DType, Device, Error, HostData, Tensor};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A fresh, empty directory for one test.
fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("checkpoint-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Random bit patterns (NaN payloads, infinities, subnormals included) as host data.
fn random_bits(dtype: DType, n: usize, c: &mut Cases) -> HostData {
    let bytes: Vec<u8> = (0..n * dtype.size()).map(|_| c.next_u64() as u8).collect();
    HostData::from_bytes(dtype, &bytes).unwrap()
}

/// [`random_bits`] for `dev`. OpenCL strided copies of f16/bf16 go through float
/// (`vstore_half` makes every f16 NaN 0x7fff/0xffff, `bf16_from_float` quiets signalling NaNs),
/// so a strided view's NaN payloads do not survive `contiguous()` there: 16-bit NaNs are made
/// finite (top exponent bit cleared) on OpenCL devices. Everything else is random bits.
fn random_bits_for(dev: &Device, dtype: DType, n: usize, c: &mut Cases) -> HostData {
    let data = random_bits(dtype, n, c);
    if dev.is_host() {
        return data;
    }
    let (exp, man) = match dtype {
        DType::F16 => (0x7c00u16, 0x03ffu16),
        DType::BF16 => (0x7f80, 0x007f),
        _ => return data,
    };
    let bits: Vec<u16> = data
        .as_bytes()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .map(|x| {
            if x & exp == exp && x & man != 0 {
                x & !0x4000
            } else {
                x
            }
        })
        .collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|x| x.to_le_bytes()).collect();
    HostData::from_bytes(dtype, &bytes).unwrap()
}

fn tensor_of(data: HostData, shape: &[usize], dev: &Device) -> Tensor {
    with_host!(data, v => Tensor::from_vec(v, shape, dev)).unwrap()
}

fn bytes_of(t: &Tensor) -> Vec<u8> {
    t.to_host_data().unwrap().as_bytes().to_vec()
}

fn info(step: u64) -> CheckpointInfo {
    CheckpointInfo {
        model: json!({"type": "Sequential", "layers": [{"Linear": {"in": 3, "out": 4, "bias": true}}]}),
        optimizer: Some(json!({"type": "AdamW", "lr": 0.001, "betas": [0.9, 0.999], "step": step})),
        step,
        extra: json!({"rng": [1, 2, 3], "epoch": 7, "loss": 0.25}),
    }
}

/// A small host checkpoint with three tensors; returns the tensors' bytes.
fn small_checkpoint(path: &Path, step: u64) -> Vec<(String, Vec<u8>)> {
    let host = Device::host();
    let a = Tensor::from_vec((0..12).map(|i| i as f32 * 0.5).collect(), &[3, 4], &host).unwrap();
    let b = Tensor::from_vec(vec![1i32, -2, 3], &[3], &host).unwrap();
    let c = Tensor::from_vec(vec![step as f64], &[], &host).unwrap();
    let named = [
        ("model.0.weight", &a),
        ("model.0.idx", &b),
        ("optim.step", &c),
    ];
    save(path, &info(step), &named).unwrap();
    named
        .iter()
        .map(|(n, t)| (n.to_string(), bytes_of(t)))
        .collect()
}

fn assert_loads(path: &Path, step: u64, want: &[(String, Vec<u8>)]) {
    let l = load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(l.meta().step, step);
    assert_eq!(l.meta().info(), info(step));
    assert_eq!(l.tensors().len(), want.len());
    for (name, bytes) in want {
        assert_eq!(&bytes_of(l.require(name).unwrap()), bytes, "{name}");
    }
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let p = json_path(path);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn sha256_hex_of_file(p: &Path) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(std::fs::read(p).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The error's message, which must be a Format error naming `file`.
fn format_error_naming(e: Error, file: &Path) -> String {
    let msg = e.to_string();
    assert!(
        matches!(e, Error::Format { .. }),
        "not a format error: {msg}"
    );
    assert!(msg.contains(&file.display().to_string()), "{msg}");
    msg
}

#[test]
fn round_trips_every_dtype_layout_and_device_bit_exact() {
    let dir = test_dir("round_trip");
    let shapes: [&[usize]; 7] = [&[], &[0], &[1], &[7], &[3, 5], &[2, 3, 4], &[33, 17, 3]];
    let mut checked = 0;
    for (di, dev) in test_devices().unwrap().into_iter().enumerate() {
        let mut c = Cases::new(11 + di as u64);
        let mut named: Vec<(String, Tensor)> = Vec::new();
        let mut want: Vec<Vec<u8>> = Vec::new();
        for dtype in dtypes_for(&dev) {
            for (si, shape) in shapes.iter().enumerate() {
                let n = shape.iter().product();
                let data = random_bits_for(&dev, dtype, n, &mut c);
                let raw = data.as_bytes().to_vec();
                let host_t = tensor_of(data.clone(), shape, &Device::host());
                let dev_t = tensor_of(data, shape, &dev);
                named.push((format!("{dtype}.{si}"), dev_t.clone()));
                want.push(raw);
                // A strided view: its reference is the same view gathered on the host.
                let state = c.clone();
                let host_v = random_view(&host_t, &mut state.clone());
                let dev_v = random_view(&dev_t, &mut c);
                named.push((format!("{dtype}.{si}.view"), dev_v));
                want.push(bytes_of(&host_v));
            }
            // A transposed (never contiguous) view.
            let t = tensor_of(random_bits_for(&dev, dtype, 24, &mut c), &[4, 6], &dev);
            let tt = t.transpose(0, 1).unwrap();
            assert!(!tt.is_contiguous());
            let host_tt = tensor_of(t.to_host_data().unwrap(), &[4, 6], &Device::host())
                .transpose(0, 1)
                .unwrap();
            named.push((format!("layers.{dtype}.weight_t"), tt));
            want.push(bytes_of(&host_tt));
        }
        let path = dir.join(format!("dev{di}/ckpt"));
        let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let saved = save(&path, &info(u64::MAX - di as u64), &refs).unwrap();
        let loaded = load(&path).unwrap();
        assert_eq!(loaded.meta(), &saved);
        assert_eq!(read_meta(&path).unwrap(), saved);
        assert_eq!(saved.schema_version, SCHEMA_VERSION);
        assert_eq!(saved.info(), info(u64::MAX - di as u64));
        assert_eq!(loaded.tensors().len(), named.len());
        for (((name, orig), (lname, lt)), bytes) in named.iter().zip(loaded.tensors()).zip(&want) {
            assert_eq!(name, lname, "save order");
            assert_eq!(
                (lt.shape(), lt.dtype()),
                (orig.shape(), orig.dtype()),
                "{dev} {name}"
            );
            assert!(lt.device().is_host(), "{name} loads on the host");
            assert_eq!(&bytes_of(lt), bytes, "{dev} {name}: bits differ");
            assert_eq!(bytes_of(lt), bytes_of(orig), "{dev} {name}");
            assert!(std::ptr::eq(loaded.get(name).unwrap(), lt));
            checked += 1;
        }
        // The save order is also the json's order, and each hash is over the raw bytes.
        let names: Vec<&str> = saved.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            named.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>()
        );
        assert_eq!(
            saved.npz_sha256,
            sha256_hex_of_file(&npz_path(&path).unwrap())
        );
        assert!(loaded.get("no.such").is_none());
        assert!(loaded
            .require("no.such")
            .unwrap_err()
            .to_string()
            .contains("no.such"));
    }
    eprintln!("checkpoint round trip: {checked} tensors bit-exact");
    assert!(checked >= 100, "only {checked} tensors checked");
}

#[test]
fn saves_are_deterministic_overwrite_and_leave_no_temporaries() {
    let dir = test_dir("overwrite");
    let path = dir.join("nested/deeper/ckpt");
    small_checkpoint(&path, 1);
    let first = std::fs::read(npz_path(&path).unwrap()).unwrap();
    small_checkpoint(&path, 1);
    assert_eq!(
        std::fs::read(npz_path(&path).unwrap()).unwrap(),
        first,
        "same tensors, same npz bytes"
    );
    let want = small_checkpoint(&path, 2);
    assert_loads(&path, 2, &want);
    let mut files: Vec<String> = std::fs::read_dir(dir.join("nested/deeper"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let npz_name = npz_path(&path).unwrap();
    let npz_name = npz_name.file_name().unwrap().to_str().unwrap();
    assert_eq!(files, [npz_name, "ckpt.json"]);
    assert!(
        npz_name.len() == "ckpt..npz".len() + 16 && npz_name.starts_with("ckpt."),
        "{npz_name}"
    );
    // An empty tensor list is a valid checkpoint.
    let empty: [(&str, &Tensor); 0] = [];
    save(dir.join("empty"), &CheckpointInfo::default(), &empty).unwrap();
    let l = load(dir.join("empty")).unwrap();
    assert!(l.tensors().is_empty());
    assert_eq!(l.meta().info(), CheckpointInfo::default());
}

#[test]
fn damaged_npz_is_an_error_naming_the_file() {
    let dir = test_dir("damaged_npz");
    let path = dir.join("ckpt");
    let want = small_checkpoint(&path, 3);
    let npz = npz_path(&path).unwrap();
    let good = std::fs::read(&npz).unwrap();

    for cut in [good.len() / 2, good.len() - 1, 0] {
        std::fs::write(&npz, &good[..cut]).unwrap();
        let msg = format_error_naming(load(&path).unwrap_err(), &npz);
        assert!(
            msg.contains("SHA-256") && msg.contains("truncated"),
            "{msg}"
        );
    }
    // Each byte position class: local header, npy header, data, central directory.
    for pos in [10, 80, 150, good.len() - 30] {
        let mut bad = good.clone();
        bad[pos] ^= 0x20;
        std::fs::write(&npz, &bad).unwrap();
        let msg = format_error_naming(load(&path).unwrap_err(), &npz);
        assert!(msg.contains("SHA-256"), "byte {pos}: {msg}");
    }
    // A flipped data byte with the whole-file hash "fixed" in the json: the per-array checks
    // (zip CRC, then the tensor's own SHA-256) still catch it and name the array.
    let data_pos = good
        .windows(4)
        .position(|w| w == 2.5f32.to_le_bytes())
        .unwrap();
    let mut bad = good.clone();
    bad[data_pos] ^= 1;
    std::fs::write(&npz, &bad).unwrap();
    let h = sha256_hex_of_file(&npz);
    edit_json(&path, |v| v["npz_sha256"] = json!(h));
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(msg.contains("model.0.weight"), "{msg}");

    std::fs::write(&npz, &good).unwrap();
    let h = sha256_hex_of_file(&npz);
    edit_json(&path, |v| v["npz_sha256"] = json!(h));
    assert_loads(&path, 3, &want);
    std::fs::remove_file(&npz).unwrap();
    let e = load(&path).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains(&npz.display().to_string()), "{e}");
}

#[test]
fn edited_json_is_an_error() {
    let dir = test_dir("edited_json");
    let path = dir.join("ckpt");
    let want = small_checkpoint(&path, 4);
    let (json, npz) = (json_path(&path), npz_path(&path).unwrap());
    let good = std::fs::read(&json).unwrap();
    let restore = || std::fs::write(&json, &good).unwrap();

    edit_json(&path, |v| v["npz_sha256"] = json!("ab".repeat(32)));
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(
        msg.contains(&"ab".repeat(32)) && msg.contains(&json.display().to_string()),
        "{msg}"
    );
    restore();

    edit_json(&path, |v| v["tensors"][0]["shape"] = json!([4, 3]));
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(
        msg.contains("[3, 4] in the npz but [4, 3] in the json"),
        "{msg}"
    );
    restore();

    edit_json(&path, |v| v["tensors"][0]["shape"] = json!([3, 4, 1]));
    assert!(format_error_naming(load(&path).unwrap_err(), &npz).contains("model.0.weight"));
    restore();

    edit_json(&path, |v| v["tensors"][0]["dtype"] = json!("i32"));
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(msg.contains("'<f4'") && msg.contains("'<i4'"), "{msg}");
    restore();

    edit_json(&path, |v| v["tensors"][0]["dtype"] = json!("f128"));
    let msg = format_error_naming(load(&path).unwrap_err(), &json);
    assert!(msg.contains("f128"), "{msg}");
    restore();

    edit_json(&path, |v| {
        v["tensors"][1]["name"] = json!("model.0.renamed")
    });
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(
        msg.contains("model.0.renamed") && msg.contains("model.0.idx"),
        "{msg}"
    );
    restore();

    edit_json(&path, |v| v["tensors"][1]["name"] = json!("model.0.weight"));
    let msg = format_error_naming(load(&path).unwrap_err(), &json);
    assert!(msg.contains("more than once"), "{msg}");
    restore();

    edit_json(&path, |v| {
        let t = v["tensors"][0]["sha256"]
            .as_str()
            .unwrap()
            .replace('0', "1")
            .replace('a', "b");
        v["tensors"][0]["sha256"] = json!(t);
    });
    let msg = format_error_naming(load(&path).unwrap_err(), &npz);
    assert!(
        msg.contains("model.0.weight") && msg.contains("SHA-256"),
        "{msg}"
    );
    restore();

    edit_json(&path, |v| v["tensors"][2]["sha256"] = json!("xyz"));
    assert!(format_error_naming(load(&path).unwrap_err(), &json).contains("optim.step"));
    restore();

    for version in [json!(3), json!(0), json!("1")] {
        edit_json(&path, |v| v["schema_version"] = version.clone());
        let msg = format_error_naming(load(&path).unwrap_err(), &json);
        assert!(
            msg.contains(&format!("schema version {version} found"))
                && msg.contains(&format!("supports versions 1 and {SCHEMA_VERSION}")),
            "{msg}"
        );
        restore();
    }
    edit_json(&path, |v| {
        v.as_object_mut().unwrap().remove("schema_version");
    });
    assert!(format_error_naming(read_meta(&path).unwrap_err(), &json).contains("schema_version"));
    restore();

    edit_json(&path, |v| {
        v.as_object_mut().unwrap().remove("step");
    });
    assert!(format_error_naming(load(&path).unwrap_err(), &json).contains("step"));
    restore();

    std::fs::write(&json, &good[..good.len() / 2]).unwrap();
    assert!(format_error_naming(load(&path).unwrap_err(), &json).contains("not valid JSON"));
    restore();

    assert_loads(&path, 4, &want);
    std::fs::remove_file(&json).unwrap();
    let e = load(&path).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains(&json.display().to_string()), "{e}");
    let e = load(dir.join("never_saved")).unwrap_err();
    assert!(e.to_string().contains("never_saved.json"), "{e}");
}

#[test]
fn failed_saves_leave_the_old_checkpoint_loadable() {
    let dir = test_dir("failed_saves");
    let path = dir.join("ckpt");
    let want = small_checkpoint(&path, 5);
    let host = Device::host();
    let t = Tensor::zeros(&[2], DType::F32, &host).unwrap();
    let u = Tensor::zeros(&[3], DType::F32, &host).unwrap();

    // Bad names are refused before anything is written.
    for names in [
        ["a", "a"],
        ["", "b"],
        ["a", "x\ny"],
        ["/abs", "b"],
        ["dir/", "b"],
        ["a\\b", "c"],
    ] {
        let e = save(&path, &info(6), &[(names[0], &t), (names[1], &u)]).unwrap_err();
        assert!(matches!(e, Error::Invalid { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        assert_loads(&path, 5, &want);
    }

    // A path below a regular file: an I/O error naming the path.
    std::fs::write(dir.join("plain_file"), b"x").unwrap();
    let e = save(dir.join("plain_file/ckpt"), &info(6), &[("a", &t)]).unwrap_err();
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("plain_file"), "{e}");
    // A directory where the json should go.
    std::fs::create_dir_all(dir.join("blocked.json")).unwrap();
    assert!(save(dir.join("blocked"), &info(6), &[("a", &t)]).is_err());

    // A read-only directory (not enforced for root, who can write anyway).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.join("read_only");
        std::fs::create_dir_all(&ro).unwrap();
        let ro_path = ro.join("ckpt");
        let ro_want = small_checkpoint(&ro_path, 5);
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        if std::fs::write(ro.join("probe"), b"").is_ok() {
            eprintln!("read-only directory check skipped: this user can write to read-only directories (root)");
        } else {
            let e = save(&ro_path, &info(6), &[("a", &t)]).unwrap_err();
            assert!(matches!(e, Error::Io { .. }), "{e}");
            assert_loads(&ro_path, 5, &ro_want);
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// Runs the test `child_saves_big_checkpoint` of this binary in a child process whose file-size
/// limit (`ulimit -f`, 512-byte blocks) stops the save's writes part way; returns its output.
#[cfg(unix)]
fn run_child_save(path: &Path, ignore_sigxfsz: bool) -> std::process::Output {
    let exe = std::env::current_exe().unwrap();
    let trap = if ignore_sigxfsz { "trap '' XFSZ; " } else { "" };
    Command::new("sh")
        .arg("-c")
        .arg(format!("{trap}ulimit -f 64 && exec \"$0\" child_saves_big_checkpoint --exact --nocapture --test-threads=1"))
        .arg(exe)
        .env("NETCL_CKPT_CHILD_PATH", path)
        .env("NETCL_CKPT_CHILD_EXPECT_ERROR", if ignore_sigxfsz { "1" } else { "0" })
        .output()
        .unwrap()
}

/// Child-process half of `save_cut_short_by_the_file_size_limit_keeps_the_old_checkpoint`; does
/// nothing unless that test started it.
#[test]
fn child_saves_big_checkpoint() {
    let Some(path) = std::env::var_os("NETCL_CKPT_CHILD_PATH") else {
        return;
    };
    let big = Tensor::full(&[1 << 20], 1.5, DType::F32, &Device::host()).unwrap();
    let r = save(Path::new(&path), &info(99), &[("model.0.weight", &big)]);
    // Reached only when SIGXFSZ is ignored, so that the write fails with EFBIG instead.
    let e = r.expect_err("the save must fail under the file-size limit");
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(
        e.to_string().contains(".npz.tmp-"),
        "the error names the file being written: {e}"
    );
    assert_eq!(
        std::env::var("NETCL_CKPT_CHILD_EXPECT_ERROR").as_deref(),
        Ok("1")
    );
    println!("child: save failed as expected: {e}");
}

#[cfg(unix)]
#[test]
fn save_cut_short_by_the_file_size_limit_keeps_the_old_checkpoint() {
    let dir = test_dir("cut_short");
    let path = dir.join("ckpt");
    let want = small_checkpoint(&path, 5);
    // Killed by SIGXFSZ mid-write: a crash during the save.
    let out = run_child_save(&path, false);
    assert!(
        !out.status.success(),
        "the child should have been killed: {out:?}"
    );
    assert_loads(&path, 5, &want);
    // SIGXFSZ ignored: the write fails and save returns the error (checked in the child).
    let out = run_child_save(&path, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("save failed as expected"),
        "{out:?}"
    );
    assert_loads(&path, 5, &want);
    // A crashed child leaves its temporary behind (the first child may also end with EFBIG
    // instead, where the signal is not fatal); the failed one cleaned up after itself, and the
    // next save removes whatever a killed save left.
    let temps = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .contains(".tmp-")
            })
            .count()
    };
    assert!(temps(&dir) <= 1);
    let want = small_checkpoint(&path, 6);
    assert_loads(&path, 6, &want);
    assert_eq!(temps(&dir), 0);
}

#[test]
fn check_against_lists_every_mismatch() {
    let dir = test_dir("check_against");
    let path = dir.join("ckpt");
    small_checkpoint(&path, 7);
    let meta: Checkpoint = read_meta(&path).unwrap();
    let exact = [
        ("model.0.weight".to_string(), vec![3, 4], DType::F32),
        ("model.0.idx".to_string(), vec![3], DType::I32),
        ("optim.step".to_string(), vec![], DType::F64),
    ];
    check_against(&path, &meta, &exact).unwrap();
    load(&path).unwrap().check_against(&exact).unwrap();

    let expected: [(&str, &[usize], DType); 4] = [
        ("model.0.weight", &[4, 3], DType::F32),
        ("model.0.idx", &[3], DType::U32),
        ("model.1.weight", &[5], DType::BF16),
        ("model.1.bias", &[5], DType::F32),
    ];
    let e = load(&path).unwrap().check_against(&expected).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::Format { .. }), "{msg}");
    for needle in [
        path.display().to_string().as_str(),
        "5 problems",
        "'model.0.weight' has shape [3, 4] in the checkpoint, the model expects [4, 3]",
        "'model.0.idx' is i32 in the checkpoint, the model expects u32",
        "missing 'model.1.weight' (expected bf16 [5])",
        "missing 'model.1.bias' (expected f32 [5])",
        "unexpected 'optim.step' (f64 [])",
    ] {
        assert!(msg.contains(needle), "{needle:?} not in: {msg}");
    }
    // Shape and dtype wrong at once: both reported.
    let e = check_against(&path, &meta, &[("model.0.weight", &[12][..], DType::F16)]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("[12]") && msg.contains("expects f16") && msg.contains("4 problems"),
        "{msg}"
    );
}

#[test]
fn numpy_reads_the_npz() {
    let has_numpy = Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_numpy {
        eprintln!("numpy_reads_the_npz skipped: python3 with numpy is not available");
        return;
    }
    let dir = test_dir("numpy");
    let path = dir.join("ckpt");
    let host = Device::host();
    let mut c = Cases::new(5);
    let mut named = Vec::new();
    for dtype in DType::ALL {
        named.push((
            format!("model.{dtype}.w"),
            tensor_of(random_bits(dtype, 30, &mut c), &[2, 3, 5], &host),
        ));
    }
    named.push((
        "known".into(),
        Tensor::from_vec(vec![1.5f32, -2.0, 3.25], &[3], &host).unwrap(),
    ));
    named.push((
        "scalar".into(),
        Tensor::from_vec(vec![-7i32], &[], &host).unwrap(),
    ));
    named.push((
        "empty".into(),
        Tensor::zeros(&[0, 4], DType::F16, &host).unwrap(),
    ));
    let refs: Vec<(&str, &Tensor)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let saved = save(&path, &info(1), &refs).unwrap();
    let script = r#"
import hashlib, json, sys, numpy as np
p = sys.argv[1]
raw = open(p, 'rb').read()
with np.load(p) as z:
    out = {"file": hashlib.sha256(raw).hexdigest(), "known": z["known"].tolist(), "scalar": int(z["scalar"]), "arrays": {}}
    for k in z.files:
        a = z[k]
        out["arrays"][k] = [a.dtype.str, list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
print(json.dumps(out))
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(npz_path(&path).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "numpy failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["file"], json!(saved.npz_sha256));
    assert_eq!(v["known"], json!([1.5, -2.0, 3.25]));
    assert_eq!(v["scalar"], json!(-7));
    assert_eq!(v["arrays"].as_object().unwrap().len(), saved.tensors.len());
    for t in &saved.tensors {
        let descr = match t.dtype {
            DType::F32 => "<f4",
            DType::F64 => "<f8",
            DType::F16 => "<f2",
            DType::BF16 => "<u2",
            DType::I32 => "<i4",
            DType::U32 => "<u4",
        };
        assert_eq!(
            v["arrays"][&t.name],
            json!([descr, t.shape, t.sha256]),
            "{}",
            t.name
        );
    }
}
