//! The retry policies, pinned to the seeds' figures as DESIGN.md reads them.

use hookwise_core::health::adaptive_multiplier;
use hookwise_core::policy::*;
use rand::rngs::StdRng;
use rand::SeedableRng;

fn cumulative(p: &RetryPolicy) -> Vec<u64> {
    p.nominal_schedule().iter().map(|r| r.2 as u64).collect()
}

#[test]
fn standard_is_seed_000s_table() {
    let p = RetryPolicy::standard();
    assert_eq!(p.max_attempts(), 8);
    assert_eq!(cumulative(&p), [0, 60, 360, 2160, 9360, 38160, 124560, 297360]);
    assert_eq!(p.jitter, Jitter::Additive(0.1));
    assert!(p.adaptive);
}

#[test]
fn ledger_dies_about_14_6_hours_after_the_first_attempt_not_2_6() {
    let p = RetryPolicy::ledger();
    assert_eq!(p.max_attempts(), 6);
    assert_eq!(*cumulative(&p).last().unwrap(), 52_560);
    assert_ne!(
        *cumulative(&p).last().unwrap(),
        9_360,
        "the sketched table's off-by-one"
    );
    assert_eq!(p.jitter, Jitter::Proportional(0.1));
    assert!(!p.adaptive);
}

#[test]
fn exponential_doubles_from_60_s_and_caps_at_a_day() {
    let p = RetryPolicy::exponential();
    assert_eq!(p.base_delay(1), Some(60.0));
    assert_eq!(p.base_delay(2), Some(120.0));
    assert_eq!(p.base_delay(11), Some(61_440.0));
    assert_eq!(p.base_delay(12), Some(86_400.0), "60 × 2^11 = 122 880 is capped");
    assert_eq!(p.base_delay(p.max_attempts()), None);
    // The cap applies after jitter: min(base × 2^n + jitter, max_delay).
    let capped = p.delay_range(12, None).unwrap();
    assert_eq!(capped.hi, 86_400.0);
    let uncapped = p.delay_range(1, None).unwrap();
    assert_eq!((uncapped.lo, uncapped.hi), (60.0, 66.0));
}

fn samples(p: &RetryPolicy, failures: u32, previous: Option<f64>) -> Vec<f64> {
    let mut rng = StdRng::seed_from_u64(2026);
    (0..20_000)
        .map(|_| p.delay_range(failures, previous).unwrap().sample(&mut rng))
        .collect()
}

fn assert_spans(xs: &[f64], lo: f64, hi: f64) {
    let min = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    assert!(
        min >= lo && max <= hi,
        "samples in [{min}, {max}], expected within [{lo}, {hi}]"
    );
    let width = hi - lo;
    assert!(
        min - lo < width * 0.01 && hi - max < width * 0.01,
        "samples should fill [{lo}, {hi}], got [{min}, {max}]"
    );
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    assert!(
        (mean - (lo + hi) / 2.0).abs() < width * 0.02,
        "uniform mean, got {mean}"
    );
}

#[test]
fn each_jitter_strategy_stays_in_its_bounds_and_fills_them() {
    let custom = |j| RetryPolicy::custom(vec![100], j, false).unwrap();
    assert!(samples(&custom(Jitter::None), 1, None).iter().all(|d| *d == 100.0));
    assert_spans(&samples(&custom(Jitter::Proportional(0.1)), 1, None), 90.0, 110.0);
    assert_spans(&samples(&custom(Jitter::Additive(0.1)), 1, None), 100.0, 110.0);
    assert_spans(&samples(&custom(Jitter::Full), 1, None), 0.0, 100.0);
    assert_spans(&samples(&custom(Jitter::Equal), 1, None), 50.0, 100.0);
}

#[test]
fn decorrelated_jitter_draws_between_base_and_three_times_the_previous_delay_capped() {
    let p = RetryPolicy::custom(vec![10, 20, 40, 1000], Jitter::Decorrelated, false).unwrap();
    assert_spans(&samples(&p, 1, None), 10.0, 30.0);
    assert_spans(&samples(&p, 2, Some(25.0)), 10.0, 75.0);
    assert_spans(&samples(&p, 3, Some(900.0)), 10.0, 1000.0);
}

#[test]
fn adaptive_scales_the_delay_by_health() {
    let p = RetryPolicy::custom(vec![100], Jitter::None, true).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let delay = |health| {
        p.next_delay(
            RetryContext {
                failures: 1,
                health,
                ..Default::default()
            },
            true,
            &mut StdRng::seed_from_u64(1),
        )
    };
    assert_eq!(delay(Some(0.95)), Some(50.0));
    assert_eq!(delay(Some(0.7)), Some(100.0));
    assert_eq!(delay(Some(0.3)), Some(200.0));
    assert_eq!(delay(None), Some(100.0));
    let off = RetryPolicy::custom(vec![100], Jitter::None, false).unwrap();
    assert_eq!(
        off.next_delay(
            RetryContext {
                failures: 1,
                health: Some(0.3),
                ..Default::default()
            },
            true,
            &mut rng
        ),
        Some(100.0)
    );
    assert_eq!(adaptive_multiplier(Some(0.3)), 2.0);
}

#[test]
fn retry_after_is_honoured_up_to_the_policys_longest_delay() {
    let p = RetryPolicy::custom(vec![10, 600], Jitter::None, false).unwrap();
    let mut rng = StdRng::seed_from_u64(1);
    let ctx = |retry_after| RetryContext {
        failures: 1,
        retry_after,
        ..Default::default()
    };
    assert_eq!(
        p.next_delay(ctx(Some(120.0)), true, &mut rng),
        Some(120.0),
        "later than the schedule: wait as asked"
    );
    assert_eq!(
        p.next_delay(ctx(Some(5.0)), true, &mut rng),
        Some(10.0),
        "sooner than the schedule: keep the schedule"
    );
    assert_eq!(
        p.next_delay(ctx(Some(86_400.0)), true, &mut rng),
        Some(600.0),
        "capped at the longest delay"
    );
}

#[test]
fn retries_switched_off_make_the_first_failure_final() {
    let mut rng = StdRng::seed_from_u64(1);
    let ctx = RetryContext {
        failures: 1,
        ..Default::default()
    };
    assert!(RetryPolicy::standard().next_delay(ctx, false, &mut rng).is_none());
    assert!(RetryPolicy::standard().next_delay(ctx, true, &mut rng).is_some());
}

#[test]
fn no_delay_after_the_last_attempt() {
    let p = RetryPolicy::custom(vec![1, 1, 1], Jitter::None, false).unwrap();
    assert_eq!(p.max_attempts(), 4);
    let mut rng = StdRng::seed_from_u64(1);
    assert!(p
        .next_delay(
            RetryContext {
                failures: 3,
                ..Default::default()
            },
            true,
            &mut rng
        )
        .is_some());
    assert!(p
        .next_delay(
            RetryContext {
                failures: 4,
                ..Default::default()
            },
            true,
            &mut rng
        )
        .is_none());
}

#[test]
fn policies_parse_from_their_api_form_and_refuse_bad_ones() {
    let named: RetryPolicy = serde_json::from_str(r#""ledger""#).unwrap();
    assert_eq!(named, RetryPolicy::ledger());
    let custom: RetryPolicy =
        serde_json::from_str(r#"{"schedule_seconds": [1, 1, 1], "jitter": {"proportional": 0.2}, "adaptive": true}"#)
            .unwrap();
    assert_eq!(custom.max_attempts(), 4);
    assert_eq!(custom.jitter, Jitter::Proportional(0.2));
    assert_eq!(
        serde_json::to_value(&custom).unwrap()["schedule_seconds"],
        serde_json::json!([1, 1, 1])
    );
    assert_eq!(
        serde_json::to_value(RetryPolicy::standard()).unwrap(),
        serde_json::json!("standard")
    );

    let unknown = serde_json::from_str::<RetryPolicy>(r#""fastest""#)
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("unknown retry policy `fastest`"), "{unknown}");
    assert!(RetryPolicy::custom(vec![1; 51], Jitter::None, false).is_err());
    assert!(RetryPolicy::custom(vec![31 * 86_400], Jitter::None, false).is_err());
    assert!(RetryPolicy::custom(vec![1], Jitter::Proportional(1.5), false).is_err());
    assert_eq!(Jitter::parse("proportional:0.1").unwrap(), Jitter::Proportional(0.1));
    assert!(Jitter::parse("sideways").is_err());
}

#[test]
fn a_policy_spec_is_a_name_or_a_custom_schedule_and_a_bad_one_says_what_is_wrong() {
    let parse = |v: serde_json::Value| serde_json::from_value::<PolicySpec>(v).map_err(|e| e.to_string());
    assert_eq!(
        parse(serde_json::json!("ledger")),
        Ok(PolicySpec::Named("ledger".into()))
    );
    assert_eq!(
        parse(serde_json::json!({"schedule_seconds": [1, 5]})),
        Ok(PolicySpec::Custom {
            schedule_seconds: vec![1, 5],
            jitter: Jitter::None,
            adaptive: false
        })
    );
    let misspelt = parse(serde_json::json!({"schedule": [1, 5]})).unwrap_err();
    assert!(misspelt.contains("unknown field `schedule`"), "{misspelt}");
    let jitter = parse(serde_json::json!({"schedule_seconds": [1], "jitter": "wobbly"})).unwrap_err();
    assert!(jitter.contains("wobbly"), "{jitter}");
    let number = parse(serde_json::json!(5)).unwrap_err();
    assert!(
        number.contains("a policy name") && number.contains("schedule_seconds"),
        "{number}"
    );
    // What is stored reads back as it was written.
    let custom = PolicySpec::Custom {
        schedule_seconds: vec![60],
        jitter: Jitter::Proportional(0.1),
        adaptive: true,
    };
    assert_eq!(parse(serde_json::to_value(&custom).unwrap()), Ok(custom));
}

#[test]
fn the_longest_span_counts_every_delay_at_its_longest() {
    // standard: [1 min … 48 h], +10 % jitter, adaptive ×2, Retry-After up to 48 h per retry.
    let h48 = 172_800.0;
    let expected = 5.0 * h48 + 86_400.0 * 1.1 * 2.0 + h48 * 1.1 * 2.0;
    assert!((RetryPolicy::standard().longest_span() - expected).abs() < 1e-6);
    // A custom 30-day delay doubled by adaptive health: 60 days.
    let long = RetryPolicy::custom(vec![30 * 86_400], Jitter::None, true).unwrap();
    assert_eq!(long.longest_span(), 60.0 * 86_400.0);
    assert_eq!(
        RetryPolicy::custom(vec![], Jitter::None, true).unwrap().longest_span(),
        0.0
    );
}
