//! Integration tests against the real libkiln: small synthetic pipelines (an MLP on 8x8 images,
//! a fraction of a second per run on a CPU), each writing under its own temporary folder.
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use kiln::{code, Api, Location, LogLevel, MetricsKind, Options, Session, State};

fn source_dir() -> PathBuf {
    match std::env::var_os("KILN_SOURCE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.."),
    }
}

mod common;
use common::TempDir;

/// A TOML basic string holding `s`.
fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// A synthetic pipeline: 512 training and 256 test images of 8x8, batches of 32 (16 steps per
/// epoch), no checkpoints or TensorBoard unless `extra_run` turns them on.
fn pipeline(out: &Path, epochs: u32, extra_run: &str) -> String {
    format!(
        r#"[run]
device = "cpu"
epochs = {epochs}
seed = 1
log_interval = 1000
checkpoints = false
tensorboard = false
output_dir = {out}
{extra_run}

[data]
dataset = "synthetic"
synthetic_train = 512
synthetic_test = 256
height = 8
width = 8
batch_size = 32
workers = 0

[model]
name = "mlp"
hidden = [32]

[optimizer]
name = "sgd"
lr = 0.02
momentum = 0.9

[precision]
name = "fp32"
"#,
        epochs = epochs,
        out = toml_string(out.to_str().unwrap()),
        extra_run = extra_run
    )
}

fn quiet() -> Options {
    Options::new().log_level(LogLevel::Warn)
}

#[test]
fn version_and_plugins() {
    let v = kiln::version().unwrap();
    // The library's own C API version (2), which also serves this crate's version 1.
    assert!(v.contains("C API 2"), "version string: {}", v);
    let (major, minor) = kiln::plugin_abi().unwrap();
    assert_eq!(major, 1, "plugin ABI {}.{}", major, minor);

    let none: [&str; 0] = [];
    let (plugins, refused) = kiln::plugins(&none).unwrap();
    assert!(refused.is_empty(), "refused: {:?}", refused);
    let sgd = plugins
        .iter()
        .find(|p| p.name == "sgd")
        .expect("the built-in sgd optimizer");
    assert_eq!(sgd.kind, "optimizer");
    assert_eq!(sgd.abi_major, 1);
    assert!(sgd.library.contains("sgd"), "library {}", sgd.library);
    assert!(plugins.iter().any(|p| p.name == "mlp" && p.kind == "model"));

    // A folder without plugins adds nothing and refuses nothing.
    let dir = TempDir::new("plugins");
    let (more, refused) = kiln::plugins(&[dir.path()]).unwrap();
    assert_eq!(more.len(), plugins.len());
    assert!(refused.is_empty());
}

#[test]
fn misspelt_key_is_a_config_error_with_position_and_suggestion() {
    let dir = TempDir::new("config");
    let text = pipeline(dir.path(), 1, "").replace("lr = 0.02", "lrr = 0.02");
    let line = text.lines().position(|l| l.starts_with("lrr")).unwrap() + 1;
    let file = dir.path().join("misspelt.toml");
    fs::write(&file, &text).unwrap();

    let err = Session::from_file(&file, &quiet()).unwrap_err();
    assert_eq!(err.code, code::CONFIG, "{}", err);
    let at = format!("misspelt.toml:{}:1", line);
    assert!(err.message.contains(&at), "no {} in: {}", at, err.message);
    assert!(err.message.contains("lrr"), "{}", err.message);
    assert!(
        err.message.contains("'lr'"),
        "no suggestion in: {}",
        err.message
    );
    // Display keeps the library's message unchanged.
    assert!(err.to_string().contains(&err.message));
    // C API version 2: the same place as fields.
    assert_eq!(
        err.location,
        Some(Location {
            file: file.to_str().unwrap().to_string(),
            line: line as i64,
            column: 1,
            key: "optimizer.lrr".to_string(),
        })
    );

    // From text, the name stands for the file.
    let err = Session::from_str(&text, "inline.toml", &quiet()).unwrap_err();
    assert_eq!(err.code, code::CONFIG);
    assert!(
        err.message.contains(&format!("inline.toml:{}:1", line)),
        "{}",
        err.message
    );
    let at = err.location.expect("a location");
    assert_eq!(
        (at.file.as_str(), at.line, at.column, at.key.as_str()),
        ("inline.toml", line as i64, 1, "optimizer.lrr")
    );

    // A key misspelt further into its line: the column is where the key starts.
    let indented = pipeline(dir.path(), 1, "").replace("epochs = 1", "  epochz = 1");
    let eline = indented.lines().position(|l| l.contains("epochz")).unwrap() + 1;
    let err = Session::from_str(&indented, "indent.toml", &quiet()).unwrap_err();
    let at = err.location.clone().expect("a location");
    assert_eq!(
        (at.line, at.column, at.key.as_str()),
        (eline as i64, 3, "run.epochz"),
        "{}",
        err
    );

    // A misspelt override is a config error too, at "--set" (no line in a file).
    let good = pipeline(dir.path(), 1, "");
    let err = Session::from_str(&good, "p.toml", &quiet().set("optimizer.lrr=0.1")).unwrap_err();
    assert_eq!(err.code, code::CONFIG, "{}", err);
    assert!(err.message.contains("'lr'"), "{}", err.message);
    let at = err.location.expect("a location");
    assert_eq!(
        (at.file.as_str(), at.line, at.key.as_str()),
        ("--set", 0, "optimizer.lrr")
    );

    // A TOML syntax error has a place and no key.
    let err = Session::from_str("[run\nepochs = 1\n", "bad.toml", &quiet()).unwrap_err();
    assert_eq!(err.code, code::CONFIG, "{}", err);
    let at = err.location.expect("a location");
    assert_eq!(
        (at.file.as_str(), at.line, at.key.as_str()),
        ("bad.toml", 1, "")
    );
    assert!(at.column > 0);
}

#[test]
fn bad_strings_are_refused_before_reaching_c() {
    let err =
        Session::from_str("[run]\n", "p.toml", &Options::new().set("run.epochs=1\0")).unwrap_err();
    assert_eq!(err.code, code::INVALID_ARGUMENT);
    assert!(err.message.contains("NUL"), "{}", err.message);
}

#[test]
fn stepwise_training_raises_accuracy() {
    let dir = TempDir::new("steps");
    let mut s = Session::from_str(&pipeline(dir.path(), 3, ""), "steps.toml", &quiet()).unwrap();
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Ready);
    assert_eq!((p.step, p.epoch, p.epochs), (0, 0, 3));
    assert_eq!(p.batches_per_epoch, 16);
    assert_eq!(p.max_steps, 48);
    assert_eq!((p.rank, p.world_size), (0, 1));
    assert_eq!(s.last_metrics(MetricsKind::Eval).unwrap(), None);

    let mut accuracies = Vec::new();
    while s.progress().unwrap().state == State::Ready {
        s.step().unwrap();
        let p = s.progress().unwrap();
        let last = s
            .last_metrics(MetricsKind::Step)
            .unwrap()
            .expect("a step record");
        assert_eq!(last.kind, MetricsKind::Step);
        assert_eq!(last.step, p.step);
        assert!(last.loss.is_finite() && last.lr > 0.0);
        if p.epoch_ended {
            assert_eq!(p.step, 16 * p.epoch);
            let m = s.evaluate().unwrap();
            assert_eq!(m.kind, MetricsKind::Eval);
            assert_eq!(m.epoch, p.epoch);
            assert!((0.0..=1.0).contains(&m.accuracy), "accuracy {}", m.accuracy);
            // The same record (compared by field: the step-only fields are NaN).
            let last = s
                .last_metrics(MetricsKind::Eval)
                .unwrap()
                .expect("an eval record");
            assert_eq!(
                (last.kind, last.step, last.epoch),
                (m.kind, m.step, m.epoch)
            );
            assert_eq!((last.loss, last.accuracy), (m.loss, m.accuracy));
            assert!(
                m.lr.is_nan() && m.grad_norm.is_nan(),
                "step fields of an eval record: {:?}",
                m
            );
            accuracies.push(m.accuracy);
        }
    }
    eprintln!("test accuracy per epoch: {:?}", accuracies);
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Finished);
    assert_eq!(p.step, 48);
    assert_eq!(accuracies.len(), 3, "{:?}", accuracies);
    assert!(
        accuracies[2] > accuracies[0] && accuracies[0] < 0.99,
        "accuracy did not rise: {:?}",
        accuracies
    );

    // Finished: no more steps.
    let err = s.step().unwrap_err();
    assert_eq!(err.code, code::FAILED_PRECONDITION, "{}", err);
    assert_eq!(s.progress().unwrap().state, State::Finished);
}

#[test]
fn run_to_the_end_then_step_is_failed_precondition() {
    let dir = TempDir::new("finished");
    let mut s =
        Session::from_str(&pipeline(dir.path(), 1, "eval = false"), "f.toml", &quiet()).unwrap();
    s.run().unwrap();
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Finished);
    assert_eq!(p.step, p.max_steps);
    let err = s.step().unwrap_err();
    assert_eq!(err.code, code::FAILED_PRECONDITION, "{}", err);
    assert_eq!(err.code_name(), "FAILED_PRECONDITION");
    // Only configuration errors point somewhere.
    assert_eq!(err.location, None);
}

#[test]
fn steps_iterates_records_up_to_a_limit_then_to_the_end() {
    let dir = TempDir::new("iter");
    let mut s = Session::from_str(&pipeline(dir.path(), 1, ""), "it.toml", &quiet()).unwrap();
    let first: Vec<i64> = s
        .steps(Some(5))
        .map(|m| {
            let m = m.unwrap();
            assert_eq!(m.kind, MetricsKind::Step);
            assert!(m.loss.is_finite());
            m.step
        })
        .collect();
    assert_eq!(first, vec![1, 2, 3, 4, 5]);
    assert_eq!(s.progress().unwrap().step, 5);
    // No limit: on to the end (16 steps), then nothing more.
    let rest: Vec<i64> = s.steps(None).map(|m| m.unwrap().step).collect();
    assert_eq!(rest, (6..=16).collect::<Vec<i64>>());
    assert_eq!(s.progress().unwrap().state, State::Finished);
    assert_eq!(s.steps(None).count(), 0);
}

#[test]
fn a_version_1_table_still_trains_without_the_version_2_calls() {
    let v1 = Api::load_version(1).unwrap();
    assert_eq!(v1.api_version(), 1);
    assert_eq!(v1.raw().struct_size, kiln::sys::KILN_API_V1_SIZE);
    assert!(v1.raw().status_location.is_none() && v1.raw().session_load_tensors.is_none());
    assert_eq!(Api::load().unwrap().api_version(), 2);
    assert_eq!(Api::load_version(3).unwrap_err().code, code::UNSUPPORTED);

    let dir = TempDir::new("v1");
    let text = pipeline(dir.path(), 1, "eval = false");
    // Errors keep code and message, without a location.
    let bad = text.replace("lr = 0.02", "lrr = 0.02");
    let err = v1.session_from_str(&bad, "v1.toml", &quiet()).unwrap_err();
    assert_eq!(err.code, code::CONFIG);
    assert!(err.message.contains("v1.toml:"), "{}", err);
    assert_eq!(err.location, None);

    let mut s = v1.session_from_str(&text, "v1.toml", &quiet()).unwrap();
    assert_eq!(s.api().api_version(), 1);
    s.step().unwrap();
    assert_eq!(s.progress().unwrap().step, 1);
    let err = s.parameters().unwrap_err();
    assert_eq!(err.code, code::UNSUPPORTED, "{}", err);
    assert!(err.message.contains("version 2"), "{}", err);
    assert_eq!(
        s.load_tensors(&[], kiln::load::STRICT).unwrap_err().code,
        code::UNSUPPORTED
    );
}

#[test]
fn callback_sees_every_record_and_true_cancels() {
    let dir = TempDir::new("callback");
    let mut s = Session::from_str(&pipeline(dir.path(), 3, ""), "cb.toml", &quiet()).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in = Arc::clone(&seen);
    s.set_metrics_callback(move |m| {
        seen_in.lock().unwrap().push((m.kind, m.step));
        m.kind == MetricsKind::Step && m.step == 20
    })
    .unwrap();
    s.run().unwrap();
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Cancelled);
    assert_eq!(p.step, 20);
    let seen = seen.lock().unwrap().clone();
    // Steps 1..=20 and the evaluation at the end of epoch 1 (step 16), in order.
    let steps: Vec<i64> = seen
        .iter()
        .filter(|r| r.0 == MetricsKind::Step)
        .map(|r| r.1)
        .collect();
    assert_eq!(steps, (1..=20).collect::<Vec<i64>>());
    let evals: Vec<i64> = seen
        .iter()
        .filter(|r| r.0 == MetricsKind::Eval)
        .map(|r| r.1)
        .collect();
    assert_eq!(evals, vec![16]);

    // A cancelled session takes no more steps.
    assert_eq!(s.step().unwrap_err().code, code::FAILED_PRECONDITION);
}

#[test]
fn callback_panic_stops_and_is_reported() {
    let dir = TempDir::new("panic");
    let mut s = Session::from_str(&pipeline(dir.path(), 2, ""), "panic.toml", &quiet()).unwrap();
    s.set_metrics_callback(|m| {
        if m.step == 3 {
            panic!("deliberate test panic at step {}", m.step);
        }
        false
    })
    .unwrap();
    let err = s.run().unwrap_err();
    assert_eq!(err.code, code::INTERNAL, "{}", err);
    assert!(
        err.message.contains("deliberate test panic at step 3"),
        "{}",
        err.message
    );
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Cancelled);
    assert_eq!(p.step, 3);
}

#[test]
fn canceller_from_another_thread_stops_run() {
    let dir = TempDir::new("cancel");
    // Long enough (200 epochs, 3200 steps) that only the cancel can end it within the test.
    let mut s = Session::from_str(
        &pipeline(dir.path(), 200, "eval = false"),
        "c.toml",
        &quiet(),
    )
    .unwrap();
    let canceller = s.canceller();
    let (tx, rx) = mpsc::channel();
    s.set_metrics_callback(move |m| {
        if m.step == 5 {
            let _ = tx.send(());
        }
        false
    })
    .unwrap();
    let watcher = thread::spawn(move || {
        rx.recv_timeout(Duration::from_secs(60))
            .expect("training started");
        assert!(canceller.cancel());
        canceller
    });
    s.run().unwrap();
    let canceller = watcher.join().unwrap();
    let p = s.progress().unwrap();
    assert_eq!(p.state, State::Cancelled);
    assert!(
        p.step >= 5 && p.step < p.max_steps,
        "step {} of {}",
        p.step,
        p.max_steps
    );

    // A canceller never outlives its session: after the drop it reports that it did nothing.
    drop(s);
    assert!(!canceller.cancel());
}

#[test]
fn from_file_with_overrides_checkpoint_and_metrics_file() {
    let dir = TempDir::new("file");
    let metrics = dir.path().join("metrics.jsonl");
    let file = source_dir().join("tests/pipelines/synthetic_mlp.toml");
    let options = quiet()
        .set("run.epochs=1")
        .set(format!(
            "run.output_dir={}",
            toml_string(dir.path().to_str().unwrap())
        ))
        .set("run.checkpoints=false")
        .set("run.tensorboard=false")
        .set("data.synthetic_train=256")
        .set("data.workers=0")
        .metrics_path(&metrics);
    let mut s = Session::from_file(&file, &options).unwrap();
    let p = s.progress().unwrap();
    assert_eq!(p.epochs, 1, "override run.epochs=1 not applied");
    assert_eq!(p.batches_per_epoch, 4); // 256 samples in batches of 64
    s.step().unwrap();
    s.step().unwrap();

    let ckpt = s.save_checkpoint().unwrap();
    assert!(!ckpt.is_empty());
    assert!(
        Path::new(&ckpt).is_dir(),
        "checkpoint {} is not a folder",
        ckpt
    );
    assert!(
        ckpt.starts_with(dir.path().to_str().unwrap()),
        "{} outside output_dir",
        ckpt
    );

    s.run().unwrap();
    assert_eq!(s.progress().unwrap().state, State::Finished);
    drop(s);

    let text = fs::read_to_string(&metrics).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // Four steps and the end-of-epoch evaluation, one JSON object each.
    assert!(lines.len() >= 5, "metrics file:\n{}", text);
    assert!(
        lines.iter().all(|l| l.starts_with('{') && l.ends_with('}')),
        "{}",
        text
    );
}

#[test]
fn missing_pipeline_file_is_an_error() {
    let dir = TempDir::new("missing");
    let err = Session::from_file(dir.path().join("nope.toml"), &quiet()).unwrap_err();
    assert_ne!(err.code, code::OK);
    assert!(err.message.contains("nope.toml"), "{}", err.message);
}
