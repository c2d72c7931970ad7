//! fused_into_groups on every device: bit for bit the same as fused_into per group, close to the host evaluator, and the number of launches (batches by dtype and alignment, chunks of FUSED_MAX_GROUPS, groups that run alone).
use netcl_core_devices::{opencl_test_devices, test_devices};
use netcl_kernels::{thread_launches, thread_launches_total};
use netcl_ops::testing::{check_close, random_tensor, tolerance};
use netcl_ops::{
    fused_into, fused_into_groups, DType, Device, Expr, FusedGroup, Tensor, FUSED_MAX_GROUPS,
};

/// How a group's tensors are laid out.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    /// Fresh contiguous tensors of the shape.
    Dense,
    /// Contiguous views starting `k` elements into a larger buffer (not a multiple of 4 for
    /// k = 1, 2, 3: the 1-wide kernel).
    Offset(usize),
    /// The parameter is a column of a matrix (not contiguous: the group runs alone).
    Strided,
}

#[derive(Clone, Debug)]
struct Spec {
    dtype: DType,
    shape: Vec<usize>,
    layout: Layout,
}

fn spec(dtype: DType, shape: &[usize], layout: Layout) -> Spec {
    Spec {
        dtype,
        shape: shape.to_vec(),
        layout,
    }
}

/// An optimizer-like update: inputs p, g, m; m = 0.9 m + 0.1 g, then p -= 0.01 m / (|m| + 1e-3)
/// (through sqrt(m * m)), both in place.
fn update() -> [Expr; 2] {
    let (p, g, m) = (Expr::input(0), Expr::input(1), Expr::input(2));
    let new_m = m * 0.9 + g * 0.1;
    let new_p = p - new_m.clone() * 0.01 / ((new_m.clone() * new_m.clone()).sqrt() + 1e-3);
    [new_m, new_p]
}

/// Tensor `which` (0 = p, 1 = g, 2 = m) of group `k` of a case seeded `seed`, on `dev` in
/// `s`'s layout (the view is taken on the device, so offsets and strides are kept).
fn operand(s: &Spec, dev: &Device, seed: u64, k: usize, which: usize) -> Tensor {
    let n: usize = s.shape.iter().product();
    let seed = seed * 1000 + k as u64 * 3 + which as u64;
    let on_dev = |shape: &[usize]| {
        random_tensor(s.dtype, shape, -1.0, 1.0, seed)
            .to_device(dev)
            .unwrap()
    };
    match s.layout {
        Layout::Offset(off) => on_dev(&[n + off + 3])
            .narrow(0, off, n)
            .unwrap()
            .reshape(&s.shape)
            .unwrap(),
        Layout::Strided if which == 0 => {
            assert_eq!(s.shape, [n, 1], "strided specs are columns");
            on_dev(&[n, 3]).narrow(1, 1, 1).unwrap()
        }
        Layout::Dense | Layout::Strided => on_dev(&s.shape),
    }
}

/// The tensors (p, g, m) of every group of a case on `dev`.
fn tensors(specs: &[Spec], dev: &Device, seed: u64) -> Vec<[Tensor; 3]> {
    specs
        .iter()
        .enumerate()
        .map(|(k, s)| [0, 1, 2].map(|w| operand(s, dev, seed, k, w)))
        .collect()
}

fn groups(ts: &[[Tensor; 3]]) -> Vec<FusedGroup<'_>> {
    ts.iter()
        .map(|[p, g, m]| FusedGroup {
            inputs: vec![p, g, m],
            outputs: vec![m, p],
        })
        .collect()
}

/// p and m of every group after the update, as f64.
fn values(ts: &[[Tensor; 3]]) -> Vec<[Vec<f64>; 2]> {
    ts.iter()
        .map(|[p, _, m]| [p.to_vec_f64().unwrap(), m.to_vec_f64().unwrap()])
        .collect()
}

/// Runs the case on every device: fused_into_groups against fused_into per group (bit for
/// bit) and against the host (within the dtype's tolerance); on OpenCL devices the number of
/// `fused_groups` launches and of launches in all must be `launches`.
fn check_case(name: &str, specs: &[Spec], seed: u64, launches: (u64, u64)) -> usize {
    let exprs = update();
    let host = tensors(specs, &Device::host(), seed);
    fused_into_groups(&exprs, &groups(&host)).unwrap();
    let want = values(&host);
    let mut checked = 0;
    for dev in test_devices().unwrap() {
        if specs.iter().any(|s| s.dtype == DType::F64) && !dev.info().fp64 {
            continue;
        }
        let batched = tensors(specs, &dev, seed);
        let (g0, t0) = (thread_launches("fused_groups"), thread_launches_total());
        fused_into_groups(&exprs, &groups(&batched)).unwrap();
        let (g1, t1) = (thread_launches("fused_groups"), thread_launches_total());
        if !dev.is_host() {
            assert_eq!((g1 - g0, t1 - t0), launches, "{name} on {dev}: launches");
        }
        let alone = tensors(specs, &dev, seed);
        for [p, g, m] in &alone {
            fused_into(&[p, g, m], &[(exprs[0].clone(), m), (exprs[1].clone(), p)]).unwrap();
        }
        let (got, per_group) = (values(&batched), values(&alone));
        for (k, s) in specs.iter().enumerate() {
            for (w, what) in ["p", "m"].iter().enumerate() {
                let ctx = format!("{name} group {k} {s:?} {what} on {dev}");
                let (a, b) = (&got[k][w], &per_group[k][w]);
                assert_eq!(a.len(), b.len(), "{ctx}");
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    assert!(
                        x.to_bits() == y.to_bits(),
                        "{ctx}: element {i}: {x} vs fused_into {y}"
                    );
                }
                check_close(a, &want[k][w], tolerance(s.dtype) * 4.0, 1.0, &ctx).unwrap();
            }
            checked += 1;
        }
    }
    checked
}

/// Launches of `groups` batched groups: chunks of `FUSED_MAX_GROUPS`; a chunk of one group
/// runs alone (a `fused_contig` launch). Returns (fused_groups launches, launches in all).
fn chunked(groups: usize) -> (u64, u64) {
    let full = groups / FUSED_MAX_GROUPS;
    let rest = groups % FUSED_MAX_GROUPS;
    let batched = full + usize::from(rest >= 2);
    (batched as u64, (full + usize::from(rest > 0)) as u64)
}

#[test]
fn more_groups_than_one_launch_holds() {
    // Lengths around the 4-wide steps, single elements, 0-dim and 2-D tensors.
    let lengths = [1, 2, 3, 4, 5, 7, 8, 13, 255, 1021, 4096, 1027];
    let mut specs: Vec<Spec> = (0..34)
        .map(|k| spec(DType::F32, &[lengths[k % lengths.len()]], Layout::Dense))
        .collect();
    specs.push(spec(DType::F32, &[], Layout::Dense));
    specs.push(spec(DType::F32, &[7, 5], Layout::Dense));
    specs.push(spec(DType::F32, &[1, 1], Layout::Dense));
    assert!(specs.len() > 2 * FUSED_MAX_GROUPS);
    let checked = check_case("37 f32 groups", &specs, 1, chunked(specs.len()));
    assert!(checked >= 37 * 2, "{checked} groups checked");
    // Exactly two full launches, and one more group than a launch holds (it runs alone).
    for n in [2 * FUSED_MAX_GROUPS, FUSED_MAX_GROUPS + 1, 2] {
        let specs: Vec<Spec> = (0..n)
            .map(|k| spec(DType::F32, &[1 + 3 * k], Layout::Dense))
            .collect();
        check_case(&format!("{n} f32 groups"), &specs, 2, chunked(n));
    }
}

#[test]
fn dtypes_offsets_strided_and_empty_groups() {
    let fp64 = opencl_test_devices().unwrap().iter().all(|d| d.info().fp64);
    let mut specs = vec![
        // A batch of 4-aligned f32 groups and one of unaligned ones (1-wide kernel).
        spec(DType::F32, &[5], Layout::Dense),
        spec(DType::F32, &[6, 3], Layout::Dense),
        spec(DType::F32, &[9], Layout::Offset(1)),
        spec(DType::F32, &[4], Layout::Offset(2)),
        spec(DType::F32, &[2, 7], Layout::Offset(3)),
        spec(DType::F32, &[1], Layout::Offset(4)),
        // f16 and bf16 batches (float arithmetic, storage rounding).
        spec(DType::F16, &[11], Layout::Dense),
        spec(DType::F16, &[1030], Layout::Dense),
        spec(DType::BF16, &[3], Layout::Dense),
        spec(DType::BF16, &[17], Layout::Dense),
        // Alone: a strided parameter, an unaligned f16 group (a batch of one), an empty group.
        spec(DType::F32, &[6, 1], Layout::Strided),
        spec(DType::F16, &[5], Layout::Offset(1)),
        spec(DType::F32, &[0], Layout::Dense),
    ];
    // Batches: f32 aligned (3 groups: offset 4 is aligned), f32 unaligned (3), f16, bf16; alone:
    // the strided group and the unaligned f16 group (the empty group launches nothing).
    let mut launches = (4u64, 4 + 2);
    if fp64 {
        specs.push(spec(DType::F64, &[3], Layout::Dense));
        specs.push(spec(DType::F64, &[8], Layout::Offset(2)));
        specs.push(spec(DType::F64, &[12], Layout::Offset(2)));
        launches = (launches.0 + 1, launches.1 + 2);
    }
    let checked = check_case("mixed", &specs, 3, launches);
    assert!(checked >= specs.len() * 2, "{checked} groups checked");
}

#[test]
fn groups_on_two_devices_launch_once_each() {
    let devices = opencl_test_devices().unwrap();
    if devices.len() < 2 {
        return;
    }
    let exprs = update();
    let specs: Vec<Spec> = (0..6)
        .map(|k| spec(DType::F32, &[3 + k], Layout::Dense))
        .collect();
    let host = tensors(&specs, &Device::host(), 4);
    fused_into_groups(&exprs, &groups(&host)).unwrap();
    let want = values(&host);
    // Groups alternate between the first two devices.
    let ts: Vec<[Tensor; 3]> = specs
        .iter()
        .enumerate()
        .map(|(k, s)| [0, 1, 2].map(|w| operand(s, &devices[k % 2], 4, k, w)))
        .collect();
    let before = thread_launches("fused_groups");
    fused_into_groups(&exprs, &groups(&ts)).unwrap();
    assert_eq!(thread_launches("fused_groups") - before, 2);
    for (k, (got, want)) in values(&ts).iter().zip(&want).enumerate() {
        for w in 0..2 {
            check_close(&got[w], &want[w], 1e-5, 1.0, &format!("group {k}")).unwrap();
        }
    }
}

#[test]
fn parameters_that_are_rows_of_one_tensor_update_as_independent_groups() {
    // Stacked projection weights: each group's p is a block of rows of one tensor (as the
    // Llama's wq, wk, wv), the same as updating separate copies.
    let exprs = update();
    for dev in test_devices().unwrap() {
        let stacked = random_tensor(DType::F32, &[12, 4], -1.0, 1.0, 7)
            .to_device(&dev)
            .unwrap();
        let rows = [(0, 4), (4, 4), (8, 4)];
        let ts: Vec<[Tensor; 3]> = rows
            .iter()
            .enumerate()
            .map(|(k, &(start, n))| {
                let spec = spec(DType::F32, &[n, 4], Layout::Dense);
                let p = stacked.narrow(0, start, n).unwrap();
                [
                    p,
                    operand(&spec, &dev, 8, k, 1),
                    operand(&spec, &dev, 8, k, 2),
                ]
            })
            .collect();
        let copies: Vec<[Tensor; 3]> = ts
            .iter()
            .map(|t| t.clone().map(|x| x.mul_scalar(1.0).unwrap()))
            .collect();
        fused_into_groups(&exprs, &groups(&ts)).unwrap();
        for c in &copies {
            let (p, g, m) = (&c[0], &c[1], &c[2]);
            let dests = [(exprs[0].clone(), m), (exprs[1].clone(), p)];
            fused_into(&[p, g, m], &dests).unwrap();
        }
        assert_eq!(values(&ts), values(&copies), "{dev}");
    }
}

#[test]
fn bad_groups_are_errors_and_change_nothing() {
    let exprs = update();
    for dev in test_devices().unwrap() {
        let specs = vec![spec(DType::F32, &[6], Layout::Dense); 3];
        let ts = tensors(&specs, &dev, 5);
        let before = values(&ts);
        let err = |gs: &[FusedGroup<'_>]| fused_into_groups(&exprs, gs).unwrap_err().to_string();
        // One parameter in two groups: group 1 reads what group 0 writes.
        let mut gs = groups(&ts);
        gs[1].inputs[0] = &ts[0][0];
        let e = err(&gs);
        assert!(
            e.contains("fused_into_groups") && e.contains("independent") && e.contains("group 0"),
            "{dev}: {e}"
        );
        // Destinations and expressions do not pair up.
        let mut gs = groups(&ts);
        gs[2].outputs.pop();
        let e = err(&gs);
        assert!(e.contains("group 2 has 1 destinations for 2"), "{dev}: {e}");
        assert_eq!(values(&ts), before, "{dev}: nothing may change");
        // A destination of the wrong dtype.
        let wrong = Tensor::zeros(&[6], DType::F64, &Device::host())
            .unwrap()
            .to_device(&dev);
        if let Ok(wrong) = wrong {
            let mut gs = groups(&ts);
            gs[1].outputs[0] = &wrong;
            let e = err(&gs);
            assert!(e.contains("f64") && e.contains("f32"), "{dev}: {e}");
        }
        // An input that overlaps its group's destination at other elements.
        let buf = Tensor::zeros(&[8], DType::F32, &dev).unwrap();
        let (a, b) = (buf.narrow(0, 0, 6).unwrap(), buf.narrow(0, 1, 6).unwrap());
        let gs = vec![FusedGroup {
            inputs: vec![&a, &b, &ts[0][2]],
            outputs: vec![&ts[0][2], &a],
        }];
        let e = err(&gs);
        assert!(e.contains("overlaps"), "{dev}: {e}");
    }
}
