//! netcl-nn: Modules, layers, losses and checkpoints (filled by the training issue).
