//! `report.toml`, kept beside an experiment's run folders: the manifest's `[report]` section,
//! what `tandem report` holds the experiment's runs to. Outside the runs' own manifests, so a
//! changed target re-judges finished runs instead of making them run again.

use serde::{Deserialize, Serialize};

/// The file's name, in `<out>/<experiment>/`.
pub const REPORT_FILE: &str = "report.toml";

/// `[report]`: how the report judges the experiment.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReportSettings {
    /// What a protocol against vanilla model parallelism must reach (unset: no verdict).
    pub target: Option<Target>,
}

impl ReportSettings {
    /// Whether nothing is set (no `report.toml` is written then).
    pub fn is_empty(&self) -> bool {
        self.target.is_none()
    }
}

/// A protocol meets the target when the 95 % interval of each figure over seeds clears it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// At least this many times less communication than vanilla model parallelism…
    #[schemars(range(min = 1.0))]
    pub communication_reduction: f64,
    /// … at least this speedup over it …
    #[schemars(range(min = 0.0))]
    pub speedup: f64,
    /// … losing at most this many validation accuracy points against it.
    #[schemars(range(min = 0.0))]
    pub points_lost: f64,
}

impl Target {
    /// The first field that is not a usable bound, and why.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let fields = [
            ("communication_reduction", self.communication_reduction, 1.0),
            ("speedup", self.speedup, 0.0),
            ("points_lost", self.points_lost, 0.0),
        ];
        fields.into_iter().find_map(|(name, value, least)| {
            (!(value.is_finite() && value >= least))
                .then(|| (name, format!("must be a number of at least {least}, got {value}")))
        })
    }
}
