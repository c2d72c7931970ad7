//! layer_norm / rms_norm without statistics (inference) give the training forward's output bit for bit on every device.
use netcl_core_devices::test_devices;
use netcl_ops::testing::random_tensor;
use netcl_ops::DType;

#[test]
fn inference_norms_equal_the_training_forward() {
    for dev in test_devices().unwrap() {
        for (shape, ns) in [
            (vec![3usize, 5, 8], vec![8usize]),
            (vec![4, 300], vec![300]),
            (vec![2, 3, 4], vec![3, 4]),
        ] {
            let x = random_tensor(DType::F32, &shape, -2.0, 2.0, 1)
                .to_device(&dev)
                .unwrap();
            let w = random_tensor(DType::F32, &ns, -1.0, 1.0, 2)
                .to_device(&dev)
                .unwrap();
            let b = random_tensor(DType::F32, &ns, -1.0, 1.0, 3)
                .to_device(&dev)
                .unwrap();
            let (y, _, _) = x.layer_norm(&ns, Some(&w), Some(&b), 1e-5).unwrap();
            let yi = x
                .layer_norm_inference(&ns, Some(&w), Some(&b), 1e-5)
                .unwrap();
            assert_eq!(
                y.to_vec::<f32>().unwrap(),
                yi.to_vec::<f32>().unwrap(),
                "{dev} {shape:?}"
            );
            let (y, rstd) = x.rms_norm(&ns, Some(&w), 1e-5).unwrap();
            assert_eq!(rstd.shape(), &shape[..shape.len() - ns.len()]);
            let yi = x.rms_norm_inference(&ns, Some(&w), 1e-5).unwrap();
            assert_eq!(
                y.to_vec::<f32>().unwrap(),
                yi.to_vec::<f32>().unwrap(),
                "{dev} {shape:?}"
            );
        }
    }
}
