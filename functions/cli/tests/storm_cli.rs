//! `hookwise storm` as a user runs it: the built binary, real files, exit codes.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn hookwise(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hookwise"))
        .args(args)
        .output()
        .expect("the binary runs")
}

fn repo_file(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hookwise-storm-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_config(name: &str, yaml: &str) -> String {
    let path = temp_dir(name).join("storm.yaml");
    std::fs::write(&path, yaml).unwrap();
    path.to_string_lossy().into_owned()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

const SEED003_NO_JITTER: &str = "retry_policy:
  backoff_base_seconds: 2
  max_tier: 6
  jitter: none
  consumer_capacity_rps: 500
  simulation:
    worst_case_failure_population: 10000
    window_seconds: 180
    fail_deploy_if_peak_exceeds_rps: 800
";

#[test]
fn given_seed003_without_jitter_when_run_with_json_then_the_figures_are_exact() {
    let config = write_config("exact", SEED003_NO_JITTER);
    let out = hookwise(&["storm", "--config", &config, "--json", "--threshold", "20000"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    for field in [
        "peak_offered_rps",
        "peak_second",
        "total_attempts",
        "delivered",
        "dead",
        "drain_seconds",
        "mean_delivery_seconds",
        "p99_delivery_seconds",
    ] {
        assert!(v.get(field).is_some(), "missing {field}");
    }
    assert_eq!(v["peak_offered_rps"], 10_000);
    assert_eq!(v["peak_second"], 1);
    assert_eq!(v["total_attempts"], 69_500);
    assert_eq!(v["delivered"], 3_500);
    assert_eq!(v["dead"], 6_500);
    assert_eq!(v["drain_seconds"], 127);
    assert_eq!(v["p99_delivery_seconds"], 127);
    let offered = v["series"]["offered"].as_array().unwrap();
    let served = v["series"]["served"].as_array().unwrap();
    let failed = v["series"]["failed"].as_array().unwrap();
    assert_eq!(offered.len(), 128);
    assert_eq!((served.len(), failed.len()), (128, 128));
    for (t, n) in [
        (1, 10_000),
        (3, 9_500),
        (7, 9_000),
        (15, 8_500),
        (31, 8_000),
        (63, 7_500),
        (127, 7_000),
    ] {
        assert_eq!(offered[t], n, "t = {t}");
        assert_eq!(served[t], 500);
        assert_eq!(failed[t], n - 500);
    }
    assert_eq!(v["gate"]["passed"], true);
}

#[test]
fn given_a_peak_above_the_threshold_when_gated_then_exit_1_says_so() {
    let config = write_config("gate-fail", SEED003_NO_JITTER);
    let out = hookwise(&["storm", "--config", &config]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("FAILED") && stderr.contains("10000") && stderr.contains("800"),
        "{stderr}"
    );
    // The table still prints the waves.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("69500") && stdout.contains("127"), "{stdout}");
}

#[test]
fn given_the_deployed_policy_file_when_gated_then_it_passes() {
    let out = hookwise(&["storm", "--config", &repo_file("infra/storm/standard.yaml"), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["policy"], "standard");
    assert!(v["peak_offered_rps"].as_u64().unwrap() <= 800);
    assert_eq!(v["gate"]["passed"], true);
}

#[test]
fn given_seed003s_own_example_when_run_then_its_gate_fails_as_the_model_says() {
    // b = 2: every strategy's first wave lands in second 1, so full jitter cannot pass 800.
    let out = hookwise(&[
        "storm",
        "--config",
        &repo_file("infra/storm/fast-backoff-example.yaml"),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(
        (v["peak_offered_rps"].as_u64(), v["peak_second"].as_u64()),
        (Some(12_000), Some(1))
    );
}

#[test]
fn given_bad_config_when_run_then_exit_2_names_the_field() {
    let cases = [
        (
            "unknown",
            SEED003_NO_JITTER.replace("max_tier: 6", "max_tier: 6\n  max_tiers: 7"),
            "max_tiers",
        ),
        (
            "type",
            SEED003_NO_JITTER.replace("consumer_capacity_rps: 500", "consumer_capacity_rps: lots"),
            "consumer_capacity_rps",
        ),
        (
            "jitter",
            SEED003_NO_JITTER.replace("jitter: none", "jitter: wobbly"),
            "retry_policy.jitter",
        ),
        (
            "missing",
            SEED003_NO_JITTER.replace("    worst_case_failure_population: 10000\n", ""),
            "worst_case_failure_population",
        ),
        (
            "policy",
            SEED003_NO_JITTER.replace("jitter: none", "jitter: none\n  policy: standard"),
            "retry_policy.policy",
        ),
        (
            "shards",
            SEED003_NO_JITTER.replace("window_seconds: 180", "window_seconds: 180\n    shards: 0"),
            "shards",
        ),
        (
            "seeds",
            SEED003_NO_JITTER.replace("window_seconds: 180", "window_seconds: 180\n    shard_seeds: both"),
            "shard_seeds",
        ),
    ];
    for (name, yaml, field) in cases {
        let config = write_config(&format!("bad-{name}"), &yaml);
        let out = hookwise(&["storm", "--config", &config]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(field), "{name}: `{field}` not named in: {stderr}");
    }
    let out = hookwise(&[
        "storm",
        "--config",
        &write_config("flag", SEED003_NO_JITTER),
        "--jitter",
        "sideways",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--jitter"));
}

#[test]
fn given_flags_when_they_contradict_the_config_then_the_flags_win() {
    let config = write_config("flags", SEED003_NO_JITTER);
    let out = hookwise(&[
        "storm",
        "--config",
        &config,
        "--json",
        "--population",
        "2000",
        "--capacity",
        "100",
        "--seed",
        "7",
        "--jitter",
        "full",
    ]);
    let v = json_of(&out);
    assert_eq!(v["population"], 2000);
    assert_eq!(v["seed"], 7);
    assert_eq!(v["jitter"], "full");
    assert!(v["series"]["capacity"].as_array().unwrap().iter().all(|c| c == 100));
    assert_eq!(v["delivered"].as_u64().unwrap() + v["dead"].as_u64().unwrap(), 2000);
    // Same flags, same storm.
    let again = json_of(&hookwise(&[
        "storm",
        "--config",
        &config,
        "--json",
        "--population",
        "2000",
        "--capacity",
        "100",
        "--seed",
        "7",
        "--jitter",
        "full",
    ]));
    assert_eq!(v, again);
    // --policy replaces backoff_base_seconds/max_tier with production's policy.
    let standard = json_of(&hookwise(&[
        "storm", "--config", &config, "--json", "--policy", "standard",
    ]));
    assert_eq!(standard["policy"], "standard");
    assert_eq!(
        standard["peak_second"], 120,
        "no jitter: the first retry 60 s × 2 after a mass failure"
    );
}

#[test]
fn given_chart_when_run_then_an_svg_with_the_series_is_written() {
    let dir = temp_dir("chart");
    let svg = dir.join("storm.svg");
    let config = write_config("chart", SEED003_NO_JITTER);
    let out = hookwise(&[
        "storm",
        "--config",
        &config,
        "--threshold",
        "20000",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.trim_end().ends_with("</svg>"));
    assert!(text.contains("offered attempts/s") && text.contains("consumer capacity") && text.contains("polyline"));
    assert!(text.matches("<rect").count() > 7, "bars for the seven waves");
}

#[test]
fn given_compare_when_run_then_every_strategy_is_summarised_and_charted() {
    let dir = temp_dir("compare");
    let svg = dir.join("compare.svg");
    let config = write_config("compare", SEED003_NO_JITTER);
    let out = hookwise(&[
        "storm",
        "--config",
        &config,
        "--compare",
        "--chart",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the configured (no-jitter) run breaks the gate"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for jitter in ["none", "full", "equal", "decorrelated", "proportional:0.1"] {
        assert!(stdout.contains(jitter), "{jitter} missing from {stdout}");
    }
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.contains("decorrelated jitter") && text.contains("p99 delivery"));

    let json = json_of(&hookwise(&[
        "storm",
        "--config",
        &config,
        "--compare",
        "--json",
        "--seed",
        "3",
    ]));
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5);
    assert_eq!(runs[0]["jitter"], "none");
    assert_eq!(runs[0]["total_attempts"], 69_500);
    let full = runs.iter().find(|r| r["jitter"] == "full").unwrap();
    assert_eq!(
        full["peak_offered_rps"], 10_000,
        "b = 2: full jitter's first wave still lands in second 1"
    );
    assert!(full["delivered"].as_u64().unwrap() > 3_500);
    assert!(full["total_attempts"].as_u64().unwrap() < 69_500);
    assert_eq!(json["gate"]["passed"], false);
}

#[test]
fn given_a_rate_limit_and_the_breaker_then_seed003s_storm_passes_its_own_gate() {
    // The same storm that fails at 10 000 /s: the limit holds every second to 100, and the
    // breaker, opened by the 10 000 failures at t = 0, lets one probe through at t = 30.
    let config = write_config("protected", SEED003_NO_JITTER);
    let out = hookwise(&[
        "storm",
        "--config",
        &config,
        "--json",
        "--rate-limit",
        "100",
        "--breaker",
        "on",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["protection"], "rate limit 100/s, breaker on");
    assert!(
        v["peak_offered_rps"].as_u64().unwrap() <= 111,
        "{}",
        v["peak_offered_rps"]
    );
    assert_eq!((v["delivered"].as_u64(), v["dead"].as_u64()), (Some(10_000), Some(0)));
    assert_eq!(v["breaker_openings"], 1);
    assert!(v["peak_waiting"].as_u64().unwrap() >= 9_000);
    let offered = v["series"]["offered"].as_array().unwrap();
    assert_eq!(
        offered[..30].iter().filter_map(Value::as_u64).sum::<u64>(),
        0,
        "all held until the probe"
    );

    // The same fields in the file; a bad one is named.
    let yaml = SEED003_NO_JITTER.replace(
        "  consumer_capacity_rps: 500\n",
        "  consumer_capacity_rps: 500\n  rate_limit_per_second: 100\n  circuit_breaker: {probe_interval_seconds: 10}\n",
    );
    let out = hookwise(&["storm", "--config", &write_config("protected-file", &yaml), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let v = json_of(&out);
    assert_eq!(v["protection"], "rate limit 100/s, breaker on");
    let offered = v["series"]["offered"].as_array().unwrap();
    assert_eq!(offered[10], 1, "the probe, at the file's interval");
    for (args, field) in [
        (vec!["--breaker", "maybe"], "--breaker"),
        (vec!["--rate-limit", "0"], "--rate-limit"),
    ] {
        let mut all = vec!["storm", "--config", &config];
        all.extend(args);
        let out = hookwise(&all);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(field), "{field}");
    }
}
