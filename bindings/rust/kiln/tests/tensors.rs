//! The session's tensors through C API version 2 (DLPack) against the real libkiln: names and
//! shapes are the mlp's, views alias the training's memory (no copies), the optimizer's state
//! is live, load_tensors copies weights between sessions exactly and refuses bad input naming
//! the key. Small synthetic pipelines: 1x8x8 images, 4 classes, an MLP with one hidden layer.
use std::path::Path;
use std::sync::{Arc, Mutex};

use kiln::{code, kinds, load, DType, Device, LogLevel, Options, Session, Tensor, TensorView};

const CLASSES: usize = 4;
const HIDDEN: usize = 16;
const INPUTS: usize = 64;

mod common;
use common::TempDir;

/// 256 training and 128 test images, batches of 32 (8 steps per epoch), SGD with momentum.
fn pipeline(out: &Path) -> String {
    format!(
        r#"[run]
device = "cpu"
epochs = 2
seed = 1
checkpoints = false
tensorboard = false
output_dir = "{out}"

[data]
dataset = "synthetic"
synthetic_train = 256
synthetic_test = 128
synthetic_classes = {classes}
channels = 1
height = 8
width = 8
batch_size = 32
workers = 0

[model]
name = "mlp"
hidden = [{hidden}]

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[precision]
name = "fp32"
"#,
        out = out.to_str().unwrap(),
        classes = CLASSES,
        hidden = HIDDEN
    )
}

fn session(dir: &TempDir) -> Session {
    let options = Options::new().log_level(LogLevel::Warn);
    Session::from_str(&pipeline(dir.path()), "tensors.toml", &options).unwrap()
}

fn find(tensors: Vec<Tensor>, name: &str) -> Tensor {
    tensors
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no tensor {}", name))
}

fn names(tensors: &[Tensor]) -> Vec<String> {
    tensors.iter().map(|t| t.name().to_string()).collect()
}

const MLP: [&str; 4] = [
    "layers.0.linear.weight",
    "layers.0.linear.bias",
    "head.weight",
    "head.bias",
];

#[test]
fn names_shapes_and_dtypes_are_the_models() {
    let dir = TempDir::new("names");
    let s = session(&dir);
    let sd = s.state_dict().unwrap();
    assert_eq!(names(&sd), MLP);
    let shapes: Vec<Vec<i64>> = sd.iter().map(|t| t.shape().to_vec()).collect();
    let (h, i, c) = (HIDDEN as i64, INPUTS as i64, CLASSES as i64);
    assert_eq!(shapes, vec![vec![h, i], vec![h], vec![c, h], vec![c]]);
    for t in &sd {
        assert_eq!(t.dtype(), DType::F32, "{}", t.name());
        assert_eq!(t.device(), Device::Cpu, "{}", t.name());
        assert!(t.is_contiguous(), "{:?}", t);
        assert_eq!(t.as_slice::<f32>().unwrap().len(), t.numel());
        // The copy helpers give the same numbers.
        let v = t.to_vec_f32().unwrap();
        assert_eq!(&v[..], &*t.as_slice::<f32>().unwrap());
    }
    assert_eq!(names(&s.parameters().unwrap()), MLP);
    assert!(s.buffers().unwrap().is_empty());
    assert_eq!(s.tensor_names(kinds::MODEL).unwrap(), MLP);

    // Asking for the wrong element type, or for no kind at all, is refused.
    let err = sd[0].as_slice::<f64>().unwrap_err();
    assert_eq!(err.code, code::INVALID_ARGUMENT, "{}", err);
    assert!(err.message.contains("layers.0.linear.weight"), "{}", err);
    let err = s.tensors(0).unwrap_err();
    assert_eq!(err.code, code::INVALID_ARGUMENT, "{}", err);
}

#[test]
fn views_alias_the_training_tensors() {
    let dir = TempDir::new("alias");
    let mut s = session(&dir);
    let a = find(s.parameters().unwrap(), "head.weight");
    let b = find(s.state_dict().unwrap(), "head.weight");
    // Two calls, one memory.
    assert_eq!(a.data_ptr(), b.data_ptr());

    // A write through one view is seen by another fetch.
    let mut bias = find(s.parameters().unwrap(), "head.bias");
    bias.as_mut_slice::<f32>()
        .unwrap()
        .copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
    let again = find(s.state_dict().unwrap(), "head.bias");
    assert_eq!(&*again.as_slice::<f32>().unwrap(), &[1.0, 2.0, 3.0, 4.0]);

    // An old view sees the step: it is the training's tensor.
    let before = a.to_vec::<f32>().unwrap();
    s.step().unwrap();
    assert_ne!(a.to_vec::<f32>().unwrap(), before);
    assert_eq!(
        a.data_ptr(),
        find(s.parameters().unwrap(), "head.weight").data_ptr()
    );

    // While a slice is alive the session does not write the memory under it.
    {
        let held = a.as_slice::<f32>().unwrap();
        let err = s.step().unwrap_err();
        assert_eq!(err.code, code::FAILED_PRECONDITION, "{}", err);
        assert!(err.message.contains("drop the slice"), "{}", err);
        // Reading calls go on.
        s.evaluate().unwrap();
        // A mutable slice of the same session waits for the shared one.
        let mut w = find(s.parameters().unwrap(), "head.bias");
        assert_eq!(
            w.as_mut_slice::<f32>().unwrap_err().code,
            code::FAILED_PRECONDITION
        );
        assert_eq!(held.len(), CLASSES * HIDDEN);
    }
    s.step().unwrap();
    assert_eq!(s.progress().unwrap().step, 2);

    // A view keeps its storage after the session is gone.
    let value = a.to_vec::<f32>().unwrap();
    drop(s);
    assert_eq!(&*a.as_slice::<f32>().unwrap(), &value[..]);
}

#[test]
fn a_write_through_a_view_changes_training() {
    let dir = TempDir::new("write");
    let mut s = session(&dir);
    for mut t in s.parameters().unwrap() {
        t.as_mut_slice::<f32>().unwrap().fill(0.0);
    }
    for t in s.state_dict().unwrap() {
        assert!(t.as_slice::<f32>().unwrap().iter().all(|&x| x == 0.0));
    }
    // Every weight zero: uniform outputs, a test loss of ln(classes).
    let loss = s.evaluate().unwrap().loss;
    let expected = (CLASSES as f64).ln();
    assert!(
        (loss - expected).abs() <= 1e-6 * expected,
        "loss {} vs ln({}) = {}",
        loss,
        CLASSES,
        expected
    );
}

#[test]
fn a_slice_inside_the_metrics_callback_is_refused() {
    let dir = TempDir::new("callback");
    let mut s = session(&dir);
    let w = find(s.parameters().unwrap(), "head.weight");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in = Arc::clone(&seen);
    s.set_metrics_callback(move |_| {
        seen_in
            .lock()
            .unwrap()
            .push(w.as_slice::<f32>().map(|_| ()).map_err(|e| e.code));
        false
    })
    .unwrap();
    s.step().unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![Err(code::FAILED_PRECONDITION)]);
}

#[test]
fn optimizer_state_is_live_and_named_by_parameter() {
    let dir = TempDir::new("optimizer");
    let mut s = session(&dir);
    assert!(s.optimizer_state().unwrap().is_empty());
    s.step().unwrap();
    let state = s.optimizer_state().unwrap();
    let expected: Vec<String> = MLP
        .iter()
        .map(|p| format!("{}.momentum_buffer", p))
        .collect();
    assert_eq!(names(&state), expected);
    // Optimizer state follows the parameters and buffers in one call.
    let all = s.tensors(kinds::MODEL | kinds::OPTIMIZER).unwrap();
    assert_eq!(names(&all)[..4], MLP);
    assert_eq!(names(&all)[4..], expected[..]);

    let buf = find(state, "head.weight.momentum_buffer");
    let old = buf.to_vec::<f32>().unwrap();
    s.step().unwrap();
    let now = find(s.optimizer_state().unwrap(), "head.weight.momentum_buffer");
    assert_eq!(now.data_ptr(), buf.data_ptr());
    assert_ne!(buf.to_vec::<f32>().unwrap(), old);
}

#[test]
fn loading_one_sessions_weights_into_another_gives_the_same_loss() {
    let dir = TempDir::new("load");
    // One seed (the synthetic data follows run.seed, so both test on the same images); a trains
    // a few steps, b stays at its initial weights.
    let mut a = session(&dir);
    let mut b = session(&dir);
    for _ in 0..3 {
        a.step().unwrap();
    }
    let loss_a = a.evaluate().unwrap().loss;
    assert_ne!(
        b.evaluate().unwrap().loss,
        loss_a,
        "training changed nothing"
    );

    // Straight from a's views (no copy on the way).
    b.load_tensors_from(&a.state_dict().unwrap(), load::STRICT)
        .unwrap();
    assert_eq!(b.evaluate().unwrap().loss, loss_a);
    for (x, y) in a.state_dict().unwrap().iter().zip(b.state_dict().unwrap()) {
        assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
        assert_ne!(x.data_ptr(), y.data_ptr(), "b holds a copy");
    }

    // Through Rust vectors: a fresh session c, loaded from copies of a's, as f64 (cast).
    let mut c = session(&dir);
    let copies: Vec<(String, Vec<f64>, Vec<i64>)> = a
        .state_dict()
        .unwrap()
        .iter()
        .map(|t| {
            let v = t.to_vec::<f32>().unwrap();
            (
                t.name().to_string(),
                v.into_iter().map(f64::from).collect(),
                t.shape().to_vec(),
            )
        })
        .collect();
    let views: Vec<(&str, TensorView)> = copies
        .iter()
        .map(|(n, v, shape)| (n.as_str(), TensorView::new(v, shape).unwrap()))
        .collect();
    c.load_tensors(&views, load::STRICT).unwrap();
    assert_eq!(c.evaluate().unwrap().loss, loss_a);

    // b trains on from a's weights; a's own tensors stay as they were.
    let before = a.to_owned_weights();
    b.step().unwrap();
    assert_eq!(a.to_owned_weights(), before);
}

trait Weights {
    fn to_owned_weights(&self) -> Vec<Vec<f32>>;
}

impl Weights for Session {
    fn to_owned_weights(&self) -> Vec<Vec<f32>> {
        self.state_dict()
            .unwrap()
            .iter()
            .map(|t| t.to_vec::<f32>().unwrap())
            .collect()
    }
}

#[test]
fn strict_loading_refuses_bad_input_naming_the_key_and_changes_nothing() {
    let dir = TempDir::new("strict");
    let mut s = session(&dir);
    let before = s.to_owned_weights();
    let zeros: Vec<(String, Vec<f32>, Vec<i64>)> = s
        .state_dict()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t.name().to_string(),
                vec![0.0; t.numel()],
                t.shape().to_vec(),
            )
        })
        .collect();
    let views = |skip: &str| -> Vec<(&str, TensorView)> {
        zeros
            .iter()
            .filter(|(n, _, _)| n != skip)
            .map(|(n, v, shape)| (n.as_str(), TensorView::new(v, shape).unwrap()))
            .collect()
    };
    let mut refused = |tensors: &[(&str, TensorView)], flags: u32, needle: &str| {
        let err = s.load_tensors(tensors, flags).unwrap_err();
        assert_eq!(err.code, code::INVALID_ARGUMENT, "{}", err);
        assert!(err.message.contains(needle), "no {:?} in: {}", needle, err);
        assert_eq!(err.location, None);
    };

    let spare = [0.0f32; 3];
    let mut unknown = views("");
    unknown.push(("head.wieght", TensorView::vector(&spare)));
    refused(&unknown, load::STRICT, "no tensor 'head.wieght'");
    refused(&views("head.bias"), load::STRICT, "not given: 'head.bias'");
    let long = vec![0.0f32; CLASSES + 1];
    let mut wrong_shape = views("head.bias");
    wrong_shape.push(("head.bias", TensorView::vector(&long)));
    refused(&wrong_shape, load::STRICT, "'head.bias' has shape [5]");
    let ints = vec![0i64; CLASSES];
    let mut wrong_dtype = views("head.bias");
    wrong_dtype.push(("head.bias", TensorView::vector(&ints)));
    refused(&wrong_dtype, load::STRICT, "'head.bias' has dtype");
    let mut twice = views("");
    twice.push(("head.bias", TensorView::vector(&zeros[3].1)));
    refused(&twice, load::STRICT, "'head.bias' is given twice");
    assert_eq!(
        s.to_owned_weights(),
        before,
        "a refused load changed the model"
    );

    // A shape that does not hold the data is refused before the call.
    let err = TensorView::new(&spare, &[2, 2]).unwrap_err();
    assert_eq!(err.code, code::INVALID_ARGUMENT);

    // The flags relax it: one tensor given, unknown names skipped.
    let twos = vec![2.0f32; CLASSES];
    s.load_tensors(
        &[
            ("head.bias", TensorView::vector(&twos)),
            ("nope", TensorView::vector(&spare)),
        ],
        load::ALLOW_MISSING | load::ALLOW_UNEXPECTED,
    )
    .unwrap();
    let after = s.to_owned_weights();
    assert_eq!(after[3], twos);
    assert_eq!(after[..3], before[..3]);
}

#[test]
fn the_average_follows_timms_update_and_is_what_evaluation_measures() {
    let dir = TempDir::new("average");
    let options = Options::new().log_level(LogLevel::Warn);
    // Without [ema]: no average to take, and evaluations measure the trained weights.
    let mut plain = session(&dir);
    let err = plain.average().unwrap_err();
    assert_eq!(err.code, code::FAILED_PRECONDITION, "{}", err);
    assert!(!plain.evaluate().unwrap().averaged);

    let text = format!("{}\n[ema]\ndecay = 0.5\n", pipeline(dir.path()));
    let mut s = Session::from_str(&text, "ema.toml", &options).unwrap();
    let average = s.average().unwrap();
    let expected: Vec<String> = MLP.iter().map(|p| format!("ema/{}", p)).collect();
    assert_eq!(names(&average), expected);
    // Step 1 copies the weights; step 2 moves halfway to them (timm's decay 0.5).
    s.step().unwrap();
    let w1 = find(s.parameters().unwrap(), "head.weight")
        .to_vec::<f32>()
        .unwrap();
    let avg = find(s.average().unwrap(), "ema/head.weight");
    assert_eq!(avg.to_vec::<f32>().unwrap(), w1);
    s.step().unwrap();
    let w2 = find(s.parameters().unwrap(), "head.weight")
        .to_vec::<f32>()
        .unwrap();
    for ((a, x1), x2) in avg.to_vec::<f32>().unwrap().iter().zip(&w1).zip(&w2) {
        assert!(
            (a - (x1 + 0.5 * (x2 - x1))).abs() < 1e-6,
            "{} {} {}",
            a,
            x1,
            x2
        );
    }
    assert!(s.evaluate().unwrap().averaged);
}
