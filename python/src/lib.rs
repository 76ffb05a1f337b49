//! `tessera._tessera`: the Python API of `tessera-runtime` (the `tessera` package re-exports it).
//!
//! `load(path)` gives a [`Model`]; `model.run({name: ndarray})` returns `{name: ndarray}`. Inputs are
//! borrowed from C-contiguous arrays in place (others are made contiguous first, one copy); outputs are
//! allocated as Rust vectors, written by the run, and handed to NumPy as the arrays' own memory (no copy
//! after the run). The GIL is released while the model loads and runs. Dict order is the caller's; nothing
//! is hashed. With the `compiler` feature (default), `compile(...)` runs the compiler (compile.rs) and
//! `cli_main(argv)` the `tessera` command line (cli.rs), the wheel's `tessera` command.

#[cfg(feature = "compiler")]
mod cli;
#[cfg(feature = "compiler")]
mod compile;

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tessera_runtime::{DType, TensorInfo, TensorView, TensorViewMut};

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
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<u8>),
}

impl OutBuf {
    fn new(d: &TensorInfo) -> PyResult<OutBuf> {
        let n = d.numel();
        Ok(match d.dtype {
            DType::F32 => OutBuf::F32(vec![0.0; n]),
            DType::I64 => OutBuf::I64(vec![0; n]),
            DType::I32 => OutBuf::I32(vec![0; n]),
            DType::Bool => OutBuf::Bool(vec![0; n]),
            other => return Err(Error::new_err(format!("output '{}' is {other}, which the Python API does not return yet", d.name))),
        })
    }

    fn view<'a>(&'a mut self, d: &'a TensorInfo) -> TensorViewMut<'a> {
        match self {
            OutBuf::F32(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::I64(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::I32(v) => TensorViewMut::from_slice(&d.shape, v),
            OutBuf::Bool(v) => TensorViewMut::from_bytes(DType::Bool, &d.shape, v),
        }
    }

    /// The vector as a NumPy array of shape `shape` (the array takes the vector over: no copy).
    fn into_numpy<'py>(self, py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            OutBuf::F32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            OutBuf::I64(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            OutBuf::I32(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            // Bytes 0 or 1, viewed as NumPy bools.
            OutBuf::Bool(v) => PyArray1::from_vec(py, v).reshape(shape)?.into_any().call_method1("view", ("bool",))?,
        })
    }
}

#[pymethods]
impl Model {
    /// Loads an artifact from bytes in memory (errors name it `<memory>`).
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<Model> {
        let inner = py.detach(|| tessera_runtime::Model::from_bytes(data)).map_err(err)?;
        Ok(Model { inner })
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

    /// Runs the model on `{input name: ndarray}` (every input, its exact dtype and shape; a batched model's
    /// with any batch up to its largest plan's) and returns `{output name: ndarray}` in model order (of the
    /// run's batch). The GIL is released while the model runs.
    fn run<'py>(&self, py: Python<'py>, inputs: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyDict>> {
        let mut held = Vec::with_capacity(inputs.len());
        for (k, v) in inputs.iter() {
            let name: String = k.extract().map_err(|_| Error::new_err(format!("input names must be strings, got {}", k.repr().map(|r| r.to_string()).unwrap_or_default())))?;
            let (h, shape) = hold(py, &name, &v)?;
            held.push((name, h, shape));
        }
        let views: Vec<(&str, TensorView)> = held.iter().map(|(n, h, s)| (n.as_str(), h.view(s))).collect();
        // A batched model's outputs have the run's batch: the inputs' leading dimension (the run checks they agree).
        let batch = held.first().and_then(|(_, _, s)| s.first().copied()).unwrap_or(0);
        let infos = self.inner.outputs_at(batch);
        let infos = &infos;
        let mut bufs = infos.iter().map(OutBuf::new).collect::<PyResult<Vec<_>>>()?;
        {
            let mut outs: Vec<(&str, TensorViewMut)> = infos.iter().zip(bufs.iter_mut()).map(|(d, b)| (d.name.as_str(), b.view(d))).collect();
            let model = &self.inner;
            py.detach(|| model.run_into(&views, &mut outs)).map_err(err)?;
        }
        let result = PyDict::new(py);
        for (d, b) in infos.iter().zip(bufs) {
            result.set_item(&d.name, b.into_numpy(py, &d.shape)?)?;
        }
        Ok(result)
    }

    fn __repr__(&self) -> String {
        let names = |l: &[TensorInfo]| l.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ");
        format!("<tessera.Model '{}': inputs {}; outputs {}>", self.inner.name(), names(self.inner.inputs()), names(self.inner.outputs()))
    }
}

/// Reads, checks (format, blake3 digest, every index and bound) and loads the artifact at `path`.
#[pyfunction]
fn load(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Model> {
    let inner = py.detach(|| tessera_runtime::Model::load(&path)).map_err(err)?;
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
