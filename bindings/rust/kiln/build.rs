// Links libkiln from KILN_LIB_DIR (the lib/ folder of a Kiln build, e.g. build/release/lib) and
// records that folder as an rpath, so examples and tests run without LD_LIBRARY_PATH.
use std::env;
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=KILN_LIB_DIR");
    println!("cargo:rerun-if-changed=build.rs");

    let dir = match env::var_os("KILN_LIB_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => panic!(
            "KILN_LIB_DIR is not set: point it at the folder holding libkiln.so, e.g. \
             KILN_LIB_DIR=/path/to/kiln/build/release/lib cargo build"
        ),
    };
    // An absolute path, so the rpath still holds when the binary is run from elsewhere.
    let dir = match dir.canonicalize() {
        Ok(d) => d,
        Err(e) => panic!(
            "KILN_LIB_DIR={}: {} (build Kiln's `kiln` library target first)",
            dir.display(),
            e
        ),
    };
    let lib = dir.join(if cfg!(target_os = "macos") {
        "libkiln.dylib"
    } else {
        "libkiln.so"
    });
    if !lib.exists() {
        panic!(
            "KILN_LIB_DIR={}: {} not found (build Kiln's `kiln` library target first)",
            dir.display(),
            lib.display()
        );
    }

    let dir = dir
        .to_str()
        .unwrap_or_else(|| panic!("KILN_LIB_DIR {:?} is not valid UTF-8", dir));
    println!("cargo:rustc-link-search=native={}", dir);
    println!("cargo:rustc-link-lib=dylib=kiln");
    // rustc-link-arg reaches every linked target of this package (examples, tests included).
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir);
    // Dependent crates read it as DEP_KILN_LIB_DIR (thanks to `links = "kiln"`) to set their own rpath.
    println!("cargo:lib_dir={}", dir);
}
