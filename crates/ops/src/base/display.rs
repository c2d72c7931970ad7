//! `{}` for tensors: values in nested brackets as PyTorch prints them, summarised above 1000 elements (only the shown corners are read from the device).
use crate::base::tensor::Tensor;
use netcl_core_devices::Result;
use std::fmt;

/// Tensors with more elements than this print only `EDGE` items at each end of long dims.
const THRESHOLD: usize = 1000;
const EDGE: usize = 3;

/// What gets printed: the values of the shown corner of the tensor (row-major over `shape`) and,
/// per dim, whether an ellipsis stands between its first and last `EDGE` entries.
struct Shown {
    shape: Vec<usize>,
    cut: Vec<bool>,
    values: Vec<f64>,
}

impl Shown {
    /// Reads the whole tensor, or with summarising only its corners (one small copy per cut dim).
    fn of(t: &Tensor) -> Result<Shown> {
        let summarise = t.numel() > THRESHOLD;
        let mut part = t.clone();
        let mut cut = vec![false; t.ndim()];
        for (d, c) in cut.iter_mut().enumerate() {
            let n = t.shape()[d];
            if summarise && n > 2 * EDGE {
                let head = part.narrow(d, 0, EDGE)?;
                let tail = part.narrow(d, n - EDGE, EDGE)?;
                part = Tensor::concat(&[&head, &tail], d)?;
                *c = true;
            }
        }
        Ok(Shown {
            shape: part.shape().to_vec(),
            cut,
            values: part.to_vec_f64()?,
        })
    }
}

/// One value: integers as they are, floats with 4 decimals, or in scientific form when the
/// magnitudes make fixed decimals unreadable.
fn number(v: f64, integer: bool, scientific: bool) -> String {
    if integer || !v.is_finite() {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            format!("{v}")
        }
    } else if scientific {
        // Rust writes `1.0000e-6`; PyTorch (and C) `1.0000e-06`, `1.0000e+00`.
        let text = format!("{v:.4e}");
        match text.split_once('e') {
            Some((m, e)) => format!("{m}e{:+03}", e.parse::<i32>().unwrap_or(0)),
            None => text,
        }
    } else {
        format!("{v:.4}")
    }
}

/// Writes `dim` of `s` starting at flat element `at`: brackets, separators and ellipses.
fn write_dim(out: &mut String, s: &Shown, cells: &[String], dim: usize, at: usize, indent: usize) {
    if dim == s.shape.len() {
        out.push_str(&cells[at]);
        return;
    }
    let n = s.shape[dim];
    let inner: usize = s.shape[dim + 1..].iter().product();
    let last = dim + 1 == s.shape.len();
    let sep = if last {
        ", ".to_string()
    } else {
        format!(
            ",{}{}",
            "\n".repeat(s.shape.len() - dim - 1),
            " ".repeat(indent + 1)
        )
    };
    out.push('[');
    for i in 0..n {
        if i > 0 {
            out.push_str(&sep);
        }
        if s.cut[dim] && i == EDGE {
            out.push_str("...");
            out.push_str(&sep);
        }
        write_dim(out, s, cells, dim + 1, at + i * inner, indent + 1);
    }
    out.push(']');
}

impl fmt::Display for Tensor {
    /// `tensor([[1.0000, 2.0000], [3.0000, 4.0000]], f32, host)`: values in nested brackets
    /// (summarised with `...` above 1000 elements), then dtype and device. A read that fails
    /// prints the error in place of the values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = match Shown::of(self) {
            Ok(s) => s,
            Err(e) => {
                return write!(
                    f,
                    "tensor(<unreadable: {e}>, {}, {})",
                    self.dtype, self.device
                )
            }
        };
        let integer = !self.dtype.is_float();
        let finite = shown.values.iter().filter(|v| v.is_finite() && **v != 0.0);
        let (lo, hi) = finite.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v.abs()), hi.max(v.abs()))
        });
        let scientific = hi >= 1e8 || (hi > 0.0 && lo < 1e-4) || (hi > 0.0 && hi / lo >= 1e8);
        let cells: Vec<String> = shown
            .values
            .iter()
            .map(|&v| number(v, integer, scientific))
            .collect();
        let width = cells.iter().map(|c| c.len()).max().unwrap_or(0);
        let cells: Vec<String> = cells.iter().map(|c| format!("{c:>width$}")).collect();
        let mut out = String::from("tensor(");
        if shown.shape.contains(&0) {
            out.push_str(&format!("[], shape={:?}", self.shape()));
        } else {
            write_dim(&mut out, &shown, &cells, 0, 0, "tensor(".len());
        }
        write!(f, "{out}, {}, {})", self.dtype, self.device)
    }
}

#[cfg(test)]
mod tests {
    use crate::base::tensor::Tensor;
    use netcl_core_devices::{DType, Device};

    #[test]
    fn prints_nested_brackets_and_summarises_large_tensors() {
        let host = Device::host();
        let t = Tensor::from_vec(vec![1.0f32, -2.5, 3.0, 4.25], &[2, 2], &host).unwrap();
        assert_eq!(
            t.to_string(),
            "tensor([[ 1.0000, -2.5000],\n        [ 3.0000,  4.2500]], f32, host)"
        );
        let s = Tensor::from_vec(vec![7i32], &[], &host).unwrap();
        assert_eq!(s.to_string(), "tensor(7, i32, host)");
        let e = Tensor::zeros(&[0, 3], DType::F32, &host).unwrap();
        assert_eq!(e.to_string(), "tensor([], shape=[0, 3], f32, host)");
        let tiny = Tensor::from_vec(vec![1e-6f64, 1.0], &[2], &host).unwrap();
        assert_eq!(
            tiny.to_string(),
            "tensor([1.0000e-06, 1.0000e+00], f64, host)"
        );
        let big = Tensor::arange(0.0, 2000.0, 1.0, DType::I32, &host)
            .unwrap()
            .reshape(&[40, 50])
            .unwrap();
        let text = big.to_string();
        assert!(
            text.starts_with("tensor([[   0,    1,    2, ...,   47,   48,   49],\n"),
            "{text}"
        );
        assert!(text.contains("\n        ...,\n"), "{text}");
        assert!(text.ends_with("[1950, 1951, 1952, ..., 1997, 1998, 1999]], i32, host)"));
    }
}
