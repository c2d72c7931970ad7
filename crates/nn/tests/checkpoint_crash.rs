//! Checkpoint saves killed before every file-system step (fault injection) still leave a loadable checkpoint and no litter after the next save; keep_last; version-1 checkpoints; crafted npz files; timing of a ~200 MB save.
use netcl_nn::checkpoint::{
    checkpoints, json_path, load, npz_path, read_meta, save, save_with, step_path, Checkpoint,
    CheckpointInfo, SaveOptions, CRASH_AT_ENV,
};
use netcl_ops::{DType, Device, Error, Tensor};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// A fresh, empty directory for one test.
fn test_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("checkpoint-crash-tests")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Save number `n`'s tensors: distinct contents (so distinct npz files) for each `n`.
fn tensors_of(n: u64) -> Vec<(String, Vec<f32>)> {
    vec![
        (
            "w".to_string(),
            (0..24).map(|i| (i as f32) * 0.5 + n as f32).collect(),
        ),
        ("b".to_string(), vec![n as f32; 5]),
    ]
}

fn save_number(path: &Path, n: u64, keep_last: usize) -> Checkpoint {
    let host = Device::host();
    let ts: Vec<(String, Tensor)> = tensors_of(n)
        .into_iter()
        .map(|(name, v)| {
            let len = v.len();
            (name, Tensor::from_vec(v, &[len], &host).unwrap())
        })
        .collect();
    let refs: Vec<(&str, &Tensor)> = ts.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let info = CheckpointInfo {
        step: n,
        extra: json!({"save": n}),
        ..Default::default()
    };
    save_with(path, &info, &refs, &SaveOptions { keep_last }).unwrap()
}

/// Loads `path` and returns which save it holds, checking its tensors are exactly that save's.
fn loaded_number(path: &Path) -> u64 {
    let l = load(path).unwrap_or_else(|e| panic!("{} does not load: {e}", path.display()));
    let n = l.meta().step;
    assert_eq!(l.meta().extra, json!({"save": n}));
    for (name, want) in tensors_of(n) {
        assert_eq!(
            l.require(&name).unwrap().to_vec::<f32>().unwrap(),
            want,
            "{name}"
        );
    }
    n
}

/// The directory's file names, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

/// The files the kept saves of `path` consist of, sorted: each json and the npz it names.
fn expected_files(path: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for p in checkpoints(path).unwrap() {
        for f in [json_path(&p), npz_path(&p).unwrap()] {
            files.push(f.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    files.sort();
    files.dedup();
    files
}

/// Child-process half of `a_save_killed_at_any_step_leaves_a_loadable_checkpoint`: does nothing
/// unless that test started it with the checkpoint path, the save's number and keep_last.
#[test]
fn child_saves_and_may_be_killed() {
    let Some(path) = std::env::var_os("NETCL_CKPT_CRASH_CHILD_PATH") else {
        return;
    };
    let n: u64 = std::env::var("NETCL_CKPT_CRASH_CHILD_SAVE")
        .unwrap()
        .parse()
        .unwrap();
    let keep: usize = std::env::var("NETCL_CKPT_CRASH_CHILD_KEEP")
        .unwrap()
        .parse()
        .unwrap();
    save_number(Path::new(&path), n, keep);
    println!("child: save {n} completed");
}

/// Runs save number `n` of `path` in a child process that aborts before file-system step `k`;
/// returns whether the save completed.
fn child_save(path: &Path, n: u64, keep_last: usize, k: u64) -> bool {
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -c 0; exec \"$0\" child_saves_and_may_be_killed --exact --nocapture --test-threads=1")
        .arg(std::env::current_exe().unwrap())
        .env("NETCL_CKPT_CRASH_CHILD_PATH", path)
        .env("NETCL_CKPT_CRASH_CHILD_SAVE", n.to_string())
        .env("NETCL_CKPT_CRASH_CHILD_KEEP", keep_last.to_string())
        .env(CRASH_AT_ENV, k.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let done = stdout.contains(&format!("child: save {n} completed"));
    assert_eq!(out.status.success(), done, "step {k}: {out:?}");
    done
}

/// For every step k of a save (and one past the last): saves before it complete in this
/// process, the next save is killed right before its k-th file-system step in a child; then
/// every kept save loads exactly as one of the completed or the killed save, and after one more
/// save the directory holds exactly the kept saves' files (no temporary, no orphan npz).
fn kill_at_every_step(name: &str, keep_last: usize, earlier: u64) {
    let killed = earlier + 1;
    let mut flipped_at = None;
    for k in 1.. {
        assert!(k < 60, "the save never completed");
        let dir = test_dir(&format!("{name}/k{k}"));
        let path = dir.join("ckpt");
        for n in 1..=earlier {
            save_number(&path, n, keep_last);
        }
        let done = child_save(&path, killed, keep_last, k);
        let newest = loaded_number(&path);
        assert!(
            newest == earlier || newest == killed,
            "step {k}: save {newest}"
        );
        if newest == killed {
            flipped_at.get_or_insert(k);
        } else {
            assert!(flipped_at.is_none(), "step {k}: back to the old save");
        }
        for p in checkpoints(&path).unwrap() {
            let n = loaded_number(&p);
            assert!(
                n <= killed && n + keep_last as u64 > earlier,
                "{}: save {n}",
                p.display()
            );
        }
        save_number(&path, killed + 1, keep_last);
        assert_eq!(loaded_number(&path), killed + 1);
        let kept = checkpoints(&path).unwrap();
        assert_eq!(
            kept.len(),
            keep_last.min(killed as usize + 1),
            "step {k}: {kept:?}"
        );
        assert_eq!(listing(&dir), expected_files(&path), "step {k}");
        if done {
            assert_eq!(newest, killed);
            eprintln!(
                "{name}: killed before each of {} steps; the save commits at step {:?}",
                k - 1,
                flipped_at
            );
            assert!(k > 8, "only {} steps", k - 1);
            return;
        }
    }
}

#[cfg(unix)]
#[test]
fn a_save_killed_at_any_step_leaves_a_loadable_checkpoint() {
    kill_at_every_step("keep1", 1, 1);
}

#[cfg(unix)]
#[test]
fn a_save_killed_at_any_step_keeps_the_last_saves_loadable() {
    kill_at_every_step("keep2", 2, 2);
}

#[test]
fn keep_last_keeps_that_many_loadable_saves() {
    let dir = test_dir("keep_last");
    let path = dir.join("ckpt");
    for n in 1..=5 {
        save_number(&path, n, 3);
    }
    let kept = checkpoints(&path).unwrap();
    assert_eq!(
        kept,
        [path.clone(), step_path(&path, 4), step_path(&path, 3)]
    );
    let numbers: Vec<u64> = kept.iter().map(|p| loaded_number(p)).collect();
    assert_eq!(numbers, [5, 4, 3]);
    assert_eq!(listing(&dir), expected_files(&path));
    assert_eq!(listing(&dir).len(), 6);
    // Back to the default: only the newest stays.
    let host = Device::host();
    let t = Tensor::from_vec(vec![6.0f32], &[1], &host).unwrap();
    save(&path, &CheckpointInfo::default(), &[("w", &t)]).unwrap();
    assert_eq!(checkpoints(&path).unwrap(), vec![path.clone()]);
    assert_eq!(listing(&dir).len(), 2);
    let e = save_with(
        &path,
        &CheckpointInfo::default(),
        &[("w", &t)],
        &SaveOptions { keep_last: 0 },
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Invalid { .. }) && e.to_string().contains("keep_last"),
        "{e}"
    );
    // Another checkpoint in the same directory is left alone.
    let other = dir.join("ckpt.other");
    save_number(&other, 9, 1);
    save_number(&path, 7, 1);
    assert_eq!(loaded_number(&other), 9);
    assert_eq!(
        checkpoints(dir.join("never")).unwrap(),
        Vec::<PathBuf>::new()
    );
}

#[test]
fn version_1_checkpoints_still_load_and_are_replaced_cleanly() {
    let dir = test_dir("version1");
    let path = dir.join("ckpt");
    save_number(&path, 1, 1);
    // Rewrite it as version 1: `P.npz`, no npz_file.
    std::fs::rename(npz_path(&path).unwrap(), dir.join("ckpt.npz")).unwrap();
    let mut v: Value = serde_json::from_slice(&std::fs::read(json_path(&path)).unwrap()).unwrap();
    v["schema_version"] = json!(1);
    v.as_object_mut().unwrap().remove("npz_file");
    std::fs::write(json_path(&path), serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(read_meta(&path).unwrap().npz_file, None);
    assert_eq!(npz_path(&path).unwrap(), dir.join("ckpt.npz"));
    assert_eq!(loaded_number(&path), 1);
    // Kept as a step, it names its npz; the next saves drop it and its npz.
    save_number(&path, 2, 2);
    assert_eq!(loaded_number(&step_path(&path, 1)), 1);
    assert_eq!(npz_path(step_path(&path, 1)).unwrap(), dir.join("ckpt.npz"));
    save_number(&path, 3, 1);
    assert_eq!(listing(&dir), expected_files(&path));
    assert!(!dir.join("ckpt.npz").exists());
    // A version-2 json must name a plain npz file beside it.
    for bad in [
        json!(null),
        json!("../x.npz"),
        json!("sub/ckpt.npz"),
        json!("ckpt.json"),
    ] {
        let mut v: Value =
            serde_json::from_slice(&std::fs::read(json_path(&path)).unwrap()).unwrap();
        let good = v["npz_file"].clone();
        v["npz_file"] = bad.clone();
        std::fs::write(json_path(&path), serde_json::to_vec(&v).unwrap()).unwrap();
        let e = load(&path).unwrap_err();
        assert!(e.to_string().contains("npz_file"), "{bad}: {e}");
        v["npz_file"] = good;
        std::fs::write(json_path(&path), serde_json::to_vec(&v).unwrap()).unwrap();
    }
    assert_eq!(loaded_number(&path), 3);
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Writes `npz` as the checkpoint's npz and records its hash (and `shape` for tensor "w") in the
/// json, so that only the npz's inner consistency can catch the lie; returns load's error.
fn load_crafted(path: &Path, npz: &[u8], shape: &[usize]) -> Error {
    let file = npz_path(path).unwrap();
    std::fs::write(&file, npz).unwrap();
    let mut v: Value = serde_json::from_slice(&std::fs::read(json_path(path)).unwrap()).unwrap();
    v["npz_sha256"] = json!(sha256_hex(npz));
    v["tensors"][0]["shape"] = json!(shape);
    std::fs::write(json_path(path), serde_json::to_vec(&v).unwrap()).unwrap();
    let t0 = Instant::now();
    let e = load(path).unwrap_err();
    assert!(t0.elapsed().as_secs_f64() < 2.0, "{:?}", t0.elapsed());
    let msg = e.to_string();
    assert!(matches!(e, Error::Format { .. }), "{msg}");
    assert!(
        msg.contains(&file.display().to_string()) && msg.contains("'w'"),
        "{msg}"
    );
    e
}

/// Crafted npz files that declare far more data than they hold are refused before anything of
/// the declared size is allocated (a 16 GiB or 3 GB allocation would abort this test process).
#[test]
fn crafted_npz_claiming_huge_arrays_is_refused_without_allocating() {
    let dir = test_dir("crafted");
    let path = dir.join("ckpt");
    let host = Device::host();
    let w = Tensor::from_vec(vec![1.5f32; 6], &[6], &host).unwrap();
    save(&path, &CheckpointInfo::default(), &[("w", &w)]).unwrap();
    let good = std::fs::read(npz_path(&path).unwrap()).unwrap();
    let find =
        |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle).unwrap();

    // The npy header (and the json) claim shape [2^30, 4]: 16 GiB in a 24-byte entry.
    let at = find(&good, b"(6, ), }");
    let mut bad = good.clone();
    let claim = b"(1073741824, 4), }";
    bad[at..at + claim.len()].copy_from_slice(claim);
    let msg = load_crafted(&path, &bad, &[1 << 30, 4]).to_string();
    assert!(msg.contains("24 data bytes, 17179869184 expected"), "{msg}");

    // The zip directory claims a 3 GB stored entry in a file of a few hundred bytes.
    let cd = find(&good, b"PK\x01\x02");
    let mut bad = good.clone();
    for off in [20, 24] {
        bad[cd + off..cd + off + 4].copy_from_slice(&3_000_000_000u32.to_le_bytes());
    }
    let msg = load_crafted(&path, &bad, &[6]).to_string();
    assert!(
        msg.contains("declares 3000000000 bytes") && msg.contains("beyond"),
        "{msg}"
    );

    // A compressed (deflate) entry, e.g. a zip bomb: refused whatever it would expand to.
    let mut bad = good.clone();
    bad[cd + 10] = 8;
    let msg = load_crafted(&path, &bad, &[6]).to_string();
    assert!(msg.contains("compressed"), "{msg}");

    // The json alone claiming more than the file holds: the entry's size gives it away.
    let msg = load_crafted(&path, &good, &[1 << 40]).to_string();
    assert!(
        msg.contains("[6] in the npz but [1099511627776] in the json"),
        "{msg}"
    );
}

/// Times saving and loading ~200 MB of f32 tensors on the host (run with `--ignored --nocapture`).
#[test]
#[ignore]
fn time_a_200mb_save() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("checkpoint-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let host = Device::host();
    let tensors: Vec<(String, Tensor)> = (0..50)
        .map(|i| {
            let n = 1 << 20;
            let v: Vec<f32> = (0..n).map(|k| (k ^ i) as f32 * 0.25).collect();
            (
                format!("layer.{i}.weight"),
                Tensor::from_vec(v, &[1024, 1024], &host).unwrap(),
            )
        })
        .collect();
    let refs: Vec<(&str, &Tensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let info = CheckpointInfo::default();
    for round in 0..3 {
        let t0 = Instant::now();
        save(dir.join("ckpt"), &info, &refs).unwrap();
        let saved = t0.elapsed();
        let t0 = Instant::now();
        let l = load(dir.join("ckpt")).unwrap();
        let loaded = t0.elapsed();
        assert_eq!(l.tensors().len(), 50);
        assert_eq!(l.tensors()[0].1.dtype(), DType::F32);
        eprintln!("round {round}: save of 200 MiB {saved:.2?}, load {loaded:.2?}");
    }
}
