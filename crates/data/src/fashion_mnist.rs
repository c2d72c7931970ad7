//! Fashion-MNIST: finding the four IDX files (env var, local dir, Debian package, embedded subset) and loading them checked.
use crate::idx::{parse_idx, read_idx, write_idx_u8, IdxArray};
use netcl_core_devices::{Error, Result};
use std::fmt;
use std::path::{Path, PathBuf};

/// Image side length in pixels.
pub const IMAGE_SIDE: usize = 28;
/// Pixels per image (28 × 28).
pub const IMAGE_PIXELS: usize = IMAGE_SIDE * IMAGE_SIDE;
/// Number of classes.
pub const NUM_CLASSES: usize = 10;
/// Mean of the training pixels scaled to [0, 1].
pub const MEAN: f32 = 0.2860;
/// Standard deviation of the training pixels scaled to [0, 1].
pub const STD: f32 = 0.3530;
/// Label `i` is `CLASS_NAMES[i]`.
pub const CLASS_NAMES: [&str; NUM_CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// The environment variable naming a directory that holds the four files.
pub const ENV_VAR: &str = "NETCL_DATA";
/// Searched (relative to the working directory) after `$NETCL_DATA`.
pub const LOCAL_DIR: &str = "data/fashion-mnist";
/// Where Debian's package dataset-fashion-mnist installs the files.
pub const SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The base names of the four files, each accepted with `.gz` or without.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte";
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte";
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte";
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte";
const FILES: [&str; 4] = [TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS];

/// Items in the embedded subset: the first 2,000 training and first 500 test images.
pub const SUBSET_TRAIN: usize = 2000;
pub const SUBSET_TEST: usize = 500;

const SUBSET_DIR: &str = "netcl-data/assets/fashion-mnist-subset";
const SUBSET: [(&str, &[u8]); 4] = [
    (
        TRAIN_IMAGES,
        include_bytes!("../assets/fashion-mnist-subset/train-images-idx3-ubyte.gz"),
    ),
    (
        TRAIN_LABELS,
        include_bytes!("../assets/fashion-mnist-subset/train-labels-idx1-ubyte.gz"),
    ),
    (
        TEST_IMAGES,
        include_bytes!("../assets/fashion-mnist-subset/t10k-images-idx3-ubyte.gz"),
    ),
    (
        TEST_LABELS,
        include_bytes!("../assets/fashion-mnist-subset/t10k-labels-idx1-ubyte.gz"),
    ),
];

/// Where a [`FashionMnist`] came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataSource {
    /// The directory named by `$NETCL_DATA` (or its `fashion-mnist` subdirectory).
    Env(PathBuf),
    /// `./data/fashion-mnist` under the working directory.
    Local(PathBuf),
    /// `/usr/share/datasets/fashion-mnist`, from the Debian package dataset-fashion-mnist.
    System(PathBuf),
    /// A directory given to [`FashionMnist::load_from`].
    Dir(PathBuf),
    /// The small subset embedded in this crate (first 2,000 training / 500 test items).
    EmbeddedSubset,
}

impl DataSource {
    /// The directory the files were read from; `None` for the embedded subset.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            DataSource::Env(p)
            | DataSource::Local(p)
            | DataSource::System(p)
            | DataSource::Dir(p) => Some(p),
            DataSource::EmbeddedSubset => None,
        }
    }
}

impl fmt::Display for DataSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSource::Env(p) => write!(f, "{} (from ${ENV_VAR})", p.display()),
            DataSource::Local(p) => write!(f, "{} (local data directory)", p.display()),
            DataSource::System(p) => {
                write!(f, "{} (Debian package dataset-fashion-mnist)", p.display())
            }
            DataSource::Dir(p) => write!(f, "{}", p.display()),
            DataSource::EmbeddedSubset => write!(
                f,
                "embedded subset (first {SUBSET_TRAIN} training / {SUBSET_TEST} test images of \
                 Fashion-MNIST; set ${ENV_VAR} or install dataset-fashion-mnist for the full set)"
            ),
        }
    }
}

/// Fashion-MNIST in memory: images are u8 pixels `[n, 28, 28]` row-major, labels are `0..10`.
#[derive(Clone, Debug)]
pub struct FashionMnist {
    /// `[n_train, 28, 28]` pixels, 0 (background) to 255.
    pub train_images: Vec<u8>,
    /// `[n_train]` class indices.
    pub train_labels: Vec<u8>,
    /// `[n_test, 28, 28]` pixels.
    pub test_images: Vec<u8>,
    /// `[n_test]` class indices.
    pub test_labels: Vec<u8>,
    /// Where the data came from.
    pub source: DataSource,
}

impl FashionMnist {
    /// The first place holding all four files, in order: `$NETCL_DATA` (an error there if it is
    /// set and lacks them), `./data/fashion-mnist`, `/usr/share/datasets/fashion-mnist`, and
    /// finally the subset embedded in this crate. Files found but corrupt are an error, never
    /// silently skipped.
    pub fn load() -> Result<FashionMnist> {
        if let Some(dir) = netcl_core_devices::Config::get().data_dir.clone() {
            let nested = dir.join("fashion-mnist");
            for d in [&dir, &nested] {
                if let Some(files) = find_files(d) {
                    return load_files(&files, DataSource::Env(d.clone()));
                }
            }
            return Err(Error::invalid(
                "FashionMnist::load",
                format!(
                    "${ENV_VAR}={} holds neither directly nor in fashion-mnist/ the four files \
                     {} (each .gz or plain)",
                    dir.display(),
                    FILES.join(", ")
                ),
            ));
        }
        let local = PathBuf::from(LOCAL_DIR);
        if let Some(files) = find_files(&local) {
            return load_files(&files, DataSource::Local(local));
        }
        let system = PathBuf::from(SYSTEM_DIR);
        if let Some(files) = find_files(&system) {
            return load_files(&files, DataSource::System(system));
        }
        log::info!(
            "Fashion-MNIST not found in ${ENV_VAR}, {LOCAL_DIR} or {SYSTEM_DIR}: using the embedded subset"
        );
        FashionMnist::embedded_subset()
    }

    /// The four files from `dir` (each `NAME.gz` or `NAME`); an error naming the missing ones.
    pub fn load_from(dir: impl AsRef<Path>) -> Result<FashionMnist> {
        let dir = dir.as_ref();
        match find_files(dir) {
            Some(files) => load_files(&files, DataSource::Dir(dir.to_path_buf())),
            None => {
                let missing: Vec<&str> = FILES
                    .iter()
                    .copied()
                    .filter(|f| locate(dir, f).is_none())
                    .collect();
                Err(Error::invalid(
                    "FashionMnist::load_from",
                    format!(
                        "{} lacks {} (each accepted as NAME.gz or NAME)",
                        dir.display(),
                        missing.join(", ")
                    ),
                ))
            }
        }
    }

    /// The subset embedded in this crate: the first 2,000 training and 500 test items.
    pub fn embedded_subset() -> Result<FashionMnist> {
        let parsed = SUBSET.map(|(name, bytes)| {
            let label = format!("{SUBSET_DIR}/{name}.gz");
            parse_idx(bytes, &label).map(|a| (label, a))
        });
        let [a, b, c, d] = parsed;
        assemble([a?, b?, c?, d?], DataSource::EmbeddedSubset)
    }

    pub fn n_train(&self) -> usize {
        self.train_labels.len()
    }

    pub fn n_test(&self) -> usize {
        self.test_labels.len()
    }

    /// Write the first `n_train` training and `n_test` test items as the four `.gz` IDX files in
    /// `dir` (created if missing): how the embedded subset is made (`examples/fashion_subset.rs`).
    pub fn write_subset(&self, n_train: usize, n_test: usize, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        if n_train > self.n_train() || n_test > self.n_test() {
            return Err(Error::invalid(
                "FashionMnist::write_subset",
                format!(
                    "asked for {n_train} training / {n_test} test items of {} / {}",
                    self.n_train(),
                    self.n_test()
                ),
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display().to_string(), e))?;
        let file = |name: &str| dir.join(format!("{name}.gz"));
        let (s, p) = (IMAGE_SIDE, IMAGE_PIXELS);
        write_idx_u8(
            file(TRAIN_IMAGES),
            &[n_train, s, s],
            &self.train_images[..n_train * p],
        )?;
        write_idx_u8(
            file(TRAIN_LABELS),
            &[n_train],
            &self.train_labels[..n_train],
        )?;
        write_idx_u8(
            file(TEST_IMAGES),
            &[n_test, s, s],
            &self.test_images[..n_test * p],
        )?;
        write_idx_u8(file(TEST_LABELS), &[n_test], &self.test_labels[..n_test])
    }

    /// The ten class names; label `i` is `class_names()[i]`.
    pub fn class_names() -> &'static [&'static str; NUM_CLASSES] {
        &CLASS_NAMES
    }
}

/// `dir/NAME.gz` or `dir/NAME`, whichever exists (the compressed one first).
fn locate(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join(format!("{name}.gz")), dir.join(name)]
        .into_iter()
        .find(|p| p.is_file())
}

/// The four files in `dir`, or `None` unless all are there.
fn find_files(dir: &Path) -> Option<[PathBuf; 4]> {
    let [a, b, c, d] = FILES.map(|f| locate(dir, f));
    Some([a?, b?, c?, d?])
}

fn load_files(files: &[PathBuf; 4], source: DataSource) -> Result<FashionMnist> {
    let read = |p: &PathBuf| read_idx(p).map(|a| (p.display().to_string(), a));
    assemble(
        [
            read(&files[0])?,
            read(&files[1])?,
            read(&files[2])?,
            read(&files[3])?,
        ],
        source,
    )
}

/// Check and combine (train images, train labels, test images, test labels).
fn assemble(parts: [(String, IdxArray); 4], source: DataSource) -> Result<FashionMnist> {
    let [train_images, train_labels, test_images, test_labels] = parts;
    let (train_images, train_labels) = split(train_images, train_labels)?;
    let (test_images, test_labels) = split(test_images, test_labels)?;
    Ok(FashionMnist {
        train_images,
        train_labels,
        test_images,
        test_labels,
        source,
    })
}

/// One split: images must be u8 `[n, 28, 28]`, labels u8 `[n]` with values below 10.
fn split(images: (String, IdxArray), labels: (String, IdxArray)) -> Result<(Vec<u8>, Vec<u8>)> {
    let ((img_file, img), (lab_file, lab)) = (images, labels);
    if img.dims.len() != 3 || img.dims[1] != IMAGE_SIDE || img.dims[2] != IMAGE_SIDE {
        return Err(Error::format(
            &img_file,
            format!(
                "image file has dimensions {:?}, expected [n, {IMAGE_SIDE}, {IMAGE_SIDE}]",
                img.dims
            ),
        ));
    }
    if lab.dims.len() != 1 {
        return Err(Error::format(
            &lab_file,
            format!("label file has dimensions {:?}, expected [n]", lab.dims),
        ));
    }
    let (n_img, n_lab) = (img.dims[0], lab.dims[0]);
    let pixels = img.into_u8(&img_file)?;
    let labels = lab.into_u8(&lab_file)?;
    if n_img != n_lab {
        return Err(Error::format(
            &lab_file,
            format!("{n_lab} labels but {img_file} holds {n_img} images"),
        ));
    }
    if let Some(i) = labels.iter().position(|&l| l as usize >= NUM_CLASSES) {
        return Err(Error::format(
            &lab_file,
            format!(
                "label {} at index {i} is out of range (classes 0..{NUM_CLASSES})",
                labels[i]
            ),
        ));
    }
    Ok((pixels, labels))
}
