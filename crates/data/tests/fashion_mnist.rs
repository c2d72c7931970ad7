//! Fashion-MNIST loading: the embedded subset, the search order, the full set when installed, and the checks on corrupt sets.
mod common;
use common::TempDir;
use netcl_data::fashion_mnist::{
    ENV_VAR, IMAGE_PIXELS, NUM_CLASSES, SUBSET_TEST, SUBSET_TRAIN, SYSTEM_DIR, TEST_IMAGES,
    TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS,
};
use netcl_data::idx::write_idx_u8;
use netcl_data::{DataSource, FashionMnist, CLASS_NAMES};
use std::path::{Path, PathBuf};

fn class_counts(labels: &[u8]) -> [usize; NUM_CLASSES] {
    let mut c = [0; NUM_CLASSES];
    for &l in labels {
        c[l as usize] += 1;
    }
    c
}

fn system_present() -> bool {
    Path::new(SYSTEM_DIR)
        .join(format!("{TRAIN_IMAGES}.gz"))
        .is_file()
}

/// A small valid set in `dir`: `n` training and `m` test items (plain files when `plain`).
fn write_set(dir: &Path, n: usize, m: usize, plain: bool) {
    let ext = if plain { "" } else { ".gz" };
    let img = |k: usize| {
        (0..k * IMAGE_PIXELS)
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>()
    };
    let lab = |k: usize| (0..k).map(|i| (i % 10) as u8).collect::<Vec<u8>>();
    write_idx_u8(
        dir.join(format!("{TRAIN_IMAGES}{ext}")),
        &[n, 28, 28],
        &img(n),
    )
    .unwrap();
    write_idx_u8(dir.join(format!("{TRAIN_LABELS}{ext}")), &[n], &lab(n)).unwrap();
    write_idx_u8(
        dir.join(format!("{TEST_IMAGES}{ext}")),
        &[m, 28, 28],
        &img(m),
    )
    .unwrap();
    write_idx_u8(dir.join(format!("{TEST_LABELS}{ext}")), &[m], &lab(m)).unwrap();
}

#[test]
fn embedded_subset_parses_with_all_classes() {
    let d = FashionMnist::embedded_subset().unwrap();
    assert_eq!(d.source, DataSource::EmbeddedSubset);
    assert_eq!((d.n_train(), d.n_test()), (SUBSET_TRAIN, SUBSET_TEST));
    assert_eq!((d.n_train(), d.n_test()), (2000, 500));
    assert_eq!(d.train_images.len(), 2000 * 784);
    assert_eq!(d.test_images.len(), 500 * 784);
    // Every class present, roughly balanced (as in the first items of the real set).
    for (split, labels) in [("train", &d.train_labels), ("test", &d.test_labels)] {
        let c = class_counts(labels);
        let expect = labels.len() / NUM_CLASSES;
        for (k, &n) in c.iter().enumerate() {
            assert!(
                n * 3 > expect * 2 && n < expect * 2,
                "{split} class {k}: {n} items ({c:?})"
            );
        }
    }
    // Real images: mostly background, some bright pixels; the training mean near Fashion-MNIST's.
    let mean =
        d.train_images.iter().map(|&p| p as f64).sum::<f64>() / d.train_images.len() as f64 / 255.0;
    assert!((mean - 0.2860).abs() < 0.02, "pixel mean {mean}");
    // First training item of Fashion-MNIST is an ankle boot (9), first test item too.
    assert_eq!(d.train_labels[..5], [9, 0, 0, 3, 0]);
    assert_eq!(d.test_labels[..5], [9, 2, 1, 1, 6]);
    assert_eq!(FashionMnist::class_names()[9], "Ankle boot");
    assert_eq!(CLASS_NAMES.len(), 10);
    assert!(d.source.to_string().contains("embedded subset"));
}

#[test]
fn subset_matches_full_dataset() {
    if !system_present() {
        eprintln!("{SYSTEM_DIR} not installed: subset-vs-full check skipped");
        return;
    }
    let full = FashionMnist::load_from(SYSTEM_DIR).unwrap();
    assert_eq!((full.n_train(), full.n_test()), (60000, 10000));
    assert_eq!(class_counts(&full.train_labels), [6000; 10]);
    assert_eq!(class_counts(&full.test_labels), [1000; 10]);
    let sub = FashionMnist::embedded_subset().unwrap();
    assert!(sub.train_images == full.train_images[..2000 * 784]);
    assert!(sub.train_labels == full.train_labels[..2000]);
    assert!(sub.test_images == full.test_images[..500 * 784]);
    assert!(sub.test_labels == full.test_labels[..500]);
    // The generator reproduces the same contents.
    let dir = TempDir::new("regen");
    full.write_subset(SUBSET_TRAIN, SUBSET_TEST, &dir).unwrap();
    let again = FashionMnist::load_from(&dir).unwrap();
    assert_eq!(again.source, DataSource::Dir(dir.to_path_buf()));
    assert!(again.train_images == sub.train_images && again.train_labels == sub.train_labels);
    assert!(again.test_images == sub.test_images && again.test_labels == sub.test_labels);
}

#[test]
fn load_from_accepts_plain_and_gzip() {
    for plain in [false, true] {
        let dir = TempDir::new(if plain { "plain" } else { "gz" });
        write_set(&dir, 30, 12, plain);
        let d = FashionMnist::load_from(&dir).unwrap();
        assert_eq!((d.n_train(), d.n_test()), (30, 12));
        assert_eq!(d.train_labels[13], 3);
        assert_eq!(d.test_images[800], (800 % 251) as u8);
    }
}

#[test]
fn bad_sets_are_errors_naming_the_file() {
    let check = |tag: &str, damage: &dyn Fn(&Path), file: &str, words: &[&str]| {
        let dir = TempDir::new(tag);
        write_set(&dir, 20, 10, false);
        damage(&dir);
        let msg = FashionMnist::load_from(&dir).unwrap_err().to_string();
        assert!(msg.contains(file), "{tag}: '{msg}' does not name {file}");
        for w in words {
            assert!(msg.contains(w), "{tag}: '{msg}' lacks '{w}'");
        }
    };
    let put = |dir: &Path, name: &str, dims: &[usize], data: &[u8]| {
        write_idx_u8(dir.join(format!("{name}.gz")), dims, data).unwrap();
    };
    check(
        "count",
        &|d| put(d, TRAIN_LABELS, &[19], &[1; 19]),
        TRAIN_LABELS,
        &["19 labels", "20 images"],
    );
    check(
        "range",
        &|d| {
            let mut l: Vec<u8> = (0..10).map(|i| (i % 10) as u8).collect();
            l[7] = 10;
            put(d, TEST_LABELS, &[10], &l);
        },
        TEST_LABELS,
        &["label 10 at index 7"],
    );
    check(
        "dims",
        &|d| put(d, TEST_IMAGES, &[10, 28, 27], &vec![0; 10 * 28 * 27]),
        TEST_IMAGES,
        &["[10, 28, 27]"],
    );
    check(
        "label-dims",
        &|d| put(d, TRAIN_LABELS, &[20, 1], &[0; 20]),
        TRAIN_LABELS,
        &["[20, 1]"],
    );
    check(
        "truncated",
        &|d| {
            let p = d.join(format!("{TRAIN_IMAGES}.gz"));
            let mut raw =
                netcl_data::idx::encode_idx_u8(&[20, 28, 28], &vec![3; 20 * 784]).unwrap();
            raw.truncate(raw.len() - 100);
            std::fs::write(p, gz(&raw)).unwrap();
        },
        TRAIN_IMAGES,
        &["15680 data bytes", "found 15580"],
    );
    check(
        "missing",
        &|d| std::fs::remove_file(d.join(format!("{TEST_LABELS}.gz"))).unwrap(),
        TEST_LABELS,
        &["lacks"],
    );
}

fn gz(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// Sets `$NETCL_DATA`'s setting for this process.
fn set_data_dir(dir: Option<PathBuf>) {
    netcl_core_devices::Config::update(|c| c.data_dir = dir);
}

/// The search order of `load()`. One test, as it sets the process-wide `Config::data_dir`.
#[test]
fn load_search_order() {
    let dir = TempDir::new("env");
    write_set(&dir, 40, 20, false);
    set_data_dir(Some(dir.to_path_buf()));
    let d = FashionMnist::load().unwrap();
    assert_eq!(d.source, DataSource::Env(dir.to_path_buf()));
    assert_eq!(d.n_train(), 40);
    assert!(d.source.to_string().contains(ENV_VAR));

    // Also a fashion-mnist/ subdirectory of $NETCL_DATA.
    let parent = TempDir::new("env-parent");
    std::fs::create_dir_all(parent.join("fashion-mnist")).unwrap();
    write_set(&parent.join("fashion-mnist"), 11, 5, true);
    set_data_dir(Some(parent.to_path_buf()));
    let d = FashionMnist::load().unwrap();
    assert_eq!(d.source, DataSource::Env(parent.join("fashion-mnist")));
    assert_eq!(d.n_test(), 5);

    // Set but without the files: an error, not a silent fallback.
    let empty = TempDir::new("env-empty");
    set_data_dir(Some(empty.to_path_buf()));
    let msg = FashionMnist::load().unwrap_err().to_string();
    assert!(
        msg.contains(&empty.display().to_string()) && msg.contains(ENV_VAR),
        "{msg}"
    );

    // Unset: ./data/fashion-mnist (absent in the crate directory), the Debian package, the subset.
    set_data_dir(None);
    let d = FashionMnist::load().unwrap();
    if system_present() {
        assert_eq!(d.source, DataSource::System(PathBuf::from(SYSTEM_DIR)));
        assert_eq!(d.n_train(), 60000);
    } else {
        assert_eq!(d.source, DataSource::EmbeddedSubset);
        assert_eq!(d.n_train(), 2000);
    }
}
