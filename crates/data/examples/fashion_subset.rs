//! Regenerates the embedded Fashion-MNIST subset (first 2,000 training / 500 test items) from the full files.
//!
//! cargo run -p netcl-data --example fashion_subset -- [SRC_DIR] [OUT_DIR]
//! SRC_DIR defaults to /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist),
//! OUT_DIR to this crate's assets/fashion-mnist-subset.
use netcl_data::fashion_mnist::{SUBSET_TEST, SUBSET_TRAIN, SYSTEM_DIR};
use netcl_data::FashionMnist;
use std::path::PathBuf;

fn main() -> netcl_ops::Result<()> {
    let mut args = netcl_core_devices::utf8_args("fashion_subset")?.into_iter();
    let src = args
        .next()
        .map(PathBuf::from)
        .unwrap_or(PathBuf::from(SYSTEM_DIR));
    let out = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/fashion-mnist-subset")
    });
    let full = FashionMnist::load_from(&src)?;
    println!(
        "read {} training / {} test items from {}",
        full.n_train(),
        full.n_test(),
        src.display()
    );
    full.write_subset(SUBSET_TRAIN, SUBSET_TEST, &out)?;
    let mut counts = [0usize; 10];
    for &l in &full.train_labels[..SUBSET_TRAIN] {
        counts[l as usize] += 1;
    }
    println!(
        "wrote the first {SUBSET_TRAIN} / {SUBSET_TEST} to {} (training items per class: {counts:?})",
        out.display()
    );
    Ok(())
}
