//! In-process LR policies from Rust closures (kiln::components) against the real libkiln: the
//! per-step lr is the closure's formula, options reach it validated, a panic fails the step
//! with its message, and the descriptor is checked as a plugin library's.
use std::path::Path;
use std::sync::{Arc, Mutex};

use kiln::components::{LrPolicy, OptionSpec, Schedule};
use kiln::{code, LogLevel, MetricsKind, Options, Session, State};

mod common;
use common::TempDir;

/// 512 samples in batches of 64: 8 steps in one epoch, the first 2 the host's warm-up.
fn pipeline(out: &Path, policy_table: &str) -> String {
    format!(
        r#"[run]
device = "cpu"
epochs = 1
seed = 2
checkpoints = false
tensorboard = false
output_dir = "{out}"

[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 64
height = 8
width = 8
batch_size = 64
workers = 0

[model]
name = "mlp"
hidden = [16]

[optimizer]
name = "sgd"
lr = 0.2
momentum = 0.9

[lr_policy]
warmup = "linear"
warmup_iters = 2
{policy_table}
"#,
        out = out.to_str().unwrap(),
        policy_table = policy_table
    )
}

fn quiet() -> Options {
    Options::new().log_level(LogLevel::Warn)
}

/// base_lr * gamma^floor((iter - 1) / step_size)
fn step_decay(iter: i64, s: &Schedule) -> f64 {
    let gamma = s.float("gamma").unwrap();
    let step = s.int("step_size").unwrap();
    s.base_lr * gamma.powi(((iter - 1) / step) as i32)
}

fn lrs(session: &mut Session) -> Vec<f64> {
    let mut out = Vec::new();
    while session.progress().unwrap().state == State::Ready {
        session.step().unwrap();
        out.push(session.last_metrics(MetricsKind::Step).unwrap().unwrap().lr);
    }
    out
}

#[test]
fn closure_gives_the_per_step_lr() {
    let tmp = TempDir::new("lr");
    let seen: Arc<Mutex<Vec<(i64, Schedule)>>> = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let policy = LrPolicy::with_options(
        "rust_step",
        vec![
            OptionSpec::float("gamma", 0.5).range(0.0, 1.0).doc("decay"),
            OptionSpec::int("step_size", 2).min(1.0),
        ],
        Box::new(move |iter, s| {
            record.lock().unwrap().push((iter, s.clone()));
            step_decay(iter, s)
        }),
    )
    .unwrap();
    let text = pipeline(
        tmp.path(),
        "name = \"rust_step\"\ngamma = 0.3\nstep_size = 3",
    );
    let mut session = Session::from_str(&text, "rust.toml", &quiet().component(policy.clone()))
        .expect("session with a Rust LR policy");
    let got = lrs(&mut session);
    assert_eq!(got.len(), 8);
    let seen = seen.lock().unwrap();
    let (_, frame) = &seen[0];
    assert_eq!(
        (frame.max_iters, frame.warmup_iters, frame.iters_per_epoch),
        (8, 2, 8)
    );
    assert_eq!(frame.float("gamma"), Some(0.3));
    assert_eq!(frame.int("step_size"), Some(3));
    let mut asked: Vec<i64> = seen.iter().map(|(i, _)| *i).collect();
    asked.sort_unstable();
    asked.dedup();
    assert_eq!(asked, (3..=8).collect::<Vec<i64>>());
    // After the warm-up the rate is the closure's, to the last bit but rounding.
    for (i, lr) in got.iter().enumerate().skip(2) {
        let want = step_decay(i as i64 + 1, frame);
        assert!(
            (lr - want).abs() <= 1e-12 * want.abs(),
            "step {}: {} != {}",
            i + 1,
            lr,
            want
        );
    }
    // Warm-up rises to base_lr; the decay then takes it down.
    assert!(got[0] < got[1] && got[7] < got[2]);
    assert!(policy.last_panic().is_none());
}

#[test]
fn a_panic_fails_the_step_with_its_message() {
    let tmp = TempDir::new("panic");
    let policy = LrPolicy::new(
        "rust_panics",
        Box::new(|iter, s| {
            if iter == 4 {
                panic!("no rate for step {}", iter);
            }
            s.base_lr
        }),
    )
    .unwrap();
    let text = pipeline(tmp.path(), "name = \"rust_panics\"");
    let mut session =
        Session::from_str(&text, "panics.toml", &quiet().component(policy.clone())).unwrap();
    for _ in 0..3 {
        session.step().unwrap();
    }
    let err = session.step().unwrap_err();
    assert_eq!(err.code, code::RUN_FAILED, "{}", err);
    assert!(
        err.message
            .contains("rust_panics: lr_at(4) panicked: no rate for step 4"),
        "{}",
        err
    );
    assert_eq!(policy.last_panic().as_deref(), Some("no rate for step 4"));
    assert_eq!(session.progress().unwrap().state, State::Failed);
}

#[test]
fn options_and_names_are_checked() {
    let tmp = TempDir::new("checks");
    let policy = LrPolicy::with_options(
        "rust_checked",
        vec![OptionSpec::float("gamma", 0.5).range(0.0, 1.0)],
        Box::new(|_, s| s.base_lr),
    )
    .unwrap();
    let options = quiet().component(policy);
    let typo = pipeline(tmp.path(), "name = \"rust_checked\"\ngama = 0.5");
    let err = Session::from_str(&typo, "typo.toml", &options).unwrap_err();
    assert_eq!(err.code, code::CONFIG, "{}", err);
    assert!(
        err.message.contains("typo.toml:") && err.message.contains("gama"),
        "{}",
        err
    );
    let range = pipeline(tmp.path(), "name = \"rust_checked\"\ngamma = 2.0");
    let err = Session::from_str(&range, "range.toml", &options).unwrap_err();
    assert_eq!(err.code, code::CONFIG, "{}", err);

    // The name of a built-in plugin's policy is refused, naming where each came from.
    let clash = LrPolicy::new("cosine", Box::new(|_, s| s.base_lr)).unwrap();
    let text = pipeline(tmp.path(), "name = \"cosine\"");
    let err = Session::from_str(&text, "clash.toml", &quiet().component(clash)).unwrap_err();
    assert_eq!(err.code, code::PLUGIN_REFUSED, "{}", err);
    assert!(
        err.message
            .contains("<rust>: component 'cosine' (lr_policy) is already provided by"),
        "{}",
        err
    );
}

/// The step lrs of a metrics file, by step.
fn step_lrs(path: &Path) -> std::collections::BTreeMap<i64, f64> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("{\"type\":\"step\"")) {
        let step: i64 = line["{\"type\":\"step\",\"step\":".len()..]
            .split(',')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let lr = &line[line.find("\"lr\":[").unwrap() + 6..];
        out.insert(step, lr.split([',', ']']).next().unwrap().parse().unwrap());
    }
    out
}

#[test]
fn a_policy_that_reacts_to_evaluations_resumes_its_state() {
    let tmp = TempDir::new("lr");
    // Halves the rate after every evaluation but the first; the rate and the count are the
    // instance's state, which a resume must bring back.
    let seen: Arc<Mutex<Vec<(i64, i64, Vec<String>)>>> = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let policy = LrPolicy::reacting(
        "rust_halving",
        Vec::new(),
        Box::new(|_, s| s.get("lr").unwrap_or(s.base_lr)),
        Box::new(move |o, s| {
            let names = o.metrics.iter().map(|(n, _)| n.clone()).collect();
            record.lock().unwrap().push((o.iter, o.epoch, names));
            let count = s.get("count").unwrap_or(0.0) + 1.0;
            s.set("count", count);
            if count >= 2.0 {
                let lr = s.get("lr").unwrap_or(s.base_lr);
                s.set("lr", lr * 0.5);
            }
        }),
        &["lr", "count"],
    )
    .unwrap();
    let text = |out: &Path| {
        pipeline(out, "name = \"rust_halving\"")
            .replace("epochs = 1", "epochs = 4")
            .replace("checkpoints = false", "checkpoints = true")
    };
    let straight_out = tmp.path().join("straight");
    let straight_metrics = tmp.path().join("straight.jsonl");
    let options = quiet().component(policy.clone());
    Session::from_str(
        &text(&straight_out),
        "straight.toml",
        &options.clone().metrics_path(&straight_metrics),
    )
    .unwrap()
    .run()
    .unwrap();
    assert!(policy.last_panic().is_none());
    let straight = step_lrs(&straight_metrics);
    assert_eq!(straight.len(), 32);
    let names = vec!["loss".to_string(), "top1".to_string(), "top5".to_string()];
    assert_eq!(
        *seen.lock().unwrap(),
        (1..=4)
            .map(|k| (8 * k, k, names.clone()))
            .collect::<Vec<_>>()
    );
    for step in 9..=32 {
        let halvings = ((step - 1) / 8 - 1).max(0);
        assert_eq!(
            straight[&step],
            0.2 * 0.5f64.powi(halvings as i32),
            "step {}",
            step
        );
    }
    // Stopped after 12 steps, then resumed: the same rates to the end.
    let resumed_out = tmp.path().join("resumed");
    let resumed_metrics = tmp.path().join("resumed.jsonl");
    Session::from_str(
        &text(&resumed_out),
        "resumed.toml",
        &options.clone().set("run.max_steps=12"),
    )
    .unwrap()
    .run()
    .unwrap();
    Session::from_str(
        &text(&resumed_out),
        "resumed.toml",
        &options.resume("auto").metrics_path(&resumed_metrics),
    )
    .unwrap()
    .run()
    .unwrap();
    let resumed = step_lrs(&resumed_metrics);
    assert!(!resumed.is_empty());
    for (step, lr) in &resumed {
        assert_eq!(*lr, straight[step], "step {}", step);
    }
}
