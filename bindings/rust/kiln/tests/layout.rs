//! The `#[repr(C)]` mirrors in `kiln::sys` must match kiln.h byte for byte.
//!
//! Two checks:
//!  1. Hand-pinned x86_64/aarch64 (LP64) values, worked out from the header: size_t, pointers,
//!     int64_t and double are 8 bytes with 8-byte alignment, int32_t/uint32_t 4 bytes with
//!     4-byte alignment; each field sits at the next multiple of its alignment after the
//!     previous one, and a struct's size is rounded up to its largest alignment (8). For
//!     example kiln_plugin_info: struct_size 0, four strings 8..40, kiln_version (3 x uint32)
//!     40..52, abi_major 52, abi_minor 56..60, size 64 (4 bytes of tail padding), so its
//!     KILN_PLUGIN_INFO_V1_SIZE is 60, not 64.
//!  2. The C compiler's own answer: a small C program including kiln/kiln.h prints sizeof,
//!     offsetof and the KILN_*_V1_SIZE macros, compared field by field. Skipped (with a note)
//!     only when no C compiler ($CC or cc) runs.
use std::mem::{size_of, MaybeUninit};
use std::path::PathBuf;
use std::process::Command;

use kiln::sys::*;

/// Offset of `$field` in `$t`, without a value of `$t` (std's offset_of! needs Rust 1.77).
macro_rules! offset {
    ($t:ty, $field:ident) => {{
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: addr_of! computes the address without reading the uninitialised value.
        let f = unsafe { std::ptr::addr_of!((*base).$field) };
        f as usize - base as usize
    }};
}

/// Size of `$field` in `$t`.
macro_rules! field_size {
    ($t:ty, $field:ident) => {{
        fn pointee_size<T>(_: *const T) -> usize {
            size_of::<T>()
        }
        let u = MaybeUninit::<$t>::uninit();
        let base = u.as_ptr();
        // SAFETY: as in offset!.
        pointee_size(unsafe { std::ptr::addr_of!((*base).$field) })
    }};
}

/// (C name "struct.field", offset, size) for every listed field of `$t`.
macro_rules! fields {
    ($t:ty, $c:literal, [$($field:ident),* $(,)?]) => {
        vec![$((
            concat!($c, ".", stringify!($field)).to_string(),
            offset!($t, $field),
            field_size!($t, $field),
        )),*]
    };
}

type Field = (String, usize, usize);

fn all_fields() -> Vec<Field> {
    let mut v: Vec<Field> = Vec::new();
    v.extend(fields!(KilnVersion, "kiln_version", [major, minor, patch]));
    v.extend(fields!(
        KilnSessionOptions,
        "kiln_session_options",
        [
            struct_size,
            overrides,
            override_count,
            plugin_paths,
            plugin_path_count,
            metrics_path,
            resume,
            log_level,
            distributed,
            process_settings,
            components,
            component_count,
            component_origin,
        ]
    ));
    v.extend(fields!(
        KilnProgress,
        "kiln_progress",
        [
            struct_size,
            state,
            epoch_ended,
            step,
            max_steps,
            epoch,
            epochs,
            batches_in_epoch,
            batches_per_epoch,
            rank,
            world_size,
            stop_reason,
            last_checkpoint,
        ]
    ));
    v.extend(fields!(
        KilnMetrics,
        "kiln_metrics",
        [
            struct_size,
            kind,
            skipped,
            step,
            epoch,
            loss,
            accuracy,
            lr,
            grad_norm,
            loss_scale,
            step_seconds,
            data_seconds,
            samples_per_second,
            tensor_mb,
            tensor_peak_mb,
            activation_mb,
            accuracy_top5,
            map,
            weights,
        ]
    ));
    v.extend(fields!(
        KilnPluginInfo,
        "kiln_plugin_info",
        [
            struct_size,
            name,
            kind,
            summary,
            library,
            version,
            abi_major,
            abi_minor,
        ]
    ));
    v.extend(fields!(
        KilnApi,
        "kiln_api",
        [
            struct_size,
            version,
            reserved,
            version_string,
            plugin_abi,
            status_code,
            status_message,
            status_release,
            session_create_from_file,
            session_create_from_string,
            session_destroy,
            session_set_metrics_callback,
            session_run,
            session_step,
            session_evaluate,
            session_save_checkpoint,
            session_cancel,
            session_progress,
            session_last_metrics,
            plugins_list,
            plugins_count,
            plugins_get,
            plugins_refused_count,
            plugins_refused,
            plugins_release,
            status_location,
            session_tensors,
            tensor_list_count,
            tensor_list_name,
            tensor_list_get,
            tensor_list_release,
            session_load_tensors,
        ]
    ));
    v.extend(fields!(
        KilnStatusLocation,
        "kiln_status_location",
        [struct_size, file, line, column, key]
    ));
    // DLPack (dlpack/dlpack.h, which kiln/abi.h includes).
    v.extend(fields!(DLDevice, "DLDevice", [device_type, device_id]));
    v.extend(fields!(DLDataType, "DLDataType", [code, bits, lanes]));
    v.extend(fields!(
        DLTensor,
        "DLTensor",
        [data, device, ndim, dtype, shape, strides, byte_offset]
    ));
    v.extend(fields!(
        DLManagedTensor,
        "DLManagedTensor",
        [dl_tensor, manager_ctx, deleter]
    ));
    // The plugin ABI's structs an in-process component is made of (kiln/plugin.h, ...).
    v.extend(fields!(
        KilnHostApiHead,
        "kiln_host_api",
        [struct_size, abi_major, abi_minor, make_status]
    ));
    v.extend(fields!(
        KilnOptionSpec,
        "kiln_option_spec",
        [struct_size, name]
    ));
    v.push((
        "kiln_option_spec.type".to_string(),
        offset!(KilnOptionSpec, type_),
        field_size!(KilnOptionSpec, type_),
    ));
    v.extend(fields!(
        KilnOptionSpec,
        "kiln_option_spec",
        [
            has_min,
            has_max,
            reserved,
            min,
            max,
            default_value,
            choices,
            doc
        ]
    ));
    v.extend(fields!(
        KilnOptionValue,
        "kiln_option_value",
        [struct_size, name]
    ));
    v.push((
        "kiln_option_value.type".to_string(),
        offset!(KilnOptionValue, type_),
        field_size!(KilnOptionValue, type_),
    ));
    v.extend(fields!(
        KilnOptionValue,
        "kiln_option_value",
        [
            bool_value,
            int_value,
            float_value,
            string_value,
            int_list,
            float_list,
            list_length,
            string_list,
        ]
    ));
    v.extend(fields!(
        KilnOptions,
        "kiln_options",
        [struct_size, count, values]
    ));
    v.extend(fields!(
        KilnCapabilities,
        "kiln_capabilities",
        [struct_size, flags, attribute_count, attributes]
    ));
    v.extend(fields!(
        KilnLrSchedule,
        "kiln_lr_schedule",
        [
            struct_size,
            base_lr,
            max_iters,
            warmup_iters,
            iters_per_epoch
        ]
    ));
    v.extend(fields!(
        KilnLrPolicyVtable,
        "kiln_lr_policy_vtable",
        [
            struct_size,
            create,
            destroy,
            lr_at,
            observe,
            get_state,
            set_state
        ]
    ));
    v.extend(fields!(
        KilnLrObservation,
        "kiln_lr_observation",
        [struct_size, iter, epoch, count, names, values]
    ));
    v.extend(fields!(
        KilnComponentDescriptor,
        "kiln_component_descriptor",
        [
            struct_size,
            kind,
            reserved,
            name,
            version,
            summary,
            capabilities,
            option_count,
            options,
            vtable,
        ]
    ));
    v.extend(fields!(
        KilnPluginDescriptor,
        "kiln_plugin_descriptor",
        [
            struct_size,
            abi_major,
            abi_minor,
            name,
            version,
            component_count,
            components,
            init,
            torch_version,
            torch_cxx11_abi,
            reserved,
        ]
    ));
    v
}

fn struct_sizes() -> Vec<(&'static str, usize)> {
    vec![
        ("kiln_version", size_of::<KilnVersion>()),
        ("kiln_session_options", size_of::<KilnSessionOptions>()),
        ("kiln_progress", size_of::<KilnProgress>()),
        ("kiln_metrics", size_of::<KilnMetrics>()),
        ("kiln_plugin_info", size_of::<KilnPluginInfo>()),
        ("kiln_api", size_of::<KilnApi>()),
        ("kiln_status_location", size_of::<KilnStatusLocation>()),
        ("DLDevice", size_of::<DLDevice>()),
        ("DLDataType", size_of::<DLDataType>()),
        ("DLTensor", size_of::<DLTensor>()),
        ("DLManagedTensor", size_of::<DLManagedTensor>()),
        ("kiln_option_spec", size_of::<KilnOptionSpec>()),
        ("kiln_option_value", size_of::<KilnOptionValue>()),
        ("kiln_options", size_of::<KilnOptions>()),
        ("kiln_capabilities", size_of::<KilnCapabilities>()),
        ("kiln_lr_schedule", size_of::<KilnLrSchedule>()),
        ("kiln_lr_policy_vtable", size_of::<KilnLrPolicyVtable>()),
        ("kiln_lr_observation", size_of::<KilnLrObservation>()),
        (
            "kiln_component_descriptor",
            size_of::<KilnComponentDescriptor>(),
        ),
        ("kiln_plugin_descriptor", size_of::<KilnPluginDescriptor>()),
    ]
}

fn constants() -> Vec<(&'static str, usize)> {
    vec![
        ("KILN_SESSION_OPTIONS_V1_SIZE", KILN_SESSION_OPTIONS_V1_SIZE),
        ("KILN_SESSION_OPTIONS_V2_SIZE", KILN_SESSION_OPTIONS_V2_SIZE),
        ("KILN_PROGRESS_V1_SIZE", KILN_PROGRESS_V1_SIZE),
        ("KILN_METRICS_V1_SIZE", KILN_METRICS_V1_SIZE),
        ("KILN_METRICS_V2_SIZE", KILN_METRICS_V2_SIZE),
        ("KILN_METRICS_V3_SIZE", KILN_METRICS_V3_SIZE),
        ("KILN_METRICS_V4_SIZE", KILN_METRICS_V4_SIZE),
        ("KILN_PLUGIN_INFO_V1_SIZE", KILN_PLUGIN_INFO_V1_SIZE),
        ("KILN_API_V1_SIZE", KILN_API_V1_SIZE),
        ("KILN_API_V2_SIZE", KILN_API_V2_SIZE),
        ("KILN_STATUS_LOCATION_V1_SIZE", KILN_STATUS_LOCATION_V1_SIZE),
        ("KILN_CAPI_VERSION", KILN_CAPI_VERSION as usize),
        ("KILN_TENSORS_PARAMETERS", KILN_TENSORS_PARAMETERS as usize),
        ("KILN_TENSORS_BUFFERS", KILN_TENSORS_BUFFERS as usize),
        ("KILN_TENSORS_MODEL", KILN_TENSORS_MODEL as usize),
        ("KILN_TENSORS_OPTIMIZER", KILN_TENSORS_OPTIMIZER as usize),
        ("KILN_TENSORS_AVERAGE", KILN_TENSORS_AVERAGE as usize),
        ("KILN_WEIGHTS_TRAINED", KILN_WEIGHTS_TRAINED as usize),
        ("KILN_WEIGHTS_AVERAGE", KILN_WEIGHTS_AVERAGE as usize),
        ("KILN_LOAD_ALLOW_MISSING", KILN_LOAD_ALLOW_MISSING as usize),
        (
            "KILN_LOAD_ALLOW_UNEXPECTED",
            KILN_LOAD_ALLOW_UNEXPECTED as usize,
        ),
        ("kDLCPU", DL_CPU as usize),
        ("kDLCUDA", DL_CUDA as usize),
        ("kDLCUDAHost", DL_CUDA_HOST as usize),
        ("kDLInt", DL_INT as usize),
        ("kDLUInt", DL_UINT as usize),
        ("kDLFloat", DL_FLOAT as usize),
        ("kDLOpaqueHandle", DL_OPAQUE_HANDLE as usize),
        ("kDLBfloat", DL_BFLOAT as usize),
        ("kDLComplex", DL_COMPLEX as usize),
    ]
}

fn offset_of(fields: &[Field], name: &str) -> usize {
    fields
        .iter()
        .find(|f| f.0 == name)
        .unwrap_or_else(|| panic!("no field {}", name))
        .1
}

#[test]
#[cfg(target_pointer_width = "64")]
fn layout_matches_hand_computed_lp64_values() {
    assert_eq!(size_of::<KilnVersion>(), 12);
    assert_eq!(size_of::<KilnSessionOptions>(), 96); // process_settings, then V2 appended
    assert_eq!(size_of::<KilnProgress>(), 88);
    assert_eq!(size_of::<KilnMetrics>(), 144); // accuracy_top5 (V2), map (V3), weights (V4)
    assert_eq!(size_of::<KilnPluginInfo>(), 64);
    // struct_size, version, reserved (16 bytes), then 22 slots of 8 (version 1) and 7 more.
    assert_eq!(size_of::<KilnApi>(), 16 + 29 * 8);
    assert_eq!(size_of::<KilnStatusLocation>(), 40);
    // DLPack: DLDevice 2 x int, DLDataType 1+1+2 bytes; DLTensor data 0, device 8, ndim 16,
    // dtype 20, shape 24, strides 32, byte_offset 40; the managed tensor adds two pointers.
    assert_eq!(size_of::<DLDevice>(), 8);
    assert_eq!(size_of::<DLDataType>(), 4);
    assert_eq!(size_of::<DLTensor>(), 48);
    assert_eq!(size_of::<DLManagedTensor>(), 64);

    let f = all_fields();
    let pinned: &[(&str, usize)] = &[
        ("kiln_session_options.overrides", 8),
        ("kiln_session_options.override_count", 16),
        ("kiln_session_options.plugin_paths", 24),
        ("kiln_session_options.plugin_path_count", 32),
        ("kiln_session_options.metrics_path", 40),
        ("kiln_session_options.resume", 48),
        ("kiln_session_options.log_level", 56),
        ("kiln_session_options.distributed", 60),
        ("kiln_session_options.process_settings", 64),
        ("kiln_session_options.components", 72),
        ("kiln_session_options.component_count", 80),
        ("kiln_session_options.component_origin", 88),
        ("kiln_progress.state", 8),
        ("kiln_progress.epoch_ended", 12),
        ("kiln_progress.step", 16),
        ("kiln_progress.max_steps", 24),
        ("kiln_progress.epoch", 32),
        ("kiln_progress.epochs", 40),
        ("kiln_progress.batches_in_epoch", 48),
        ("kiln_progress.batches_per_epoch", 56),
        ("kiln_progress.rank", 64),
        ("kiln_progress.world_size", 68),
        ("kiln_progress.stop_reason", 72),
        ("kiln_progress.last_checkpoint", 80),
        ("kiln_metrics.kind", 8),
        ("kiln_metrics.skipped", 12),
        ("kiln_metrics.step", 16),
        ("kiln_metrics.epoch", 24),
        ("kiln_metrics.loss", 32),
        ("kiln_metrics.accuracy", 40),
        ("kiln_metrics.lr", 48),
        ("kiln_metrics.grad_norm", 56),
        ("kiln_metrics.loss_scale", 64),
        ("kiln_metrics.step_seconds", 72),
        ("kiln_metrics.data_seconds", 80),
        ("kiln_metrics.samples_per_second", 88),
        ("kiln_metrics.tensor_mb", 96),
        ("kiln_metrics.tensor_peak_mb", 104),
        ("kiln_metrics.activation_mb", 112),
        ("kiln_metrics.accuracy_top5", 120),
        ("kiln_metrics.map", 128),
        ("kiln_metrics.weights", 136),
        ("kiln_plugin_info.name", 8),
        ("kiln_plugin_info.kind", 16),
        ("kiln_plugin_info.summary", 24),
        ("kiln_plugin_info.library", 32),
        ("kiln_plugin_info.version", 40),
        ("kiln_plugin_info.abi_major", 52),
        ("kiln_plugin_info.abi_minor", 56),
        ("kiln_api.version", 8),
        ("kiln_api.reserved", 12),
        ("kiln_api.version_string", 16),
        ("kiln_api.session_create_from_file", 56),
        ("kiln_api.session_destroy", 72),
        ("kiln_api.session_cancel", 120),
        ("kiln_api.plugins_release", 184),
        ("kiln_api.status_location", 192),
        ("kiln_api.session_load_tensors", 240),
        ("kiln_status_location.file", 8),
        ("kiln_status_location.line", 16),
        ("kiln_status_location.column", 24),
        ("kiln_status_location.key", 32),
        ("DLTensor.device", 8),
        ("DLTensor.ndim", 16),
        ("DLTensor.dtype", 20),
        ("DLTensor.shape", 24),
        ("DLTensor.strides", 32),
        ("DLTensor.byte_offset", 40),
        ("DLManagedTensor.manager_ctx", 48),
        ("DLManagedTensor.deleter", 56),
    ];
    for (name, off) in pinned {
        assert_eq!(offset_of(&f, name), *off, "offset of {}", name);
    }
    // The slots follow each other with no gap, in the header's order.
    let slots: Vec<&Field> = f
        .iter()
        .filter(|x| x.0.starts_with("kiln_api.") && x.1 >= 16)
        .collect();
    assert_eq!(slots.len(), 29);
    for (i, s) in slots.iter().enumerate() {
        assert_eq!(s.1, 16 + 8 * i, "{}", s.0);
        assert_eq!(s.2, 8, "{}", s.0);
    }
    // A V1 size is the end of the struct's last version-1 field.
    let end = |name: &str| f.iter().find(|x| x.0 == name).map(|x| x.1 + x.2).unwrap();
    assert_eq!(
        KILN_SESSION_OPTIONS_V1_SIZE,
        end("kiln_session_options.distributed")
    );
    assert_eq!(
        KILN_SESSION_OPTIONS_V2_SIZE,
        end("kiln_session_options.component_origin")
    );
    assert_eq!(KILN_PROGRESS_V1_SIZE, end("kiln_progress.last_checkpoint"));
    assert_eq!(KILN_METRICS_V1_SIZE, end("kiln_metrics.activation_mb"));
    assert_eq!(KILN_METRICS_V3_SIZE, end("kiln_metrics.map"));
    assert_eq!(KILN_METRICS_V4_SIZE, end("kiln_metrics.weights"));
    assert_eq!(KILN_PLUGIN_INFO_V1_SIZE, end("kiln_plugin_info.abi_minor"));
    assert_eq!(KILN_API_V1_SIZE, end("kiln_api.plugins_release"));
    assert_eq!(KILN_API_V2_SIZE, end("kiln_api.session_load_tensors"));
    assert_eq!(KILN_API_V2_SIZE, size_of::<KilnApi>());
    assert_eq!(
        KILN_STATUS_LOCATION_V1_SIZE,
        end("kiln_status_location.key")
    );
}

fn source_dir() -> PathBuf {
    match std::env::var_os("KILN_SOURCE_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.."),
    }
}

#[test]
fn layout_matches_the_c_compiler() {
    let include = source_dir().join("sdk/include");
    assert!(
        include.join("kiln/kiln.h").exists(),
        "kiln.h not under {}",
        include.display()
    );

    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"kiln/kiln.h\"\n\
         #include \"kiln/lr_policy.h\"\n#include \"kiln/plugin.h\"\nint main(void) {\n",
    );
    for (name, _, _) in all_fields() {
        let (ty, field) = name.split_once('.').unwrap();
        c.push_str(&format!(
            "  printf(\"{n} %zu %zu\\n\", offsetof({t}, {f}), sizeof((({t}*)0)->{f}));\n",
            n = name,
            t = ty,
            f = field
        ));
    }
    for (ty, _) in struct_sizes() {
        c.push_str(&format!(
            "  printf(\"sizeof({t}) %zu 0\\n\", sizeof({t}));\n",
            t = ty
        ));
    }
    for (m, _) in constants() {
        c.push_str(&format!(
            "  printf(\"{m} %zu 0\\n\", (size_t)({m}));\n",
            m = m
        ));
    }
    c.push_str("  return 0;\n}\n");

    let dir = std::env::temp_dir().join(format!("kiln-rust-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    // A sanitizer runtime preloaded for this test (see tests/capi/rust_test.sh) is not for cc.
    let compiled = Command::new(&cc)
        .env_remove("LD_PRELOAD")
        .arg("-std=c11")
        .arg("-I")
        .arg(&include)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output();
    let compiled = match compiled {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "note: skipping the C layout check: cannot run {}: {}",
                cc, e
            );
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    };
    if !compiled.status.success() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        compiled.status.success(),
        "{} failed on the layout program:\n{}",
        cc,
        String::from_utf8_lossy(&compiled.stderr)
    );
    let out = Command::new(&exe)
        .env_remove("LD_PRELOAD")
        .output()
        .expect("run the layout program");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();

    let mut expected: Vec<(String, usize, usize)> = all_fields();
    expected.extend(
        struct_sizes()
            .into_iter()
            .map(|(t, s)| (format!("sizeof({})", t), s, 0)),
    );
    expected.extend(constants().into_iter().map(|(m, s)| (m.to_string(), s, 0)));
    let got: Vec<(String, usize, usize)> = text
        .lines()
        .map(|l| {
            let p: Vec<&str> = l.split(' ').collect();
            (
                p[0].to_string(),
                p[1].parse().unwrap(),
                p[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected.iter()) {
        assert_eq!(g, e, "C (left) and Rust (right) disagree");
    }
}
