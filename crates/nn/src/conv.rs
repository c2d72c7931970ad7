//! Conv2d layer (NCHW; stride, padding, dilation, groups) over the op library's im2col/1x1 convolution.
use crate::init::Init;
use crate::module::Module;
use netcl_autograd::{Parameter, Tape, Var};
use netcl_ops::{Conv2dParams, DType, Device, Error, Generator, Result};
use serde_json::{json, Value};

/// A 2-D convolution layer over NCHW input: weight `[cout, cin / groups, kh, kw]`, an optional
/// bias `[cout]`, and [`Conv2dParams`] (stride, padding, dilation, groups). It runs as im2col and
/// a batched GEMM plus a channel-bias add (a direct GEMM for 1x1 kernels of stride 1).
pub struct Conv2d {
    pub weight: Parameter,
    pub bias: Option<Parameter>,
    pub params: Conv2dParams,
}

impl Conv2d {
    /// f32 convolution with a square `kernel`, PyTorch's default initialisation and a bias.
    pub fn new(
        cin: usize,
        cout: usize,
        kernel: usize,
        params: Conv2dParams,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Conv2d> {
        Conv2d::with_init(
            cin,
            cout,
            (kernel, kernel),
            params,
            true,
            Init::Default,
            DType::F32,
            device,
            gen,
        )
    }

    /// A convolution with a `(kh, kw)` kernel, an optional bias, the weight initialisation
    /// `init` and storage `dtype`.
    #[allow(clippy::too_many_arguments)]
    pub fn with_init(
        cin: usize,
        cout: usize,
        kernel: (usize, usize),
        params: Conv2dParams,
        bias: bool,
        init: Init,
        dtype: DType,
        device: &Device,
        gen: &mut Generator,
    ) -> Result<Conv2d> {
        let g = params.groups;
        if g == 0 || !cin.is_multiple_of(g) || !cout.is_multiple_of(g) {
            return Err(Error::invalid(
                "Conv2d",
                format!("{cin} input and {cout} output channels do not split into {g} groups"),
            ));
        }
        let fan_in = cin / g * kernel.0 * kernel.1;
        let fan_out = cout / g * kernel.0 * kernel.1;
        let w = init.tensor(
            &[cout, cin / g, kernel.0, kernel.1],
            fan_in,
            fan_out,
            dtype,
            device,
            gen,
        )?;
        let b = if bias {
            Some(Parameter::new(Init::Default.tensor(
                &[cout],
                fan_in,
                fan_out,
                dtype,
                device,
                gen,
            )?)?)
        } else {
            None
        };
        Ok(Conv2d {
            weight: Parameter::new(w)?,
            bias: b,
            params,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, tape: &Tape, x: &Var) -> Result<Var> {
        let b = self.bias.as_ref().map(|b| tape.param(b));
        x.conv2d(&tape.param(&self.weight), b.as_ref(), self.params)
    }
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        v.extend(self.bias.iter().map(|b| ("bias".to_string(), b.clone())));
        v
    }
    fn describe(&self) -> Value {
        let s = self.weight.shape();
        let p = &self.params;
        json!({
            "type": "Conv2d", "in": s[1] * p.groups, "out": s[0], "kernel": [s[2], s[3]],
            "stride": [p.stride.0, p.stride.1], "padding": [p.padding.0, p.padding.1],
            "dilation": [p.dilation.0, p.dilation.1], "groups": p.groups, "bias": self.bias.is_some(),
        })
    }
}
