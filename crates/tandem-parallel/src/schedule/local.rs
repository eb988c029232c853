//! A local step (local learning) as a timetable: each stage trains on its own loss, with no
//! gradient crossing a boundary; activations go forward only, when the step transfers.

use super::{Action, Layout, OwnInput};

/// What a device does in a step without end-to-end gradients. The first stage trains on the
/// batch (with `first`, or `transfer`, which sends its output on); a later stage on the
/// activations the stage before it sends now (`transfer`; every device must agree), else, with
/// `replay`, on inputs it received at earlier steps, else not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalStep {
    pub first: bool,
    pub transfer: bool,
    pub replay: bool,
}

impl LocalStep {
    /// The timetable of `device` (one micro-batch: the whole global batch).
    pub fn actions(&self, layout: &Layout, device: usize) -> Vec<Action> {
        let last = layout.stages() - 1;
        let mut actions = Vec::new();
        for stage in layout.stages_of(device) {
            let input = match stage {
                0 if self.first || self.transfer => OwnInput::Batch,
                0 => continue,
                _ if self.transfer => {
                    actions.push(Action::ReceiveActivation { stage, micro: 0 });
                    OwnInput::Received
                }
                _ if self.replay => OwnInput::Replayed,
                _ => continue,
            };
            let sends = self.transfer && stage < last;
            actions.push(Action::TrainOwn { stage, input, sends });
            if sends {
                actions.push(Action::SendActivation { stage, micro: 0 });
            }
        }
        actions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::completes;

    #[test]
    fn every_local_step_trains_each_stage_at_most_once_sends_forward_only_and_completes() {
        for devices in 2..=4 {
            for virtual_stages in 1..=2 {
                let layout = Layout { devices, virtual_stages, micro: 1 };
                for bits in 0..8 {
                    let step = LocalStep { first: bits & 1 != 0, transfer: bits & 2 != 0, replay: bits & 4 != 0 };
                    let plans: Vec<Vec<Action>> = (0..devices).map(|d| step.actions(&layout, d)).collect();
                    assert!(completes(&plans), "{step:?} {layout:?} deadlocks");
                    let all: Vec<Action> = plans.concat();
                    let trained: Vec<(usize, OwnInput)> = all
                        .iter()
                        .filter_map(|a| match *a {
                            Action::TrainOwn { stage, input, .. } => Some((stage, input)),
                            _ => None,
                        })
                        .collect();
                    let expected: Vec<(usize, OwnInput)> = (0..layout.stages())
                        .filter_map(|s| match s {
                            0 => (step.first || step.transfer).then_some((0, OwnInput::Batch)),
                            _ if step.transfer => Some((s, OwnInput::Received)),
                            _ => step.replay.then_some((s, OwnInput::Replayed)),
                        })
                        .collect();
                    let mut trained_sorted = trained.clone();
                    trained_sorted.sort_by_key(|(s, _)| *s);
                    assert_eq!(trained_sorted, expected, "{step:?} {layout:?}");
                    let sends = all.iter().filter(|a| matches!(a, Action::SendActivation { .. })).count();
                    assert_eq!(sends, if step.transfer { layout.stages() - 1 } else { 0 }, "{step:?} {layout:?}");
                    assert!(!all.iter().any(|a| matches!(a, Action::SendGradient { .. } | Action::Run(_))));
                }
            }
        }
    }
}
