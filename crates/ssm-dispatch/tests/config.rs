//! Configuration errors are typed and name what was wrong.

use ssm_dispatch::{BackendKind, Config, Error, Runtime};
use ssm_ssu::SsuAlgorithm;

#[test]
fn unknown_algorithm_is_refused() {
    let e = serde_json::from_str::<Config>(r#"{"ssu_algorithm": "fastest"}"#).unwrap_err();
    insta::assert_snapshot!("unknown_algorithm", e.to_string());
}

#[test]
fn gpu_tilings_without_a_cuda_backend_are_refused_by_name() {
    for (name, algorithm) in [("auto", SsuAlgorithm::Auto), ("simple", SsuAlgorithm::Simple)] {
        let cfg: Config = serde_json::from_str(&format!(r#"{{"backend": "cpu", "ssu_algorithm": "{name}"}}"#)).unwrap();
        assert_eq!(Runtime::new(&cfg).unwrap().ssu_algorithm(), algorithm);
    }
    for name in ["vertical", "horizontal"] {
        let cfg: Config = serde_json::from_str(&format!(r#"{{"backend": "cpu", "ssu_algorithm": "{name}"}}"#)).unwrap();
        match Runtime::new(&cfg) {
            Err(Error::Unsupported { backend: "cpu", what }) => assert!(what.contains(&format!("`{name}`")), "{what}"),
            other => panic!("`{name}` on the CPU: expected Unsupported, got {other:?}"),
        }
    }
    let e = Runtime::new(&Config { ssu_algorithm: SsuAlgorithm::Vertical, ..Config::cpu(Some(1)) }).unwrap_err();
    insta::assert_snapshot!("vertical_on_cpu", e.to_string());
}

#[test]
fn config_from_json_with_defaults_and_unknown_fields() {
    let cfg: Config = serde_json::from_str(r#"{"backend": "cpu"}"#).unwrap();
    assert_eq!(cfg.backend, BackendKind::Cpu);
    assert_eq!(cfg.ssu_algorithm, SsuAlgorithm::Auto);
    let json = serde_json::to_value(Config { ssu_algorithm: SsuAlgorithm::Horizontal, ..cfg }).unwrap();
    assert_eq!(json["ssu_algorithm"], "horizontal");
    assert_eq!(serde_json::from_value::<Config>(json).unwrap().ssu_algorithm, SsuAlgorithm::Horizontal);
    let e = serde_json::from_str::<Config>(r#"{"backend": "tpu"}"#).unwrap_err();
    insta::assert_snapshot!("unknown_backend", e.to_string());
    let e = serde_json::from_str::<Config>(r#"{"algorithm": "auto"}"#).unwrap_err();
    assert!(e.to_string().starts_with("unknown field `algorithm`"), "{e}");
}

#[test]
fn cuda_without_a_device_or_feature_is_a_clear_error() {
    let cfg = Config { backend: BackendKind::Cuda, ..Config::default() };
    let compiled = cfg!(feature = "cuda");
    match Runtime::new(&cfg) {
        // Only on a machine with a ready CUDA device and the `cuda` feature.
        Ok(rt) => assert!(compiled && rt.cuda().is_some() && rt.cpu().is_none(), "{rt:?}"),
        Err(Error::NotCompiledWithCuda) => assert!(!compiled, "the cuda feature is on"),
        Err(Error::NoCudaDevice(why)) => assert!(compiled && !why.is_empty(), "{why}"),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

#[test]
fn auto_falls_back_to_cpu_without_a_device() {
    let rt = Runtime::new(&Config::default()).unwrap();
    // `auto` always runs host tensors (on the CPU backend), and device tensors only where a
    // device is ready.
    assert!(rt.devices().contains(ssm_tensor::Device::Cpu));
    if !cfg!(feature = "cuda") {
        assert!(rt.cuda().is_none());
    }
    rt.check().unwrap();
}

#[test]
fn wrong_device_is_refused_before_anything_runs() {
    use ssm_ssu::SelectiveStateUpdateArgs;
    use ssm_tensor::{DType, Device, TensorMut, TensorRef};
    let rt = Runtime::new(&Config::cpu(Some(1))).unwrap();
    // SAFETY: these device views are planned and refused, never dereferenced.
    let (mut st, x, dt, a, b, out) = unsafe {
        (
            TensorMut::from_device_ptr(0x1000, 2 * 8 * 4, DType::F32, Device::Cuda(0), &[2, 1, 8, 4], &[32, 32, 4, 1])
                .unwrap(),
            TensorRef::from_device_ptr(0x2000, 8, DType::F32, Device::Cuda(0), &[1, 1, 8], &[8, 8, 1]).unwrap(),
            TensorRef::from_device_ptr(0x3000, 8, DType::F32, Device::Cuda(0), &[1, 1, 8], &[8, 8, 1]).unwrap(),
            TensorRef::from_device_ptr(0x4000, 32, DType::F32, Device::Cuda(0), &[1, 8, 4], &[32, 4, 1]).unwrap(),
            TensorRef::from_device_ptr(0x5000, 4, DType::F32, Device::Cuda(0), &[1, 1, 4], &[4, 4, 1]).unwrap(),
            TensorMut::from_device_ptr(0x6000, 8, DType::F32, Device::Cuda(0), &[1, 1, 8], &[8, 8, 1]).unwrap(),
        )
    };
    let e = rt
        .selective_state_update(SelectiveStateUpdateArgs {
            ..SelectiveStateUpdateArgs::new(st.reborrow(), x, dt, a, b, b, out)
        })
        .unwrap_err();
    insta::assert_snapshot!("wrong_device", e.to_string());
}
