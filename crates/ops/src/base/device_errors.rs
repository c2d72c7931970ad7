//! Errors found by kernels (an index out of range): recorded in a per-device buffer, reported at the next read.
//!
//! A kernel that meets a bad index writes `{op code, position, value, bound}` into its device's
//! 16-byte error record (the first report wins, `atomic_cmpxchg`) and carries on without touching
//! memory out of bounds. No host sync is added to the op: the record (one per device and thread)
//! is read back at the thread's next read of any tensor of that device ([`Tensor::to_host_data`](crate::Tensor::to_host_data) and everything built on it), and
//! only when an index kernel ran since the last check. That read then returns the error, naming
//! the op, the index and the bound, as the host reports at once. Everything the bad op and later
//! ops computed is suspect; the record is cleared so the device stays usable. With
//! `NETCL_DEBUG=sync` the record is read right after each launch instead, so the op whose kernel
//! found the index returns the error.
use crate::base::dispatch::{backend, Backend};
use netcl_core_devices::opencl3::types::cl_mem;
use netcl_core_devices::{Device, Error, Result};
use netcl_core_memory::{read, read_async, write, Block, Pending, Pool};
use std::cell::RefCell;
use std::collections::hash_map::{Entry, HashMap};

/// Ops whose kernels report: the code a kernel writes is the position here plus one.
const OPS: [&str; 8] = [
    "embedding",
    "index_select",
    "gather",
    "cross_entropy",
    "scatter_add",
    "index_add",
    "decode_qkv",
    "decode_attention",
];

struct Record {
    block: Block,
    /// An index kernel ran since the record was last read.
    armed: bool,
    /// How many times a found error was cleared from the record: a queued read that sees an
    /// error cleared after it was queued knows another check reported it already.
    cleared: u64,
}

thread_local! {
    /// One record per device for each thread, so an error surfaces in the thread whose op made
    /// it (at its next read from that device), not in another thread sharing the device.
    static RECORDS: RefCell<ThreadRecords> = RefCell::new(ThreadRecords::default());
}

/// One thread's records. At thread exit their blocks go to [`RETIRED`], freed by the next
/// `record_arg` on a live thread: freeing one may call the driver (an exact pool releases the
/// buffer), whose own per-thread state may already be gone then (see `netcl_kernels`' kernels).
#[derive(Default)]
struct ThreadRecords(HashMap<usize, Record>);

impl std::ops::Deref for ThreadRecords {
    type Target = HashMap<usize, Record>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ThreadRecords {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ThreadRecords {
    fn drop(&mut self) {
        let mut retired = RETIRED.lock().unwrap_or_else(|p| p.into_inner());
        retired.extend(self.0.drain().map(|(_, r)| r.block));
    }
}

/// Record blocks of exited threads, to be freed from a live one.
static RETIRED: std::sync::Mutex<Vec<Block>> = std::sync::Mutex::new(Vec::new());

/// The op code kernels write for `op` (0 for ops not in the table: reported as "an index kernel").
pub(crate) fn code_of(op: &str) -> i32 {
    OPS.iter()
        .position(|&o| o == op)
        .map_or(0, |i| i as i32 + 1)
}

/// Bytes of a record's buffer: the record's 4 words, then 8 words of counters that persistent
/// kernels (decode_block) share, one launch after another on the thread's queue, and leave at 0.
const RECORD_BYTES: usize = 48;

/// The error record of `device` as a kernel argument (`__global int* err`, 4 ints, then the
/// counters), made and zeroed on the thread's first use; marks it to be checked at the thread's
/// next read.
pub(crate) fn record_arg(device: &Device) -> Result<cl_mem> {
    netcl_kernels::set_after_sync_check(check_after_launch);
    drop(std::mem::take(
        &mut *RETIRED.lock().unwrap_or_else(|p| p.into_inner()),
    ));
    RECORDS.with_borrow_mut(|records| {
        let r = match records.entry(device.ordinal()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                let block = Pool::of(device)?.alloc(RECORD_BYTES)?;
                write(&block, 0, &[0u8; RECORD_BYTES])?;
                e.insert(Record {
                    block,
                    armed: false,
                    cleared: 0,
                })
            }
        };
        r.armed = true;
        Ok(r.block.mem())
    })
}

/// Reads the thread's error record of `device` if an index kernel ran since the last read:
/// the error it holds, once (the record is cleared).
pub(crate) fn check(device: &Device) -> Result<()> {
    check_device(
        device,
        "at the next read, so this op's result and later results are invalid",
    )
}

/// `NETCL_DEBUG=sync`: the check after every launch (set through `netcl_kernels`).
fn check_after_launch(device: &Device) -> Result<()> {
    check_device(
        device,
        "right after its launch (NETCL_DEBUG=sync), so this op's result is invalid",
    )
}

/// The error in `device`'s record for this thread, if an index kernel ran since the last check;
/// `when` says when it was reported.
fn check_device(device: &Device, when: &str) -> Result<()> {
    if backend(device) == Backend::Host {
        return Ok(());
    }
    let found = RECORDS.with_borrow_mut(|records| -> Result<Option<[i32; 4]>> {
        let Some(r) = records.get_mut(&device.ordinal()).filter(|r| r.armed) else {
            return Ok(None);
        };
        let mut bytes = [0u8; 16];
        read(&r.block, 0, &mut bytes)?;
        r.armed = false;
        Ok(Some(bytemuck::cast(bytes)))
    })?;
    match found {
        Some(words) => report(device, words, when),
        None => Ok(()),
    }
}

/// A read of a device's error record queued behind the work enqueued so far ([`check_async`]).
/// Dropped without [`PendingCheck::finish`], it arms the record again so the next read checks.
pub(crate) struct PendingCheck {
    device: Device,
    read: Option<Pending<Vec<u8>>>,
    /// The record's `cleared` count when the read was queued.
    cleared: u64,
}

/// Queues a read of this thread's error record of `device` if an index kernel ran since the last
/// check, without waiting: [`PendingCheck::finish`] gives the error the kernels enqueued before
/// this call found. Lets an asynchronous read check the record without blocking on work queued
/// after it.
pub(crate) fn check_async(device: &Device) -> Result<PendingCheck> {
    let (read, cleared) = match backend(device) {
        Backend::Host => (None, 0),
        Backend::OpenCl => RECORDS.with_borrow_mut(|records| {
            let Some(r) = records.get_mut(&device.ordinal()).filter(|r| r.armed) else {
                return Ok((None, 0));
            };
            let read = read_async(&r.block, 0, 16)?;
            r.armed = false;
            Ok::<_, Error>((Some(read), r.cleared))
        })?,
    };
    Ok(PendingCheck {
        device: device.clone(),
        read,
        cleared,
    })
}

impl PendingCheck {
    /// Waits for the record's read and returns the error it holds, if any.
    pub(crate) fn finish(mut self) -> Result<()> {
        let Some(read) = self.read.take() else {
            return Ok(());
        };
        let bytes: [u8; 16] = read
            .wait()?
            .try_into()
            .map_err(|_| Error::invalid("device error record", "read back fewer than 16 bytes"))?;
        let reported_since = RECORDS.with_borrow(|records| {
            records
                .get(&self.device.ordinal())
                .is_some_and(|r| r.cleared != self.cleared)
        });
        if reported_since {
            return Ok(());
        }
        report(
            &self.device,
            bytemuck::cast(bytes),
            "at the next read, so this op's result and later results are invalid",
        )
    }
}

impl Drop for PendingCheck {
    fn drop(&mut self) {
        if self.read.take().is_some() {
            RECORDS.with_borrow_mut(|records| {
                if let Some(r) = records.get_mut(&self.device.ordinal()) {
                    r.armed = true;
                }
            });
        }
    }
}

/// The error a record's words `{code, position, value, bound}` hold (none when the code is 0);
/// a found error clears the record so the device stays usable.
fn report(device: &Device, [code, pos, value, bound]: [i32; 4], when: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    RECORDS.with_borrow_mut(|records| match records.get_mut(&device.ordinal()) {
        Some(r) => {
            r.cleared += 1;
            write(&r.block, 0, &[0u8; 16])
        }
        None => Ok(()),
    })?;
    let op = usize::try_from(code - 1)
        .ok()
        .and_then(|i| OPS.get(i))
        .copied()
        .unwrap_or("an index kernel");
    let bound = bound as u32;
    // Worded as the host's check words it, then where it was found.
    let what = if op == "cross_entropy" {
        format!("target {value} of row {pos} is outside [0, {bound}) for logits of {bound} classes")
    } else if op.starts_with("decode_") {
        format!("cache position {value} is outside [0, {bound}) of the KV cache")
    } else {
        format!("index {value} at position {pos} is out of range [0, {bound})")
    };
    Err(Error::invalid(
        op,
        format!("{what} (found on {device} by the kernel and reported {when})"),
    ))
}

/// The name a captured graph binds this thread's index-error record of a device by.
pub const INDEX_ERRORS_BUFFER: &str = "netcl.index_errors";

/// This thread's index-error record of `device` (made on first use), armed so the next read
/// checks it: what a replayed graph whose kernels report bad indices binds and arms.
pub fn index_error_record(device: &Device) -> Result<cl_mem> {
    record_arg(device)
}

/// This thread's index-error record of `device` if it exists (without making or arming it).
pub fn existing_index_error_record(device: &Device) -> Option<cl_mem> {
    RECORDS.with_borrow(|r| r.get(&device.ordinal()).map(|r| r.block.mem()))
}
