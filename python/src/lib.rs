//! `tessera._tessera`: the Python API of `tessera-runtime` (the `tessera` package re-exports it).
//!
//! `load(path, gpu=None)` gives a [`Model`]; `model.run({name: ndarray})` returns `{name: ndarray}`. Inputs are
//! borrowed from C-contiguous arrays in place (others are made contiguous first, one copy); outputs are
//! allocated as Rust vectors, written by the run, and handed to NumPy as the arrays' own memory (no copy
//! after the run). Tensors of other frameworks (torch, CuPy, JAX) come in through DLPack, in place, on the
//! host or the GPU, and `out=` takes DLPack tensors the outputs are written into (dlpack.rs). The GIL is released while the model loads and runs. Dict order is the caller's; nothing
//! is hashed. With the `compiler` feature (default), `compile(...)` runs the compiler (compile.rs) and
//! `cli_main(argv)` the `tessera` command line (cli.rs), the wheel's `tessera` command.

#[cfg(feature = "compiler")]
mod cli;
#[cfg(feature = "compiler")]
mod compile;
mod dlpack;

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tessera_runtime::{DType, DeviceTensor, TensorInfo, TensorView, TensorViewMut};

pyo3::create_exception!(_tessera, Error, PyException, "A tessera error: the message names the file, model, input or output at fault.");

fn err(e: tessera_runtime::Error) -> PyErr {
    Error::new_err(e.to_string())
}

/// NumPy's name of a dtype.
fn numpy_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I64 => "int64",
        DType::I32 => "int32",
        DType::Bool => "bool",
    }
}

fn describe(list: &[TensorInfo]) -> Vec<(String, &'static str, Vec<usize>)> {
    list.iter().map(|d| (d.name.clone(), numpy_name(d.dtype), d.shape.clone())).collect()
}

/// A loaded model: run it from any number of Python threads (see the package documentation).
#[pyclass(frozen, module = "tessera._tessera")]
struct Model {
    inner: tessera_runtime::Model,
}

/// An input array read in place: kept borrowed (read-only) until the run is over.
enum Held<'py> {
    F32(PyReadonlyArrayDyn<'py, f32>),
    I64(PyReadonlyArrayDyn<'py, i64>),
    I32(PyReadonlyArrayDyn<'py, i32>),
    Bool(PyReadonlyArrayDyn<'py, bool>),
}

impl Held<'_> {
    fn view<'a>(&'a self, shape: &'a [usize]) -> TensorView<'a> {
        // Contiguous by construction (see `hold`), so `as_slice` succeeds.
        match self {
            Held::F32(a) => TensorView::from_slice(shape, a.as_slice().expect("contiguous")),
            Held::I64(a) => TensorView::from_slice(shape, a.as_slice().expect("contiguous")),
            Held::I32(a) => TensorView::from_slice(shape, a.as_slice().expect("contiguous")),
            Held::Bool(a) => TensorView::from_slice(shape, a.as_slice().expect("contiguous")),
        }
    }
}

/// An input as the run reads it: a NumPy array, or a DLPack tensor of another framework.
enum Input<'py> {
    Numpy(Held<'py>, Vec<usize>),
    Dl(dlpack::Borrowed),
}

impl Input<'_> {
    fn place(&self) -> dlpack::Place {
        match self {
            Input::Numpy(..) => dlpack::Place::Host,
            Input::Dl(b) => b.place,
        }
    }

    fn shape(&self) -> &[usize] {
        match self {
            Input::Numpy(_, shape) => shape,
            Input::Dl(b) => &b.shape,
        }
    }

    /// The host view of a host input.
    fn view(&self) -> TensorView<'_> {
        match self {
            Input::Numpy(h, shape) => h.view(shape),
            // SAFETY: the producer's memory lives as long as `b`, and nothing writes it during the run.
            Input::Dl(b) => TensorView::from_bytes(b.dtype, &b.shape, unsafe { b.host_bytes() }),
        }
    }
}

/// Takes input `name`: a NumPy array, or any object with `__dlpack__` (torch, CuPy, JAX tensors).
fn take_input<'py>(py: Python<'py>, model: &tessera_runtime::Model, name: &str, value: &Bound<'py, PyAny>, stream: Option<u64>) -> PyResult<Input<'py>> {
    if value.cast::<PyUntypedArray>().is_ok() {
        let (h, shape) = hold(py, name, value)?;
        return Ok(Input::Numpy(h, shape));
    }
    if dlpack::is_dlpack(value) {
        return Ok(Input::Dl(take_dlpack(py, model, &format!("input '{name}'"), value, stream)?));
    }
    Err(Error::new_err(format!("input '{name}' must be a NumPy array or a DLPack tensor (torch, CuPy, JAX), got {}", value.get_type().name()?)))
}

/// Takes a DLPack tensor (`what` in errors) for a run of `model`. A CUDA tensor must be on the model's GPU
/// (checked before it is taken, so that the refusal is tessera's and names both GPUs); that GPU is made
/// current first, as PyTorch exports a CUDA tensor only while its GPU is the current one.
fn take_dlpack(py: Python<'_>, model: &tessera_runtime::Model, what: &str, value: &Bound<'_, PyAny>, stream: Option<u64>) -> PyResult<dlpack::Borrowed> {
    if let dlpack::Place::Cuda(id) = dlpack::place_of(what, value)? {
        match model.gpu() {
            None => {
                return Err(Error::new_err(format!(
                    "{what} is on GPU {id}, but model '{}' runs on the host: give it host tensors (NumPy arrays, torch: .cpu())",
                    model.name()
                )))
            }
            Some(gpu) if usize::try_from(id).ok() != Some(gpu) => {
                return Err(Error::new_err(format!(
                    "{what} is on GPU {id}, but model '{}' runs on GPU {gpu}: give it tensors on GPU {gpu} (torch: .to('cuda:{gpu}')), or load the model there (tessera.load(path, gpu={id}))",
                    model.name()
                )))
            }
            Some(gpu) => tessera_runtime::make_gpu_current(gpu).map_err(err)?,
        }
    }
    dlpack::borrow(py, what, value, stream)
}

/// Borrows `value` (input `name`) as a contiguous array of a tessera dtype.
fn hold<'py>(py: Python<'py>, name: &str, value: &Bound<'py, PyAny>) -> PyResult<(Held<'py>, Vec<usize>)> {
    let Ok(arr) = value.cast::<PyUntypedArray>() else {
        return Err(Error::new_err(format!("input '{name}' must be a NumPy array, got {}", value.get_type().name()?)));
    };
    let arr = if arr.is_c_contiguous() { arr.clone() } else { py.import("numpy")?.call_method1("ascontiguousarray", (arr,))?.cast_into::<PyUntypedArray>()? };
    let shape = arr.shape().to_vec();
    let dtype = arr.dtype();
    let held = if dtype.is_equiv_to(&numpy::dtype::<f32>(py)) {
        Held::F32(arr.cast::<PyArrayDyn<f32>>()?.readonly())
    } else if dtype.is_equiv_to(&numpy::dtype::<i64>(py)) {
        Held::I64(arr.cast::<PyArrayDyn<i64>>()?.readonly())
    } else if dtype.is_equiv_to(&numpy::dtype::<i32>(py)) {
        Held::I32(arr.cast::<PyArrayDyn<i32>>()?.readonly())
    } else if dtype.is_equiv_to(&numpy::dtype::<bool>(py)) {
        Held::Bool(arr.cast::<PyArrayDyn<bool>>()?.readonly())
    } else {
        return Err(Error::new_err(format!("input '{name}': NumPy dtype {dtype} is not one tessera models take (float32, int64, int32, bool)")));
    };
    Ok((held, shape))
}

/// An output's memory: a vector the run writes and NumPy then owns.
enum OutBuf {
    F32(Vec<f32>),
    /// f16 bits, handed to NumPy as float16.
    F16(Vec<u16>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<u8>),
}

impl OutBuf {
    fn new(d: &TensorInfo) -> PyResult<OutBuf> {
        let n = d.numel();
        Ok(match d.dtype {
            DType::F32 => OutBuf::F32(vec![0.0; n]),
            DType::F16 => OutBuf::F16(vec![0; n]),
            DType::I64 => OutBuf::I64(vec![0; n]),
            DType::I32 => OutBuf::I32(vec![0; n]),
            DType::Bool => OutBuf::Bool(vec![0; n]),
            other => {
                return Err(Error::new_err(format!(
                    "output '{}' is {other}, which NumPy has no type for: give it a tensor to be written into, run(..., out={{'{}': torch.empty(..., dtype=torch.bfloat16)}})",
                    d.name, d.name
                )))
            }
        })
    }

    fn view<'a>(&'a mut self, d: &'a TensorInfo) -> TensorViewMut<'a> {
        match self {
            OutBuf::F32(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::F16(v) => TensorViewMut::from_bytes(DType::F16, &d.shape, bytes_of_mut(v)),
            OutBuf::I64(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::I32(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::Bool(v) => TensorViewMut::from_bytes(DType::Bool, &d.shape, v),
        }
    }

    /// The vector as a NumPy array of shape `shape` (the array takes the vector over: no copy).
    fn into_numpy<'py>(self, py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            OutBuf::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            OutBuf::F16(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any().call_method1("view", ("float16",))?,
            OutBuf::I64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            OutBuf::I32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            // Bytes 0 or 1, viewed as NumPy bools.
            OutBuf::Bool(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any().call_method1("view", ("bool",))?,
        })
    }
}

/// A `u16` vector's bytes.
fn bytes_of_mut(v: &mut [u16]) -> &mut [u8] {
    // SAFETY: u16 has no padding and u8 any alignment; the length covers the same memory.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 2) }
}

#[pymethods]
impl Model {
    /// Loads an artifact from bytes in memory (errors name it `<memory>`); `gpu` as for `load`.
    #[staticmethod]
    #[pyo3(signature = (data, gpu=None))]
    fn from_bytes(py: Python<'_>, data: &[u8], gpu: Option<i64>) -> PyResult<Model> {
        let gpu = gpu_index(gpu)?;
        let inner = py
            .detach(|| match gpu {
                None => tessera_runtime::Model::from_bytes(data),
                Some(g) => tessera_runtime::Model::from_bytes_on_gpu(data, g),
            })
            .map_err(err)?;
        Ok(Model { inner })
    }

    /// The GPU (CUDA device index, as torch's `cuda:N`) a GPU model was loaded on and runs on; `None` for a
    /// host model.
    #[getter]
    fn gpu(&self) -> Option<usize> {
        self.inner.gpu()
    }

    /// The model's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// A batched model's batch sizes, ascending (compiled with `batch=[1, 8]` / `--batch 1,8`): `run` takes any
    /// batch up to the largest, on the smallest plan that fits (inputs zero-padded). `[]` for a model of one plan.
    #[getter]
    fn batch_sizes(&self) -> Vec<usize> {
        self.inner.batch_sizes().to_vec()
    }

    /// `[(name, numpy dtype name, shape), ...]` in model order (a batched model's: its largest plan's).
    #[getter]
    fn inputs(&self) -> Vec<(String, &'static str, Vec<usize>)> {
        describe(self.inner.inputs())
    }

    /// `[(name, numpy dtype name, shape), ...]` in model order.
    #[getter]
    fn outputs(&self) -> Vec<(String, &'static str, Vec<usize>)> {
        describe(self.inner.outputs())
    }

    /// How the artifact was built, as a dict (the JSON the C API gives, parsed: digests as hex), or `None` for
    /// an artifact written before tessera recorded provenance.
    #[getter]
    fn provenance<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(json) = self.inner.provenance_json() else { return Ok(None) };
        Ok(Some(py.import("json")?.call_method1("loads", (json,))?))
    }

    /// Runs the model on `{input name: tensor}` (every input, its exact dtype and shape; a batched model's with
    /// any batch up to its largest plan's, the outputs then of the run's batch): NumPy arrays, or
    /// DLPack tensors (torch, CuPy, JAX) read in place, on the host or, for a GPU model, on its GPU. Returns
    /// `{output name: ndarray}` in model order; with `out={output name: DLPack tensor}`, writes the outputs
    /// into those tensors instead (on the host: every output; on the GPU: the ones named) and returns `out`.
    /// GPU tensors need `out=` on the GPU (tessera allocates no memory for the caller). Without `stream`, the
    /// run synchronizes the device before reading them and returns when the outputs are written; with
    /// `stream` (a CUstream handle: `torch.cuda.current_stream().cuda_stream`), the producers order their
    /// writes before it (DLPack's stream argument), the run is enqueued on it and the call returns at once:
    /// work the caller enqueues on that stream afterwards sees the outputs. GPU tensors must be on the model's
    /// GPU (`gpu`); the run makes that GPU the thread's current CUDA device while it takes them (torch exports a
    /// tensor only from its current device) and runs, and gives the caller back its own current device
    /// afterwards. The GIL is released while the model runs.
    #[pyo3(signature = (inputs, out=None, stream=None))]
    fn run<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyDict>, out: Option<&Bound<'py, PyDict>>, stream: Option<u64>) -> PyResult<Bound<'py, PyDict>> {
        tessera_runtime::keeping_callers_gpu(|| self.run_here(py, inputs, out, stream))
    }

    fn __repr__(&self) -> String {
        let names = |l: &[TensorInfo]| l.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ");
        format!("<tessera.Model '{}': inputs {}; outputs {}>", self.inner.name(), names(self.inner.inputs()), names(self.inner.outputs()))
    }
}

impl Model {
    /// [`Model::run`]'s body, inside `keeping_callers_gpu`.
    fn run_here<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyDict>, out: Option<&Bound<'py, PyDict>>, stream: Option<u64>) -> PyResult<Bound<'py, PyDict>> {
        if stream == Some(0) {
            return Err(Error::new_err("stream=0 is the legacy default stream, which tessera cannot order against: give a stream's handle, or none"));
        }
        let mut held: Vec<(String, Input)> = Vec::with_capacity(inputs.len());
        for (k, v) in inputs.iter() {
            let name: String = k.extract().map_err(|_| Error::new_err(format!("input names must be strings, got {}", k.repr().map(|r| r.to_string()).unwrap_or_default())))?;
            let input = take_input(py, &self.inner, &name, &v, stream)?;
            held.push((name, input));
        }
        let mut outs: Vec<(String, Bound<'py, PyAny>, dlpack::Borrowed)> = Vec::new();
        if let Some(out) = out {
            for (k, v) in out.iter() {
                let name: String = k.extract().map_err(|_| Error::new_err("output names in out= must be strings"))?;
                if !dlpack::is_dlpack(&v) {
                    return Err(Error::new_err(format!("out['{name}'] must be a DLPack tensor (torch, CuPy, JAX, NumPy), got {}", v.get_type().name()?)));
                }
                let b = take_dlpack(py, &self.inner, &format!("out['{name}']"), &v, stream)?;
                outs.push((name, v, b));
            }
        }
        let on_gpu = held.iter().any(|(_, i)| i.place() != dlpack::Place::Host) || outs.iter().any(|(_, _, b)| b.place != dlpack::Place::Host);
        if on_gpu {
            return self.run_on_gpu(py, &held, out, &outs, stream);
        }
        if stream.is_some() {
            return Err(Error::new_err("stream= is for GPU tensors: this run's tensors are on the host"));
        }
        let views: Vec<(&str, TensorView)> = held.iter().map(|(n, i)| (n.as_str(), i.view())).collect();
        let model = &self.inner;
        if let Some(out_dict) = out {
            let mut targets: Vec<(&str, TensorViewMut)> = outs
                .iter()
                // SAFETY: the caller's output tensors, alive as long as `outs`; nothing else uses them during the run.
                .map(|(n, _, b)| (n.as_str(), TensorViewMut::from_bytes(b.dtype, &b.shape, unsafe { b.host_bytes_mut() })))
                .collect();
            py.detach(|| model.run_into(&views, &mut targets)).map_err(err)?;
            return Ok(out_dict.clone());
        }
        // A batched model's outputs have the run's batch: the inputs' leading dimension (the run checks they agree).
        let batch = held.first().and_then(|(_, i)| i.shape().first().copied()).unwrap_or(0);
        let infos = self.inner.outputs_at(batch);
        let infos = &infos;
        let mut bufs = infos.iter().map(OutBuf::new).collect::<PyResult<Vec<_>>>()?;
        {
            let mut outs: Vec<(&str, TensorViewMut)> = infos.iter().zip(bufs.iter_mut()).map(|(d, b)| (d.name.as_str(), b.view(d))).collect();
            py.detach(|| model.run_into(&views, &mut outs)).map_err(err)?;
        }
        let result = PyDict::new(py);
        for (d, b) in infos.iter().zip(bufs) {
            result.set_item(&d.name, b.into_numpy(py, &d.shape)?)?;
        }
        Ok(result)
    }

    /// A run whose tensors are on the GPU: every input and every `out=` tensor there (the model's GPU), none
    /// copied.
    fn run_on_gpu<'py>(
        &self,
        py: Python<'py>,
        held: &[(String, Input)],
        out: Option<&Bound<'py, PyDict>>,
        outs: &[(String, Bound<'py, PyAny>, dlpack::Borrowed)],
        stream: Option<u64>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let side = |p: dlpack::Place| if p == dlpack::Place::Host { "the host" } else { "the GPU" };
        // Every GPU tensor is on the model's GPU (`take_dlpack` refused others).
        let first_gpu = held.iter().map(|(n, i)| (n, i.place())).chain(outs.iter().map(|(n, _, b)| (n, b.place))).find(|(_, p)| *p != dlpack::Place::Host);
        let (gpu_name, _) = first_gpu.expect("called for a run with a GPU tensor");
        for (name, input) in held {
            if input.place() == dlpack::Place::Host {
                return Err(Error::new_err(format!("input '{name}' is on {} but '{gpu_name}' is on the GPU: give every tensor of a run on one side", side(input.place()))));
            }
        }
        let Some(out_dict) = out.filter(|_| !outs.is_empty()) else {
            return Err(Error::new_err("GPU inputs need out= tensors on the GPU to write the outputs into (tessera allocates no device memory for callers)"));
        };
        for (name, _, b) in outs {
            if b.place == dlpack::Place::Host {
                return Err(Error::new_err(format!("out['{name}'] is on the host but '{gpu_name}' is on the GPU: give every tensor of a run on one side")));
            }
        }
        fn dev(b: &dlpack::Borrowed) -> DeviceTensor<'_> {
            DeviceTensor::new(b.dtype, &b.shape, b.address())
        }
        let ins: Vec<(&str, DeviceTensor)> = held
            .iter()
            .map(|(n, i)| match i {
                Input::Dl(b) => (n.as_str(), dev(b)),
                Input::Numpy(..) => unreachable!("NumPy arrays are on the host, refused above"),
            })
            .collect();
        let targets: Vec<(&str, DeviceTensor)> = outs.iter().map(|(n, _, b)| (n.as_str(), dev(b))).collect();
        let model = &self.inner;
        py.detach(|| {
            if let (None, Some(gpu)) = (stream, model.gpu()) {
                // The producers' streams are theirs: wait for all the model's GPU's work before reading.
                tessera_runtime::synchronize_gpu_of(gpu)?;
            }
            // SAFETY: DLPack tensors on the model's GPU (checked above) the caller owns, alive for the call (`held`, `outs`) and, with a
            // stream, kept by the caller until the stream passes the run (the documented contract of `stream=`);
            // the run checks dtypes, shapes and allocation sizes; outputs are the caller's distinct tensors.
            unsafe { model.run_device_on(&ins, &targets, stream) }
        })
        .map_err(err)?;
        Ok(out_dict.clone())
    }
}

/// The `gpu=` argument of `load` and `Model.from_bytes`, refused when negative.
fn gpu_index(gpu: Option<i64>) -> PyResult<Option<usize>> {
    gpu.map(|g| usize::try_from(g).map_err(|_| Error::new_err(format!("gpu={g}: a GPU index (CUDA device index) is 0 or more"))))
        .transpose()
}

/// Reads, checks (format, blake3 digest, every index and bound) and loads the artifact at `path`. A GPU
/// artifact loads on GPU `gpu` (a CUDA device index, as torch's `cuda:N`; default 0), where every run of it
/// executes; a host artifact takes no `gpu` (giving one is an error).
#[pyfunction]
#[pyo3(signature = (path, gpu=None))]
fn load(py: Python<'_>, path: std::path::PathBuf, gpu: Option<i64>) -> PyResult<Model> {
    let gpu = gpu_index(gpu)?;
    let inner = py
        .detach(|| match gpu {
            None => tessera_runtime::Model::load(&path),
            Some(g) => tessera_runtime::Model::load_on_gpu(&path, g),
        })
        .map_err(err)?;
    Ok(Model { inner })
}

#[pymodule]
fn _tessera(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    m.add_function(wrap_pyfunction!(load, m)?)?;
    #[cfg(feature = "compiler")]
    m.add_function(wrap_pyfunction!(compile::compile, m)?)?;
    #[cfg(feature = "compiler")]
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
