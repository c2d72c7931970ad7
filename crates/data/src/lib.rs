//! netcl-data: what training loops need around the model: IDX/Fashion-MNIST loading, shuffled mini-batches as tensors, text corpora, a BPE tokenizer and token batches, a progress bar, PNG plots.
//!
//! ```no_run
//! use netcl_data::{plot_history, Batches, BatchBuilder, DeviceData, FashionMnist, History, ImageLayout, Progress};
//! # fn main() -> netcl_ops::Result<()> {
//! let device = netcl_ops::Device::best()?;
//! let data = FashionMnist::load()?; // $NETCL_DATA, ./data/fashion-mnist, Debian's package, or the embedded subset
//! println!("Fashion-MNIST from {}", data.source);
//! let builder = BatchBuilder::new(ImageLayout::Flat); // x f32 [B, 784], normalized; y i32 [B]
//! let train = DeviceData::upload(&builder, &data.train_images, &data.train_labels, &device)?;
//! let (epochs, mut history) = (3, History::new());
//! for epoch in 1..=epochs {
//!     let batches = Batches::new(train.len(), 256, Some(1234 + epoch as u64))?;
//!     let mut progress = Progress::new(epoch, epochs, batches.len());
//!     for (step, batch) in train.batches(&batches)?.enumerate() {
//!         let (x, y) = batch?;
//!         // ... forward, loss, backward, optimizer step ...
//!         progress.update(step + 1, 0.5, 0.8);
//!     }
//!     progress.finish("test acc 80.00%");
//!     history.push(0.5, 0.8, 0.8);
//! }
//! plot_history("training.png", "MLP on Fashion-MNIST", &history)?;
//! # Ok(())
//! # }
//! ```
pub mod batches;
pub mod bigram;
mod bpe_words;
pub mod device_data;
pub mod fashion_mnist;
pub mod idx;
pub mod plot;
pub mod progress;
mod text_backend;
pub mod text_corpus;
pub mod token_batcher;
pub mod tokenizer;

pub use batches::{labels_i32, BatchBuilder, Batches, ImageLayout};
pub use bigram::{bigram_baseline, BigramReport};
pub use device_data::{DeviceBatches, DeviceData};
pub use fashion_mnist::{DataSource, FashionMnist, CLASS_NAMES};
pub use idx::{parse_idx, read_idx, write_idx_u8, IdxArray, IdxData, IdxType};
pub use plot::{plot_history, plot_history_sized, History};
pub use progress::Progress;
pub use text_corpus::{
    corpus_limit, encode_documents, encode_documents_with_progress, split_documents, utf8_bytes,
    TextCorpus, TextSplit, DEFAULT_CORPUS_LIMIT, EMBEDDED_TEXT, FORTUNES_DIR,
};
pub use token_batcher::{TokenBatch, TokenBatcher, TransferStats};
pub use tokenizer::{Tokenizer, ENDOFTEXT, TEXT_CHUNK};
