//! `hookwise storm`: the retry-storm calculator and its deploy gate.
//!
//! Reads the storm config's YAML (`retry_policy: {backoff_base_seconds, max_tier, jitter,
//! consumer_capacity_rps, simulation: {...}}`), extended with a named or custom policy, new
//! traffic, a capacity schedule, a seed and shards, and the endpoint's rate limit and circuit
//! breaker as a subscription sets them; flags override the file. Exit 0: the
//! peak is within `fail_deploy_if_peak_exceeds_rps`; 1: it is not; 2: the config is bad.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use hookwise_core::circuit::CircuitBreaker;
use hookwise_core::policy::{Jitter, PolicySpec, RetryPolicy};
use hookwise_core::storm::{
    comparison_jitters, simulate_with_progress, Capacity, CapacityStep, HealthModel, ShardSeeds, StormConfig,
    StormReport,
};
use indicatif::{ProgressBar, ProgressDrawTarget};
use serde::Deserialize;
use serde_json::json;

// A file of its own beside this one, declared here so main.rs needs no new line.
use crate::storm_chart;

#[derive(clap::Args)]
pub struct StormArgs {
    /// The YAML policy file (see infra/storm/ and docs/storm.md).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Seed of the random streams (same seed, same storm).
    #[arg(long)]
    seed: Option<u64>,
    /// Deliveries failing at t = 0 (worst_case_failure_population).
    #[arg(long)]
    population: Option<u64>,
    /// none, full, equal, decorrelated, proportional:P or additive:P.
    #[arg(long)]
    jitter: Option<String>,
    /// The consumer's capacity in attempts per second (consumer_capacity_rps).
    #[arg(long)]
    capacity: Option<u64>,
    /// A production policy (standard, ledger, exponential) instead of backoff_base_seconds/max_tier.
    #[arg(long)]
    policy: Option<String>,
    /// The gate: fail when the peak offered rate exceeds this (fail_deploy_if_peak_exceeds_rps).
    #[arg(long)]
    threshold: Option<u64>,
    /// New first attempts per second during the window.
    #[arg(long)]
    first_attempt_rps: Option<u64>,
    /// Dispatcher shards sharing the consumer.
    #[arg(long)]
    shards: Option<u32>,
    /// shared or independent jitter streams across shards.
    #[arg(long)]
    shard_seeds: Option<String>,
    /// The endpoint's rate limit in attempts per second (rate_limit_per_second), as the
    /// delivery path enforces it.
    #[arg(long, value_name = "N")]
    rate_limit: Option<u32>,
    /// The endpoint's circuit breaker with a subscription's defaults (circuit_breaker): on or
    /// off (the default here: the policy alone).
    #[arg(long, value_name = "on|off")]
    breaker: Option<String>,
    /// One JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw offered and served attempts per second, with the capacity, to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Run every jitter strategy on the same inputs, side by side.
    #[arg(long)]
    compare: bool,
}

/// A config problem: the field at fault and what is wrong with it.
#[derive(Debug)]
struct ConfigError {
    field: String,
    message: String,
}

fn bad(field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    retry_policy: PolicySection,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PolicySection {
    backoff_base_seconds: Option<u64>,
    max_tier: Option<u32>,
    /// A name or a custom schedule, as the API takes it.
    policy: Option<PolicySpec>,
    jitter: Option<String>,
    adaptive_health: Option<HealthField>,
    consumer_capacity_rps: Option<u64>,
    #[serde(default)]
    capacity_schedule: Vec<StepField>,
    first_attempt_rps: Option<u64>,
    /// The endpoint's protections, as the API takes them.
    rate_limit_per_second: Option<u32>,
    circuit_breaker: Option<CircuitBreaker>,
    #[serde(default)]
    simulation: SimulationSection,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum HealthField {
    Score(f64),
    Name(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepField {
    from_second: u64,
    rps: u64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SimulationSection {
    worst_case_failure_population: Option<u64>,
    window_seconds: Option<u64>,
    fail_deploy_if_peak_exceeds_rps: Option<u64>,
    seed: Option<u64>,
    shards: Option<u32>,
    shard_seeds: Option<String>,
}

/// What the command runs: the storm and its gate.
struct Plan {
    config: StormConfig,
    threshold: Option<u64>,
}

const P: &str = "retry_policy";

fn plan(args: &StormArgs) -> Result<Plan, ConfigError> {
    let file = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| bad("--config", format!("cannot read {}: {e}", path.display())))?;
            serde_yaml_ng::from_str::<ConfigFile>(&text).map_err(|e| {
                // serde_yaml_ng names the path (`retry_policy.simulation: unknown field ...`).
                let msg = e.to_string();
                match msg.split_once(": ") {
                    Some((path, rest)) if !path.contains(' ') => bad(path, rest),
                    _ => bad("retry_policy", msg),
                }
            })?
        }
        None => ConfigFile::default(),
    };
    let rp = file.retry_policy;
    let sim = rp.simulation;

    let jitter = match args.jitter.as_deref().or(rp.jitter.as_deref()) {
        Some(s) => {
            let field = if args.jitter.is_some() {
                "--jitter"
            } else {
                "retry_policy.jitter"
            };
            Some(Jitter::parse(s).map_err(|e| bad(field, e.message))?)
        }
        None => None,
    };

    let (policy, label) = if let Some(name) = &args.policy {
        let p = RetryPolicy::named(name).map_err(|e| bad("--policy", e.message))?;
        (p, name.clone())
    } else {
        match (rp.policy, rp.backoff_base_seconds, rp.max_tier) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                return Err(bad(
                    &format!("{P}.policy"),
                    "give either a policy or backoff_base_seconds and max_tier, not both",
                ))
            }
            (Some(PolicySpec::Named(name)), None, None) => (
                RetryPolicy::named(&name).map_err(|e| bad(&format!("{P}.policy"), e.message))?,
                name,
            ),
            (
                Some(PolicySpec::Custom {
                    schedule_seconds,
                    jitter,
                    adaptive,
                }),
                None,
                None,
            ) => {
                let p = RetryPolicy::custom(schedule_seconds, jitter, adaptive)
                    .map_err(|e| bad(&format!("{P}.policy.schedule_seconds"), e.message))?;
                (p, "custom".into())
            }
            (None, Some(b), Some(m)) => {
                if b == 0 {
                    return Err(bad(&format!("{P}.backoff_base_seconds"), "must be at least 1"));
                }
                let p = StormConfig::seed_policy(b, m, Jitter::None)
                    .map_err(|e| bad(&format!("{P}.max_tier"), e.message))?;
                (p, format!("b={b} m={m}"))
            }
            (None, None, _) => {
                return Err(bad(
                    &format!("{P}.backoff_base_seconds"),
                    "missing (or name a policy: retry_policy.policy / --policy)",
                ))
            }
            (None, Some(_), None) => return Err(bad(&format!("{P}.max_tier"), "missing")),
        }
    };
    // A named policy keeps its own jitter unless one is given; the calculator's default is none.
    let policy = match jitter {
        Some(j) => policy.with_jitter(j),
        None => policy,
    };

    let population = args.population.or(sim.worst_case_failure_population).ok_or_else(|| {
        bad(
            &format!("{P}.simulation.worst_case_failure_population"),
            "missing (or give --population)",
        )
    })?;
    let base_rps = args
        .capacity
        .or(rp.consumer_capacity_rps)
        .ok_or_else(|| bad(&format!("{P}.consumer_capacity_rps"), "missing (or give --capacity)"))?;
    let steps: Vec<CapacityStep> = rp
        .capacity_schedule
        .iter()
        .map(|s| CapacityStep {
            from_second: s.from_second,
            rps: s.rps,
        })
        .collect();
    if steps.windows(2).any(|w| w[0].from_second >= w[1].from_second) {
        return Err(bad(
            &format!("{P}.capacity_schedule"),
            "steps must be in increasing from_second order",
        ));
    }
    let first_attempt_rps = args.first_attempt_rps.or(rp.first_attempt_rps).unwrap_or(0);
    let window = sim.window_seconds.unwrap_or(0);
    if first_attempt_rps > 0 && window == 0 {
        return Err(bad(
            &format!("{P}.simulation.window_seconds"),
            "needed with first_attempt_rps: how long the new traffic lasts",
        ));
    }
    let health = match rp.adaptive_health {
        None => HealthModel::Tracked,
        Some(HealthField::Name(n)) if n == "tracked" => HealthModel::Tracked,
        Some(HealthField::Name(n)) if n == "unknown" => HealthModel::Unknown,
        Some(HealthField::Score(h)) if (0.0..=1.0).contains(&h) => HealthModel::Fixed(h),
        Some(_) => {
            return Err(bad(
                &format!("{P}.adaptive_health"),
                "use tracked, unknown, or a score between 0 and 1",
            ))
        }
    };
    let shards = args.shards.or(sim.shards).unwrap_or(1);
    if shards == 0 || shards > hookwise_core::storm::MAX_SHARDS {
        let field = if args.shards.is_some() {
            "--shards".to_string()
        } else {
            format!("{P}.simulation.shards")
        };
        return Err(bad(
            &field,
            format!("must be between 1 and {}", hookwise_core::storm::MAX_SHARDS),
        ));
    }
    let shard_seeds = match args
        .shard_seeds
        .as_deref()
        .or(sim.shard_seeds.as_deref())
        .unwrap_or("independent")
    {
        "independent" => ShardSeeds::Independent,
        "shared" => ShardSeeds::Shared,
        other => {
            let field = if args.shard_seeds.is_some() {
                "--shard-seeds".to_string()
            } else {
                format!("{P}.simulation.shard_seeds")
            };
            return Err(bad(&field, format!("`{other}`: use shared or independent")));
        }
    };

    let rate_limit_per_second = args.rate_limit.or(rp.rate_limit_per_second);
    if rate_limit_per_second.is_some_and(|r| !(1..=10_000).contains(&r)) {
        let field = if args.rate_limit.is_some() {
            "--rate-limit".to_string()
        } else {
            format!("{P}.rate_limit_per_second")
        };
        return Err(bad(&field, "must be 1 to 10000 attempts per second"));
    }
    let circuit_breaker = match args.breaker.as_deref() {
        Some("on") => CircuitBreaker::on(),
        Some("off") => CircuitBreaker::off(),
        Some(other) => return Err(bad("--breaker", format!("`{other}`: use on or off"))),
        None => rp.circuit_breaker.unwrap_or_else(CircuitBreaker::off),
    };
    if let Some(problem) = circuit_breaker.problem() {
        return Err(bad(&format!("{P}.circuit_breaker"), problem));
    }

    let config = StormConfig {
        policy,
        policy_label: label,
        population,
        capacity: Capacity { base_rps, steps },
        first_attempt_rps,
        traffic_seconds: window,
        seed: args.seed.or(sim.seed).unwrap_or(0),
        shards,
        shard_seeds,
        health,
        rate_limit_per_second,
        circuit_breaker,
    };
    config.validate().map_err(|e| bad(P, e.message))?;
    Ok(Plan {
        config,
        threshold: args.threshold.or(sim.fail_deploy_if_peak_exceeds_rps),
    })
}

pub fn run(args: StormArgs) -> anyhow::Result<ExitCode> {
    let plan = match plan(&args) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: bad storm config: {}: {}", e.field, e.message);
            return Ok(ExitCode::from(2));
        }
    };
    let configs: Vec<StormConfig> = if args.compare {
        let own = plan.config.policy.jitter;
        let mut jitters = vec![own];
        jitters.extend(comparison_jitters(own).into_iter().filter(|j| *j != own));
        jitters
            .into_iter()
            .map(|j| StormConfig {
                policy: plan.config.policy.clone().with_jitter(j),
                ..plan.config.clone()
            })
            .collect()
    } else {
        vec![plan.config.clone()]
    };

    let mut reports = Vec::with_capacity(configs.len());
    for config in &configs {
        reports.push(run_with_progress(config)?);
    }
    // The gate judges the configured policy: the first run.
    let gated = &reports[0];

    if args.json {
        let gate = plan
            .threshold
            .map(|t| json!({"threshold_rps": t, "passed": gated.peak_offered_rps <= t}));
        let out = if args.compare {
            json!({"gate": gate, "runs": reports})
        } else {
            let mut v = serde_json::to_value(gated)?;
            v["gate"] = gate.unwrap_or(serde_json::Value::Null);
            v
        };
        println!("{}", serde_json::to_string(&out)?);
    } else if args.compare {
        print_compare(&plan, &reports);
    } else {
        print_report(&plan, gated);
    }

    if let Some(path) = &args.chart {
        let svg = if args.compare {
            storm_chart::compare(&reports, plan.threshold)
        } else {
            storm_chart::single(gated, plan.threshold)
        };
        std::fs::write(path, svg).with_context(|| format!("writing the chart to {}", path.display()))?;
        if !args.json {
            println!("chart written to {}", path.display());
        }
    }

    match plan.threshold {
        Some(t) if gated.peak_offered_rps > t => {
            eprintln!(
                "storm gate FAILED: peak offered {} attempts/s at t = {} s exceeds fail_deploy_if_peak_exceeds_rps {} ({} jitter, population {})",
                gated.peak_offered_rps, gated.peak_second, t, gated.jitter, gated.population
            );
            Ok(ExitCode::from(1))
        }
        Some(t) => {
            eprintln!(
                "storm gate passed: peak offered {} attempts/s ≤ {}",
                gated.peak_offered_rps, t
            );
            Ok(ExitCode::SUCCESS)
        }
        None => Ok(ExitCode::SUCCESS),
    }
}

/// Simulate, with a progress bar on stderr once a run has taken more than a second.
fn run_with_progress(config: &StormConfig) -> anyhow::Result<StormReport> {
    let bar = ProgressBar::with_draw_target(Some(1), ProgressDrawTarget::hidden());
    bar.set_message(format!("simulating {} jitter", config.policy.jitter.label()));
    let started = Instant::now();
    let mut shown = false;
    let report = simulate_with_progress(config, &mut |p| {
        if !shown && started.elapsed() > Duration::from_secs(1) {
            bar.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        bar.set_length(p.horizon);
        bar.set_position(p.second.min(p.horizon));
    })
    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    bar.finish_and_clear();
    Ok(report)
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.1} s"))
}

fn print_report(plan: &Plan, r: &StormReport) {
    let c = &plan.config;
    println!(
        "retry storm: policy {}, jitter {}, population {}, capacity {} rps{}, seed {}{}{}",
        r.policy,
        r.jitter,
        r.population,
        c.capacity.base_rps,
        if c.capacity.steps.is_empty() {
            ""
        } else {
            " (scheduled)"
        },
        r.seed,
        if c.shards > 1 {
            format!(", {} shards ({:?} seeds)", c.shards, c.shard_seeds).to_lowercase()
        } else {
            String::new()
        },
        storm_chart::protection(r),
    );
    let retries = r.total_attempts - r.population;
    println!(
        "  peak offered      {} attempts/s at t = {} s",
        r.peak_offered_rps, r.peak_second
    );
    println!(
        "  total attempts    {} ({} failed first attempts at t = 0 + {} more)",
        r.total_attempts, r.population, retries
    );
    if !r.protection.is_empty() {
        println!(
            "  protection        breaker opened {} times; at most {} held or waiting for the limiter",
            r.breaker_openings, r.peak_waiting
        );
    }
    println!("  delivered         {}", r.delivered);
    println!("  dead              {}", r.dead);
    println!("  drain             {} s (last attempt)", r.drain_seconds);
    println!(
        "  time to delivery  mean {}, p99 {}",
        opt_secs(r.mean_delivery_seconds),
        r.p99_delivery_seconds.map_or("-".into(), |s| format!("{s} s"))
    );
    if let Some(t) = plan.threshold {
        println!(
            "  gate              peak ≤ {t} attempts/s: {}",
            if r.peak_offered_rps <= t { "pass" } else { "FAIL" }
        );
    }
    println!();
    print_series(r);
}

/// Every busy second when there are few; otherwise the storm in about 30 time ranges.
fn print_series(r: &StormReport) {
    let s = &r.series;
    let busy: Vec<usize> = (0..s.offered.len()).filter(|t| s.offered[*t] > 0).collect();
    if busy.is_empty() {
        println!("  (no retries)");
        return;
    }
    if busy.len() <= 40 {
        println!(
            "  {:>9} {:>12} {:>12} {:>12} {:>10}",
            "second", "offered", "served", "failed", "capacity"
        );
        for t in busy {
            println!(
                "  {:>9} {:>12} {:>12} {:>12} {:>10}",
                t, s.offered[t], s.served[t], s.failed[t], s.capacity[t]
            );
        }
        return;
    }
    let len = s.offered.len();
    let step = len.div_ceil(30);
    println!(
        "  {:>17} {:>12} {:>12} {:>12} {:>12}",
        "seconds", "peak/s", "offered", "served", "failed"
    );
    for from in (0..len).step_by(step) {
        let to = (from + step).min(len);
        let offered: u64 = s.offered[from..to].iter().sum();
        if offered == 0 {
            continue;
        }
        let peak = s.offered[from..to].iter().max().copied().unwrap_or(0);
        let served: u64 = s.served[from..to].iter().sum();
        let failed: u64 = s.failed[from..to].iter().sum();
        println!(
            "  {:>17} {:>12} {:>12} {:>12} {:>12}",
            format!("{}-{}", from, to - 1),
            peak,
            offered,
            served,
            failed
        );
    }
}

fn print_compare(plan: &Plan, reports: &[StormReport]) {
    let c = &plan.config;
    println!(
        "retry storm, every jitter strategy: policy {}, population {}, capacity {} rps, seed {}{}",
        c.policy_label,
        c.population,
        c.capacity.base_rps,
        c.seed,
        reports.first().map(storm_chart::protection).unwrap_or_default()
    );
    println!(
        "  {:<16} {:>10} {:>6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>6}",
        "jitter", "peak/s", "at", "attempts", "delivered", "dead", "drain s", "p99 s", "gate"
    );
    for r in reports {
        let gate = plan
            .threshold
            .map_or("-", |t| if r.peak_offered_rps <= t { "pass" } else { "FAIL" });
        println!(
            "  {:<16} {:>10} {:>6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>6}",
            r.jitter,
            r.peak_offered_rps,
            r.peak_second,
            r.total_attempts,
            r.delivered,
            r.dead,
            r.drain_seconds,
            r.p99_delivery_seconds.map_or("-".into(), |s| s.to_string()),
            gate
        );
    }
}
