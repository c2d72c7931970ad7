//! A split kept on the device (normalized f32 images, i32 labels): per epoch one index upload and a gather, per step only views.
use crate::batches::{labels_i32, BatchBuilder, Batches};
use netcl_core_devices::{Device, Error, Result};
use netcl_ops::Tensor;

/// Images and labels uploaded once: x f32 `[n, ...]` in the builder's layout (normalized), y i32 `[n]`.
///
/// [`BatchBuilder::build`] writes two host vectors per step, and a write waits for the work
/// already queued on the device. Here a step costs no transfer at all: [`DeviceData::batches`]
/// uploads the epoch's order once (4 bytes per item) and gathers the split into that order on
/// the device (two kernels); each batch is then a view (`narrow`) of the gathered tensors.
#[derive(Clone, Debug)]
pub struct DeviceData {
    x: Tensor,
    y: Tensor,
}

impl DeviceData {
    /// Upload all `labels.len()` items of `images` (u8, one image after another) to `device`.
    pub fn upload(
        builder: &BatchBuilder,
        images: &[u8],
        labels: &[u8],
        device: &Device,
    ) -> Result<DeviceData> {
        let n = labels.len();
        let all: Vec<usize> = (0..n).collect();
        if n == 0 {
            return Err(Error::invalid("DeviceData::upload", "no items to upload"));
        }
        let x = builder.images(images, n, &all)?;
        let y = labels_i32(labels, &all)?;
        Ok(DeviceData {
            x: Tensor::from_vec(x, &builder.x_shape(n), device)?,
            y: Tensor::from_vec(y, &[n], device)?,
        })
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.y.shape()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All images, f32 `[n, ...]`.
    pub fn x(&self) -> &Tensor {
        &self.x
    }

    /// All labels, i32 `[n]`.
    pub fn y(&self) -> &Tensor {
        &self.y
    }

    /// `len` items from `start`, as views (no copy).
    pub fn rows(&self, start: usize, len: usize) -> Result<(Tensor, Tensor)> {
        Ok((self.x.narrow(0, start, len)?, self.y.narrow(0, start, len)?))
    }

    /// The batches of `batches` (made for `self.len()` items): the split gathered into their
    /// order on the device (skipped when unshuffled), then one view pair per batch.
    pub fn batches(&self, batches: &Batches) -> Result<DeviceBatches> {
        let n = self.len();
        let order = batches.order();
        if order.len() != n {
            return Err(Error::invalid(
                "DeviceData::batches",
                format!("batches over {} items for a split of {n}", order.len()),
            ));
        }
        let data = if order.iter().enumerate().all(|(i, &j)| i == j) {
            self.clone()
        } else {
            let idx: Vec<i32> = order.iter().map(|&i| i as i32).collect();
            let idx = Tensor::from_vec(idx, &[n], self.x.device())?;
            DeviceData {
                x: self.x.index_select(0, &idx)?,
                y: self.y.index_select(0, &idx)?,
            }
        };
        Ok(DeviceBatches {
            data,
            batch_size: batches.batch_size(),
            count: batches.len(),
            next: 0,
        })
    }
}

/// The batches of one epoch on the device: yields `(x, y)` views in order.
#[derive(Debug)]
pub struct DeviceBatches {
    data: DeviceData,
    batch_size: usize,
    count: usize,
    next: usize,
}

impl Iterator for DeviceBatches {
    type Item = Result<(Tensor, Tensor)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.count {
            return None;
        }
        let start = self.next * self.batch_size;
        let len = self.batch_size.min(self.data.len() - start);
        self.next += 1;
        Some(self.data.rows(start, len))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.count - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for DeviceBatches {}
