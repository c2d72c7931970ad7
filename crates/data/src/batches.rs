//! Mini-batches: seeded shuffled index batches, and the normalized f32 image / i32 label tensors of a batch.
use crate::fashion_mnist::{IMAGE_SIDE, MEAN, STD};
use netcl_core_devices::{Device, Error, Result};
use netcl_ops::Tensor;
use rand::rngs::Xoshiro256PlusPlus;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// The batches of one epoch over `n` items: index lists of `batch_size` (the last one shorter
/// unless [`Batches::drop_last`]), in order or in a seeded random order.
///
/// The order for a seed is fixed (Xoshiro256++ seeded with `seed_from_u64`, then a Fisher-Yates
/// shuffle), so runs repeat. Use a different seed per epoch, e.g. `Some(seed + epoch as u64)`.
#[derive(Clone, Debug)]
pub struct Batches {
    order: Vec<usize>,
    batch_size: usize,
    drop_last: bool,
}

/// Iterator over the index batches of a [`Batches`].
pub type BatchIter<'a> = std::iter::Take<std::slice::Chunks<'a, usize>>;

impl Batches {
    /// Batches of `batch_size` over `0..n`, shuffled with `shuffle`'s seed, in order for `None`.
    pub fn new(n: usize, batch_size: usize, shuffle: Option<u64>) -> Result<Batches> {
        if batch_size == 0 {
            return Err(Error::invalid(
                "Batches::new",
                "batch_size must be at least 1",
            ));
        }
        let mut order: Vec<usize> = (0..n).collect();
        if let Some(seed) = shuffle {
            order.shuffle(&mut Xoshiro256PlusPlus::seed_from_u64(seed));
        }
        Ok(Batches {
            order,
            batch_size,
            drop_last: false,
        })
    }

    /// Drop the last batch when it is shorter than `batch_size`.
    pub fn drop_last(mut self, drop: bool) -> Batches {
        self.drop_last = drop;
        self
    }

    /// Number of batches.
    pub fn len(&self) -> usize {
        if self.drop_last {
            self.order.len() / self.batch_size
        } else {
            self.order.len().div_ceil(self.batch_size)
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// All item indices in visiting order (a permutation of `0..n`).
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The index batches, in order.
    pub fn iter(&self) -> BatchIter<'_> {
        self.order.chunks(self.batch_size).take(self.len())
    }
}

impl<'a> IntoIterator for &'a Batches {
    type Item = &'a [usize];
    type IntoIter = BatchIter<'a>;
    fn into_iter(self) -> BatchIter<'a> {
        self.iter()
    }
}

/// The shape of a batch's image tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageLayout {
    /// `[B, H*W]` (784 for Fashion-MNIST): for MLPs.
    Flat,
    /// `[B, 1, H, W]`: for CNNs.
    Nchw,
}

/// Builds a batch's tensors: images as f32, `(pixel / 255 - mean) / std`, labels as i32 `[B]`.
///
/// Each pixel goes through a 256-entry table, so a batch is one pass over its pixels into one
/// host vector per tensor, handed to `Tensor::from_vec` (one host-to-device write per tensor on
/// an OpenCL device; the vector becomes the storage on the host device).
#[derive(Clone, Debug)]
pub struct BatchBuilder {
    layout: ImageLayout,
    height: usize,
    width: usize,
    table: [f32; 256],
}

impl BatchBuilder {
    /// 28×28 single-channel images normalized with Fashion-MNIST's mean 0.2860 and std 0.3530.
    pub fn new(layout: ImageLayout) -> BatchBuilder {
        BatchBuilder {
            layout,
            height: IMAGE_SIDE,
            width: IMAGE_SIDE,
            table: table(MEAN, STD),
        }
    }

    /// Other image sizes (single channel, `height × width` u8 pixels per image).
    pub fn image_size(mut self, height: usize, width: usize) -> Result<BatchBuilder> {
        if height == 0 || width == 0 {
            return Err(Error::invalid(
                "BatchBuilder::image_size",
                format!("image size {height}x{width} must be non-empty"),
            ));
        }
        self.height = height;
        self.width = width;
        Ok(self)
    }

    /// Normalize with another `mean` and `std` (of pixels scaled to [0, 1]); `std` must be > 0.
    pub fn normalize(mut self, mean: f32, std: f32) -> Result<BatchBuilder> {
        if !(std > 0.0 && std.is_finite() && mean.is_finite()) {
            return Err(Error::invalid(
                "BatchBuilder::normalize",
                format!("mean {mean}, std {std}: need finite values and std > 0"),
            ));
        }
        self.table = table(mean, std);
        Ok(self)
    }

    pub fn layout(&self) -> ImageLayout {
        self.layout
    }

    /// Pixels per image.
    pub fn pixels(&self) -> usize {
        self.height * self.width
    }

    /// The normalized value of pixel value `p`.
    pub fn value(&self, p: u8) -> f32 {
        self.table[p as usize]
    }

    /// The shape of the image tensor for `batch` images.
    pub fn x_shape(&self, batch: usize) -> Vec<usize> {
        match self.layout {
            ImageLayout::Flat => vec![batch, self.pixels()],
            ImageLayout::Nchw => vec![batch, 1, self.height, self.width],
        }
    }

    /// The tensors for items `idx` of (`images`: `[n, H*W]` u8, `labels`: `[n]` u8) on `device`:
    /// x f32 in [`BatchBuilder::x_shape`], y i32 `[B]`.
    pub fn build(
        &self,
        images: &[u8],
        labels: &[u8],
        idx: &[usize],
        device: &Device,
    ) -> Result<(Tensor, Tensor)> {
        let x = self.images(images, labels.len(), idx)?;
        let y = labels_i32(labels, idx)?;
        let b = idx.len();
        Ok((
            Tensor::from_vec(x, &self.x_shape(b), device)?,
            Tensor::from_vec(y, &[b], device)?,
        ))
    }

    /// The normalized pixels of items `idx` (row-major `[B, H*W]`) of `n` images in `images`.
    pub fn images(&self, images: &[u8], n: usize, idx: &[usize]) -> Result<Vec<f32>> {
        let op = "BatchBuilder::images";
        let px = self.pixels();
        if images.len() != n * px {
            return Err(Error::shape(
                op,
                format!(
                    "{} pixels do not hold {n} images of {}x{} ({})",
                    images.len(),
                    self.height,
                    self.width,
                    n * px
                ),
            ));
        }
        check_batch(op, idx, n)?;
        let mut x = Vec::with_capacity(idx.len() * px);
        for &i in idx {
            x.extend(
                images[i * px..(i + 1) * px]
                    .iter()
                    .map(|&p| self.table[p as usize]),
            );
        }
        Ok(x)
    }
}

/// The labels of items `idx` as i32.
pub fn labels_i32(labels: &[u8], idx: &[usize]) -> Result<Vec<i32>> {
    check_batch("labels_i32", idx, labels.len())?;
    Ok(idx.iter().map(|&i| labels[i] as i32).collect())
}

fn check_batch(op: &str, idx: &[usize], n: usize) -> Result<()> {
    if idx.is_empty() {
        return Err(Error::invalid(op, "empty batch (no indices)"));
    }
    if let Some(&i) = idx.iter().find(|&&i| i >= n) {
        return Err(Error::invalid(
            op,
            format!("index {i} out of range for {n} items"),
        ));
    }
    Ok(())
}

fn table(mean: f32, std: f32) -> [f32; 256] {
    std::array::from_fn(|p| (p as f32 / 255.0 - mean) / std)
}
