//! `--devices all|N|list`: which devices a data-parallel run uses, and the line that says so.
use netcl_core_devices::{Device, DeviceKind, Error, Result};

/// Preference among OpenCL device kinds for `all` and `N`: a GPU beats an accelerator beats a
/// CPU (a PoCL CPU device beside GPUs would be a slow rank that every step waits for).
fn rank_of(kind: DeviceKind) -> u8 {
    match kind {
        DeviceKind::Gpu => 0,
        DeviceKind::Accelerator => 1,
        DeviceKind::Cpu => 2,
        DeviceKind::Other | DeviceKind::Host => 3,
    }
}

/// What a spec picks from OpenCL devices of `kinds` (in discovery order): positions into
/// `kinds` for `all` and `N` (every device of the best kind present, or its first N), `None`
/// for a list of specs (resolved by [`Device::parse`]). An empty `kinds` means no OpenCL
/// device: `all` and `1` then mean the host, returned as an empty selection.
pub fn select_of_kinds(spec: &str, kinds: &[DeviceKind]) -> Result<Option<Vec<usize>>> {
    let spec = spec.trim();
    let best = kinds.iter().map(|&k| rank_of(k)).min();
    let of_best: Vec<usize> = (0..kinds.len())
        .filter(|&i| Some(rank_of(kinds[i])) == best)
        .collect();
    if spec == "all" {
        return Ok(Some(of_best));
    }
    let Ok(n) = spec.parse::<usize>() else {
        return Ok(None);
    };
    let have = of_best.len().max(1);
    if n == 0 || n > have {
        let what = match best {
            None => "no OpenCL device: the host is the only device".to_string(),
            Some(_) => format!(
                "{} {} device(s) present{}",
                of_best.len(),
                kinds[of_best[0]].name(),
                if of_best.len() < kinds.len() {
                    format!(
                        " (and {} of other kinds: list them by spec to use them)",
                        kinds.len() - of_best.len()
                    )
                } else {
                    String::new()
                }
            ),
        };
        return Err(Error::invalid(
            "--devices",
            format!("{n} devices asked for; {what}"),
        ));
    }
    Ok(Some(of_best[..n.min(of_best.len())].to_vec()))
}

/// The devices `spec` names: `all` (every OpenCL device of the best kind present: the GPUs
/// when there are any, else the accelerators, else the CPUs; the host without OpenCL), `N` (the
/// first N of those), or a comma-separated list of device specs (`opencl:0:1,host`,
/// `gpu:0,cpu:0`; see [`Device::parse`]), which may mix kinds.
pub fn parse_devices(spec: &str) -> Result<Vec<Device>> {
    let cl = Device::opencl_devices();
    let kinds: Vec<DeviceKind> = cl.iter().map(Device::kind).collect();
    let devices = match select_of_kinds(spec, &kinds)? {
        Some(picked) if picked.is_empty() => vec![Device::host()],
        Some(picked) => picked.into_iter().map(|i| cl[i].clone()).collect(),
        None => spec
            .trim()
            .split(',')
            .map(Device::parse)
            .collect::<Result<Vec<_>>>()?,
    };
    for (i, d) in devices.iter().enumerate() {
        if devices[..i].contains(d) {
            return Err(Error::invalid(
                "--devices",
                format!("{d} is listed twice in {spec:?}"),
            ));
        }
    }
    Ok(devices)
}

/// Whether the devices differ (kind or model), so equal shares of a batch would leave the fast
/// ones waiting: such a group should be split by measured speed
/// ([`crate::DataParallel::calibrate`]) unless the user gave weights.
pub fn mixed_devices(devices: &[Device]) -> bool {
    devices.windows(2).any(|w| {
        w[0].kind() != w[1].kind() || w[0].is_host() != w[1].is_host() || {
            let (a, b) = (w[0].info(), w[1].info());
            a.name != b.name || a.compute_units != b.compute_units
        }
    })
}

/// One line naming the chosen devices and, when `all` or `N` left some out, which and how to
/// use them anyway (printed once, by the first rank).
pub fn describe_devices(spec: &str, chosen: &[Device]) -> String {
    let names: Vec<String> = chosen.iter().map(Device::label).collect();
    let left: Vec<String> = Device::opencl_devices()
        .iter()
        .filter(|d| !chosen.contains(d))
        .map(Device::label)
        .collect();
    let mut line = format!(
        "devices ({spec}): {} rank(s): {}",
        chosen.len(),
        names.join(", ")
    );
    if !left.is_empty() && !spec.contains(',') && !spec.contains(':') {
        line += &format!(
            "; not used: {} (list devices by spec to include them)",
            left.join(", ")
        );
    }
    line
}

/// Removes `--devices X` from `args` and returns `X` (None when absent).
pub fn take_devices_flag(args: &mut Vec<String>) -> Result<Option<String>> {
    let Some(i) = args.iter().position(|a| a == "--devices") else {
        return Ok(None);
    };
    if i + 1 >= args.len() {
        return Err(Error::invalid(
            "--devices",
            "needs a value: all, N, or a list such as opencl:0:0,opencl:0:1",
        ));
    }
    let v = args.remove(i + 1);
    args.remove(i);
    Ok(Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeviceKind::{Cpu, Gpu};

    #[test]
    fn all_and_n_take_the_best_kind() {
        // A machine with a PoCL CPU device listed first and four GPUs after it.
        let kinds = [Cpu, Gpu, Gpu, Gpu, Gpu];
        assert_eq!(
            select_of_kinds("all", &kinds).unwrap(),
            Some(vec![1, 2, 3, 4])
        );
        assert_eq!(select_of_kinds("2", &kinds).unwrap(), Some(vec![1, 2]));
        assert_eq!(
            select_of_kinds(" 4 ", &kinds).unwrap(),
            Some(vec![1, 2, 3, 4])
        );
        let five = select_of_kinds("5", &kinds).unwrap_err().to_string();
        assert!(
            five.contains("4 gpu device(s)") && five.contains("1 of other kinds"),
            "{five}"
        );
        assert!(select_of_kinds("0", &kinds).is_err());
        // CPUs only when there is no GPU.
        assert_eq!(
            select_of_kinds("all", &[Cpu, Cpu]).unwrap(),
            Some(vec![0, 1])
        );
        assert_eq!(select_of_kinds("1", &[Cpu, Cpu]).unwrap(), Some(vec![0]));
        // No OpenCL device: the host, for `all` and `1` only.
        assert_eq!(select_of_kinds("all", &[]).unwrap(), Some(vec![]));
        assert_eq!(select_of_kinds("1", &[]).unwrap(), Some(vec![]));
        assert!(select_of_kinds("2", &[]).is_err());
        // A list is resolved by spec.
        assert_eq!(select_of_kinds("gpu:0,cpu:0", &kinds).unwrap(), None);
    }

    #[test]
    fn specs_on_this_machine() {
        let cl = Device::opencl_devices();
        let all = parse_devices("all").unwrap();
        assert!(!all.is_empty() && all.len() <= cl.len().max(1));
        assert!(!mixed_devices(&all));
        assert_eq!(parse_devices("1").unwrap().len(), 1);
        assert_eq!(parse_devices("host").unwrap(), vec![Device::host()]);
        assert!(parse_devices("host,host").is_err());
        assert!(parse_devices("0").is_err());
        assert!(parse_devices("99").is_err());
        if let Some(d) = cl.first() {
            let mix = parse_devices(&format!("host,{}", d.spec())).unwrap();
            assert!(mixed_devices(&mix));
            assert!(describe_devices("host,x", &mix).contains("2 rank(s)"));
        }
        let mut args: Vec<String> = ["--epochs", "1", "--devices", "2", "--lr", "0.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(take_devices_flag(&mut args).unwrap().as_deref(), Some("2"));
        assert_eq!(args, vec!["--epochs", "1", "--lr", "0.1"]);
    }
}
