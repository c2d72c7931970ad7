//! netcl-nn: Modules, layers, losses and checkpoints (filled by the training issue).
mod atomic_file;
pub mod checkpoint;
mod npz;
