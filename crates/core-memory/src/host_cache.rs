//! Freed host allocations kept for reuse by size: a training step frees and allocates the same
//! sizes every step, and memory fresh from the system costs a page fault per 4 KiB on first touch.
use std::alloc::{dealloc, Layout};
use std::collections::HashMap;
use std::sync::Mutex;

/// Allocations below this come fast from the allocator's own bins.
const MIN_BYTES: usize = 32 << 10;
/// The most bytes kept; an allocation freed beyond it goes back to the system.
const MAX_BYTES: usize = 256 << 20;

/// Kept allocations by (bytes, alignment), as addresses (the cache owns them).
#[derive(Default)]
struct Cache {
    free: HashMap<(usize, usize), Vec<usize>>,
    bytes: usize,
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut Cache) -> R) -> R {
    f(CACHE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(Cache::default))
}

/// An empty vector with capacity exactly `n` from a kept allocation of its size, if there is one.
pub(crate) fn take<T>(n: usize) -> Option<Vec<T>> {
    let bytes = n.checked_mul(std::mem::size_of::<T>())?;
    if bytes < MIN_BYTES {
        return None;
    }
    let addr = with(|c| {
        let list = c.free.get_mut(&(bytes, std::mem::align_of::<T>()))?;
        let addr = list.pop()?;
        c.bytes -= bytes;
        Some(addr)
    })?;
    // SAFETY: the address was allocated by the global allocator for a vector of `bytes` bytes at
    // T's alignment (see `give`), so a Vec<T> of capacity n (n·size_of T = bytes) may own it; it
    // holds no elements.
    Some(unsafe { Vec::from_raw_parts(addr as *mut T, 0, n) })
}

/// Keeps `v`'s allocation for a later vector of the same byte size and alignment (its elements
/// are dropped), or frees it when it is small or the cache is full.
pub fn give<T>(mut v: Vec<T>) {
    v.clear();
    let bytes = v.capacity() * std::mem::size_of::<T>();
    if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) {
        return;
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    let addr = v.as_mut_ptr() as usize;
    let kept = with(|c| {
        if c.bytes + bytes > MAX_BYTES {
            return false;
        }
        c.bytes += bytes;
        c.free
            .entry((bytes, std::mem::align_of::<T>()))
            .or_default()
            .push(addr);
        true
    });
    if !kept {
        // SAFETY: reassembles the vector the ManuallyDrop holds, once, to free it.
        drop(unsafe { Vec::from_raw_parts(addr as *mut T, 0, v.capacity()) });
    }
}

/// Frees every kept allocation (before an allocation the system refused is tried again).
pub(crate) fn release() {
    let free = with(|c| {
        c.bytes = 0;
        std::mem::take(&mut c.free)
    });
    for ((bytes, align), addrs) in free {
        // SAFETY: each address was allocated with this size and alignment (see `give`).
        let layout = unsafe { Layout::from_size_align_unchecked(bytes, align) };
        for addr in addrs {
            // SAFETY: as above; the cache owned it and no longer lists it.
            unsafe { dealloc(addr as *mut u8, layout) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_allocation_comes_back_for_the_same_size_and_alignment() {
        let n = MIN_BYTES; // bytes of u8: the smallest size kept
        let v: Vec<u32> = Vec::with_capacity(n / 4);
        let addr = v.as_ptr() as usize;
        give(v);
        // Another alignment of the same size does not take it.
        assert!(take::<u64>(n / 8).is_none_or(|w| w.as_ptr() as usize != addr));
        let w: Vec<f32> = take(n / 4).expect("kept");
        assert_eq!(
            (w.as_ptr() as usize, w.len(), w.capacity()),
            (addr, 0, n / 4)
        );
        give(w);
        release();
        assert!(take::<f32>(n / 4).is_none());
        // Small allocations are not kept.
        give(Vec::<f32>::with_capacity(16));
        assert!(take::<f32>(16).is_none());
    }
}
