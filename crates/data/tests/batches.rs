//! Mini-batches: seeded permutations, batch counts with and without drop_last, and batch tensors (values, shapes, dtypes) on every device.
use netcl_core_devices::test_devices;
use netcl_core_devices::DType;
use netcl_data::{labels_i32, BatchBuilder, Batches, DeviceData, FashionMnist, ImageLayout};

#[test]
fn batches_cover_every_item_once() {
    for (n, bs) in [(10, 3), (12, 4), (1, 5), (2000, 256), (7, 1)] {
        for shuffle in [None, Some(5u64)] {
            let b = Batches::new(n, bs, shuffle).unwrap();
            assert_eq!(b.len(), n.div_ceil(bs));
            let batches: Vec<&[usize]> = b.iter().collect();
            assert_eq!(batches.len(), b.len());
            for (i, batch) in batches.iter().enumerate() {
                let want = if i + 1 < batches.len() {
                    bs
                } else {
                    n - bs * (batches.len() - 1)
                };
                assert_eq!(batch.len(), want, "n {n} bs {bs} batch {i}");
            }
            let mut all: Vec<usize> = batches.concat();
            assert_eq!(all, b.order());
            all.sort_unstable();
            assert_eq!(all, (0..n).collect::<Vec<_>>());
            if shuffle.is_none() {
                assert_eq!(b.order(), (0..n).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn drop_last_and_edge_cases() {
    let b = Batches::new(10, 3, Some(1)).unwrap().drop_last(true);
    assert_eq!(b.len(), 3);
    assert!(b.iter().all(|x| x.len() == 3));
    assert_eq!((&b).into_iter().count(), 3);
    // Exact multiple: nothing dropped.
    assert_eq!(Batches::new(12, 3, None).unwrap().drop_last(true).len(), 4);
    // Fewer items than a batch.
    let b = Batches::new(2, 3, None).unwrap().drop_last(true);
    assert!(b.is_empty() && b.iter().next().is_none());
    assert!(Batches::new(0, 3, Some(1)).unwrap().is_empty());
    let msg = Batches::new(10, 0, None).unwrap_err().to_string();
    assert!(msg.contains("batch_size"), "{msg}");
}

#[test]
fn shuffle_is_seeded() {
    let a = Batches::new(1000, 32, Some(42)).unwrap();
    let b = Batches::new(1000, 32, Some(42)).unwrap();
    let c = Batches::new(1000, 32, Some(43)).unwrap();
    assert_eq!(a.order(), b.order());
    assert_ne!(a.order(), c.order());
    // Actually shuffled: few items stay in place, and the first batch is spread over the range.
    let fixed = a
        .order()
        .iter()
        .enumerate()
        .filter(|(i, &x)| *i == x)
        .count();
    assert!(fixed < 10, "{fixed} fixed points");
    let first: Vec<usize> = a.iter().next().unwrap().to_vec();
    assert!(first.iter().any(|&i| i >= 500) && first.iter().any(|&i| i < 500));
    // Pinned: the order for seed 42 (a change here means runs no longer repeat across versions).
    assert_eq!(&a.order()[..8], &[516, 515, 247, 958, 993, 674, 280, 657]);
}

/// Reference: (p / 255 - 0.2860) / 0.3530 in f64.
fn reference(p: u8) -> f64 {
    (p as f64 / 255.0 - 0.2860) / 0.3530
}

#[test]
fn batch_tensors_on_every_device() {
    let data = FashionMnist::embedded_subset().unwrap();
    let (images, labels) = (&data.train_images, &data.train_labels);
    let batches = Batches::new(data.n_train(), 96, Some(7)).unwrap();
    // A full batch and the last (short) one.
    let picks = [
        batches.iter().next().unwrap(),
        batches.iter().next_back().unwrap(),
    ];
    assert_eq!(picks[1].len(), 2000 - 96 * 20);
    for dev in test_devices().unwrap() {
        for layout in [ImageLayout::Flat, ImageLayout::Nchw] {
            let builder = BatchBuilder::new(layout);
            for idx in picks {
                let b = idx.len();
                let (x, y) = builder.build(images, labels, idx, &dev).unwrap();
                let want_shape = match layout {
                    ImageLayout::Flat => vec![b, 784],
                    ImageLayout::Nchw => vec![b, 1, 28, 28],
                };
                assert_eq!(x.shape(), &want_shape[..]);
                assert_eq!((x.dtype(), y.dtype()), (DType::F32, DType::I32));
                assert_eq!(y.shape(), &[b]);
                assert_eq!(x.device().spec(), dev.spec());
                let xv = x.to_vec::<f32>().unwrap();
                for (k, &i) in idx.iter().enumerate() {
                    for p in 0..784 {
                        let got = xv[k * 784 + p] as f64;
                        let want = reference(images[i * 784 + p]);
                        assert!(
                            (got - want).abs() < 1e-5,
                            "{}: item {i} px {p}: {got} vs {want}",
                            dev.label()
                        );
                    }
                }
                let yv = y.to_vec::<i32>().unwrap();
                let want: Vec<i32> = idx.iter().map(|&i| labels[i] as i32).collect();
                assert_eq!(yv, want);
            }
        }
    }
}

#[test]
fn normalization_and_errors() {
    let b = BatchBuilder::new(ImageLayout::Flat);
    assert!((b.value(0) as f64 - reference(0)).abs() < 1e-6);
    assert!((b.value(255) as f64 - reference(255)).abs() < 1e-6);
    let plain = BatchBuilder::new(ImageLayout::Flat)
        .normalize(0.0, 1.0)
        .unwrap();
    assert_eq!((plain.value(0), plain.value(255)), (0.0, 1.0));
    assert!(BatchBuilder::new(ImageLayout::Flat)
        .normalize(0.5, 0.0)
        .is_err());
    assert!(BatchBuilder::new(ImageLayout::Flat)
        .normalize(f32::NAN, 1.0)
        .is_err());

    // Other image sizes.
    let small = BatchBuilder::new(ImageLayout::Nchw)
        .image_size(2, 3)
        .unwrap();
    assert_eq!(small.x_shape(4), vec![4, 1, 2, 3]);
    let imgs: Vec<u8> = (0..12).collect();
    let x = small.images(&imgs, 2, &[1]).unwrap();
    assert_eq!(x.len(), 6);
    assert!((x[0] as f64 - reference(6)).abs() < 1e-6);

    let dev = netcl_core_devices::Device::host();
    let images = vec![0u8; 3 * 784];
    let labels = vec![1u8, 2, 3];
    let msg = b
        .build(&images, &labels, &[0, 3], &dev)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("index 3 out of range for 3"), "{msg}");
    let msg = b
        .build(&images[..784 * 2], &labels, &[0], &dev)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("3 images"), "{msg}");
    assert!(b.build(&images, &labels, &[], &dev).is_err());
    assert_eq!(labels_i32(&labels, &[2, 0]).unwrap(), vec![3, 1]);
    assert!(labels_i32(&labels, &[9]).is_err());
}

/// Device-resident batches equal host-built ones bit for bit (gathered: n > and <= the index-check limit).
#[test]
fn device_data_matches_host_batches() {
    let data = FashionMnist::embedded_subset().unwrap();
    for dev in test_devices().unwrap() {
        for (n, layout) in [(2000, ImageLayout::Flat), (300, ImageLayout::Nchw)] {
            let (images, labels) = (&data.train_images[..n * 784], &data.train_labels[..n]);
            let builder = BatchBuilder::new(layout);
            let on_dev = DeviceData::upload(&builder, images, labels, &dev).unwrap();
            assert_eq!(on_dev.len(), n);
            assert_eq!(on_dev.x().shape(), &builder.x_shape(n)[..]);
            for (shuffle, drop_last) in [(Some(3u64), false), (None, false), (Some(4), true)] {
                let batches = Batches::new(n, 128, shuffle).unwrap().drop_last(drop_last);
                let dev_batches = on_dev.batches(&batches).unwrap();
                assert_eq!(dev_batches.len(), batches.len());
                let mut seen = 0;
                for (idx, got) in batches.iter().zip(dev_batches) {
                    let (x, y) = got.unwrap();
                    let (wx, wy) = builder.build(images, labels, idx, &dev).unwrap();
                    assert_eq!(x.shape(), wx.shape());
                    assert_eq!(
                        x.to_vec::<f32>().unwrap(),
                        wx.to_vec::<f32>().unwrap(),
                        "{}",
                        dev.label()
                    );
                    assert_eq!(y.to_vec::<i32>().unwrap(), wy.to_vec::<i32>().unwrap());
                    seen += 1;
                }
                assert_eq!(seen, batches.len());
            }
        }
        let small = DeviceData::upload(
            &BatchBuilder::new(ImageLayout::Flat),
            &[0; 784 * 2],
            &[1, 2],
            &dev,
        )
        .unwrap();
        let msg = small
            .batches(&Batches::new(3, 2, None).unwrap())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("3 items for a split of 2"), "{msg}");
        let (x, y) = small.rows(1, 1).unwrap();
        assert_eq!(
            (x.shape(), y.to_vec::<i32>().unwrap()),
            (&[1, 784][..], vec![2])
        );
    }
}
