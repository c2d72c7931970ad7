//! Graph files as an attacker or a careless user edits them, on every OpenCL device: an edit the seal does not cover is refused, and edited plans re-sealed with this installation's key are validated before anything is compiled or allocated (indices, sizes, work sizes, netcl's own programs, version and device): each is an error naming what is wrong, never a panic, a hang or a replaced built-in program.
use netcl_core_devices::{opencl_test_devices, DType, Device, Error};
use netcl_graph::desc::{BufRef, Node, NodeArg};
use netcl_graph::{Graph, GraphDesc};
use netcl_ops::Tensor;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("netcl-graph-files-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The step: y = x * k + 1 (k a constant written inside the step), s = sum(y); input `x`,
/// outputs `y` and `s`. Returns the saved file's path and the input slot's tensor.
fn saved(dev: &Device, path: &Path) -> Tensor {
    let x = Tensor::from_vec((0..64).map(|i| i as f32).collect::<Vec<_>>(), &[64], dev).unwrap();
    let (g, _) = Graph::capture(dev, |c| {
        c.input("x", &x)?;
        let k = Tensor::from_vec(vec![0.5f32; 64], &[64], dev)?;
        let y = x.mul(&k)?.add_scalar(1.0)?;
        let s = y.sum_all()?;
        c.output("y", &y)?;
        c.output("s", &s)
    })
    .unwrap();
    g.save(path).unwrap();
    x
}

/// The file's description, changed by `edit` and sealed again with this installation's key.
fn resealed(path: &Path, out: &Path, edit: impl FnOnce(&mut GraphDesc)) {
    let mut d = GraphDesc::read(path).unwrap();
    edit(&mut d);
    d.save(out).unwrap();
}

/// The fused elementwise launch (x * k + 1) of a description.
fn fused(d: &mut GraphDesc) -> &mut Node {
    d.nodes
        .iter_mut()
        .find(|n| matches!(n, Node::Launch { kernel, .. } if kernel == "fused_contig"))
        .expect("a fused_contig launch")
}

/// A change to a description.
type Edit = Box<dyn Fn(&mut GraphDesc)>;

fn load_err(path: &Path, dev: &Device, x: &Tensor) -> String {
    match Graph::load(path, dev, &[("x", x)]) {
        Ok(_) => panic!("{dev}: {} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn edited_or_foreign_graph_files_are_refused_before_anything_runs() {
    let dir = dir();
    for dev in opencl_test_devices().unwrap() {
        let path = dir.join(format!("g{}.json", dev.ordinal()));
        let x = saved(&dev, &path);
        let edited = dir.join(format!("e{}.json", dev.ordinal()));
        // The original loads and replays: y = x / 2 + 1.
        let mut g = Graph::load(&path, &dev, &[("x", &x)]).unwrap();
        g.replay().unwrap();
        let y = g.output("y").unwrap().to_vec::<f32>().unwrap();
        assert_eq!(y[10], 6.0, "{dev}");

        // Edits the seal does not cover: the element count x4, a store offset, program text.
        let text = std::fs::read_to_string(&path).unwrap();
        let (head, json) = text.split_once('\n').unwrap();
        let mut d: GraphDesc = serde_json::from_str(json).unwrap();
        if let Node::Launch { args, .. } = fused(&mut d) {
            let Some(NodeArg::Bytes(n)) = args.last_mut() else {
                panic!("the element count comes last")
            };
            let count = u32::from_le_bytes(n[..4].try_into().unwrap());
            *n = (count * 4).to_le_bytes().to_vec();
        }
        let body = serde_json::to_string(&d).unwrap();
        std::fs::write(&edited, format!("{head}\n{body}")).unwrap();
        let e = load_err(&edited, &dev, &x);
        assert!(e.contains("seal does not match"), "{dev}: {e}");

        // Plans re-sealed with the key (a bug, or a user's own tool): validated field by field.
        let cases: Vec<(&str, Edit)> = vec![
            (
                "names External(9999)",
                Box::new(|d| {
                    if let Node::Launch { args, .. } = fused(d) {
                        args[0] = NodeArg::Buf(BufRef::External(9999));
                    }
                }),
            ),
            (
                "names Internal(9999)",
                Box::new(|d| {
                    if let Node::Launch { args, .. } = fused(d) {
                        args[0] = NodeArg::Buf(BufRef::Internal(9999));
                    }
                }),
            ),
            (
                "outside buffer 999",
                Box::new(|d| d.outputs[0].external = 999),
            ),
            (
                "outside buffers",
                Box::new(|d| {
                    d.externals.truncate(1);
                }),
            ),
            (
                "divides the global",
                Box::new(|d| {
                    if let Node::Launch { local, .. } = fused(d) {
                        *local = vec![3];
                    }
                }),
            ),
            (
                "more than 2^32 work-items",
                Box::new(|d| {
                    if let Node::Launch { global, .. } = fused(d) {
                        *global = vec![1 << 34];
                    }
                }),
            ),
            (
                "do not match the kernel's parameters",
                Box::new(|d| {
                    if let Node::Launch { args, .. } = fused(d) {
                        args.pop();
                    }
                }),
            ),
            (
                "write flags for",
                Box::new(|d| {
                    if let Node::Launch { writes, .. } = fused(d) {
                        writes.push(true);
                    }
                }),
            ),
            (
                "differ from the kernel's declaration",
                Box::new(|d| {
                    let own: Vec<usize> = (d.programs.iter().enumerate())
                        .filter(|(_, p)| !p.name.starts_with("fused_"))
                        .map(|(i, _)| i)
                        .collect();
                    let node = d.nodes.iter_mut().find(
                        |n| matches!(n, Node::Launch { program, .. } if own.contains(program)),
                    );
                    if let Some(Node::Launch { writes, .. }) = node {
                        writes.iter_mut().for_each(|w| *w = !*w);
                    }
                }),
            ),
            (
                "touches bytes",
                Box::new(|d| {
                    for n in &mut d.nodes {
                        if let Node::Write { offset, .. } = n {
                            *offset += 1 << 20;
                        }
                    }
                }),
            ),
            (
                "its text differs from this netcl's kernels/",
                Box::new(|d| {
                    let own = d
                        .programs
                        .iter_mut()
                        .find(|p| !p.name.starts_with("fused_"));
                    own.expect("a program of netcl's files").text += "\n#error edited\n";
                }),
            ),
            (
                "made by netcl 0.0.1",
                Box::new(|d| d.netcl_version = "0.0.1".into()),
            ),
            (
                "other kernels",
                Box::new(|d| d.kernels_sha256 = "00".repeat(32)),
            ),
            (
                "was captured on",
                Box::new(|d| d.device_id.driver_version += "-other"),
            ),
            (
                "does not fit its buffer",
                Box::new(|d| d.outputs[0].shape = vec![1 << 40]),
            ),
        ];
        for (want, edit) in cases {
            resealed(&path, &edited, edit);
            let e = load_err(&edited, &dev, &x);
            assert!(e.contains(want), "{dev}: expected {want:?}: {e}");
        }

        // A multi-byte character in an `#if 0` block of a generated program: read, built, run.
        resealed(&path, &edited, |d| {
            let p = d.programs.iter_mut().find(|p| p.name.starts_with("fused_"));
            let p = p.expect("the generated program");
            p.text = format!("#if 0\nkernel é ü\n#endif\n{}", p.text);
        });
        let mut g = Graph::load(&edited, &dev, &[("x", &x)]).unwrap();
        g.replay().unwrap();
        assert_eq!(g.output("y").unwrap().to_vec::<f32>().unwrap(), y, "{dev}");

        // A generated program's text changed (sealed): it builds as a program of its own (its
        // kernel returns at once, so y is not x / 2 + 1), not netcl's cached one of the same name
        // and options, and the same op outside the graph still runs netcl's.
        resealed(&path, &edited, |d| {
            let p = d.programs.iter_mut().find(|p| p.name.starts_with("fused_"));
            let p = p.expect("the generated program");
            p.text = p.text.replace("uint n) {", "uint n) { if (n > 0) return;");
        });
        let mut g = Graph::load(&edited, &dev, &[("x", &x)]).unwrap();
        g.replay().unwrap();
        let skipped = g.output("y").unwrap().to_vec::<f32>().unwrap();
        assert_ne!(skipped, y, "{dev}: the file's program did not run");
        let k = Tensor::from_vec(vec![0.5f32; 64], &[64], &dev).unwrap();
        let eager = x.mul(&k).unwrap().add_scalar(1.0).unwrap();
        assert_eq!(eager.to_vec::<f32>().unwrap(), y, "{dev}");

        // A missing binding fails before any program of the file is built or anything allocated.
        let e = Graph::load(&path, &dev, &[]).err().unwrap().to_string();
        assert!(e.contains("not bound"), "{dev}: {e}");
    }
    // Files that are not sealed graphs.
    let dev = &opencl_test_devices().unwrap()[0];
    let x = Tensor::zeros(&[64], DType::F32, dev).unwrap();
    let old = dir.join("v1.json");
    std::fs::write(&old, b"{\"schema_version\": 1, \"nodes\": []}").unwrap();
    let e = load_err(&old, dev, &x);
    assert!(e.contains("schema version 1 without a seal"), "{e}");
    std::fs::write(&old, b"netcl-graph 99 00\n{}").unwrap();
    assert!(load_err(&old, dev, &x).contains("schema version 99"));
    let fifo = dir.join("fifo.json");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|s| s.success()) {
        assert!(load_err(&fifo, dev, &x).contains("not a regular file"));
    }
    let missing = Graph::load(dir.join("missing.json"), dev, &[])
        .err()
        .unwrap();
    assert!(matches!(missing, Error::Io { .. }), "{missing}");
    let _ = std::fs::remove_dir_all(&dir);
}
