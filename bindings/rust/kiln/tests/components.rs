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
