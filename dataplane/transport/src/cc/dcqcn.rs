//! DCQCN's reaction point: the per-QP rate a sender may use, cut on CNPs and raised by timer
//! and byte-counter stages (Zhu et al., SIGCOMM 2015, as NVIDIA ConnectX firmware runs it).
//!
//! State per QP: the current rate `rc`, the target rate `rt` and the congestion estimate
//! `alpha`. The rules, with NVIDIA's knob names ([`DcqcnParams`]):
//!
//! - **First CNP** (the QP was not rate limited): `alpha = initial_alpha_value`,
//!   `rc = rt = rate_to_set_on_first_cnp` (0 keeps the current rate); the QP becomes rate
//!   limited.
//! - **Alpha**, on a grid of `dce_tcp_rtt` from the first CNP: at each step
//!   `alpha = g * alpha + (1 - g) * [a CNP arrived during the step]`, with `g = dce_tcp_g/1024`
//!   (NVIDIA's g weighs the old value; the paper's g is `1 - dce_tcp_g/1024`). Computed lazily in
//!   closed form when needed, so an idle QP costs nothing.
//! - **Decrease**, on a grid of `rate_reduce_monitor_period` from the first CNP (0: at once on
//!   each CNP): if a CNP arrived since the last step, `rt = rc` (unless `clamp_tgt_rate` is off
//!   and no timer increase happened since the last cut), then
//!   `rc = max(rpg_min_rate, rc * (1 - alpha * 1024 / 2^rpg_gd), rc * rpg_min_dec_fac / 100)`
//!   (with the default `rpg_gd` 11 that is the paper's `rc * (1 - alpha/2)`); both stage
//!   counters and the byte counter restart, and the increase timer restarts.
//! - **Increase**, each time `rpg_time_reset` passes without a cut (timer stage `T`) and each
//!   time `rpg_byte_reset` bytes are sent (byte stage `B`; 0 turns the byte counter off), with
//!   `F = rpg_threshold`, judged on the stages before the event counts: fast recovery while
//!   `max(T, B) < F`; hyper increase `rt += i * rpg_hai_rate` with `i = min(T, B) - F` when
//!   both are above `F` (without a byte counter: `T > F`, `i = T - F`); otherwise additive
//!   increase `rt += rpg_ai_rate`. Then `rc = (rc + rt) / 2`. Rates stay within
//!   `[rpg_min_rate, rpg_max_rate]`.
//! - When `rc` is back at the maximum the QP stops being rate limited: its timers stop, and the
//!   next CNP is a first CNP again.
//!
//! Sans-IO like the transport: time comes in, [`Dcqcn::next_timeout`] says when
//! [`Dcqcn::handle_timeout`] is due.

use core::time::Duration;
use wire::time::Instant;

/// DCQCN settings, named and scaled as NVIDIA's firmware knobs are.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DcqcnParams {
    /// Rate increase timer period, microseconds.
    pub rpg_time_reset: u32,
    /// Bytes sent between byte-counter increase events (0: no byte counter).
    pub rpg_byte_reset: u32,
    /// Stages of fast recovery before additive increase (F).
    pub rpg_threshold: u32,
    /// Additive increase step, Mb/s.
    pub rpg_ai_rate: u32,
    /// Hyper increase step, Mb/s.
    pub rpg_hai_rate: u32,
    /// Decrease divisor as log2, with alpha in 1/1024 units (11: rc * (1 - alpha/2)).
    pub rpg_gd: u32,
    /// A cut leaves at least this percentage of the rate.
    pub rpg_min_dec_fac: u32,
    /// Lowest rate, Mb/s.
    pub rpg_min_rate: u32,
    /// Highest rate, Mb/s (0: the line rate).
    pub rpg_max_rate: u32,
    /// Rate set on the first CNP, Mb/s (0: keep the current rate).
    pub rate_to_set_on_first_cnp: u32,
    /// Weight of the old alpha at each update, in 1/1024.
    pub dce_tcp_g: u32,
    /// Alpha update period, microseconds.
    pub dce_tcp_rtt: u32,
    /// Shortest time between two rate cuts, microseconds (0: cut on every CNP).
    pub rate_reduce_monitor_period: u32,
    /// Alpha on the first CNP, in 1/1024.
    pub initial_alpha_value: u32,
    /// On a cut, always set the target to the current rate (else only after a timer increase).
    pub clamp_tgt_rate: bool,
    /// Notification point: shortest time between CNPs to one QP, microseconds.
    pub min_time_between_cnps: u32,
    /// DSCP of the CNPs we send.
    pub cnp_dscp: u8,
    /// 802.1p priority of the CNPs we send.
    pub cnp_802p_prio: u8,
}

impl Default for DcqcnParams {
    fn default() -> Self {
        Self::nvidia()
    }
}

impl DcqcnParams {
    /// The named parameter sets: "nvidia" ([`Self::nvidia`]), "paper" ([`Self::paper`]),
    /// "hpcc-ns3" ([`Self::hpcc_ns3`]).
    pub const PROFILES: [&'static str; 3] = ["nvidia", "paper", "hpcc-ns3"];

    /// A parameter set by name (one of [`Self::PROFILES`]).
    pub fn profile(name: &str) -> Option<Self> {
        match name {
            "nvidia" => Some(Self::nvidia()),
            "paper" => Some(Self::paper()),
            "hpcc-ns3" => Some(Self::hpcc_ns3()),
            _ => None,
        }
    }

    /// NVIDIA ConnectX-4 Lx / ConnectX-5 firmware defaults.
    pub const fn nvidia() -> Self {
        DcqcnParams {
            rpg_time_reset: 300,
            rpg_byte_reset: 32767,
            rpg_threshold: 1,
            rpg_ai_rate: 5,
            rpg_hai_rate: 50,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate: 1,
            rpg_max_rate: 0,
            rate_to_set_on_first_cnp: 0,
            dce_tcp_g: 1019,
            dce_tcp_rtt: 1,
            rate_reduce_monitor_period: 4,
            initial_alpha_value: 1023,
            clamp_tgt_rate: false,
            min_time_between_cnps: 0,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
        }
    }

    /// The DCQCN paper's parameters (its authors' simulator): g 1/256, alpha period 55 us,
    /// timer 60 us, byte counter 300 KB, F 5, R_AI 40 Mb/s, R_HAI 200 Mb/s, a cut on every
    /// CNP, one CNP per 50 us per QP.
    pub const fn paper() -> Self {
        DcqcnParams {
            rpg_time_reset: 60,
            rpg_byte_reset: 300_000,
            rpg_threshold: 5,
            rpg_ai_rate: 40,
            rpg_hai_rate: 200,
            rpg_gd: 11,
            rpg_min_dec_fac: 50,
            rpg_min_rate: 1,
            rpg_max_rate: 0,
            rate_to_set_on_first_cnp: 0,
            dce_tcp_g: 1020,
            dce_tcp_rtt: 55,
            rate_reduce_monitor_period: 0,
            initial_alpha_value: 1024,
            clamp_tgt_rate: true,
            min_time_between_cnps: 50,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
        }
    }

    /// The HPCC ns-3 simulator's DCQCN (CC_MODE 1, its `run.py --cc dcqcn --bw 100`), the
    /// reference in `bench/`: g 1/256, alpha every 1 us, cuts at most every 4 us, timer 300 us,
    /// no byte counter, F 1, R_AI 20 Mb/s, R_HAI 200 Mb/s, floor 1 Gb/s.
    pub const fn hpcc_ns3() -> Self {
        DcqcnParams {
            rpg_time_reset: 300,
            rpg_byte_reset: 0,
            rpg_threshold: 1,
            rpg_ai_rate: 20,
            rpg_hai_rate: 200,
            rpg_gd: 11,
            rpg_min_dec_fac: 0,
            rpg_min_rate: 1000,
            rpg_max_rate: 0,
            rate_to_set_on_first_cnp: 0,
            dce_tcp_g: 1020,
            dce_tcp_rtt: 1,
            rate_reduce_monitor_period: 4,
            initial_alpha_value: 1024,
            clamp_tgt_rate: false,
            min_time_between_cnps: 0,
            cnp_dscp: 48,
            cnp_802p_prio: 6,
        }
    }

    /// Checks ranges; the error names the knob.
    pub fn validate(&self) -> Result<(), &'static str> {
        let checks: [(bool, &'static str); 8] = [
            (self.rpg_time_reset > 0, "rpg_time_reset"),
            (self.rpg_threshold <= 31, "rpg_threshold"),
            ((1..=20).contains(&self.rpg_gd), "rpg_gd"),
            (self.rpg_min_dec_fac <= 100, "rpg_min_dec_fac"),
            (self.rpg_min_rate > 0, "rpg_min_rate"),
            (self.dce_tcp_g <= 1024, "dce_tcp_g"),
            (self.dce_tcp_rtt > 0, "dce_tcp_rtt"),
            (self.initial_alpha_value <= 1024, "initial_alpha_value"),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, name)) => Err(name),
            None if self.rpg_max_rate != 0 && self.rpg_max_rate < self.rpg_min_rate => {
                Err("rpg_max_rate")
            }
            None if self.cnp_dscp > 63 => Err("cnp_dscp"),
            None if self.cnp_802p_prio > 7 => Err("cnp_802p_prio"),
            None => Ok(()),
        }
    }
}

const MBPS: f64 = 1e6;

fn us(v: u32) -> Duration {
    Duration::from_micros(v as u64)
}

/// One QP's reaction point. Laid out so that what every packet touches (the rate, the timers,
/// the byte counter and the flags) shares the first cache line; the target, alpha and counters
/// (touched on CNPs and rate changes) are in the second.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Dcqcn {
    /// Current rate, bits per second.
    rc: f64,
    /// When the pending cut is applied.
    cut_at: Option<Instant>,
    /// Next timer increase.
    inc_at: Option<Instant>,
    bytes: u64,
    /// Timer and byte stages since the last cut.
    t_stage: u32,
    b_stage: u32,
    /// Rate limited (since a first CNP, until back at the maximum).
    limited: bool,
    /// A CNP arrived since the last decrease step.
    cut_pending: bool,
    /// A CNP arrived in the current alpha step.
    alpha_cnp: bool,
    /// Target rate, bits per second.
    rt: f64,
    /// Line rate, bits per second.
    line: f64,
    alpha: f64,
    /// Start of the alpha step `alpha` is current for.
    alpha_at: Instant,
    /// Start of the decrease grid.
    grid: Instant,
    /// CNPs that cut or will cut the rate, and CNPs that arrived while a cut was already due.
    pub cnp_handled: u64,
    /// CNPs that changed nothing (a cut was already pending for this step).
    pub cnp_ignored: u64,
}

impl Dcqcn {
    /// A QP sending at `line_bps`, not rate limited.
    pub fn new(line_bps: f64) -> Self {
        Dcqcn {
            rc: line_bps,
            rt: line_bps,
            line: line_bps,
            alpha: 0.0,
            alpha_at: Instant::ZERO,
            alpha_cnp: false,
            limited: false,
            cut_pending: false,
            cut_at: None,
            grid: Instant::ZERO,
            t_stage: 0,
            b_stage: 0,
            bytes: 0,
            inc_at: None,
            cnp_handled: 0,
            cnp_ignored: 0,
        }
    }

    fn max_rate(&self, p: &DcqcnParams) -> f64 {
        if p.rpg_max_rate == 0 {
            self.line
        } else {
            (p.rpg_max_rate as f64 * MBPS).min(self.line)
        }
    }

    /// Current rate, bits per second.
    pub fn rate(&self) -> f64 {
        self.rc
    }

    /// Target rate, bits per second.
    pub fn target(&self) -> f64 {
        self.rt
    }

    /// Alpha as of `now` (0..=1).
    pub fn alpha(&self, now: Instant, p: &DcqcnParams) -> f64 {
        let mut c = self.clone();
        c.advance_alpha(now, p);
        c.alpha
    }

    /// True while CNPs hold the rate below the maximum.
    pub fn is_limited(&self) -> bool {
        self.limited
    }

    /// Applies the alpha steps that ended by `now`.
    fn advance_alpha(&mut self, now: Instant, p: &DcqcnParams) {
        if !self.limited {
            return;
        }
        let period = us(p.dce_tcp_rtt).as_nanos() as u64;
        let steps = now.0.saturating_sub(self.alpha_at.0) / period;
        if steps == 0 {
            return;
        }
        let g = p.dce_tcp_g as f64 / 1024.0;
        if self.alpha_cnp {
            self.alpha = g * self.alpha + (1.0 - g);
        } else {
            self.alpha *= g;
        }
        self.alpha *= g.powi((steps - 1).min(i32::MAX as u64) as i32);
        self.alpha_cnp = false;
        self.alpha_at = Instant(self.alpha_at.0 + steps * period);
    }

    /// A CNP for this QP arrived at `now`.
    pub fn on_cnp(&mut self, now: Instant, p: &DcqcnParams) {
        if !self.limited {
            self.limited = true;
            self.alpha = p.initial_alpha_value as f64 / 1024.0;
            self.alpha_at = now;
            self.alpha_cnp = false;
            self.grid = now;
            if p.rate_to_set_on_first_cnp != 0 {
                self.rc = (p.rate_to_set_on_first_cnp as f64 * MBPS).min(self.max_rate(p));
            }
            self.rt = self.rc;
            self.t_stage = 0;
            self.b_stage = 0;
            self.bytes = 0;
            self.inc_at = None;
        } else {
            self.advance_alpha(now, p);
            self.alpha_cnp = true;
        }
        if p.rate_reduce_monitor_period == 0 {
            self.cnp_handled += 1;
            self.cut(now, p);
            return;
        }
        if self.cut_pending {
            self.cnp_ignored += 1;
            return;
        }
        self.cnp_handled += 1;
        self.cut_pending = true;
        // The next step of the decrease grid strictly after now.
        let period = us(p.rate_reduce_monitor_period).as_nanos() as u64;
        let k = now.0.saturating_sub(self.grid.0) / period + 1;
        self.cut_at = Some(Instant(self.grid.0 + k * period));
    }

    fn cut(&mut self, now: Instant, p: &DcqcnParams) {
        self.advance_alpha(now, p);
        if p.clamp_tgt_rate || self.t_stage != 0 {
            self.rt = self.rc;
        }
        let by_alpha = self.rc * (1.0 - self.alpha * 1024.0 / (1u64 << p.rpg_gd) as f64);
        let floor = self.rc * p.rpg_min_dec_fac as f64 / 100.0;
        self.rc = by_alpha
            .max(floor)
            .max(p.rpg_min_rate as f64 * MBPS)
            .min(self.rc);
        self.t_stage = 0;
        self.b_stage = 0;
        self.bytes = 0;
        self.cut_pending = false;
        self.cut_at = None;
        self.inc_at = Some(now + us(p.rpg_time_reset));
    }

    /// `n` bytes were sent (drives the byte counter).
    pub fn on_sent(&mut self, n: u64, p: &DcqcnParams) {
        if !self.limited || p.rpg_byte_reset == 0 || self.inc_at.is_none() {
            return;
        }
        self.bytes += n;
        while self.limited && self.bytes >= p.rpg_byte_reset as u64 {
            self.bytes -= p.rpg_byte_reset as u64;
            self.increase(true, p);
        }
    }

    fn increase(&mut self, by_bytes: bool, p: &DcqcnParams) {
        let f = p.rpg_threshold;
        let (t, b) = (self.t_stage, self.b_stage);
        let byte_counter = p.rpg_byte_reset != 0;
        let (fast, hyper) = if byte_counter {
            (t.max(b) < f, (t.min(b) > f).then(|| t.min(b) - f))
        } else {
            (t < f, (t > f).then(|| t - f))
        };
        let max = self.max_rate(p);
        if !fast {
            match hyper {
                Some(i) => self.rt += i as f64 * p.rpg_hai_rate as f64 * MBPS,
                None => self.rt += p.rpg_ai_rate as f64 * MBPS,
            }
            self.rt = self.rt.min(max);
        }
        self.rc = ((self.rc + self.rt) / 2.0).min(max);
        if by_bytes {
            self.b_stage += 1;
        } else {
            self.t_stage += 1;
        }
        if self.rc >= max && self.rt >= max && !self.cut_pending {
            // Back at the maximum: no longer rate limited; the next CNP starts afresh.
            self.rc = max;
            self.rt = max;
            self.limited = false;
            self.inc_at = None;
        }
    }

    /// When [`Dcqcn::handle_timeout`] is next due.
    pub fn next_timeout(&self) -> Option<Instant> {
        match (self.cut_at, self.inc_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the cut and increase steps due at `now`, in time order.
    pub fn handle_timeout(&mut self, now: Instant, p: &DcqcnParams) {
        loop {
            match (self.cut_at, self.inc_at) {
                (Some(c), i) if c <= now && i.is_none_or(|i| c <= i) => self.cut(c, p),
                (_, Some(i)) if i <= now => {
                    self.inc_at = Some(i + us(p.rpg_time_reset));
                    self.increase(false, p);
                }
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
