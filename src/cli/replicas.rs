//! `serve --data-parallel N --devices LIST`: which device each replica runs on.
//!
//! One replica (the default) runs where `--device` says, `auto` included. Several run one per
//! CUDA device: `--devices 0,2` names them (N defaults to their count), `--devices all` takes
//! every visible one, and without `--devices` the first N (from `--device cuda:K`'s K on).
//! `--device cpu --data-parallel N` runs N CPU replicas (for tests), sharing the cores.

use qwen3_vl::DeviceRequest;

/// `--devices`: CUDA ordinals, or every visible device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceList {
    All,
    Ordinals(Vec<usize>),
}

/// Parses `all` or `0,1,3` (no repeats).
pub fn parse_devices(s: &str) -> Result<DeviceList, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(DeviceList::All);
    }
    let mut v: Vec<usize> = Vec::new();
    for part in s.split(',') {
        let o = part.trim().trim_start_matches("cuda:").parse::<usize>().map_err(|_| format!("'{}' is not a CUDA device ordinal: expected all or a list like 0,1,2", part.trim()))?;
        if v.contains(&o) {
            return Err(format!("device {} is listed twice (one replica per device)", o));
        }
        v.push(o);
    }
    Ok(DeviceList::Ordinals(v))
}

/// `--data-parallel`: 1 to 64 replicas.
pub fn parse_replicas(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(v) if (1..=64).contains(&v) => Ok(v),
        _ => Err("must be an integer from 1 to 64".into()),
    }
}

/// The device of each replica. `visible` counts the CUDA devices (asked only when needed);
/// errors name the flags.
pub fn replica_devices(device: DeviceRequest, n: Option<usize>, devices: Option<&DeviceList>, visible: &dyn Fn() -> Result<usize, String>) -> Result<Vec<DeviceRequest>, String> {
    let count = || visible().map_err(|e| format!("--data-parallel needs CUDA devices: {} (--device cpu runs CPU replicas)", e));
    match (device, devices) {
        (DeviceRequest::Cpu, Some(_)) => Err("--devices picks CUDA devices; with --device cpu give the number of CPU replicas with --data-parallel".into()),
        (DeviceRequest::Cpu, None) => Ok(vec![DeviceRequest::Cpu; n.unwrap_or(1)]),
        (DeviceRequest::Cuda(k), Some(_)) if k != 0 => Err(format!("--device {} and --devices both pick devices: give the devices with --devices only", device)),
        (_, Some(list)) => {
            let ordinals = match list {
                DeviceList::All => (0..count()?).collect(),
                DeviceList::Ordinals(v) => v.clone(),
            };
            if ordinals.is_empty() {
                return Err("--devices all: no CUDA device is visible".into());
            }
            if let Some(n) = n.filter(|&n| n != ordinals.len()) {
                return Err(format!("--data-parallel {} but --devices names {} device{}: one replica per device", n, ordinals.len(), if ordinals.len() == 1 { "" } else { "s" }));
            }
            if let DeviceList::Ordinals(v) = list {
                let c = count()?;
                if let Some(bad) = v.iter().find(|&&o| o >= c) {
                    return Err(format!("--devices {}: no CUDA device {} (this process sees {})", v.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(","), bad, c));
                }
            }
            Ok(ordinals.into_iter().map(DeviceRequest::Cuda).collect())
        }
        (_, None) if n.unwrap_or(1) == 1 => Ok(vec![device]),
        (_, None) => {
            let n = n.unwrap_or(1);
            let first = match device {
                DeviceRequest::Cuda(k) => k,
                _ => 0,
            };
            let c = count()?;
            if first + n > c {
                return Err(format!("--data-parallel {} needs {} CUDA devices from {} on; this process sees {} (--devices picks them, --device cpu runs CPU replicas)", n, n, DeviceRequest::Cuda(first), c));
            }
            Ok((first..first + n).map(DeviceRequest::Cuda).collect())
        }
    }
}

/// CPU threads per replica: `--threads` as given, else the cores shared out among CPU
/// replicas (at least one each); `None` leaves the backend's default (all cores).
pub fn cpu_threads(threads: Option<usize>, devices: &[DeviceRequest]) -> Option<usize> {
    let cpu = devices.iter().filter(|d| **d == DeviceRequest::Cpu).count();
    match threads {
        Some(t) => Some(t),
        None if cpu > 1 => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Some((cores / cpu).max(1))
        }
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DeviceRequest::{Auto, Cpu, Cuda};

    fn two() -> Result<usize, String> {
        Ok(2)
    }

    fn none() -> Result<usize, String> {
        Err("no usable CUDA device".into())
    }

    fn list(s: &str) -> DeviceList {
        parse_devices(s).unwrap()
    }

    #[test]
    fn device_lists_parse() {
        assert_eq!(list("all"), DeviceList::All);
        assert_eq!(list("0, 2,cuda:3"), DeviceList::Ordinals(vec![0, 2, 3]));
        assert!(parse_devices("0,0").unwrap_err().contains("twice"));
        assert!(parse_devices("0,x").unwrap_err().contains("'x'"));
        assert!(parse_devices("").is_err());
        assert!(parse_replicas("0").is_err() && parse_replicas("65").is_err());
    }

    #[test]
    fn one_replica_runs_where_device_says() {
        for d in [Auto, Cpu, Cuda(0), Cuda(1)] {
            assert_eq!(replica_devices(d, None, None, &none), Ok(vec![d]));
            assert_eq!(replica_devices(d, Some(1), None, &none), Ok(vec![d]));
        }
    }

    #[test]
    fn several_replicas_take_one_device_each() {
        assert_eq!(replica_devices(Auto, Some(2), None, &two), Ok(vec![Cuda(0), Cuda(1)]));
        assert_eq!(replica_devices(Cuda(1), Some(1), None, &two), Ok(vec![Cuda(1)]));
        assert_eq!(replica_devices(Auto, None, Some(&list("all")), &two), Ok(vec![Cuda(0), Cuda(1)]));
        assert_eq!(replica_devices(Cuda(0), None, Some(&list("1,0")), &two), Ok(vec![Cuda(1), Cuda(0)]));
        assert_eq!(replica_devices(Cpu, Some(3), None, &none), Ok(vec![Cpu, Cpu, Cpu]));
    }

    #[test]
    fn impossible_combinations_are_refused_by_name() {
        let e = |d, n, l: Option<&str>, v: &dyn Fn() -> Result<usize, String>| replica_devices(d, n, l.map(list).as_ref(), v).unwrap_err();
        assert!(e(Auto, Some(3), None, &two).contains("--data-parallel 3 needs 3 CUDA devices"));
        assert!(e(Cuda(1), Some(2), None, &two).contains("from cuda:1 on; this process sees 2"));
        assert!(e(Auto, Some(2), None, &none).contains("no usable CUDA device"));
        assert!(e(Auto, Some(3), Some("0,1"), &two).contains("--devices names 2 devices"));
        assert!(e(Auto, None, Some("0,2"), &two).contains("no CUDA device 2"));
        assert!(e(Cpu, None, Some("0"), &two).contains("--devices picks CUDA devices"));
        assert!(e(Cuda(1), None, Some("0"), &two).contains("--device cuda:1 and --devices"));
        assert!(e(Auto, None, Some("all"), &|| Ok(0)).contains("no CUDA device is visible"));
    }

    #[test]
    fn cpu_replicas_share_the_cores() {
        assert_eq!(cpu_threads(Some(3), &[Cpu, Cpu]), Some(3));
        assert_eq!(cpu_threads(None, &[Cpu]), None);
        assert_eq!(cpu_threads(None, &[Cuda(0), Cuda(1)]), None);
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(cpu_threads(None, &[Cpu, Cpu]), Some((cores / 2).max(1)));
    }
}
