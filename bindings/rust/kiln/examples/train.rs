//! Trains a Kiln pipeline step by step, evaluating at the end of every epoch.
//!
//!   cargo run --example train -- [PIPELINE.toml] [--set key=value]... [--target ACCURACY] [--verbose]
//!
//! PIPELINE defaults to configs/quickstart.toml (Fashion-MNIST). With --target, training stops
//! after the first epoch whose test accuracy reaches it. Kiln's own log is limited to warnings
//! unless --verbose.
use std::path::PathBuf;
use std::process;
use std::time::Instant;

use kiln::{Api, LogLevel, Options, Session, State};

const USAGE: &str =
    "usage: train [PIPELINE.toml] [--set key=value]... [--target ACCURACY] [--verbose]";

struct Args {
    pipeline: PathBuf,
    overrides: Vec<String>,
    target: Option<f64>,
    verbose: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut pipeline = None;
    let mut overrides = Vec::new();
    let mut target = None;
    let mut verbose = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                println!("{}", USAGE);
                process::exit(0);
            }
            "--set" => {
                let kv = it.next().ok_or("--set needs key=value")?;
                if !kv.contains('=') {
                    return Err(format!("--set {}: expected key=value", kv));
                }
                overrides.push(kv);
            }
            "--target" => {
                let v = it.next().ok_or("--target needs an accuracy in [0, 1]")?;
                let t: f64 = v
                    .parse()
                    .map_err(|_| format!("--target {}: not a number", v))?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(format!("--target {}: accuracy must be in [0, 1]", v));
                }
                target = Some(t);
            }
            "--verbose" => verbose = true,
            s if s.starts_with('-') => return Err(format!("unknown option {}", s)),
            s => {
                if pipeline.is_some() {
                    return Err(format!("more than one pipeline given ({})", s));
                }
                pipeline = Some(PathBuf::from(s));
            }
        }
    }
    let pipeline = match pipeline {
        Some(p) => p,
        None => {
            // The repository's quickstart, from the repository root or from this crate.
            let here = PathBuf::from("configs/quickstart.toml");
            if here.exists() {
                here
            } else {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../configs/quickstart.toml")
            }
        }
    };
    Ok(Args {
        pipeline,
        overrides,
        target,
        verbose,
    })
}

fn train(args: &Args) -> Result<(), kiln::Error> {
    println!("{}", Api::load()?.version());
    let mut options = Options::new().log_level(if args.verbose {
        LogLevel::Info
    } else {
        LogLevel::Warn
    });
    options.overrides = args.overrides.clone();
    let mut session = Session::from_file(&args.pipeline, &options)?;

    let start = Instant::now();
    let p = session.progress()?;
    println!(
        "training {}: {} epochs of {} steps",
        args.pipeline.display(),
        p.epochs,
        p.batches_per_epoch
    );
    let mut reached = None;
    while session.progress()?.state == State::Ready {
        session.step()?;
        let p = session.progress()?;
        if !p.epoch_ended {
            continue;
        }
        let m = session.evaluate()?;
        println!(
            "epoch {}/{}: accuracy {:.4}  test loss {:.4}  ({} steps, {:.1} s)",
            p.epoch,
            p.epochs,
            m.accuracy,
            m.loss,
            p.step,
            start.elapsed().as_secs_f64()
        );
        if let Some(t) = args.target {
            if m.accuracy >= t {
                reached = Some(m.accuracy);
                break;
            }
        }
    }

    let p = session.progress()?;
    print!(
        "final state: {} after {} of {} steps",
        p.state, p.step, p.max_steps
    );
    if let (Some(acc), Some(t)) = (reached, args.target) {
        print!(" (target {:.4} reached with {:.4})", t, acc);
    }
    if !p.stop_reason.is_empty() {
        print!(" ({})", p.stop_reason);
    }
    println!();
    if !p.last_checkpoint.is_empty() {
        println!("last checkpoint: {}", p.last_checkpoint);
    }
    Ok(())
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("train: {}\n{}", e, USAGE);
            process::exit(2);
        }
    };
    if let Err(e) = train(&args) {
        eprintln!("train: {}", e);
        process::exit(1);
    }
}
