//! A replay's enqueues: each step (a bound kernel or a copy) on the queue its schedule gives, after the events of the steps it depends on there; side queues start after the work before the replay and the device's queue ends after all of them.
use crate::schedule::{Access, Schedule};
use netcl_core_devices::opencl3::command_queue::{CommandQueue, CL_QUEUE_PROFILING_ENABLE};
use netcl_core_devices::opencl3::types::{cl_command_queue, cl_event, cl_mem};
use netcl_core_devices::{cl3, ClResultExt, Device, Result};
use netcl_kernels::BoundKernel;
use std::ptr;

/// One enqueue of a replay.
pub(crate) enum Step {
    Kernel(BoundKernel),
    Copy(CopyStep),
}

/// A device-to-device copy of a replay (buffers as `cl_mem` numbers).
pub(crate) struct CopyStep {
    pub src: usize,
    pub src_offset: usize,
    pub dst: usize,
    pub dst_offset: usize,
    pub len: usize,
}

impl CopyStep {
    /// Enqueues the copy on `queue` after `wait`, writing its event to `event` unless null.
    ///
    /// # Safety
    /// Both buffers are alive and belong to the queue's context; the ranges lie inside them;
    /// `wait` holds valid events; `event` is null or writable.
    unsafe fn enqueue(
        &self,
        queue: cl_command_queue,
        wait: &[cl_event],
        event: *mut cl_event,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        let ev = unsafe {
            cl3::command_queue::enqueue_copy_buffer(
                queue,
                self.src as cl_mem,
                self.dst as cl_mem,
                self.src_offset,
                self.dst_offset,
                self.len,
                wait.len() as u32,
                list(wait),
            )
        }
        .cl("clEnqueueCopyBuffer (graph replay)")?;
        if event.is_null() {
            // The enqueue handed over a reference to its new event.
            drop(netcl_core_devices::opencl3::event::Event::new(ev));
        } else {
            // SAFETY: the caller's contract; the caller now owns the reference.
            unsafe { *event = ev };
        }
        Ok(())
    }
}

impl Step {
    /// # Safety
    /// As [`BoundKernel::enqueue`] and [`CopyStep::enqueue`].
    pub(crate) unsafe fn enqueue(
        &mut self,
        queue: cl_command_queue,
        wait: &[cl_event],
        event: *mut cl_event,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            match self {
                Step::Kernel(k) => k.enqueue(queue, wait, event),
                Step::Copy(c) => c.enqueue(queue, wait, event),
            }
        }
    }
}

fn list(events: &[cl_event]) -> *const cl_event {
    if events.is_empty() {
        ptr::null()
    } else {
        events.as_ptr()
    }
}

/// Releases every event it holds when dropped (a replay that fails midway included).
struct Events(Vec<cl_event>);

impl Events {
    fn release(&mut self) {
        for e in &mut self.0 {
            if !e.is_null() {
                // SAFETY: each non-null entry is a reference this replay got from an enqueue.
                let _ = unsafe { cl3::event::release_event(*e) };
                *e = ptr::null_mut();
            }
        }
    }
}

/// The side queues of a graph and the schedule that spreads its steps over them.
pub(crate) struct Queues {
    schedule: Schedule,
    side: Vec<CommandQueue>,
}

impl Queues {
    /// The schedule of `access` over `queues` queues, with `queues - 1` new in-order queues on
    /// `device` beside its own (profiling like it); None when every node lands on the device's
    /// queue (no branches to run side by side).
    pub(crate) fn plan(
        device: &Device,
        access: &[Access],
        queues: usize,
    ) -> Result<Option<Queues>> {
        if queues <= 1 {
            return Ok(None);
        }
        let schedule = crate::schedule::schedule(access, queues);
        if schedule.placed.iter().all(|p| p.queue == 0) {
            return Ok(None);
        }
        let cl = device.cl("Graph::replay")?;
        let props = if cl.profiling {
            CL_QUEUE_PROFILING_ENABLE
        } else {
            0
        };
        let used = schedule.placed.iter().map(|p| p.queue).max().unwrap_or(0);
        let side = (0..used)
            .map(|_| {
                CommandQueue::create_default_with_properties(&cl.context, props, 0)
                    .cl("clCreateCommandQueue (graph side queue)")
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Queues { schedule, side }))
    }

    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Enqueues `steps` (the schedule's nodes) with `main` as queue 0.
    ///
    /// # Safety
    /// Every buffer the steps use is alive and belongs to the queues' context.
    pub(crate) unsafe fn enqueue(&self, main: cl_command_queue, steps: &mut [Step]) -> Result<()> {
        let queue = |q: usize| match q {
            0 => main,
            q => self.side[q - 1].get(),
        };
        let placed = &self.schedule.placed;
        let mut events = Events(vec![ptr::null_mut(); steps.len() + 1]);
        let start = steps.len();
        if placed.iter().any(|p| p.wait_start) {
            // SAFETY: `main` is a valid queue; the event is released by `events`.
            events.0[start] =
                unsafe { cl3::command_queue::enqueue_marker_with_wait_list(main, 0, ptr::null()) }
                    .cl("clEnqueueMarkerWithWaitList (graph replay start)")?;
            // Side queues wait on it: submit it (a queue's events are only reliable to other
            // queues once it is flushed).
            cl3::command_queue::flush(main).cl("clFlush (graph replay start)")?;
        }
        let mut wait: Vec<cl_event> = Vec::with_capacity(8);
        for (i, (s, p)) in steps.iter_mut().zip(placed).enumerate() {
            wait.clear();
            wait.extend(p.wait.iter().map(|&j| events.0[j]));
            if p.wait_start {
                wait.push(events.0[start]);
            }
            let event = if p.signal {
                &mut events.0[i] as *mut cl_event
            } else {
                ptr::null_mut()
            };
            let q = queue(p.queue);
            // SAFETY: the caller's contract; waited events come from earlier enqueues.
            unsafe { s.enqueue(q, &wait, event)? };
            if p.signal {
                // Another queue waits on this: submit it now rather than at the replay's end.
                cl3::command_queue::flush(q).cl("clFlush (graph replay)")?;
            }
        }
        if !self.schedule.join.is_empty() {
            let ends: Vec<cl_event> = self.schedule.join.iter().map(|&j| events.0[j]).collect();
            // SAFETY: valid queue and events.
            let ev = unsafe {
                cl3::command_queue::enqueue_barrier_with_wait_list(
                    main,
                    ends.len() as u32,
                    list(&ends),
                )
            }
            .cl("clEnqueueBarrierWithWaitList (graph replay end)")?;
            // SAFETY: the enqueue handed over this reference.
            let _ = unsafe { cl3::event::release_event(ev) };
        }
        for q in &self.side {
            cl3::command_queue::flush(q.get()).cl("clFlush (graph side queue)")?;
        }
        events.release();
        Ok(())
    }

    /// Waits for the side queues (a graph coming apart).
    pub(crate) fn finish(&self) {
        for q in &self.side {
            let _ = q.finish();
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        self.release();
    }
}
