//! ClBlast::load with `$NETCL_CLBLAST` naming a missing file: an error naming the path, no panic.
use netcl_bench::clblast::ClBlast;

#[test]
fn missing_library_is_an_error_naming_the_path() {
    let path = "/nonexistent/dir/libclblast.so.1";
    std::env::set_var("NETCL_CLBLAST", path);
    let err = ClBlast::load()
        .err()
        .expect("a missing library must not load")
        .to_string();
    assert!(err.contains(path), "{err}");
    assert!(err.contains("not found"), "{err}");
}
