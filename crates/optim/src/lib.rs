//! netcl-optim: Optimizers and learning-rate schedules with fused updates (filled by the training issue).
