//! Which devices a run computes on: the command line's, the manifest's, or the chosen backend's
//! first; and which of them each replica or stage gets.

use super::{RunError, RunOptions};
use crate::backend::{BackendKind, DeviceSpec};
use crate::manifest::Manifest;

/// The devices to run on: `--devices`, else the manifest's, else (when `--backend` chose a
/// backend the manifest's devices do not belong to) that backend's first device.
pub(super) fn run_devices(
    manifest: &Manifest,
    options: &RunOptions,
    backend: BackendKind,
) -> Result<Vec<DeviceSpec>, RunError> {
    let parse = |names: &[String], origin: &str| {
        names
            .iter()
            .map(|d| {
                d.parse::<DeviceSpec>().map_err(|e| e.to_string()).and_then(|s| s.check_backend(backend).map(|_| s))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| RunError::Config(format!("{origin}: {m}")))
    };
    if let Some(names) = &options.devices {
        return parse(names, "--devices");
    }
    let from_manifest =
        parse(&manifest.experiment.devices, &format!("{}: [experiment] devices", manifest.source.display()));
    match (from_manifest, options.backend) {
        (Err(_), Some(_)) => Ok(vec![DeviceSpec::first_of(backend)]),
        (result, _) => result,
    }
}
/// The devices of `n` replicas or stages: on a CPU backend (one device) the same device `n`
/// times; on a GPU backend the first `n` devices listed in `[experiment] devices`.
pub(super) fn devices_for<D: Clone>(available: &[D], n: usize, cpu: bool) -> Result<Vec<D>, String> {
    match (cpu, available.len() >= n) {
        (true, _) => Ok(vec![available[0].clone(); n]),
        (false, true) => Ok(available[..n].to_vec()),
        (false, false) => Err(format!(
            "the strategy needs {n} devices but the run has {} ([experiment] devices, or --devices): list one per replica or stage, e.g. `--devices cuda:0,cuda:1`, or one GPU twice to share it",
            available.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn manifest(devices: &str) -> Manifest {
        let text = format!("[experiment]\nname = \"d\"\nbackend = \"flex\"\ndevices = {devices}\n[[models]]\nname = \"cnn\"\narchitecture = \"cnn\"\n");
        Manifest::parse(&text, Path::new("d.toml")).unwrap()
    }

    fn resolve(devices: &str, backend: Option<BackendKind>, flag: Option<&[&str]>) -> Result<Vec<String>, String> {
        let m = manifest(devices);
        let options = RunOptions {
            backend,
            devices: flag.map(|d| d.iter().map(ToString::to_string).collect()),
            ..Default::default()
        };
        run_devices(&m, &options, backend.unwrap_or(m.experiment.backend))
            .map(|d| d.iter().map(ToString::to_string).collect())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn devices_come_from_the_flag_the_manifest_or_the_chosen_backend() {
        assert_eq!(resolve(r#"["cpu"]"#, None, None).unwrap(), ["cpu"]);
        // `--backend cuda` on a CPU manifest: that backend's first device.
        assert_eq!(resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), None).unwrap(), ["cuda:0"]);
        assert_eq!(
            resolve(r#"["cpu"]"#, Some(BackendKind::Wgpu), Some(&["wgpu:0", "wgpu:0"])).unwrap(),
            ["wgpu:0", "wgpu:0"]
        );
        let err = resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), Some(&["cuda:0", "wgpu:1"])).unwrap_err();
        assert!(err.contains("--devices") && err.contains("wgpu:1") && err.contains("cuda"), "{err}");
        let err = resolve(r#"["cpu"]"#, None, Some(&["gpu0"])).unwrap_err();
        assert!(err.contains("--devices") && err.contains("gpu0"), "{err}");
        // CubeCL numbers devices with u16: a larger number must not wrap around to another GPU.
        let err = resolve(r#"["cpu"]"#, Some(BackendKind::Cuda), Some(&["cuda:65536"])).unwrap_err();
        assert!(err.contains("cuda:65536") && err.contains("0–65535"), "{err}");
    }
}
