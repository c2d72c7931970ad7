//! netcl-graph: capture a training step once on an OpenCL device (every kernel launch, copy, host write, allocation and free is recorded while it runs), leave out nodes whose results reach nothing the step keeps, plan its buffers (buffers never alive together share memory), and replay it with nothing but enqueues; save and load the plan as sealed JSON, checked whole before a load builds anything.
//!
//! ```no_run
//! # use netcl_graph::Graph;
//! # use netcl_ops::{DType, Device, Tensor, Result};
//! # fn main() -> Result<()> {
//! let device = Device::best()?;
//! let x = Tensor::zeros(&[64, 784], DType::F32, &device)?;
//! // ... one eager step first, so optimizer state and gradient buffers exist ...
//! let (mut graph, _) = Graph::capture(&device, |g| {
//!     g.input("x", &x)?;
//!     let y = x.relu()?.sum_all()?; // the step: forward, backward, optimizer update
//!     g.output("loss", &y)
//! })?;
//! let batch = Tensor::ones(&[64, 784], DType::F32, &device)?;
//! graph.set_input("x", &batch)?;
//! graph.replay()?;
//! let loss = graph.output("loss")?.to_vec::<f32>()?;
//! # Ok(()) }
//! ```
mod access;
mod command_buffer;
pub mod desc;
mod graph;
mod plan;
mod prune;
mod record;
mod replay;
mod save;
mod schedule;
mod seal;
mod validate;

pub use desc::{GraphDesc, SCHEMA_VERSION};
pub use graph::{Capture, Graph, GraphStats};
pub use seal::key_path;
