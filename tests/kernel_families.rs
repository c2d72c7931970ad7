//! One tiny case of every kernel family (every kernels/*.cl file a device without tensor cores runs, and the generated fused kernels), forward and backward, on every OpenCL device against the host. Small enough to run under Oclgrind's memory and race checks (.ci/oclgrind), which is what it is for; on PoCL it is one more cross-device check.
use netcl::autograd::{Tape, Var};
use netcl::ops::testing::random_tensor;
use netcl::ops::{
    Conv2dParams, DecodeBlock, KvWrite, Pool2dParams, RmsScale, RopeFreqs, RopePositions, RopeStyle,
};
use netcl::prelude::*;
use netcl_core_devices::opencl_test_devices;

/// A case: its outputs (forward values and gradients) computed on a device from the same host
/// inputs.
type Case = fn(&Device) -> Result<Vec<Tensor>>;

/// Host values of `shape` in [-1, 1), moved to `dev`.
fn rnd(dev: &Device, shape: &[usize], seed: u64) -> Result<Tensor> {
    random_tensor(DType::F32, shape, -1.0, 1.0, seed).to_device(dev)
}

fn ids(dev: &Device, v: Vec<i32>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(v, shape, dev)
}

/// `f` of leaves made from `inputs` on a tape, the output and the gradient of each leaf for
/// sum(output * a fixed projection).
fn grads(
    dev: &Device,
    inputs: &[Tensor],
    f: impl FnOnce(&[Var]) -> Result<Var>,
) -> Result<Vec<Tensor>> {
    let tape = Tape::new();
    let leaves = inputs
        .iter()
        .map(|t| tape.leaf(t))
        .collect::<Result<Vec<_>>>()?;
    let y = f(&leaves)?;
    let proj = rnd(dev, y.shape(), 99)?.to_dtype(y.dtype())?;
    let g = tape.backward_with(&y, &proj)?;
    let mut out = vec![y.value().clone()];
    for l in &leaves {
        out.push(
            g.get(l)
                .cloned()
                .unwrap_or(Tensor::zeros(&[1], DType::F32, dev)?),
        );
    }
    Ok(out)
}

fn elementwise_and_copies(dev: &Device) -> Result<Vec<Tensor>> {
    let (a, b) = (rnd(dev, &[4, 6], 1)?, rnd(dev, &[6], 2)?);
    let mut out = grads(dev, &[a.clone(), b.clone()], |v| {
        v[0].mul(&v[1])?.tanh()?.add_scalar(0.5)?.relu()
    })?;
    out.push(a.transpose(0, 1)?.contiguous()?);
    out.push(a.to_dtype(DType::F16)?.to_dtype(DType::F32)?);
    out.push(a.to_dtype(DType::BF16)?.to_dtype(DType::F32)?);
    Ok(out)
}

fn random_and_dropout(dev: &Device) -> Result<Vec<Tensor>> {
    let mut g = Generator::new(7);
    let r = Tensor::randn(&[5, 7], DType::F32, dev, &mut g)?;
    let u = Tensor::rand(&[9], DType::F32, dev, &mut g)?;
    let (y, mask) = rnd(dev, &[6, 5], 3)?.dropout(0.3, &mut g)?;
    Ok(vec![r, u, y, mask])
}

fn matmul(dev: &Device) -> Result<Vec<Tensor>> {
    let (a, b) = (rnd(dev, &[2, 5, 7], 4)?, rnd(dev, &[7, 3], 5)?);
    grads(dev, &[a, b], |v| v[0].matmul(&v[1]))
}

fn index(dev: &Device) -> Result<Vec<Tensor>> {
    let table = rnd(dev, &[6, 4], 6)?;
    let i = ids(dev, vec![1, 5, 0, 5], &[2, 2])?;
    let sel = ids(dev, vec![3, 0, 3], &[3])?;
    let mut out = grads(dev, std::slice::from_ref(&table), |v| {
        v[0].embedding(&i)?
            .sum(&[1], false)?
            .add(&v[0].index_select(0, &sel)?.narrow(0, 0, 2)?)
    })?;
    let src = rnd(dev, &[6, 4], 7)?;
    let at = ids(
        dev,
        vec![
            0, 1, 2, 3, 0, 1, 2, 3, 1, 1, 1, 1, 2, 2, 0, 0, 3, 3, 3, 3, 0, 1, 0, 1,
        ],
        &[6, 4],
    )?;
    out.push(table.gather(0, &ids(dev, vec![5, 0, 1, 2], &[1, 4])?)?);
    out.push(table.scatter_add(
        0,
        &ids(dev, vec![5, 0, 1, 2], &[1, 4])?,
        &src.narrow(0, 0, 1)?,
    )?);
    out.push(table.index_add(0, &ids(dev, vec![2, 2, 0, 1, 5, 4], &[6])?, &src)?);
    out.push(Tensor::zeros(&[4, 4], DType::F32, dev)?.scatter_add(
        0,
        &at.narrow(0, 0, 4)?,
        &src.narrow(0, 0, 4)?,
    )?);
    Ok(out)
}

fn shape(dev: &Device) -> Result<Vec<Tensor>> {
    let (a, b) = (rnd(dev, &[2, 3], 8)?, rnd(dev, &[2, 5], 9)?);
    let mut out = grads(dev, &[a.clone(), b.clone()], |v| {
        Var::concat(&[&v[0], &v[1]], 1)?.pad(&[(1, 0), (0, 2)], 0.5)
    })?;
    out.push(rnd(dev, &[4, 5], 10)?.triu(1)?);
    out.push(rnd(dev, &[4, 5], 10)?.tril(0)?);
    out.push(Tensor::one_hot(
        &ids(dev, vec![2, 0, 3], &[3])?,
        4,
        DType::F32,
    )?);
    Ok(out)
}

fn rope(dev: &Device) -> Result<Vec<Tensor>> {
    let x = rnd(dev, &[1, 3, 2, 8], 11)?;
    let mut out = grads(dev, std::slice::from_ref(&x), |v| v[0].rope(2, 10000.0))?;
    out.push(x.rope_with_freqs(
        RopeStyle::Halves,
        &RopePositions::Offset(1),
        &RopeFreqs::Theta(500.0),
    )?);
    Ok(out)
}

fn reduce(dev: &Device) -> Result<Vec<Tensor>> {
    let x = rnd(dev, &[3, 4, 5], 12)?;
    let mut out = grads(dev, std::slice::from_ref(&x), |v| {
        v[0].sum(&[1], false)?
            .add(&v[0].max(&[1], false)?)?
            .add(&v[0].logsumexp(&[1], false)?)?
            .add(&v[0].var(&[1], 1.0, false)?)
    })?;
    out.push(x.argmax(&[2], false)?.to_dtype(DType::F32)?);
    out.push(x.mean_all()?);
    Ok(out)
}

fn softmax(dev: &Device) -> Result<Vec<Tensor>> {
    let x = rnd(dev, &[3, 7], 13)?;
    let t = ids(dev, vec![6, 0, -100], &[3])?;
    let mut out = grads(dev, std::slice::from_ref(&x), |v| {
        v[0].softmax(1)?.add(&v[0].log_softmax(0)?)
    })?;
    out.extend(grads(dev, &[x], |v| v[0].cross_entropy(&t, Some(-100)))?);
    Ok(out)
}

fn norms(dev: &Device) -> Result<Vec<Tensor>> {
    let (x, w, b) = (
        rnd(dev, &[3, 6], 14)?,
        rnd(dev, &[6], 15)?,
        rnd(dev, &[6], 16)?,
    );
    let mut out = grads(dev, &[x.clone(), w.clone(), b.clone()], |v| {
        v[0].layer_norm(&[6], Some(&v[1]), Some(&v[2]), 1e-5)
    })?;
    out.extend(grads(dev, &[x, w], |v| {
        v[0].rms_norm(&[6], Some(&v[1]), 1e-6)
    })?);
    let img = rnd(dev, &[2, 3, 2, 2], 17)?;
    let (g, bias) = (rnd(dev, &[3], 18)?, rnd(dev, &[3], 19)?);
    out.extend(grads(dev, &[img, g, bias], |v| {
        v[0].batch_norm_train(Some(&v[1]), Some(&v[2]), None, None, 0.1, 1e-5)
    })?);
    Ok(out)
}

fn conv_and_pool(dev: &Device) -> Result<Vec<Tensor>> {
    let (x, w, b) = (
        rnd(dev, &[1, 2, 5, 5], 20)?,
        rnd(dev, &[3, 2, 3, 3], 21)?,
        rnd(dev, &[3], 22)?,
    );
    let conv = Conv2dParams {
        padding: (1, 1),
        ..Default::default()
    };
    let pool = Pool2dParams::new((2, 2));
    let mut out = grads(dev, &[x, w, b], |v| {
        v[0].conv2d(&v[1], Some(&v[2]), conv)?.max_pool2d(pool)
    })?;
    let y = rnd(dev, &[1, 2, 5, 5], 23)?;
    out.extend(grads(dev, &[y], |v| {
        v[0].avg_pool2d(pool, true)?
            .sum_all()?
            .add(&v[0].adaptive_avg_pool2d((2, 3))?.sum_all()?)
    })?);
    Ok(out)
}

fn sort(dev: &Device) -> Result<Vec<Tensor>> {
    let (v, i) = ids(dev, vec![5, -3, 5, 0, 9, -3, 2], &[7])?.sort_stable()?;
    Ok(vec![v.to_dtype(DType::F32)?, i.to_dtype(DType::F32)?])
}

fn attention(dev: &Device) -> Result<Vec<Tensor>> {
    let (q, k, v) = (
        rnd(dev, &[1, 2, 3, 4], 24)?,
        rnd(dev, &[1, 2, 5, 4], 25)?,
        rnd(dev, &[1, 2, 5, 4], 26)?,
    );
    let mut out = grads(dev, &[q.clone(), k.clone(), v.clone()], |x| {
        Var::flash_attention(&x[0], &x[1], &x[2], true, None)
    })?;
    out.extend(grads(dev, &[q.clone(), k.clone(), v.clone()], |x| {
        Var::attention(&x[0], &x[1], &x[2], None, false, None)
    })?);
    // A sliding window of 2 keys (Mistral's).
    out.extend(grads(dev, &[q, k, v], |x| {
        Var::flash_attention_window(&x[0], &x[1], &x[2], Some(2), None)
    })?);
    Ok(out)
}

fn decode(dev: &Device) -> Result<Vec<Tensor>> {
    let x = rnd(dev, &[2, 8], 27)?;
    let (w, up) = (rnd(dev, &[6, 8], 28)?, rnd(dev, &[6, 8], 29)?);
    let norm = RmsScale {
        weight: rnd(dev, &[8], 30)?,
        eps: 1e-6,
    };
    let cache = rnd(dev, &[2, 1, 6, 4], 31)?;
    let at = ids(dev, vec![3], &[1])?;
    Ok(vec![
        x.decode_linear(Some(&norm), &w, None)?,
        x.decode_swiglu(None, &w, &up)?,
        x.decode_attention(&cache, &cache, &at, None, 2)?,
        x.decode_attention_window(&cache, &cache, &at, None, 2, Some(2))?,
        x.decode_swiglu_biased(Some(&norm), &w, &up, Some(&rnd(dev, &[12], 32)?))?,
        decode_block(dev)?,
    ])
}

/// A whole block in one persistent kernel (GQA: 2 heads over 1 kv head of 4 dims; MLP of 12).
fn decode_block(dev: &Device) -> Result<Tensor> {
    let norm = |seed| -> Result<RmsScale> {
        Ok(RmsScale {
            weight: rnd(dev, &[8], seed)?,
            eps: 1e-6,
        })
    };
    let block = DecodeBlock {
        attention_norm: norm(33)?,
        wq: rnd(dev, &[8, 8], 34)?,
        wk: rnd(dev, &[4, 8], 35)?,
        wv: rnd(dev, &[4, 8], 36)?,
        qkv_bias: None,
        kv: KvWrite {
            k_cache: rnd(dev, &[2, 1, 6, 4], 37)?,
            v_cache: rnd(dev, &[2, 1, 6, 4], 38)?,
            pos: ids(dev, vec![3], &[1])?,
            pads: None,
            style: RopeStyle::Halves,
            freqs: RopeFreqs::Theta(10000.0),
        },
        heads: 2,
        window: None,
        wo: rnd(dev, &[8, 8], 39)?,
        wo_bias: Some(rnd(dev, &[8], 40)?),
        ffn_norm: norm(41)?,
        gate: rnd(dev, &[12, 8], 42)?,
        up: rnd(dev, &[12, 8], 43)?,
        gate_up_bias: None,
        down: rnd(dev, &[8, 12], 44)?,
        down_bias: None,
    };
    rnd(dev, &[2, 8], 45)?.decode_block(&block)
}

#[test]
fn every_kernel_family_matches_the_host_on_tiny_shapes() {
    let cases: [(&str, Case); 12] = [
        ("elementwise and copies", elementwise_and_copies),
        ("random and dropout", random_and_dropout),
        ("matmul", matmul),
        ("index", index),
        ("shape", shape),
        ("rope", rope),
        ("reduce", reduce),
        ("softmax and cross-entropy", softmax),
        ("norms", norms),
        ("conv and pool", conv_and_pool),
        ("sort", sort),
        ("attention", attention),
    ];
    let host = Device::host();
    for dev in opencl_test_devices().unwrap() {
        for (name, case) in cases.iter().chain([&("decode", decode as Case)]) {
            let want = case(&host).unwrap_or_else(|e| panic!("{name} on the host: {e}"));
            let got = case(&dev).unwrap_or_else(|e| panic!("{name} on {dev}: {e}"));
            assert_eq!(got.len(), want.len(), "{name}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.shape(), w.shape(), "{name} output {i} on {dev}");
                let (g, w) = (g.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
                for (j, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{name} output {i}[{j}] on {dev}: {a} vs host {b}"
                    );
                }
            }
        }
    }
}
