//! Each rule against values computed by hand.

use super::*;

const G100: f64 = 100e9;

fn at_us(u: u64) -> Instant {
    Instant(u * 1000)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * b.abs().max(1.0)
}

/// NVIDIA defaults without the byte counter, so only the timer drives increases.
fn timer_only() -> DcqcnParams {
    DcqcnParams {
        rpg_byte_reset: 0,
        ..DcqcnParams::nvidia()
    }
}

#[test]
fn the_first_cnp_sets_alpha_and_the_cut_waits_for_the_monitor_period() {
    let p = DcqcnParams::nvidia();
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(10), &p);
    assert!(d.is_limited());
    assert_eq!(d.rate(), G100, "rate_to_set_on_first_cnp 0 keeps the rate");
    assert_eq!(d.next_timeout(), Some(at_us(14)));
    // Alpha starts at 1023/1024 and decays by 1019/1024 per microsecond without CNPs.
    let a0 = 1023.0 / 1024.0;
    let g: f64 = 1019.0 / 1024.0;
    assert!(close(d.alpha(at_us(10), &p), a0));
    assert!(close(d.alpha(at_us(12), &p), a0 * g * g));
    d.handle_timeout(at_us(14), &p);
    // At 14 us: four decays, then rc = 100G * (1 - alpha * 1024 / 2^11) = 100G * (1 - alpha/2).
    let a = a0 * g.powi(4);
    assert!(close(d.rate(), G100 * (1.0 - a / 2.0)), "{}", d.rate());
    // clamp_tgt_rate off and no timer increase yet: the target stays where it was.
    assert_eq!(d.target(), G100);
    // The increase timer starts at the cut.
    assert_eq!(d.next_timeout(), Some(at_us(14 + 300)));
}

#[test]
fn cnps_within_one_monitor_period_cut_once() {
    let p = timer_only();
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p);
    d.on_cnp(at_us(1), &p);
    d.on_cnp(at_us(3), &p);
    assert_eq!((d.cnp_handled, d.cnp_ignored), (1, 2));
    d.handle_timeout(at_us(4), &p);
    // Alpha steps: 0-1 none (the first CNP only initialises), 1-2 a CNP (the one at 1 us falls
    // in the step that starts at 1 us), 2-3 none, 3-4 a CNP.
    let g: f64 = 1019.0 / 1024.0;
    let mut a: f64 = 1023.0 / 1024.0;
    a *= g;
    a = g * a + (1.0 - g);
    a *= g;
    a = g * a + (1.0 - g);
    assert!(close(d.rate(), G100 * (1.0 - a / 2.0)), "{}", d.rate());
    // A CNP after the cut waits for the next step of the grid (8 us).
    d.on_cnp(at_us(5), &p);
    assert_eq!(d.next_timeout(), Some(at_us(8)));
}

#[test]
fn a_cut_never_goes_below_min_dec_fac_or_min_rate() {
    let p = DcqcnParams {
        rpg_gd: 10, // rc * (1 - alpha): alpha near 1 would cut to almost nothing
        rpg_min_dec_fac: 50,
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p);
    d.handle_timeout(at_us(4), &p);
    assert!(
        close(d.rate(), G100 * 0.5),
        "min_dec_fac keeps half: {}",
        d.rate()
    );
    let p = DcqcnParams {
        rpg_min_rate: 40_000,
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    for i in 0..10 {
        d.on_cnp(at_us(i * 4), &p);
        d.handle_timeout(at_us(i * 4 + 4), &p);
    }
    assert!(close(d.rate(), 40e9), "floor at rpg_min_rate: {}", d.rate());
}

#[test]
fn rate_to_set_on_first_cnp_and_clamp_tgt_rate() {
    let p = DcqcnParams {
        rate_to_set_on_first_cnp: 25_000,
        clamp_tgt_rate: true,
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 512,
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p);
    // Monitor period 0: the cut happens at once, from 25G with alpha 1/2: 25G * 3/4.
    assert!(close(d.rate(), 18.75e9), "{}", d.rate());
    assert!(close(d.target(), 25e9), "clamp: rt = rc before the cut");
}

#[test]
fn increases_go_fast_recovery_then_additive_then_hyper() {
    // F = 2, AI 40 Mb/s, HAI 200 Mb/s, timer 55 us, no byte counter.
    let p = DcqcnParams {
        rpg_threshold: 2,
        rpg_ai_rate: 40,
        rpg_hai_rate: 200,
        rpg_time_reset: 55,
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 1024,
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p);
    // alpha 1: rc = 50G; rt stays 100G (no clamp, no timer increase yet), so bring the target
    // down with a second cut after one timer increase.
    assert!(close(d.rate(), 50e9));
    d.handle_timeout(at_us(55), &p); // fast recovery: 75G, T=1
    d.on_cnp(at_us(56), &p); // rt = 75G, rc = 75G * (1 - alpha/2)
    assert!(close(d.target(), 75e9));
    let mut rc = d.rate();
    let mut rt = 75e9;
    // Stages seen by each timer event, and what they do (F = 2).
    for (k, t) in [0u32, 1, 2, 3, 4].into_iter().enumerate() {
        let when = at_us(56 + 55 * (k as u64 + 1));
        assert_eq!(d.next_timeout(), Some(when));
        d.handle_timeout(when, &p);
        match t {
            0 | 1 => {}                        // fast recovery
            2 => rt += 40e6,                   // additive
            n => rt += (n - 2) as f64 * 200e6, // hyper, i = T - F
        }
        rc = (rc + rt) / 2.0;
        assert!(close(d.rate(), rc), "stage {t}: {} vs {rc}", d.rate());
        assert!(close(d.target(), rt), "stage {t}: {} vs {rt}", d.target());
    }
}

#[test]
fn a_cut_after_a_timer_increase_sets_the_target_to_the_current_rate() {
    let p = DcqcnParams {
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 1024,
        dce_tcp_g: 1024, // alpha stays 1
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p); // 50G, rt 100G
    d.handle_timeout(at_us(300), &p); // fast recovery: 75G
    assert!(close(d.rate(), 75e9));
    d.on_cnp(at_us(301), &p); // t_stage 1: rt = 75G, rc = 37.5G
    assert!(close(d.target(), 75e9));
    assert!(close(d.rate(), 37.5e9));
}

#[test]
fn the_byte_counter_drives_increases_and_hyper_needs_both_stages() {
    let p = DcqcnParams {
        rpg_byte_reset: 1000,
        rpg_threshold: 1,
        rpg_ai_rate: 10,
        rpg_hai_rate: 100,
        rate_reduce_monitor_period: 0,
        initial_alpha_value: 1024,
        dce_tcp_g: 1024,
        ..DcqcnParams::nvidia()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p); // rc 50G, rt 100G
    d.on_sent(999, &p);
    assert!(close(d.rate(), 50e9), "not yet a full byte step");
    d.on_sent(1, &p); // T=0,B=0: fast recovery -> 75G, B=1
    assert!(close(d.rate(), 75e9));
    d.handle_timeout(at_us(300), &p); // T=0,B=1: additive (rt clamps at 100G) -> 87.5G, T=1
    assert!(close(d.rate(), 87.5e9));
    d.on_cnp(at_us(301), &p); // T=1: rt = rc = 87.5G; rc = 43.75G; stages reset
    assert!(close(d.target(), 87.5e9));
    assert!(close(d.rate(), 43.75e9));
    let (mut rc, mut rt) = (d.rate(), d.target());
    // Byte events only: min(T, B) stays 0, so never hyper.
    d.on_sent(1000, &p); // T=0,B=0: fast recovery
    rc = (rc + rt) / 2.0;
    d.on_sent(1000, &p); // T=0,B=1: additive
    rt += 10e6;
    rc = (rc + rt) / 2.0;
    assert!(close(d.rate(), rc) && close(d.target(), rt));
    // Two timer events: (T=0,B=2) additive, (T=1,B=2) additive; then a byte event at
    // (T=2,B=2): hyper with i = 1.
    d.handle_timeout(at_us(601), &p);
    d.handle_timeout(at_us(901), &p);
    for _ in 0..2 {
        rt += 10e6;
        rc = (rc + rt) / 2.0;
    }
    d.on_sent(1000, &p);
    rt += 100e6;
    rc = (rc + rt) / 2.0;
    assert!(close(d.rate(), rc), "{} vs {rc}", d.rate());
    assert!(close(d.target(), rt));
}

#[test]
fn back_at_line_rate_the_qp_stops_being_limited_and_costs_nothing() {
    let p = DcqcnParams {
        rate_reduce_monitor_period: 0,
        ..timer_only()
    };
    let mut d = Dcqcn::new(G100);
    d.on_cnp(at_us(0), &p);
    let mut t = 0;
    while d.is_limited() {
        let next = d.next_timeout().expect("a limited QP has a timer");
        d.handle_timeout(next, &p);
        t += 1;
        assert!(t < 10_000);
    }
    assert_eq!(d.rate(), G100);
    assert_eq!(d.next_timeout(), None, "no timers once recovered");
    // The next CNP is a first CNP again: alpha restarts at initial_alpha_value (and with no
    // monitor period it cuts at once with it).
    d.on_cnp(at_us(1_000_000), &p);
    let a = 1023.0 / 1024.0;
    assert!(close(d.alpha(at_us(1_000_000), &p), a));
    assert!(close(d.rate(), G100 * (1.0 - a / 2.0)));
}

#[test]
fn profiles_validate_and_bad_knobs_are_named() {
    for p in [
        DcqcnParams::nvidia(),
        DcqcnParams::paper(),
        DcqcnParams::hpcc_ns3(),
    ] {
        assert_eq!(p.validate(), Ok(()));
    }
    let bad = |f: fn(&mut DcqcnParams)| {
        let mut p = DcqcnParams::nvidia();
        f(&mut p);
        p.validate().unwrap_err()
    };
    assert_eq!(bad(|p| p.rpg_time_reset = 0), "rpg_time_reset");
    assert_eq!(bad(|p| p.rpg_gd = 0), "rpg_gd");
    assert_eq!(bad(|p| p.dce_tcp_g = 1025), "dce_tcp_g");
    assert_eq!(bad(|p| p.rpg_min_dec_fac = 101), "rpg_min_dec_fac");
    assert_eq!(bad(|p| p.cnp_dscp = 64), "cnp_dscp");
    assert_eq!(bad(|p| p.cnp_802p_prio = 8), "cnp_802p_prio");
    assert_eq!(
        bad(|p| {
            p.rpg_min_rate = 10;
            p.rpg_max_rate = 5
        }),
        "rpg_max_rate"
    );
}

#[test]
fn cc_none_is_line_rate_and_counts_cnps_as_ignored() {
    let p = DcqcnParams::nvidia();
    let mut c = crate::cc::Cc::new(crate::cc::CcKind::None, G100);
    c.on_cnp(at_us(1), &p);
    assert_eq!(c.rate(), G100);
    assert_eq!(c.cnp_counts(), (0, 1));
    assert_eq!(c.next_timeout(), None);
    assert_eq!("dcqcn".parse(), Ok(crate::cc::CcKind::Dcqcn));
    assert!("reno".parse::<crate::cc::CcKind>().is_err());
}
