//! netcl-distributed: Collectives across devices and data-parallel training (filled by a later issue).
