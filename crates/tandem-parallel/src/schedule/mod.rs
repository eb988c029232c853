//! Pipeline schedules: *when* each device runs the forward and backward pass of each stage and
//! micro-batch. What a pass does is the stage's business ([`crate::Stage`]); every schedule
//! computes the same gradients, only the order (and so the idle time and the number of
//! activations kept alive) differs.
//!
//! A schedule is data: for each device it emits the list of [`Action`]s to run, in order —
//! forward and backward passes and the sends and receives between stages — and one executor runs
//! any such list. A schedule file implements [`PipelineSchedule`] (usually just the order of the
//! passes; [`lower`] adds the sends and receives) and is listed in [`SCHEDULES`]. A step of
//! local learning is lowered to actions too ([`LocalStep`]), so the same executor runs it.

mod gpipe;
mod interleaved;
mod local;
mod naive;
mod one_f_one_b;

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tandem_models::Invalid;

pub use gpipe::GPipe;
pub use interleaved::Interleaved1F1B;
pub use local::LocalStep;
pub use naive::Naive;
pub use one_f_one_b::OneFOneB;

/// Every schedule a manifest can name.
pub const SCHEDULES: &[&dyn PipelineSchedule] = &[&Naive, &GPipe, &OneFOneB, &Interleaved1F1B];

/// How a model-parallel run is laid out: `devices` workers, each running `virtual_stages`
/// stages, and `micro` micro-batches per global batch. Stage `s` (of `devices × virtual_stages`,
/// in model order) runs on device `s % devices`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub devices: usize,
    pub virtual_stages: usize,
    pub micro: usize,
}

impl Layout {
    /// Stages in the pipeline.
    pub fn stages(&self) -> usize {
        self.devices * self.virtual_stages
    }

    /// The device stage `stage` runs on.
    pub fn device_of(&self, stage: usize) -> usize {
        stage % self.devices
    }

    /// The stages of `device`, in model order.
    pub fn stages_of(&self, device: usize) -> impl Iterator<Item = usize> + '_ {
        (0..self.virtual_stages).map(move |v| v * self.devices + device)
    }
}

/// A pass of one micro-batch through one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    Forward { stage: usize, micro: usize },
    Backward { stage: usize, micro: usize },
}

/// One step of a device's timetable. Activations travel from a stage to the next, gradients back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// Runs a forward or backward pass.
    Run(Pass),
    /// Receives the input of `stage` for `micro` from the stage before it.
    ReceiveActivation { stage: usize, micro: usize },
    /// Sends the output of `stage` for `micro` to the stage after it.
    SendActivation { stage: usize, micro: usize },
    /// Receives the gradient of `stage`'s output for `micro` from the stage after it.
    ReceiveGradient { stage: usize, micro: usize },
    /// Sends the gradient of `stage`'s input for `micro` to the stage before it.
    SendGradient { stage: usize, micro: usize },
    /// Trains `stage` on its own loss (local learning): forward and backward through the stage
    /// and, before the last stage, its auxiliary head; clipping by the stage's own gradient norm
    /// and its optimizer step. With `sends`, its output is kept for a [`Action::SendActivation`]
    /// of micro-batch 0.
    TrainOwn { stage: usize, input: OwnInput, sends: bool },
}

/// What a stage trains on in an [`Action::TrainOwn`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OwnInput {
    /// The global batch's tokens (the first stage).
    Batch,
    /// The activations just received from the stage before it (micro-batch 0).
    Received,
    /// Inputs it received at earlier steps, from its replay buffer (nothing when it is empty).
    Replayed,
}

/// A pipeline schedule (one file each; see the module docs).
pub trait PipelineSchedule: Sync {
    /// The name manifests write (`schedule = "…"`).
    fn name(&self) -> &'static str;

    /// Micro-batches per global batch when the manifest asks for `requested`.
    fn micro_batches(&self, requested: usize) -> usize {
        requested
    }

    /// Checks that the schedule can run `virtual_stages` stages per device.
    fn check_virtual_stages(&self, virtual_stages: usize) -> Result<(), Invalid> {
        match virtual_stages {
            1 => Ok(()),
            v => Err(Invalid::at(
                "virtual_stages",
                format!("schedule `{}` runs one stage per device, not {v} (`virtual_stages`)", self.name()),
            )),
        }
    }

    /// The passes `device` runs, in order. Each of its stages runs every micro-batch's forward
    /// and backward pass once.
    fn passes(&self, layout: &Layout, device: usize) -> Vec<Pass>;

    /// The device's whole timetable: its passes with the sends and receives they need.
    fn actions(&self, layout: &Layout, device: usize) -> Vec<Action> {
        lower(&self.passes(layout, device), layout)
    }
}

/// `passes` with a receive just before each pass whose input comes from another stage, and a
/// send just after each pass whose output goes to another stage.
pub fn lower(passes: &[Pass], layout: &Layout) -> Vec<Action> {
    let last = layout.stages() - 1;
    let mut actions = Vec::with_capacity(3 * passes.len());
    for &pass in passes {
        match pass {
            Pass::Forward { stage, micro } => {
                if stage > 0 {
                    actions.push(Action::ReceiveActivation { stage, micro });
                }
                actions.push(Action::Run(pass));
                if stage < last {
                    actions.push(Action::SendActivation { stage, micro });
                }
            }
            Pass::Backward { stage, micro } => {
                if stage < last {
                    actions.push(Action::ReceiveGradient { stage, micro });
                }
                actions.push(Action::Run(pass));
                if stage > 0 {
                    actions.push(Action::SendGradient { stage, micro });
                }
            }
        }
    }
    actions
}

/// `schedule = "naive" | "gpipe" | "1f1b" | "interleaved-1f1b"`: one of [`SCHEDULES`].
#[derive(Clone, Copy)]
pub struct Schedule(&'static dyn PipelineSchedule);

impl Schedule {
    pub const NAIVE: Schedule = Schedule(&Naive);
    pub const GPIPE: Schedule = Schedule(&GPipe);
    pub const ONE_F_ONE_B: Schedule = Schedule(&OneFOneB);
    pub const INTERLEAVED_1F1B: Schedule = Schedule(&Interleaved1F1B);

    /// The schedule a manifest names `name`.
    pub fn named(name: &str) -> Result<Self, Invalid> {
        SCHEDULES.iter().find(|s| s.name() == name).map(|s| Schedule(*s)).ok_or_else(|| {
            let names: Vec<String> = SCHEDULES.iter().map(|s| format!("\"{}\"", s.name())).collect();
            Invalid::at("schedule", format!("unknown schedule `{name}` (expected one of: {})", names.join(", ")))
        })
    }

    /// Name as written in manifests.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Micro-batches per batch when the manifest asks for `requested` (naive: 1).
    pub fn micro_batches(&self, requested: usize) -> usize {
        self.0.micro_batches(requested)
    }

    /// Checks that the schedule can run `virtual_stages` stages per device.
    pub fn check_virtual_stages(&self, virtual_stages: usize) -> Result<(), Invalid> {
        self.0.check_virtual_stages(virtual_stages)
    }

    /// The timetable of `device`.
    pub fn actions(&self, layout: &Layout, device: usize) -> Vec<Action> {
        self.0.actions(layout, device)
    }

    /// Largest number of micro-batches whose activations a device holds at once.
    pub fn peak_live(actions: &[Action]) -> usize {
        let mut live: usize = 0;
        let mut peak = 0;
        for action in actions {
            match action {
                Action::Run(Pass::Forward { .. }) => {
                    live += 1;
                    peak = peak.max(live);
                }
                Action::Run(Pass::Backward { .. }) => live = live.saturating_sub(1),
                _ => {}
            }
        }
        peak
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Schedule {}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Schedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        Schedule::named(&name).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Schedule {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Schedule".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = SCHEDULES.iter().map(|s| s.name()).collect();
        schemars::json_schema!({ "type": "string", "enum": names })
    }
}

/// The idle fraction of an ideal pipeline with equal stages: (K − 1) / (M + K − 1).
pub fn theoretical_bubble(stages: usize, micro: usize) -> f64 {
    (stages.saturating_sub(1)) as f64 / (micro + stages).saturating_sub(1).max(1) as f64
}

/// Checks a schedule for every layout in the given ranges: each device runs each of its stages'
/// passes exactly once, a backward after its forward, and all the devices' timetables, played
/// against each other with unbounded links, finish (no receive waits for a send never made).
#[cfg(test)]
pub(crate) fn check(schedule: &dyn PipelineSchedule, devices: std::ops::Range<usize>, virtual_stages: &[usize]) {
    use std::collections::HashSet;
    for d in devices {
        for &v in virtual_stages {
            for requested in 1..=9 {
                let layout = Layout { devices: d, virtual_stages: v, micro: schedule.micro_batches(requested) };
                let plans: Vec<Vec<Action>> = (0..d).map(|device| schedule.actions(&layout, device)).collect();
                for (device, plan) in plans.iter().enumerate() {
                    let mut seen = HashSet::new();
                    for action in plan {
                        if let Action::Run(pass) = action {
                            assert!(seen.insert(*pass), "{} {layout:?}: {pass:?} twice", schedule.name());
                            if let Pass::Backward { stage, micro } = *pass {
                                let forward = Pass::Forward { stage, micro };
                                assert!(
                                    seen.contains(&forward),
                                    "{} {layout:?}: {pass:?} before its forward",
                                    schedule.name()
                                );
                            }
                        }
                    }
                    let expected: HashSet<Pass> = layout
                        .stages_of(device)
                        .flat_map(|stage| {
                            (0..layout.micro).flat_map(move |micro| {
                                [Pass::Forward { stage, micro }, Pass::Backward { stage, micro }]
                            })
                        })
                        .collect();
                    assert_eq!(seen, expected, "{} {layout:?} device {device}", schedule.name());
                }
                assert!(completes(&plans), "{} deadlocks with {layout:?}", schedule.name());
            }
        }
    }
}

/// Plays the devices' timetables against each other: a receive is ready once its send was made.
#[cfg(test)]
pub(crate) fn completes(plans: &[Vec<Action>]) -> bool {
    use std::collections::HashSet;
    let mut next = vec![0usize; plans.len()];
    let mut sent: HashSet<Action> = HashSet::new();
    loop {
        let mut progressed = false;
        for (device, plan) in plans.iter().enumerate() {
            while let Some(&action) = plan.get(next[device]) {
                let ready = match action {
                    Action::ReceiveActivation { stage, micro } => {
                        sent.contains(&Action::SendActivation { stage: stage - 1, micro })
                    }
                    Action::ReceiveGradient { stage, micro } => {
                        sent.contains(&Action::SendGradient { stage: stage + 1, micro })
                    }
                    send @ (Action::SendActivation { .. } | Action::SendGradient { .. }) => {
                        sent.insert(send);
                        true
                    }
                    Action::Run(_) | Action::TrainOwn { .. } => true,
                };
                if !ready {
                    break;
                }
                next[device] += 1;
                progressed = true;
            }
        }
        if !progressed {
            return next.iter().zip(plans).all(|(n, plan)| *n == plan.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_found_by_name_and_unknown_names_listed() {
        for schedule in SCHEDULES {
            assert_eq!(Schedule::named(schedule.name()).unwrap().name(), schedule.name());
        }
        let error = Schedule::named("zero-bubble").unwrap_err().to_string();
        assert!(error.contains("zero-bubble") && error.contains("\"1f1b\""), "{error}");
    }

    #[test]
    fn lowering_adds_the_transfers_between_stages() {
        let layout = Layout { devices: 2, virtual_stages: 1, micro: 1 };
        let passes = [Pass::Forward { stage: 1, micro: 0 }, Pass::Backward { stage: 1, micro: 0 }];
        let (f, b) = (passes[0], passes[1]);
        assert_eq!(
            lower(&passes, &layout),
            vec![
                Action::ReceiveActivation { stage: 1, micro: 0 },
                Action::Run(f),
                Action::Run(b),
                Action::SendGradient { stage: 1, micro: 0 }
            ]
        );
    }

    #[test]
    fn the_bubble_of_an_ideal_pipeline() {
        assert_eq!(theoretical_bubble(2, 8), 1.0 / 9.0);
        assert_eq!(theoretical_bubble(2, 1), 0.5);
    }
}
