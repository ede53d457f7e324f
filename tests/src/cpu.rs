//! Where a machine's CPU goes during a stretch of a benchmark, from `/proc`: each watched
//! process's cores (its user and system time, all its threads, over the wall time), the whole
//! machine's busy share, and the share its hypervisor gave to other guests (steal: on a shared
//! host, time this machine wanted and did not get). The latency bench puts it beside each run,
//! so a reader can see whether a tail is Hookwise's or an emulator's saturated core.

use std::time::Instant;

use serde_json::{json, Value};

/// Linux reports `/proc` times in clock ticks of `USER_HZ`, which is 100 on every
/// architecture it exposes to user space.
const USER_HZ: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` after the command name (which may hold spaces): the
/// state is `[0]`, user time `[11]`, system time `[12]`.
fn stat_fields(pid: u32) -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect())
}

/// User and system ticks of `pids`, all their threads; not their children's (the bench is
/// the parent of the `hookwise` it watches, which would count twice).
fn ticks(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|&pid| stat_fields(pid))
        .map(|f| f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0))
        .sum()
}

/// The machine's cores: the `cpuN` lines of `/proc/stat`, the scope of its ticks.
fn machine_cores() -> usize {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count()
}

/// The machine's busy, stolen and total ticks, all cores (the first line of `/proc/stat`).
fn machine_ticks() -> (u64, u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .take(8) // user nice system idle iowait irq softirq steal (guest time is in user)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    let steal = ticks.get(7).copied().unwrap_or(0);
    (total - idle - steal, steal, total)
}

/// Counting from [`CpuMeter::start`].
pub struct CpuMeter {
    started: Instant,
    machine: (u64, u64, u64),
    watched: Vec<(String, Vec<u32>, u64)>,
}

/// What a [`CpuMeter`] read: cores each watched process used, on average, and how busy the
/// whole machine was.
#[derive(Debug, Clone)]
pub struct CpuShares {
    pub seconds: f64,
    pub cores: usize,
    pub machine_busy: f64,
    pub machine_steal: f64,
    pub processes: Vec<(String, f64)>,
}

impl CpuMeter {
    /// Watch these processes, each a label and its pids (a label without pids is left out).
    pub fn start(watched: Vec<(String, Vec<u32>)>) -> Self {
        Self {
            started: Instant::now(),
            machine: machine_ticks(),
            watched: watched
                .into_iter()
                .filter(|(_, pids)| !pids.is_empty())
                .map(|(label, pids)| {
                    let ticks = ticks(&pids);
                    (label, pids, ticks)
                })
                .collect(),
        }
    }

    /// The shares since the start.
    pub fn read(&self) -> CpuShares {
        let seconds = self.started.elapsed().as_secs_f64();
        let (busy, steal, total) = machine_ticks();
        let (busy0, steal0, total0) = self.machine;
        let total = total.saturating_sub(total0).max(1) as f64;
        CpuShares {
            seconds,
            cores: machine_cores(),
            machine_busy: busy.saturating_sub(busy0) as f64 / total,
            machine_steal: steal.saturating_sub(steal0) as f64 / total,
            processes: self
                .watched
                .iter()
                .map(|(label, pids, ticks0)| {
                    let used = ticks(pids).saturating_sub(*ticks0) as f64 / USER_HZ;
                    (label.clone(), used / seconds)
                })
                .collect(),
        }
    }
}

impl CpuShares {
    pub fn json(&self) -> Value {
        json!({
            "seconds": self.seconds,
            "cores": self.cores,
            "machine_busy": self.machine_busy,
            "machine_steal": self.machine_steal,
            "processes": self.processes.iter().map(|(l, c)| json!({"process": l, "cores": c})).collect::<Vec<_>>(),
        })
    }

    /// `the machine's 2 cores 84% busy (1% stolen); cores used by LocalStack 0.95, ...`
    pub fn line(&self) -> String {
        let each: Vec<String> = self
            .processes
            .iter()
            .map(|(label, cores)| format!("{label} {cores:.2}"))
            .collect();
        format!(
            "the machine's {} cores {:.0}% busy ({:.0}% stolen); cores used by {}",
            self.cores,
            self.machine_busy * 100.0,
            self.machine_steal * 100.0,
            each.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_busy_thread_counts_and_a_busy_child_counts_as_its_own_not_its_parents() {
        // An idle shell whose child spins, for a second: about as long as the test, and it
        // ends by itself whatever becomes of the test (killing the shell leaves it running).
        let mut parent = Command::new("sh")
            .args(["-c", "timeout 1 sh -c 'while :; do :; done' & wait"])
            .spawn()
            .expect("sh");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let meter = CpuMeter::start(vec![
            ("me".into(), vec![std::process::id()]),
            ("parent".into(), vec![parent.id()]),
            ("nobody".into(), vec![]),
        ]);
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed().as_millis() < 500 {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let shares = meter.read();
        parent.kill().ok();
        parent.wait().ok();
        let names: Vec<&str> = shares.processes.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(names, ["me", "parent"], "a label without pids is left out");
        // A shared machine may be busy, and the tick is 10 ms: loose bounds.
        assert!(shares.processes[0].1 > 0.2, "a spinning thread: {shares:?}");
        assert!(
            shares.processes[1].1 < 0.1,
            "an idle parent of a spinning child: {shares:?}"
        );
        // At least this thread's core, whatever the machine's size.
        assert!(shares.machine_busy * shares.cores as f64 > 0.5, "{shares:?}");
    }
}
