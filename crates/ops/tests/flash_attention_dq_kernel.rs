//! The register-blocked attention backward with dq from its own kernel (NETCL_ATTENTION_DS=0), the path of shapes whose scores' gradients exceed their budget, against the naive attention on every device (its own process: the switch is read once, at the first backward).
use netcl_core_devices::test_devices;

mod attention_support;
use attention_support::head_dim_64_cases;

#[test]
fn head_dim_64_blocks_with_the_dq_kernel_match_naive_attention() {
    std::env::set_var("NETCL_ATTENTION_DS", "0");
    head_dim_64_cases(&test_devices().unwrap());
}
