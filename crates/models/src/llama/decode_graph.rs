//! One-token decoding replayed from a captured graph: the step's kernels are bound once and each later token is one copy of its ids plus enqueues, the cache position living on the device.
use super::cache::KvCache;
use super::decode::check_ids;
use super::model::Llama;
use netcl_graph::Graph;
use netcl_ops::{DType, Error, Result, Tensor};

/// [`Llama::decode`] captured once and replayed for each later token. Each replay enqueues the
/// step's kernels with the arguments bound at capture (NVIDIA's OpenCL: one
/// `clEnqueueNDRangeKernel` each and nothing else; PoCL: one command buffer), which takes the
/// host's per-op work (checks, allocation, argument setting) out of generation. The position
/// comes from the cache's device copy ([`KvCache::position`]), which the step itself moves on.
///
/// The graph is bound to the model's weights, to one cache and to one `pads` tensor; replacing a
/// parameter invalidates it (an error at the next step).
pub struct DecodeGraph {
    graph: Graph,
    batch: usize,
    /// The captured cache's device position (which cache the graph writes).
    position: Tensor,
}

impl Llama {
    /// Runs [`Llama::decode`] for `ids` (I32 `[B]` or `[B, 1]`) while capturing it, and returns the graph
    /// with the step's logits. OpenCL devices only (the host device has no kernels to record).
    pub fn capture_decode(
        &self,
        ids: &Tensor,
        cache: &KvCache,
        pads: Option<&Tensor>,
    ) -> Result<(DecodeGraph, Tensor)> {
        let b = cache.batch();
        let ids = match ids.shape() == [b, 1] {
            true => ids.reshape(&[b])?,
            false => ids.clone(),
        };
        check_ids("Llama::capture_decode", &ids, b)?;
        // The input slot, made before the capture and holding this step's ids.
        let slot = Tensor::empty(&[b], DType::I32, self.device())?;
        slot.copy_(&ids)?;
        let (graph, logits) = Graph::capture(self.device(), |g| {
            g.input("ids", &slot)?;
            let logits = self.decode(&slot, cache, pads)?;
            g.output("logits", &logits)?;
            Ok(logits)
        })?;
        let position = cache.position().clone();
        Ok((
            DecodeGraph {
                graph,
                batch: b,
                position,
            },
            logits,
        ))
    }
}

impl DecodeGraph {
    /// The logits `[B, vocab]` after one more token per row (`ids`: I32 `[B]`, or `[B, 1]`),
    /// as [`Llama::decode`] gives them: replays the captured step with `cache`, the cache it was
    /// captured with. The returned tensor shares the graph's output storage, which the next
    /// step overwrites: read it (or queue what reads it) before then.
    pub fn step(&mut self, ids: &Tensor, cache: &KvCache) -> Result<Tensor> {
        if !cache.position().shares_storage(&self.position) {
            return Err(Error::invalid(
                "DecodeGraph::step",
                "the cache is not the one the step was captured with",
            ));
        }
        cache.check_room(1)?;
        self.graph.set_input("ids", &ids.reshape(&[self.batch])?)?;
        if let Err(e) = self.graph.replay() {
            // Part of the step may have run (the device's position moved on, say): put the
            // device position back to the host's, which did not move. The replay's error is the
            // one to report, whether or not this works.
            let _ = cache.position().fill_(cache.len() as f64);
            return Err(e);
        }
        cache.note_advanced(1);
        Ok(self.graph.output("logits")?.clone())
    }

    /// The captured graph (its kernels, plan and sizes).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
}
