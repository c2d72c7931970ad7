//! `--devices all|N|list`: which devices a data-parallel run uses.
use netcl_core_devices::{Device, Error, Result};

/// The devices `spec` names: `all` (every OpenCL device, else the host), `N` (the first N
/// OpenCL devices), or a comma-separated list of device specs (`opencl:0:1,host`, `gpu:0,gpu:1`;
/// see [`Device::parse`]).
pub fn parse_devices(spec: &str) -> Result<Vec<Device>> {
    let spec = spec.trim();
    let cl = Device::opencl_devices();
    let devices = if spec == "all" {
        if cl.is_empty() {
            vec![Device::host()]
        } else {
            cl
        }
    } else if let Ok(n) = spec.parse::<usize>() {
        if n == 0 || n > cl.len().max(1) || (cl.is_empty() && n > 1) {
            return Err(Error::invalid(
                "--devices",
                format!(
                    "{n} devices asked for; {} OpenCL device(s) present",
                    cl.len()
                ),
            ));
        }
        if cl.is_empty() {
            vec![Device::host()]
        } else {
            cl[..n].to_vec()
        }
    } else {
        spec.split(',')
            .map(Device::parse)
            .collect::<Result<Vec<_>>>()?
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

    #[test]
    fn specs() {
        let cl = Device::opencl_devices();
        let all = parse_devices("all").unwrap();
        assert_eq!(all.len(), cl.len().max(1));
        assert_eq!(parse_devices("1").unwrap().len(), 1);
        assert_eq!(parse_devices("host").unwrap(), vec![Device::host()]);
        assert!(parse_devices("host,host").is_err());
        assert!(parse_devices("0").is_err());
        assert!(parse_devices("99").is_err());
        let mut args: Vec<String> = ["--epochs", "1", "--devices", "2", "--lr", "0.1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(take_devices_flag(&mut args).unwrap().as_deref(), Some("2"));
        assert_eq!(args, vec!["--epochs", "1", "--lr", "0.1"]);
    }
}
