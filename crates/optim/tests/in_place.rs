//! Steps after the first update parameters and state in place: no device allocation at all (alone in its own test binary, so the pool counters see only this test).
mod common;

use common::*;
use netcl_core_devices::opencl_test_devices;
use netcl_core_memory::Pool;
use netcl_ops::DType;
use netcl_optim::{Adam, AdamW, Optimizer, Sgd};

#[test]
fn steps_after_the_first_allocate_nothing() {
    for dev in opencl_test_devices().unwrap() {
        let pool = Pool::of(&dev).unwrap();
        let requests = || {
            let s = pool.stats();
            s.hits + s.misses
        };
        let prob = Problem::new(11, DType::F32, 4);
        for kind in 0..3 {
            let params = prob.params(&dev, DType::F32);
            let mut opt: Box<dyn Optimizer> = match kind {
                0 => Box::new(Sgd::new(params.clone(), 0.1).momentum(0.9).nesterov(true)),
                1 => Box::new(Adam::new(params.clone(), 0.1).weight_decay(0.1)),
                _ => Box::new(AdamW::new(params.clone(), 0.1)),
            };
            // Steps 0 and 1 create the state of parameters 0 and 1 (parameter 2 starts at step 2).
            for s in 0..4 {
                prob.set_grads(&params, s);
                let before = requests();
                opt.step().unwrap();
                let allocated = requests() - before;
                // State buffers are created once per parameter (SGD: momentum; Adam: m, v, the
                // step count, step size and bias correction on the device), the learning rate on
                // the device once.
                let per_param = if kind == 0 { 1 } else { 5 };
                let new_state = match s {
                    0 => 2,
                    2 => 1,
                    _ => 0,
                };
                let lr = u64::from(s == 0);
                assert_eq!(
                    allocated,
                    per_param * new_state + lr,
                    "optimizer {kind} step {s} on {dev}"
                );
            }
        }
    }
}
