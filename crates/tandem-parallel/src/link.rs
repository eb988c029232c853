//! Links: one direction of a stage boundary, counting what crosses it and, optionally,
//! simulating an interconnect's latency and bandwidth so the cost of model parallelism over a
//! slow network can be studied on one machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tandem_models::Invalid;

/// A named interconnect, with approximate per-direction figures.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Preset {
    /// No simulated cost: messages arrive as soon as they are sent (the default).
    #[serde(rename = "none")]
    Instant,
    /// NVLink 3 (A100): 300 GB/s, 3 µs.
    #[serde(rename = "nvlink")]
    NvLink,
    /// PCIe 4.0 ×16: 25 GB/s, 5 µs.
    #[serde(rename = "pcie4")]
    Pcie4,
    /// 10 Gigabit Ethernet: 1.25 GB/s, 30 µs.
    #[serde(rename = "10gbe")]
    TenGbE,
    /// 1 Gigabit Ethernet: 0.125 GB/s, 50 µs.
    #[serde(rename = "1gbe")]
    OneGbE,
}

/// `interconnect = "1gbe"` (a [`Preset`]) or `interconnect = { latency_us = 50, bandwidth_gb_s = 0.125 }`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, schemars::JsonSchema)]
#[serde(
    untagged,
    deny_unknown_fields,
    expecting = "`interconnect`: one of \"none\", \"nvlink\", \"pcie4\", \"10gbe\", \"1gbe\", or { latency_us = …, bandwidth_gb_s = … }"
)]
pub enum Interconnect {
    Preset(Preset),
    Custom {
        /// One-way latency in microseconds.
        latency_us: f64,
        /// Bandwidth per direction in gigabytes (10⁹ bytes) per second.
        bandwidth_gb_s: f64,
    },
}

impl Default for Interconnect {
    fn default() -> Self {
        Self::Preset(Preset::Instant)
    }
}

impl Interconnect {
    /// One-way latency and bandwidth in bytes per second (`None`: no simulated cost).
    pub fn figures(&self) -> Option<(Duration, f64)> {
        let (latency_us, gb_s) = match *self {
            Self::Preset(Preset::Instant) => return None,
            Self::Preset(Preset::NvLink) => (3.0, 300.0),
            Self::Preset(Preset::Pcie4) => (5.0, 25.0),
            Self::Preset(Preset::TenGbE) => (30.0, 1.25),
            Self::Preset(Preset::OneGbE) => (50.0, 0.125),
            Self::Custom { latency_us, bandwidth_gb_s } => (latency_us, bandwidth_gb_s),
        };
        Some((Duration::from_secs_f64(latency_us * 1e-6), gb_s * 1e9))
    }

    /// Checks values serde cannot; the message names the field.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Self::Custom { latency_us, bandwidth_gb_s } = *self {
            if !(0.0..=1e9).contains(&latency_us) {
                let message =
                    format!("`interconnect.latency_us` must be between 0 and 1e9 (1,000 s), got {latency_us}");
                return Err(Invalid::at("interconnect.latency_us", message));
            }
            if !(1e-6..=1e6).contains(&bandwidth_gb_s) {
                let message = format!(
                    "`interconnect.bandwidth_gb_s` must be between 1e-6 (1 kB/s) and 1e6, got {bandwidth_gb_s}"
                );
                return Err(Invalid::at("interconnect.bandwidth_gb_s", message));
            }
        }
        Ok(())
    }

    /// Short name for labels: the preset's, or `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Preset(Preset::Instant) => "none",
            Self::Preset(Preset::NvLink) => "nvlink",
            Self::Preset(Preset::Pcie4) => "pcie4",
            Self::Preset(Preset::TenGbE) => "10gbe",
            Self::Preset(Preset::OneGbE) => "1gbe",
            Self::Custom { .. } => "custom",
        }
    }
}

/// Messages and bytes that crossed one link.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
}

/// How long a receiver waited for a message: `idle` until the sender had sent it, `transfer`
/// from then until the simulated interconnect delivered it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wait {
    pub idle: Duration,
    pub transfer: Duration,
}

struct Envelope<T> {
    value: T,
    arrives: Instant,
}

/// The sending end of a link.
pub struct LinkSender<T> {
    channel: Sender<Envelope<T>>,
    interconnect: Option<(Duration, f64)>,
    /// When the simulated wire is free again (messages serialize on it).
    wire_free: Instant,
    traffic: Arc<Mutex<Traffic>>,
}

/// The receiving end of a link.
pub struct LinkReceiver<T> {
    channel: Receiver<Envelope<T>>,
    traffic: Arc<Mutex<Traffic>>,
}

/// A one-directional link over `interconnect`.
pub fn link<T>(interconnect: Interconnect) -> (LinkSender<T>, LinkReceiver<T>) {
    let (tx, rx) = mpsc::channel();
    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let sender = LinkSender {
        channel: tx,
        interconnect: interconnect.figures(),
        wire_free: Instant::now(),
        traffic: traffic.clone(),
    };
    (sender, LinkReceiver { channel: rx, traffic })
}

impl<T> LinkSender<T> {
    /// Sends `value`, counted as `bytes`. Never blocks: on a simulated interconnect the message
    /// occupies the wire for `bytes / bandwidth` after the previous one and arrives `latency`
    /// later, which the receiver waits for.
    pub fn send(&mut self, value: T, bytes: usize) -> Result<(), ReceiverGone> {
        let now = Instant::now();
        let arrives = match self.interconnect {
            None => now,
            Some((latency, bytes_per_second)) => {
                self.wire_free = self.wire_free.max(now) + Duration::from_secs_f64(bytes as f64 / bytes_per_second);
                self.wire_free + latency
            }
        };
        {
            let mut traffic = self.traffic.lock().unwrap_or_else(|e| e.into_inner());
            traffic.messages += 1;
            traffic.bytes += bytes as u64;
        }
        self.channel.send(Envelope { value, arrives }).map_err(|_| ReceiverGone)
    }

    /// What has been sent so far.
    pub fn traffic(&self) -> Traffic {
        *self.traffic.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a send failed: the receiving end is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the receiving stage has stopped")]
pub struct ReceiverGone;

/// How often a waiting receiver checks whether the run was stopped.
const POLL: Duration = Duration::from_millis(20);

/// Why a receive returned no message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// `stop` was raised.
    Stopped,
    /// The sending end is gone (its stage stopped).
    Disconnected,
    /// Nothing was sent within the timeout.
    Timeout(Duration),
    /// A message was sent but the simulated interconnect did not deliver it within the timeout.
    Undelivered(Duration),
}

impl std::fmt::Display for RecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Stopped => write!(f, "stopped"),
            Self::Disconnected => write!(f, "the sending stage has stopped"),
            Self::Timeout(t) => write!(f, "no message for {} s", t.as_secs_f64()),
            Self::Undelivered(t) => {
                write!(f, "a message took over {} s on the simulated interconnect", t.as_secs_f64())
            }
        }
    }
}

impl<T> LinkReceiver<T> {
    /// Waits for the next message to be delivered, at most `timeout` in all, returning early if
    /// `stop` is raised or the sender has gone.
    pub fn recv(&self, timeout: Duration, stop: &AtomicBool) -> Result<(T, Wait), RecvError> {
        let started = Instant::now();
        let deadline = started + timeout;
        let check = |late: RecvError| match () {
            _ if stop.load(Ordering::SeqCst) => Err(RecvError::Stopped),
            _ if Instant::now() >= deadline => Err(late),
            _ => Ok(()),
        };
        let envelope = loop {
            match self.channel.recv_timeout(POLL) {
                Ok(envelope) => break envelope,
                Err(RecvTimeoutError::Disconnected) => return Err(RecvError::Disconnected),
                Err(RecvTimeoutError::Timeout) => check(RecvError::Timeout(timeout))?,
            }
        };
        let received = Instant::now();
        while let Some(left) = envelope.arrives.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            check(RecvError::Undelivered(timeout))?;
            std::thread::sleep(left.min(POLL));
        }
        let wait = Wait { idle: received - started, transfer: Instant::now() - received };
        Ok((envelope.value, wait))
    }

    /// What has crossed the link so far (sent, whether or not received yet).
    pub fn traffic(&self) -> Traffic {
        *self.traffic.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_from_their_names_and_custom_from_a_table() {
        #[derive(Deserialize)]
        struct Holder {
            interconnect: Interconnect,
        }
        let parse = |s: &str| serde_json::from_str::<Holder>(s).unwrap().interconnect;
        assert_eq!(parse(r#"{"interconnect": "1gbe"}"#), Interconnect::Preset(Preset::OneGbE));
        assert_eq!(parse(r#"{"interconnect": "none"}"#).figures(), None);
        let custom = parse(r#"{"interconnect": {"latency_us": 10, "bandwidth_gb_s": 2}}"#);
        assert_eq!(custom.figures(), Some((Duration::from_micros(10), 2e9)));
        assert!(Interconnect::Custom { latency_us: 1.0, bandwidth_gb_s: 0.0 }.validate().is_err());
    }

    #[test]
    fn messages_arrive_in_order_and_are_counted() {
        let (mut tx, rx) = link::<u32>(Interconnect::default());
        let stop = AtomicBool::new(false);
        tx.send(1, 100).unwrap();
        tx.send(2, 28).unwrap();
        assert_eq!(rx.recv(Duration::from_secs(1), &stop).unwrap().0, 1);
        assert_eq!(rx.recv(Duration::from_secs(1), &stop).unwrap().0, 2);
        assert_eq!(rx.traffic(), Traffic { messages: 2, bytes: 128 });
    }

    #[test]
    fn a_silent_or_vanished_sender_is_an_error_not_a_hang() {
        let (tx, rx) = link::<u32>(Interconnect::default());
        let stop = AtomicBool::new(false);
        assert_eq!(
            rx.recv(Duration::from_millis(50), &stop).unwrap_err(),
            RecvError::Timeout(Duration::from_millis(50))
        );
        stop.store(true, Ordering::SeqCst);
        assert_eq!(rx.recv(Duration::from_secs(60), &stop).unwrap_err(), RecvError::Stopped);
        drop(tx);
        assert_eq!(rx.recv(Duration::from_secs(60), &AtomicBool::new(false)).unwrap_err(), RecvError::Disconnected);
    }

    #[test]
    fn a_message_still_on_a_slow_wire_does_not_delay_a_stop() {
        // 1 kB/s: 1 MB would take 1,000 s to arrive.
        let (mut tx, rx) = link::<u32>(Interconnect::Custom { latency_us: 0.0, bandwidth_gb_s: 1e-6 });
        tx.send(1, 1_000_000).unwrap();
        let started = Instant::now();
        assert_eq!(
            rx.recv(Duration::from_millis(100), &AtomicBool::new(false)).unwrap_err(),
            RecvError::Undelivered(Duration::from_millis(100))
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
