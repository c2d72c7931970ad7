//! Scatter-adds (scatter_add, index_add, embedding_backward, index_select_backward): bit-identical across runs and devices, whole-row scatters over many repeated indices equal to the host, and the sort's launch count.
mod index_support;
use index_support::{check_sum, numel, random_indices, Idx, Input};
use netcl_core_devices::test_devices;
use netcl_kernels::{thread_launches, thread_launches_total};
use netcl_ops::testing::{random_tensor, Cases};
use netcl_ops::{DType, Device, Tensor};

#[test]
fn scatter_and_index_add_are_bit_identical_across_runs_and_devices() {
    let devices = test_devices().unwrap();
    // Many repeated indices and values that are not exact sums, so summation order matters.
    let (v, d, n) = (7, 71, 600);
    let mut c = Cases::new(77);
    let ids: Vec<i32> = (0..n).map(|_| c.below(v) as i32).collect();
    let grad = random_tensor(DType::F32, &[n, d], -1.0, 1.0, 5);
    let x = random_tensor(DType::F32, &[v, d], -1.0, 1.0, 6);
    let ids_t = Tensor::from_vec(ids, &[n], &Device::host()).unwrap();
    let host = (
        x.index_add(0, &ids_t, &grad)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        Tensor::embedding_backward(&grad, &ids_t, v)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        x.transpose(0, 1)
            .unwrap()
            .scatter_add(
                1,
                &ids_t.unsqueeze(0).unwrap().broadcast_to(&[d, n]).unwrap(),
                &grad.transpose(0, 1).unwrap(),
            )
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
    );
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for dev in &devices {
        let (xd, gd, id) = (
            x.to_device(dev).unwrap(),
            grad.to_device(dev).unwrap(),
            ids_t.to_device(dev).unwrap(),
        );
        for run in 0..3 {
            let a = xd.index_add(0, &id, &gd).unwrap().to_vec::<f32>().unwrap();
            let b = Tensor::embedding_backward(&gd, &id, v)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            let s = xd
                .transpose(0, 1)
                .unwrap()
                .scatter_add(
                    1,
                    &id.unsqueeze(0).unwrap().broadcast_to(&[d, n]).unwrap(),
                    &gd.transpose(0, 1).unwrap(),
                )
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(bits(&a), bits(&host.0), "index_add run {run} on {dev}");
            assert_eq!(
                bits(&b),
                bits(&host.1),
                "embedding_backward run {run} on {dev}"
            );
            assert_eq!(bits(&s), bits(&host.2), "scatter_add run {run} on {dev}");
        }
    }
}

#[test]
fn row_scatters_over_many_repeated_indices_match_the_host() {
    let devices = test_devices().unwrap();
    let host = Device::host();
    let mut c = Cases::new(0xE3_B0);
    // (V, D, ids shape): many repeats, V = 1, D = 1, no ids, multi-dim ids, past a sort chunk.
    let cases: [(usize, usize, &[usize]); 9] = [
        (50, 7, &[3000]),
        (50, 3, &[30, 100]),
        (1, 5, &[40]),
        (9, 1, &[2000]),
        (13, 4, &[0]),
        (300, 16, &[2, 700]),
        (40, 33, &[1025]),
        (7, 5, &[1]),
        (2000, 8, &[4, 1024]),
    ];
    for (case, &(v, d, ids_shape)) in cases.iter().enumerate() {
        let dtype = [DType::F32, DType::F64, DType::F16, DType::BF16][case % 4];
        let n = numel(ids_shape);
        let ids = random_indices(&mut c, n, v);
        let idx = Idx::new(&ids, ids_shape, &mut c);
        let mut gshape = ids_shape.to_vec();
        gshape.push(d);
        let g = Input::exact(
            random_tensor(dtype, &gshape, -1.0, 1.0, case as u64),
            &mut c,
        );
        let gv = g.host().to_vec_f64().unwrap();
        let mut want = vec![0.0; v * d];
        for (i, &x) in gv.iter().enumerate() {
            want[ids[i / d] as usize * d + i % d] += x;
        }
        let href = Tensor::embedding_backward(&g.host(), &idx.on(&host), v).unwrap();
        // index_add and index_select_backward along dim 0 of [V, 2, d'] with src [N, 2, d'].
        let x = Input::exact(
            random_tensor(dtype, &[v, d], -1.0, 1.0, 50 + case as u64),
            &mut c,
        );
        let flat = Idx::new(&ids, &[n], &mut c);
        let (d2, split) = if d % 2 == 0 { (d / 2, 2) } else { (d, 1) };
        let rows3 = |t: Tensor, r: usize| t.reshape(&[r, split, d2]).unwrap();
        let add_want: Vec<f64> = x
            .host()
            .to_vec_f64()
            .unwrap()
            .iter()
            .zip(&want)
            .map(|(a, b)| a + b)
            .collect();
        let gh = g.host().reshape(&[n, d]).unwrap();
        let add_ref = rows3(x.host(), v)
            .index_add(0, &flat.on(&host), &rows3(gh.clone(), n))
            .unwrap();
        let sel_ref =
            Tensor::index_select_backward(&rows3(gh, n), 0, &flat.on(&host), &[v, split, d2])
                .unwrap();
        for dev in &devices {
            if dtype == DType::F64 && !dev.info().fp64 {
                continue;
            }
            let what = format!("case {case} V {v} D {d} ids {ids_shape:?} {dtype} on {dev}");
            let gd = g.on(dev);
            for run in 0..2 {
                let got = Tensor::embedding_backward(&gd, &idx.on(dev), v).unwrap();
                assert_eq!(got.shape(), &[v, d], "{what}");
                check_sum(&format!("{what} run {run}"), dtype, &got, &want, &href);
            }
            let g2 = rows3(gd.reshape(&[n, d]).unwrap(), n);
            let sel = Tensor::index_select_backward(&g2, 0, &flat.on(dev), &[v, split, d2]);
            check_sum(
                &format!("{what} index_select_backward"),
                dtype,
                &sel.unwrap(),
                &want,
                &sel_ref,
            );
            let added = rows3(x.on(dev), v)
                .index_add(0, &flat.on(dev), &g2)
                .unwrap();
            check_sum(
                &format!("{what} index_add"),
                dtype,
                &added,
                &add_want,
                &add_ref,
            );
            // The same on 2-D views (strided x and grad as they come).
            let g2d = if ids_shape.len() == 1 {
                gd.clone()
            } else {
                gd.reshape(&[n, d]).unwrap()
            };
            let added = x.on(dev).index_add(0, &flat.on(dev), &g2d).unwrap();
            let add_ref = add_ref.reshape(&[v, d]).unwrap();
            check_sum(
                &format!("{what} 2-D index_add"),
                dtype,
                &added,
                &add_want,
                &add_ref,
            );
            let sel = Tensor::index_select_backward(&g2d, 0, &flat.on(dev), &[v, d]).unwrap();
            check_sum(
                &format!("{what} 2-D index_select_backward"),
                dtype,
                &sel,
                &want,
                &href,
            );
        }
    }
}

#[test]
fn embedding_backward_launches_the_sort_and_one_kernel() {
    for dev in test_devices()
        .unwrap()
        .into_iter()
        .filter(|d| d.is_opencl())
    {
        if dev.info().max_work_group_size < 256 || dev.info().local_mem_bytes < 8192 {
            continue; // smaller sort chunks: more launches than counted here
        }
        let (v, d, n) = (100, 4, 8192);
        let ids: Vec<i32> = (0..n as i32).map(|i| (i * 37) % v).collect();
        let ids = Tensor::from_vec(ids, &[8, n / 8], &dev).unwrap();
        let g = Tensor::ones(&[8, n / 8, d], DType::F32, &dev).unwrap();
        let (t0, s0) = (thread_launches_total(), thread_launches("scatter_add"));
        let w = Tensor::embedding_backward(&g, &ids, v as usize).unwrap();
        assert_eq!(
            thread_launches_total() - t0,
            11,
            "{dev}: 10 sort launches and 1"
        );
        assert_eq!(thread_launches("scatter_add"), s0, "{dev}");
        let counts = w.to_vec::<f32>().unwrap();
        let per_row = |r: usize| (0..n).filter(|&i| (i * 37) % v as usize == r).count();
        for r in 0..v as usize {
            assert_eq!(counts[r * d], per_row(r) as f32, "{dev}: row {r}");
        }
    }
}
