//! Congestion control, behind one small interface so variants are interchangeable: a QP's
//! controller hears about CNPs ([`Cc::on_cnp`]), bytes sent ([`Cc::on_sent`]) and its timers
//! ([`Cc::next_timeout`], [`Cc::handle_timeout`]), and says how fast the QP may send
//! ([`Cc::rate`]). Dispatched by enum, not by trait object: no allocation and no indirect call
//! on the packet path. [`CcKind::None`] sends at line rate; [`CcKind::Dcqcn`] runs
//! [`dcqcn::Dcqcn`]. Room for more (TIMELY, HPCC, Swift) as further variants.

pub mod dcqcn;
pub mod wheel;

pub use dcqcn::{Dcqcn, DcqcnParams};
use wire::time::Instant;

/// Which algorithm, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CcKind {
    /// No congestion control: line rate, CNPs counted and ignored.
    None,
    /// DCQCN.
    #[default]
    Dcqcn,
}

impl CcKind {
    /// Its name in configurations and the API (what `FromStr` reads).
    pub fn name(self) -> &'static str {
        match self {
            CcKind::None => "none",
            CcKind::Dcqcn => "dcqcn",
        }
    }
}

impl core::str::FromStr for CcKind {
    type Err = &'static str;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(CcKind::None),
            "dcqcn" => Ok(CcKind::Dcqcn),
            _ => Err("congestion control must be `dcqcn` or `none`"),
        }
    }
}

/// One QP's congestion controller.
#[derive(Clone, Debug)]
pub enum Cc {
    /// Line rate always.
    None {
        /// Line rate, bits per second.
        line: f64,
        /// CNPs received (and ignored).
        cnps: u64,
    },
    /// DCQCN reaction point.
    Dcqcn(Dcqcn),
}

impl Cc {
    /// Which algorithm this is.
    pub fn kind(&self) -> CcKind {
        match self {
            Cc::None { .. } => CcKind::None,
            Cc::Dcqcn(_) => CcKind::Dcqcn,
        }
    }

    /// A controller of `kind` for a QP on a port of `line_bps`.
    pub fn new(kind: CcKind, line_bps: f64) -> Self {
        match kind {
            CcKind::None => Cc::None {
                line: line_bps,
                cnps: 0,
            },
            CcKind::Dcqcn => Cc::Dcqcn(Dcqcn::new(line_bps)),
        }
    }

    /// The rate the QP may send at now, bits per second.
    pub fn rate(&self) -> f64 {
        match self {
            Cc::None { line, .. } => *line,
            Cc::Dcqcn(d) => d.rate(),
        }
    }

    /// A CNP arrived.
    pub fn on_cnp(&mut self, now: Instant, p: &DcqcnParams) {
        match self {
            Cc::None { cnps, .. } => *cnps += 1,
            Cc::Dcqcn(d) => d.on_cnp(now, p),
        }
    }

    /// `n` bytes were sent.
    pub fn on_sent(&mut self, n: u64, p: &DcqcnParams) {
        if let Cc::Dcqcn(d) = self {
            d.on_sent(n, p);
        }
    }

    /// When [`Cc::handle_timeout`] is due.
    pub fn next_timeout(&self) -> Option<Instant> {
        match self {
            Cc::None { .. } => None,
            Cc::Dcqcn(d) => d.next_timeout(),
        }
    }

    /// Runs what is due at `now`.
    pub fn handle_timeout(&mut self, now: Instant, p: &DcqcnParams) {
        if let Cc::Dcqcn(d) = self {
            d.handle_timeout(now, p);
        }
    }

    /// (handled, ignored) CNP counts: `rp_cnp_handled`, `rp_cnp_ignored`.
    pub fn cnp_counts(&self) -> (u64, u64) {
        match self {
            Cc::None { cnps, .. } => (0, *cnps),
            Cc::Dcqcn(d) => (d.cnp_handled, d.cnp_ignored),
        }
    }
}
