use super::*;
use crate::policy::{Jitter, RetryPolicy};

fn seed003(population: u64, jitter: Jitter, seed: u64) -> StormConfig {
    let policy = StormConfig::seed_policy(2, 6, jitter).unwrap();
    let mut c = StormConfig::new(policy, population, 500);
    c.seed = seed;
    c
}

fn standard(population: u64, jitter: Jitter, seed: u64) -> StormConfig {
    let mut c = StormConfig::new(RetryPolicy::standard().with_jitter(jitter), population, 500);
    c.seed = seed;
    c
}

fn run(c: &StormConfig) -> StormReport {
    simulate(c).unwrap()
}

#[test]
fn given_no_jitter_when_10000_fail_at_b2_m6_then_the_waves_are_exact() {
    let r = run(&seed003(10_000, Jitter::None, 1));
    let waves = [
        (1, 10_000),
        (3, 9_500),
        (7, 9_000),
        (15, 8_500),
        (31, 8_000),
        (63, 7_500),
        (127, 7_000),
    ];
    for (t, n) in waves {
        assert_eq!(r.series.offered[t], n, "offered at t = {t}");
        assert_eq!(r.series.served[t], 500, "served at t = {t}");
        assert_eq!(r.series.failed[t], n - 500, "failed at t = {t}");
    }
    let busy: Vec<usize> = (0..r.series.offered.len())
        .filter(|t| r.series.offered[*t] > 0)
        .collect();
    assert_eq!(
        busy,
        waves.iter().map(|w| w.0).collect::<Vec<_>>(),
        "nothing lands between the waves"
    );
    assert_eq!(r.total_attempts, 69_500, "the 10 000 first attempts included");
    assert_eq!((r.delivered, r.dead), (3_500, 6_500));
    assert_eq!((r.peak_offered_rps, r.peak_second, r.drain_seconds), (10_000, 1, 127));
    let mean = 500.0 * (1 + 3 + 7 + 15 + 31 + 63 + 127) as f64 / 3_500.0;
    assert!((r.mean_delivery_seconds.unwrap() - mean).abs() < 1e-9);
    assert_eq!(r.p99_delivery_seconds, Some(127));
}

#[test]
fn given_no_jitter_when_the_seed_changes_then_nothing_does() {
    let a = run(&seed003(10_000, Jitter::None, 1));
    let b = run(&seed003(10_000, Jitter::None, 99));
    assert_eq!(a.series, b.series);
    assert_eq!(
        (a.delivered, a.dead, a.total_attempts),
        (b.delivered, b.dead, b.total_attempts)
    );
}

#[test]
fn given_standard_policy_when_jitter_is_full_then_the_peak_is_an_order_of_magnitude_lower() {
    let none = run(&standard(10_000, Jitter::None, 3));
    let full = run(&standard(10_000, Jitter::Full, 3));
    // No jitter: every delivery's first retry comes in the same second (60 s × 2, health 0).
    assert_eq!(none.peak_offered_rps, 10_000);
    assert_eq!(none.peak_second, 120);
    assert!(
        full.peak_offered_rps * 10 <= none.peak_offered_rps,
        "full {} vs none {}",
        full.peak_offered_rps,
        none.peak_offered_rps
    );
    // Spread below capacity, the first wave is served in full.
    assert_eq!((full.delivered, full.dead), (10_000, 0));
    assert!(none.dead > 0 || none.drain_seconds > full.drain_seconds);
}

#[test]
fn given_b2_when_jitter_is_full_or_equal_then_the_first_wave_still_lands_in_second_1() {
    for jitter in [Jitter::None, Jitter::Full, Jitter::Equal] {
        let r = run(&seed003(10_000, jitter, 5));
        assert_eq!((r.peak_offered_rps, r.peak_second), (10_000, 1), "{jitter:?}");
    }
}

#[test]
fn given_b2_when_jitter_is_full_then_the_gains_are_in_attempts_deliveries_and_drain_time() {
    let none = run(&seed003(10_000, Jitter::None, 11));
    for seed in [11, 12, 13] {
        for jitter in [Jitter::Full, Jitter::Equal] {
            let r = run(&seed003(10_000, jitter, seed));
            assert!(
                r.delivered > none.delivered + 500,
                "{jitter:?} seed {seed}: {} delivered",
                r.delivered
            );
            assert!(
                r.total_attempts < none.total_attempts,
                "{jitter:?} seed {seed}: {} attempts",
                r.total_attempts
            );
            assert!(
                r.drain_seconds < none.drain_seconds,
                "{jitter:?} seed {seed}: drains at {}",
                r.drain_seconds
            );
            assert_eq!(r.delivered + r.dead, 10_000);
        }
    }
}

#[test]
fn given_an_outage_then_a_recovery_when_the_storm_runs_then_it_drains() {
    let mut c = standard(10_000, Jitter::Additive(0.1), 8);
    c.capacity = Capacity {
        base_rps: 0,
        steps: vec![CapacityStep {
            from_second: 600,
            rps: 400,
        }],
    };
    let r = run(&c);
    assert_eq!((r.delivered, r.dead), (10_000, 0));
    assert!(
        r.series.served[..600].iter().all(|n| *n == 0),
        "nothing is served during the outage"
    );
    let failed_after: u64 = r.series.failed[600..].iter().sum();
    assert_eq!(failed_after, 0, "after the recovery, every retry is served");
    assert!(
        r.drain_seconds > 600 && r.drain_seconds < 1_000,
        "drained at {}",
        r.drain_seconds
    );
}

#[test]
fn given_the_same_seed_when_run_twice_then_the_results_are_identical() {
    for c in [
        standard(1_000_000, Jitter::Full, 42),
        seed003(1_000_000, Jitter::Decorrelated, 42),
    ] {
        let a = run(&c);
        let b = run(&c);
        assert_eq!(a, b);
        let mut other = c.clone();
        other.seed = 43;
        assert_ne!(a.series, run(&other).series, "another seed, another storm");
    }
}

#[test]
fn given_shards_when_they_share_a_seed_then_they_land_together_and_independent_ones_do_not() {
    let mut c = standard(4_000, Jitter::Full, 9);
    c.capacity = Capacity::constant(1_000_000);
    c.shards = 4;
    c.shard_seeds = ShardSeeds::Shared;
    let shared = run(&c);
    c.shard_seeds = ShardSeeds::Independent;
    let independent = run(&c);

    assert!(
        shared.shard_offered.windows(2).all(|w| w[0] == w[1]),
        "shared seed: every shard draws the same seconds"
    );
    assert_eq!(
        shared.peak_offered_rps,
        4 * shared.shard_offered[0].iter().max().unwrap()
    );
    assert!(
        independent.shard_offered.windows(2).all(|w| w[0] != w[1]),
        "independent streams differ"
    );
    assert!(
        shared.peak_offered_rps > independent.peak_offered_rps,
        "shared {} vs independent {}",
        shared.peak_offered_rps,
        independent.peak_offered_rps
    );
}

#[test]
fn given_any_strategy_when_the_storm_ends_then_every_delivery_is_delivered_or_dead() {
    for jitter in comparison_jitters(Jitter::Additive(0.1)) {
        for mut c in [seed003(123_457, jitter, 1), standard(123_457, jitter, 1)] {
            c.first_attempt_rps = 40;
            c.traffic_seconds = 300;
            let r = run(&c);
            assert_eq!(r.delivered + r.dead, 123_457 + 40 * 300, "{jitter:?} {}", r.policy);
            let offered: u64 = r.series.offered.iter().sum();
            assert_eq!(r.total_attempts, 123_457 + offered);
            let served: u64 = r.series.served.iter().sum();
            assert_eq!(served, r.delivered);
            assert!(r
                .series
                .offered
                .iter()
                .zip(&r.series.capacity)
                .zip(&r.series.served)
                .all(|((o, c), s)| *s == (*o).min(*c)));
        }
    }
}

#[test]
fn given_a_wide_spread_when_pooled_then_the_landings_follow_the_jitter() {
    // One retry, full jitter over an hour: 10⁶ deliveries should land about 278 a second.
    let policy = RetryPolicy::custom(vec![3_600], Jitter::Full, false).unwrap();
    let mut c = StormConfig::new(policy, 1_000_000, 10_000_000);
    c.seed = 4;
    let r = run(&c);
    assert_eq!(r.delivered, 1_000_000);
    assert!(r.series.offered[0] == 0 && r.drain_seconds <= 3_600);
    for block in r.series.offered[1..].chunks(360) {
        let n: u64 = block.iter().sum();
        assert!((n as f64 - 100_000.0).abs() < 2_000.0, "an hour's tenth got {n}");
    }
}

#[test]
fn given_a_billion_when_simulated_then_it_costs_what_a_thousand_costs() {
    let time = |n| {
        let started = std::time::Instant::now();
        let r = run(&seed003(n, Jitter::Full, 2));
        assert_eq!(r.delivered + r.dead, n);
        started.elapsed()
    };
    let small = time(1_000);
    let huge = time(1_000_000_000);
    assert!(huge.as_secs_f64() < 0.5, "N = 10⁹ took {huge:?} (N = 10³: {small:?})");
}

#[test]
fn given_an_adaptive_policy_when_health_is_tracked_then_a_mass_failure_doubles_the_delays() {
    let mut c = standard(1_000, Jitter::None, 1);
    c.capacity = Capacity::constant(0);
    let tracked = run(&c);
    c.health = HealthModel::Unknown;
    let unknown = run(&c);
    assert_eq!(unknown.peak_second, 60);
    assert_eq!(tracked.peak_second, 120);
    // 60 s × 2 + 300 × 2 + ... : the nominal 297 360 s schedule, doubled.
    assert_eq!(tracked.drain_seconds, 2 * 297_360);
    assert_eq!(unknown.drain_seconds, 297_360);
    assert_eq!(tracked.dead, 1_000);
}

/// The outage in the calculator, as the end-to-end storm test runs it: 5 000 fail at
/// t = 0 on a consumer down for 90 s, then able to take 100 a second; retries doubling from
/// 2 s, without jitter.
fn outage(protected: bool) -> StormReport {
    let policy = RetryPolicy::custom(vec![2, 4, 8, 16, 32, 64, 128], Jitter::None, false).unwrap();
    let mut c = StormConfig::new(policy, 5_000, 100);
    c.capacity.steps = vec![
        CapacityStep { from_second: 0, rps: 0 },
        CapacityStep {
            from_second: 90,
            rps: 100,
        },
    ];
    if protected {
        c.rate_limit_per_second = Some(100);
        c.circuit_breaker = crate::circuit::CircuitBreaker::on();
    }
    run(&c)
}

#[test]
fn given_an_outage_then_the_limit_and_breaker_hold_the_retries_and_lose_none() {
    let (on, off) = (outage(true), outage(false));
    let during = |r: &StormReport| r.series.offered[1..90].iter().sum::<u64>();
    // Off: every retry inside the outage is made (five of them each), and the waves after it
    // kill most; on: a probe each 30 s, then 100 a second, and none dies.
    assert_eq!(during(&off), 5 * 5_000);
    assert!(during(&on) <= 3, "{} offered during the outage", during(&on));
    assert!(off.dead > 2_000, "{} dead without protection", off.dead);
    assert_eq!((on.delivered, on.dead), (5_000, 0));
    assert!(on.peak_offered_rps <= 111, "{}", on.peak_offered_rps);
    assert_eq!(on.breaker_openings, 1);
    assert_eq!(on.peak_waiting, 5_000);
    // Released at 100 a second from the first probe after the recovery.
    assert!(on.drain_seconds <= 90 + 30 + 51, "{}", on.drain_seconds);
}

#[test]
fn given_a_rate_limit_then_no_second_offers_more_and_everything_is_delivered() {
    let mut c = seed003(10_000, Jitter::None, 1);
    c.rate_limit_per_second = Some(100);
    let r = run(&c);
    assert!(
        r.series.offered[1..].iter().all(|n| *n <= 100),
        "{:?}",
        r.series.offered
    );
    assert_eq!((r.delivered, r.dead), (10_000, 0));
    assert_eq!(r.breaker_openings, 0);
}
