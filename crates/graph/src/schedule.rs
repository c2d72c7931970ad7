//! Spreading a replay's nodes over several in-order queues: each node follows the nodes it depends on (through the buffers it reads and writes), continues the chain of one of them, and waits on an event for those on other queues; independent branches (a weight gradient beside the input gradient) run side by side.

/// What one node reads and writes, as buffer keys (equal keys are the same memory).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Access {
    pub reads: Vec<usize>,
    pub writes: Vec<usize>,
}

/// Where a node runs and what it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Placement {
    pub queue: usize,
    /// Earlier nodes on other queues whose events it waits on.
    pub wait: Vec<usize>,
    /// It waits for the replay's start marker (the first node of a side queue: the work before the
    /// replay on the device's queue, such as a new batch's copy, comes first).
    pub wait_start: bool,
    /// Another queue waits on its event.
    pub signal: bool,
}

/// The placement of every node, and the side queues' last nodes the device's queue waits for at
/// the end (so that what follows a replay on the device's queue sees all of it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub placed: Vec<Placement>,
    pub join: Vec<usize>,
    pub queues: usize,
}

impl Schedule {
    /// Events waited on across queues, the start marker and joins included.
    pub fn cross_waits(&self) -> usize {
        let waits: usize = self
            .placed
            .iter()
            .map(|p| p.wait.len() + p.wait_start as usize)
            .sum();
        waits + self.join.len()
    }
}

/// For each node, the earlier nodes it must follow: the last writer of what it reads or writes
/// (read after write, write after write) and the readers since of what it writes (write after
/// read).
fn dependencies(access: &[Access]) -> Vec<Vec<usize>> {
    use std::collections::HashMap;
    let mut last_writer: HashMap<usize, usize> = HashMap::new();
    let mut readers: HashMap<usize, Vec<usize>> = HashMap::new();
    access
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut deps = Vec::new();
            for k in a.reads.iter().chain(&a.writes) {
                deps.extend(last_writer.get(k));
            }
            for k in &a.writes {
                deps.extend(readers.get(k).into_iter().flatten());
            }
            for &k in &a.reads {
                readers.entry(k).or_default().push(i);
            }
            for &k in &a.writes {
                last_writer.insert(k, i);
                readers.remove(&k);
            }
            deps.retain(|&d| d != i);
            deps.sort_unstable();
            deps.dedup();
            deps
        })
        .collect()
}

/// Places the nodes (in their order) on `queues` in-order queues, queue 0 being the device's.
/// A node continues the queue whose last node it depends on (the latest such), else starts on the
/// queue that has been idle longest; it waits on the events of dependencies on other queues that
/// an earlier wait does not already cover.
pub(crate) fn schedule(access: &[Access], queues: usize) -> Schedule {
    let queues = queues.max(1);
    let deps = dependencies(access);
    let n = access.len();
    // seen[q][p]: nodes of queue p up to this index (+1) are ordered before what q runs next.
    let mut seen = vec![vec![0usize; queues]; queues];
    // The same vector as of each node's completion.
    let mut known: Vec<Vec<usize>> = Vec::with_capacity(n);
    let mut tail: Vec<Option<usize>> = vec![None; queues];
    let mut queue_of = Vec::with_capacity(n);
    let mut placed: Vec<Placement> = Vec::with_capacity(n);
    for (i, d) in deps.iter().enumerate() {
        let chain = (0..queues)
            .filter(|&q| tail[q].is_some_and(|t| d.contains(&t)))
            .max_by_key(|&q| tail[q]);
        let q = chain.unwrap_or_else(|| {
            (0..queues)
                .min_by_key(|&q| tail[q].map_or(0, |t| t + 1))
                .unwrap_or(0)
        });
        let mut wait = Vec::new();
        for &j in d.iter().rev() {
            let p = queue_of[j];
            if p == q || seen[q][p] > j {
                continue;
            }
            wait.push(j);
            placed[j].signal = true;
            let k: &Vec<usize> = &known[j];
            for (s, &v) in seen[q].iter_mut().zip(k) {
                *s = (*s).max(v);
            }
        }
        wait.sort_unstable();
        // The first node of a side queue waits for the work before the replay, unless it already
        // waits on a node of the device's queue (which comes after that work).
        let wait_start = q != 0 && tail[q].is_none() && seen[q][0] == 0;
        seen[q][q] = i + 1;
        known.push(seen[q].clone());
        tail[q] = Some(i);
        queue_of.push(q);
        placed.push(Placement {
            queue: q,
            wait,
            wait_start,
            signal: false,
        });
    }
    let mut join = Vec::new();
    for (q, t) in tail.iter().enumerate().skip(1) {
        if let Some(t) = *t {
            if seen[0][q] <= t {
                join.push(t);
                placed[t].signal = true;
            }
        }
    }
    Schedule {
        placed,
        join,
        queues,
    }
}

#[cfg(test)]
mod tests {
    use super::{dependencies, schedule, Access};

    fn acc(reads: &[usize], writes: &[usize]) -> Access {
        Access {
            reads: reads.to_vec(),
            writes: writes.to_vec(),
        }
    }

    /// An MLP's backward in eager order: buffers 0 x, 1 h1, 2 h2, 3 dz3, 4 dz2, 5 dz1, 6 dh2,
    /// 7 dh1, 8 the gradients (one buffer), 9 W2, 10 W3, 11 the parameters.
    fn mlp_backward() -> Vec<Access> {
        vec![
            acc(&[], &[3]),      // 0: loss backward -> dz3
            acc(&[3, 2], &[8]),  // 1: dW3 = dz3ᵀ h2
            acc(&[3, 10], &[6]), // 2: dh2 = dz3 W3
            acc(&[6, 2], &[4]),  // 3: relu backward -> dz2
            acc(&[4, 1], &[8]),  // 4: dW2 = dz2ᵀ h1
            acc(&[4, 9], &[7]),  // 5: dh1 = dz2 W2
            acc(&[7, 1], &[5]),  // 6: relu backward -> dz1
            acc(&[5, 0], &[8]),  // 7: dW1 = dz1ᵀ x
            acc(&[8], &[11, 8]), // 8: the optimizer
        ]
    }

    #[test]
    fn dependencies_follow_reads_after_writes_and_writes_after_reads() {
        let d = dependencies(&mlp_backward());
        assert_eq!(d[1], vec![0]);
        assert_eq!(d[2], vec![0]);
        assert_eq!(d[4], vec![1, 3]);
        assert_eq!(d[7], vec![4, 6]);
        assert_eq!(d[8], vec![7]);
        // Write after read: a node writing what an earlier one read waits for it.
        let war = dependencies(&[acc(&[1], &[2]), acc(&[], &[1])]);
        assert_eq!(war[1], vec![0]);
    }

    #[test]
    fn the_weight_gradients_run_beside_the_input_gradients() {
        let s = schedule(&mlp_backward(), 2);
        let q: Vec<usize> = s.placed.iter().map(|p| p.queue).collect();
        assert_eq!(q, vec![0, 0, 1, 1, 1, 0, 0, 0, 0]);
        assert_eq!(s.placed[2].wait, vec![0]);
        assert!(
            !s.placed[2].wait_start,
            "its wait on node 0 orders it after the replay's start"
        );
        assert_eq!(s.placed[5].wait, vec![3]);
        // dW1 follows dW2 (the same gradient buffer); the optimizer needs no second wait.
        assert_eq!(s.placed[7].wait, vec![4]);
        assert!(s.placed[8].wait.is_empty());
        assert!(
            s.join.is_empty(),
            "queue 0 already waited for queue 1's last node"
        );
        assert_eq!(s.placed[4].wait, vec![1]);
        assert_eq!(s.cross_waits(), 4);
    }

    #[test]
    fn every_dependency_is_ordered_on_one_queue_or_through_waits() {
        // A chain with branches of several widths, checked on 1 to 4 queues: each dependency is
        // earlier on the same queue or reachable through the waits.
        let mut a = Vec::new();
        for i in 0..40usize {
            let r = [i % 7, (i * 3) % 11 + 20];
            a.push(acc(&r, &[(i * 5) % 13 + 40 * (i % 2)]));
        }
        for queues in 1..=4 {
            let s = schedule(&a, queues);
            let d = dependencies(&a);
            // before[i]: every node ordered before node i.
            let mut before: Vec<std::collections::BTreeSet<usize>> = Vec::new();
            let mut last_on = vec![None::<usize>; queues];
            for (i, p) in s.placed.iter().enumerate() {
                let mut b = std::collections::BTreeSet::new();
                for &j in p.wait.iter().chain(&last_on[p.queue]) {
                    b.insert(j);
                    b.extend(before[j].iter().copied());
                }
                last_on[p.queue] = Some(i);
                before.push(b);
            }
            for (i, deps) in d.iter().enumerate() {
                for j in deps {
                    assert!(before[i].contains(j), "{queues} queues: {i} after {j}");
                }
            }
            let mut end: std::collections::BTreeSet<usize> = s.join.iter().copied().collect();
            for &j in s.join.iter().chain(&last_on[0]) {
                end.extend(before[j].iter().copied());
            }
            for (q, last) in last_on.iter().enumerate().skip(1) {
                if let Some(t) = last {
                    assert!(end.contains(t), "{queues} queues: queue {q} not joined");
                }
            }
            if queues == 1 {
                assert_eq!(s.cross_waits(), 0);
            }
        }
    }
}
