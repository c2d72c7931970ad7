//! The host sort: Rust's stable sort of the positions by key.
use super::SortStable;
use crate::base::tensor::Tensor;
use netcl_core_devices::{Device, Result};

/// The sort on the host, into two new host tensors.
pub(super) fn sort_stable(desc: &SortStable) -> Result<(Tensor, Tensor)> {
    let n = desc.x.shape[0];
    let (keys, perm) = host_sort(&desc.x.to_vec::<i32>()?);
    let h = Device::host();
    Ok((
        Tensor::from_vec(keys, &[n], &h)?,
        Tensor::from_vec(perm, &[n], &h)?,
    ))
}

/// The stable order of `v`: (sorted keys, positions).
fn host_sort(v: &[i32]) -> (Vec<i32>, Vec<i32>) {
    let mut perm: Vec<i32> = (0..v.len() as i32).collect();
    perm.sort_by_key(|&i| v[i as usize]);
    (perm.iter().map(|&i| v[i as usize]).collect(), perm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sort_is_stable() {
        let (k, p) = host_sort(&[3, -1, 3, 0, -1, i32::MAX, i32::MIN]);
        assert_eq!(k, vec![i32::MIN, -1, -1, 0, 3, 3, i32::MAX]);
        assert_eq!(p, vec![6, 1, 4, 3, 0, 2, 5]);
    }
}
