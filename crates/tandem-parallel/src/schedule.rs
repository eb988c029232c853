//! Pipeline schedules: *when* each stage runs the forward and backward pass of each
//! micro-batch. What a pass does is the stage's business ([`crate::stage`]); every schedule
//! computes the same gradients, only the order (and so the idle time and the number of
//! activations kept alive) differs.

use serde::{Deserialize, Serialize};

/// `schedule = "naive" | "gpipe" | "1f1b"`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// The whole batch at once: forward through every stage, then backward (one stage busy at a time).
    #[serde(rename = "naive")]
    Naive,
    /// GPipe: every micro-batch forward, then every micro-batch backward.
    #[serde(rename = "gpipe")]
    GPipe,
    /// One-forward-one-backward (PipeDream-flush): after a warm-up, each stage alternates, so at
    /// most `stages − stage` micro-batches' activations are alive at once.
    #[serde(rename = "1f1b")]
    OneFOneB,
}

/// One pass of one micro-batch on one stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Forward(usize),
    Backward(usize),
}

impl Schedule {
    /// Name as written in manifests.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Naive => "naive",
            Self::GPipe => "gpipe",
            Self::OneFOneB => "1f1b",
        }
    }

    /// Micro-batches per batch: `requested`, or 1 for the naive schedule.
    pub fn micro_batches(&self, requested: usize) -> usize {
        match self {
            Self::Naive => 1,
            _ => requested,
        }
    }

    /// The passes stage `stage` (0-based) of `stages` runs, in order, for `micro` micro-batches.
    /// Every stage runs forwards in micro-batch order and backwards in micro-batch order, so the
    /// messages on each link arrive in the order they are consumed.
    pub fn actions(&self, stage: usize, stages: usize, micro: usize) -> Vec<Action> {
        let forwards = (0..micro).map(Action::Forward);
        let backwards = (0..micro).map(Action::Backward);
        match self {
            Self::Naive | Self::GPipe => forwards.chain(backwards).collect(),
            Self::OneFOneB => {
                let warmup = (stages - 1 - stage).min(micro);
                let mut actions: Vec<Action> = (0..warmup).map(Action::Forward).collect();
                for m in warmup..micro {
                    actions.push(Action::Forward(m));
                    actions.push(Action::Backward(m - warmup));
                }
                actions.extend((micro - warmup..micro).map(Action::Backward));
                actions
            }
        }
    }

    /// Largest number of micro-batches whose activations a stage holds at once.
    pub fn peak_live(actions: &[Action]) -> usize {
        let mut live: usize = 0;
        let mut peak = 0;
        for action in actions {
            match action {
                Action::Forward(_) => {
                    live += 1;
                    peak = peak.max(live);
                }
                Action::Backward(_) => live = live.saturating_sub(1),
            }
        }
        peak
    }
}

/// The idle fraction of an ideal pipeline with equal stages: (K − 1) / (M + K − 1).
pub fn theoretical_bubble(stages: usize, micro: usize) -> f64 {
    (stages.saturating_sub(1)) as f64 / (micro + stages).saturating_sub(1).max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::{Backward as B, Forward as F};

    /// Plays the schedules of all stages against each other with unbounded links and checks
    /// that every stage finishes: no schedule may wait for a message never sent.
    fn completes(schedule: Schedule, stages: usize, micro: usize) -> bool {
        let plans: Vec<Vec<Action>> = (0..stages).map(|s| schedule.actions(s, stages, micro)).collect();
        let mut next = vec![0usize; stages];
        let (mut forwarded, mut returned) = (vec![0usize; stages], vec![0usize; stages]);
        loop {
            let mut progressed = false;
            for s in 0..stages {
                let Some(&action) = plans[s].get(next[s]) else { continue };
                let ready = match action {
                    F(m) => s == 0 || forwarded[s - 1] > m,
                    B(m) => s + 1 == stages || returned[s + 1] > m,
                };
                if ready {
                    match action {
                        F(_) => forwarded[s] += 1,
                        B(_) => returned[s] += 1,
                    }
                    next[s] += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return (0..stages).all(|s| next[s] == plans[s].len());
            }
        }
    }

    #[test]
    fn one_f_one_b_warms_up_then_alternates() {
        let s = Schedule::OneFOneB;
        assert_eq!(s.actions(0, 2, 4), vec![F(0), F(1), B(0), F(2), B(1), F(3), B(2), B(3)]);
        assert_eq!(s.actions(1, 2, 4), vec![F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3)]);
        assert_eq!(s.actions(0, 4, 2), vec![F(0), F(1), B(0), B(1)]);
    }

    #[test]
    fn every_schedule_runs_each_pass_once_and_completes() {
        for schedule in [Schedule::Naive, Schedule::GPipe, Schedule::OneFOneB] {
            for stages in 1..=4 {
                for micro in 1..=9 {
                    let micro = schedule.micro_batches(micro);
                    for s in 0..stages {
                        let mut actions = schedule.actions(s, stages, micro);
                        actions.sort_by_key(|a| match a {
                            F(m) => (0, *m),
                            B(m) => (1, *m),
                        });
                        let expected: Vec<Action> = (0..micro).map(F).chain((0..micro).map(B)).collect();
                        assert_eq!(actions, expected, "{schedule:?} stage {s}/{stages}, {micro} micro-batches");
                    }
                    assert!(
                        completes(schedule, stages, micro),
                        "{schedule:?} deadlocks with {stages} stages, {micro} micro-batches"
                    );
                }
            }
        }
    }

    #[test]
    fn one_f_one_b_keeps_fewer_activations_alive_than_gpipe() {
        for s in 0..3 {
            assert_eq!(Schedule::peak_live(&Schedule::GPipe.actions(s, 3, 8)), 8);
            assert_eq!(Schedule::peak_live(&Schedule::OneFOneB.actions(s, 3, 8)), 3 - s);
        }
        assert_eq!(theoretical_bubble(2, 8), 1.0 / 9.0);
        assert_eq!(theoretical_bubble(2, 1), 0.5);
    }
}
