//! netcl-autograd: Tape autograd: recorded ops, one backward rule per op, gradient checks (filled by the training issue).
