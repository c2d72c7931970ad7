//! The host device's memory budget: host tensor bytes counted, capped by NETCL_POOL_LIMIT, allocated fallibly.
use crate::host_cache;
use netcl_core_devices::{Config, Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// What [`set_host_limit`] set, over [`Config::pool_limit`].
static SET_LIMIT: Mutex<Option<Option<usize>>> = Mutex::new(None);

/// The cap: what [`set_host_limit`] set, else [`Config::pool_limit`] (`NETCL_POOL_LIMIT`; a bad
/// value is an error on every allocation).
fn limit() -> Result<Option<usize>> {
    match *SET_LIMIT.lock().unwrap_or_else(|p| p.into_inner()) {
        Some(set) => Ok(set),
        None => Config::get().pool_limit.get(),
    }
}

/// Cap the bytes live host tensors may hold (`None`: no cap beyond what the system grants),
/// over [`Config::pool_limit`].
pub fn set_host_limit(limit: Option<usize>) {
    *SET_LIMIT.lock().unwrap_or_else(|p| p.into_inner()) = Some(limit);
}

/// Bytes held by live host tensors, and the most held at once.
pub fn host_memory() -> (usize, usize) {
    (IN_USE.load(Ordering::Relaxed), PEAK.load(Ordering::Relaxed))
}

/// Restarts the host's peak from the bytes held now (as `Pool::reset_peak` does for a device).
pub fn reset_host_peak() {
    PEAK.store(IN_USE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Counts `bytes` as held (for storage that already exists; see [`host_vec`] for new storage).
pub fn host_charge(bytes: usize) {
    let now = IN_USE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// Returns `bytes` counted by [`host_charge`].
pub fn host_release(bytes: usize) {
    IN_USE.fetch_sub(bytes, Ordering::Relaxed);
}

fn out_of_memory(requested: usize, why: String) -> Error {
    let (in_use, peak) = host_memory();
    Error::OutOfMemory {
        device: "host".to_string(),
        requested,
        stats: format!("{why}; host tensors hold {in_use} B (peak {peak} B)"),
    }
}

/// Whether `bytes` more fit under the cap: an `OutOfMemory` error naming the cap if not.
pub fn host_check(bytes: usize) -> Result<()> {
    if let Some(cap) = limit()? {
        let in_use = IN_USE.load(Ordering::Relaxed);
        if in_use.saturating_add(bytes) > cap {
            return Err(out_of_memory(
                bytes,
                format!("NETCL_POOL_LIMIT of {cap} B reached"),
            ));
        }
    }
    Ok(())
}

/// An empty vector with room for `n` elements, checked against the cap and reserved fallibly: a
/// request the system cannot grant is `Error::OutOfMemory`, not an abort.
pub fn host_vec<T>(n: usize) -> Result<Vec<T>> {
    let bytes = n.saturating_mul(std::mem::size_of::<T>());
    host_check(bytes)?;
    if let Some(v) = host_cache::take(n) {
        return Ok(v);
    }
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        // What the cache keeps may be what the system is missing.
        host_cache::release();
        v.try_reserve_exact(n).map_err(|e| {
            out_of_memory(bytes, format!("the system refused the allocation ({e})"))
        })?;
    }
    Ok(v)
}

/// Host memory an operation holds for a while (an f64 copy of a view, a row buffer, a result
/// before it becomes a tensor): checked against the cap, allocated fallibly, and counted in
/// [`host_memory`] while it lives.
pub struct HostBuf<T> {
    v: Vec<T>,
    bytes: usize,
}

impl<T> HostBuf<T> {
    /// The `n` items of `items` (an error if it yields fewer), counted.
    pub fn collect(n: usize, items: impl IntoIterator<Item = T>) -> Result<HostBuf<T>> {
        let mut v = host_vec(n)?;
        v.extend(items.into_iter().take(n));
        if v.len() != n {
            return Err(Error::invalid(
                "host buffer",
                format!("{} of {n} items", v.len()),
            ));
        }
        let bytes = n * std::mem::size_of::<T>();
        host_charge(bytes);
        Ok(HostBuf { v, bytes })
    }

    /// `n` copies of `value`, counted.
    pub fn filled(n: usize, value: T) -> Result<HostBuf<T>>
    where
        T: Clone,
    {
        HostBuf::collect(n, std::iter::repeat_n(value, n))
    }

    /// The vector, no longer counted here (the storage it becomes counts it).
    pub fn into_vec(mut self) -> Vec<T> {
        host_release(std::mem::take(&mut self.bytes));
        std::mem::take(&mut self.v)
    }
}

impl<T> std::ops::Deref for HostBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.v
    }
}

impl<T> std::ops::DerefMut for HostBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.v
    }
}

impl<T> Drop for HostBuf<T> {
    fn drop(&mut self) {
        host_release(self.bytes);
        host_cache::give(std::mem::take(&mut self.v));
    }
}
