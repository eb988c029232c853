//! Format 1: the strategy's figures as an untyped `extra` map in each epoch record and summary,
//! one flat map whose keys tell the kind of strategy. It reads into the typed figures: their
//! fields are named after format 1's keys, the predictive-sync and multi-process keys of a
//! pipeline going to its `sync` and `across_ranks` parts.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::figures::{PipelineFigures, StrategyFigures};

/// Format 1's number (summaries of that format have no `format_version`).
pub const FORMAT: u32 = 1;

pub(crate) fn format() -> u32 {
    FORMAT
}

/// A format-1 summary or epoch record (JSON text), its `extra` map read as its figures.
pub fn parse<T: DeserializeOwned>(json: &str) -> serde_json::Result<T> {
    let mut object: Map<String, Value> = serde_json::from_str(json)?;
    let extra = object.remove("extra").unwrap_or_else(|| Value::Object(Map::new()));
    object.insert("figures".into(), serde_json::to_value(figures(extra)?)?);
    serde_json::from_value(Value::Object(object))
}

/// The keys of a format-1 map that say which figures it holds.
#[derive(Deserialize)]
struct Parts {
    /// Data parallel.
    replicas: Option<IgnoredAny>,
    /// A pipeline of stages …
    stages: Option<IgnoredAny>,
    /// … whose stages synchronise predictively …
    predictor: Option<IgnoredAny>,
    /// … or run on several ranks.
    stages_per_rank: Option<IgnoredAny>,
}

/// A format-1 `extra` map as typed figures: data parallel when it has `replicas`, a pipeline
/// when it has `stages`, sequential (no figures) otherwise.
pub fn figures(extra: Value) -> serde_json::Result<StrategyFigures> {
    let parts = Parts::deserialize(&extra)?;
    Ok(match (parts.replicas, parts.stages) {
        (Some(_), _) => StrategyFigures::DataParallel(Deserialize::deserialize(&extra)?),
        (None, Some(_)) => StrategyFigures::Pipeline(PipelineFigures {
            sync: part(parts.predictor, &extra)?,
            across_ranks: part(parts.stages_per_rank, &extra)?,
            ..Deserialize::deserialize(&extra)?
        }),
        (None, None) => StrategyFigures::Sequential,
    })
}

/// The figures of an optional part of the map, read from the whole map when it is `present`.
fn part<T: DeserializeOwned>(present: Option<IgnoredAny>, extra: &Value) -> serde_json::Result<Option<T>> {
    present.map(|_| T::deserialize(extra)).transpose()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::figures::PipelineRanks;

    /// A format-1 map of predictive sync on 2 stages over 2 ranks, as the code of that format
    /// wrote it (multi-process runs are not in the fixture: they need MPI).
    fn two_ranks() -> Value {
        json!({
            "stages": 2, "cuts": [1], "schedule": "gpipe", "micro_batches": 3, "interconnect": "none",
            "stage_parameters": [2400, 900], "compute_seconds": [0.1, 0.2], "transfer_seconds": [0.01, 0.02],
            "idle_seconds": [0.3, 0.1], "bubble_fraction": [0.5, 0.2], "bubble_fraction_mean": 0.35,
            "bubble_fraction_theory": 0.25, "peak_live_activations": [3, 3],
            "links_per_step": [{ "forward": { "messages": 3.0, "bytes": 100.0 }, "backward": { "messages": 3.0, "bytes": 100.0 } }],
            "bytes_per_step": 216.0, "communication_share": 0.05,
            "control_bytes_per_step": 16.0, "predict_seconds": [0.001, 0.002], "replayed_samples": 0,
            "ranks": 2, "stages_per_rank": 1, "cross_rank_bytes_per_step": 200.0, "cross_rank_seconds": 0.75,
            "predictor": "velocity", "trigger": "adaptive", "sync_steps": 5, "predicted_steps": 3,
            "horizons": { "1": 1, "2": 1 }, "relative_error_mean": 0.5,
        })
    }

    #[test]
    fn a_pipeline_map_gives_its_sync_and_rank_parts() {
        let figures = figures(two_ranks()).unwrap();
        let pipeline = figures.pipeline().unwrap();
        assert_eq!((pipeline.stages, pipeline.cuts.as_slice(), pipeline.bytes_per_step), (2, &[1][..], 216.0));
        assert_eq!(pipeline.links_per_step[0].backward.bytes, 100.0);
        let ranks =
            PipelineRanks { ranks: 2, stages_per_rank: 1, cross_rank_bytes_per_step: 200.0, cross_rank_seconds: 0.75 };
        assert_eq!(pipeline.across_ranks, Some(ranks));
        let sync = figures.sync().unwrap();
        assert_eq!((sync.predictor.as_str(), sync.trigger.as_str()), ("velocity", "adaptive"));
        assert_eq!((sync.sync_steps, sync.predicted_steps, sync.control_bytes_per_step), (5, 3, 16.0));
        assert_eq!(sync.horizons, [(1, 1), (2, 1)].into());
        assert_eq!(sync.relative_error_mean, Some(0.5));
        assert_eq!(figures.cross_rank_seconds(), 0.75);
    }

    #[test]
    fn a_map_without_a_strategy_s_keys_is_sequential_and_a_broken_one_an_error() {
        assert_eq!(figures(json!({})).unwrap(), StrategyFigures::Sequential);
        let mut broken = two_ranks();
        broken["cuts"] = json!("one");
        assert!(figures(broken).is_err(), "a pipeline's figures of the wrong type");
    }

    #[test]
    fn a_format_1_record_reads_with_its_extra_map_as_figures() {
        let line = r#"{"epoch":1,"train_loss":1.0,"holdout_loss":1.0,"holdout":{"accuracy":0.5,"macro_precision":0.5,"macro_recall":0.5,"macro_f1":0.5,"per_class":[],"confusion":{"counts":[]}},"learning_rate":0.001,"train_seconds":1.0,"eval_seconds":0.1,"train_samples_per_second":10.0,"steps":4,"extra":{}}"#;
        let record: crate::EpochRecord = parse(line).unwrap();
        assert_eq!((record.epoch, record.steps, record.figures), (1, 4, StrategyFigures::Sequential));
        assert!(serde_json::from_str::<crate::EpochRecord>(line).is_err(), "the typed record has no `extra`");
    }
}
