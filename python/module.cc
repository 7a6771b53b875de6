// The native part of the causeway Python package (causeway._causeway): the
// client API (causeway/client/client.h) bound once, so Python runs the same
// way on an island in this process and on island servers. The package's
// __init__.py adds what is plain Python (asyncio, context managers).
//
// Every call that may wait (on devices, on a socket, on a budget) releases
// the GIL; a Status error becomes the exception class of its code
// (StatusError below), carrying the status message whole.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "causeway/base/env.h"
#include "causeway/base/trace.h"
#include "causeway/client/client.h"
#include "causeway/client/local_client.h"
#include "causeway/client/remote_client.h"
#include "causeway/kernels/attention_ops.h"
#include "causeway/kernels/nn_ops.h"
#include "causeway/kernels/op_plan.h"
#include "causeway/kernels/ops.h"
#include "causeway/models/text_data.h"
#include "causeway/models/trainer.h"
#include "causeway/models/transformer.h"
#include "causeway/runtime/device_capabilities.h"
#include "causeway/runtime/instance.h"
#include "causeway/runtime/kernel.h"
#include "causeway/scheduler/function.h"
#include "causeway/scheduler/program_def.h"
#include "causeway/transport/auth.h"
#include "tools/program_file.h"

namespace py = pybind11;

namespace causeway::python {
namespace {

// A failed Status on its way to Python.
struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}
template <typename T>
T Take(absl::StatusOr<T> value) {
  Check(value.status());
  return *std::move(value);
}
absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// The exception classes, by status code; made at import (MakeErrors).
struct ErrorClasses {
  py::object base;
  absl::flat_hash_map<absl::StatusCode, py::object> by_code;
  py::object other;
};
ErrorClasses& Errors() {
  static auto* errors = new ErrorClasses;  // lives as long as the interpreter's module
  return *errors;
}

void MakeErrors(py::module_& m) {
  ErrorClasses& e = Errors();
  e.base = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "causeway.Error", "Every error Causeway raises; `code` names its status code.", PyExc_Exception,
      nullptr));
  m.attr("Error") = e.base;
  auto make = [&](const char* name, PyObject* builtin, std::vector<absl::StatusCode> codes) {
    py::tuple bases = py::make_tuple(e.base, py::handle(builtin));
    py::object cls = py::reinterpret_steal<py::object>(
        PyErr_NewException(absl::StrCat("causeway.", name).c_str(), bases.ptr(), nullptr));
    m.attr(name) = cls;
    for (absl::StatusCode code : codes) e.by_code[code] = cls;
    return cls;
  };
  make("InvalidArgumentError", PyExc_ValueError,
       {absl::StatusCode::kInvalidArgument, absl::StatusCode::kOutOfRange});
  make("NotFoundError", PyExc_LookupError, {absl::StatusCode::kNotFound});
  make("DeadlineExceededError", PyExc_TimeoutError, {absl::StatusCode::kDeadlineExceeded});
  make("CancelledError", PyExc_RuntimeError, {absl::StatusCode::kCancelled});
  make("UnavailableError", PyExc_ConnectionError, {absl::StatusCode::kUnavailable});
  make("PermissionDeniedError", PyExc_PermissionError,
       {absl::StatusCode::kPermissionDenied, absl::StatusCode::kUnauthenticated});
  make("ResourceExhaustedError", PyExc_RuntimeError, {absl::StatusCode::kResourceExhausted});
  make("FailedPreconditionError", PyExc_RuntimeError,
       {absl::StatusCode::kFailedPrecondition, absl::StatusCode::kAborted, absl::StatusCode::kAlreadyExists});
  make("UnimplementedError", PyExc_NotImplementedError, {absl::StatusCode::kUnimplemented});
  make("DataLossError", PyExc_RuntimeError, {absl::StatusCode::kDataLoss});
  e.other = make("InternalError", PyExc_RuntimeError, {});

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& error) {
      ErrorClasses& errors = Errors();
      auto it = errors.by_code.find(error.status.code());
      py::object cls = it != errors.by_code.end() ? it->second : errors.other;
      py::object exc = cls(std::string(error.status.message()));
      exc.attr("code") = absl::StatusCodeToString(error.status.code());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

// ---- dtypes and shapes ------------------------------------------------------

// "f32", "f16", "i32", or a numpy dtype (or type) of those.
DType DTypeOf(const py::handle& obj) {
  if (py::isinstance<py::str>(obj)) {
    const std::string name = obj.cast<std::string>();
    if (name == "f32") return DType::kF32;
    if (name == "f16") return DType::kF16;
    if (name == "i32") return DType::kI32;
  }
  py::dtype dt = py::dtype::from_args(py::reinterpret_borrow<py::object>(obj));
  if (dt.kind() == 'f' && dt.itemsize() == 4) return DType::kF32;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return DType::kF16;
  if (dt.kind() == 'i' && dt.itemsize() == 4) return DType::kI32;
  throw StatusError{
      Invalid(absl::StrCat("dtype ", py::str(dt).cast<std::string>(),
                           " is not one of Causeway's: float32 (f32), float16 (f16), int32 (i32)"))};
}

py::dtype NumpyDType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return py::dtype("float32");
    case DType::kF16:
      return py::dtype("float16");
    case DType::kI32:
      return py::dtype("int32");
  }
  return py::dtype("float32");
}

py::tuple ShapeTuple(const Shape& shape) {
  py::tuple t(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t[i] = shape[i];
  return t;
}

// ---- handles ----------------------------------------------------------------

// A client, shared by everything made through it (arrays keep it alive).
struct PyClient {
  std::shared_ptr<client::Client> impl;
};
using ClientPtr = std::shared_ptr<PyClient>;

struct PyMesh {
  ClientPtr client;
  client::Mesh mesh;
};

// An array; given back to its client when the last Python reference goes.
struct PyArray {
  ClientPtr client;
  client::Array array;
  bool released = false;
  PyArray(ClientPtr c, client::Array a) : client(std::move(c)), array(std::move(a)) {}
  PyArray(const PyArray&) = delete;
  PyArray& operator=(const PyArray&) = delete;
  ~PyArray() {
    if (released) return;
    py::gil_scoped_release unlocked;
    // A client that lost the array's island has nothing to give back to.
    (void)client->impl->Release(array);
  }
  void CheckLive() const {
    if (released) throw StatusError{absl::FailedPreconditionError("the array was released")};
  }
};
using ArrayPtr = std::shared_ptr<PyArray>;

struct PyProgram {
  ClientPtr client;
  std::shared_ptr<client::LoadedProgram> program;
};

// A run's completion; the run's outputs are handed out beside it.
struct PyFuture {
  ClientPtr client;
  client::Run run;  // outputs cleared: the Python arrays hold them
};

absl::Time DeadlineFrom(const std::optional<double>& timeout) {
  if (!timeout.has_value()) return absl::InfiniteFuture();
  if (!(*timeout >= 0)) throw StatusError{Invalid("timeout must be a number of seconds >= 0")};
  return absl::Now() + absl::Seconds(*timeout);
}

// ---- the client -------------------------------------------------------------

std::vector<client::Device> Devices(PyClient& c) {
  py::gil_scoped_release unlocked;
  return Take(c.impl->Devices());
}

PyMesh AllocateMesh(const ClientPtr& c, std::vector<int> dims, int island) {
  client::Mesh mesh;
  {
    py::gil_scoped_release unlocked;
    mesh = Take(c->impl->AllocateMesh(island, std::move(dims)));
  }
  return PyMesh{c, std::move(mesh)};
}

// `data` as a row-major numpy array (the bytes the client sends), from
// anything numpy takes as one.
py::array RowMajor(const py::object& data) {
  py::array contiguous = py::array::ensure(data, py::array::c_style);
  if (!contiguous) throw py::error_already_set();
  return contiguous;
}

ArrayPtr Put(const ClientPtr& c, const py::object& data, const PyMesh& mesh,
             const std::optional<Sharding>& sharding) {
  if (mesh.client != c) throw StatusError{Invalid("the mesh belongs to another client")};
  py::array contiguous = RowMajor(data);
  const DType dtype = DTypeOf(contiguous.dtype());
  Shape shape(contiguous.shape(), contiguous.shape() + contiguous.ndim());
  if (shape.empty())
    throw StatusError{Invalid("a Causeway array has at least one dimension; reshape a scalar to (1,)")};
  const void* bytes = contiguous.data();
  const uint64_t size = static_cast<uint64_t>(contiguous.nbytes());
  client::Array array;
  {
    py::gil_scoped_release unlocked;
    array = Take(c->impl->CreateArray(mesh.mesh, shape, dtype, sharding.value_or(Sharding::Replicated())));
    const absl::Status uploaded = c->impl->Upload(array, bytes, size);
    if (!uploaded.ok()) {
      (void)c->impl->Release(array);
      throw StatusError{uploaded};
    }
  }
  return std::make_shared<PyArray>(c, std::move(array));
}

ArrayPtr Empty(const ClientPtr& c, const std::vector<int64_t>& shape, const py::object& dtype,
               const PyMesh& mesh, const std::optional<Sharding>& sharding) {
  if (mesh.client != c) throw StatusError{Invalid("the mesh belongs to another client")};
  const DType dt = DTypeOf(dtype);
  client::Array array;
  {
    py::gil_scoped_release unlocked;
    array = Take(c->impl->CreateArray(mesh.mesh, Shape(shape.begin(), shape.end()), dt,
                                      sharding.value_or(Sharding::Replicated())));
  }
  return std::make_shared<PyArray>(c, std::move(array));
}

py::array ToNumpy(PyArray& a, const std::optional<double>& timeout) {
  a.CheckLive();
  py::array out(NumpyDType(a.array.dtype),
                std::vector<py::ssize_t>(a.array.shape.begin(), a.array.shape.end()));
  void* host = out.mutable_data();
  const uint64_t size = a.array.bytes();
  const absl::Time deadline = DeadlineFrom(timeout);
  {
    py::gil_scoped_release unlocked;
    Check(a.client->impl->Download(a.array, host, size, deadline));
  }
  return out;
}

void Upload(PyArray& a, const py::object& data) {
  a.CheckLive();
  py::array contiguous = RowMajor(data);
  if (DTypeOf(contiguous.dtype()) != a.array.dtype) {
    throw StatusError{Invalid(absl::StrCat("the array holds ", DTypeName(a.array.dtype), ", given ",
                                           py::str(contiguous.dtype()).cast<std::string>()))};
  }
  const Shape shape(contiguous.shape(), contiguous.shape() + contiguous.ndim());
  if (shape != a.array.shape) {
    throw StatusError{Invalid(
        absl::StrCat("the array's shape is ", ShapeString(a.array.shape), ", given ", ShapeString(shape)))};
  }
  const void* bytes = contiguous.data();
  const uint64_t size = static_cast<uint64_t>(contiguous.nbytes());
  py::gil_scoped_release unlocked;
  Check(a.client->impl->Upload(a.array, bytes, size));
}

void ReleaseArray(PyArray& a) {
  a.CheckLive();
  a.released = true;
  py::gil_scoped_release unlocked;
  Check(a.client->impl->Release(a.array));
}

PyProgram Load(const ClientPtr& c, const ProgramDef& def, const std::map<std::string, PyMesh>& meshes) {
  absl::flat_hash_map<std::string, client::Mesh> bound;
  for (const auto& [name, mesh] : meshes) {
    if (mesh.client != c)
      throw StatusError{Invalid(absl::StrCat("mesh '", name, "' belongs to another client"))};
    bound[name] = mesh.mesh;
  }
  py::gil_scoped_release unlocked;
  return PyProgram{c, Take(c->impl->Load(def, bound))};
}

py::tuple Execute(const PyProgram& p, const std::vector<ArrayPtr>& inputs,
                  const std::optional<double>& deadline) {
  std::vector<client::Array> arrays;
  arrays.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i] == nullptr) throw StatusError{Invalid(absl::StrCat("input ", i, " is None"))};
    inputs[i]->CheckLive();
    if (inputs[i]->client != p.client) {
      throw StatusError{Invalid(absl::StrCat("input ", i, " belongs to another client"))};
    }
    arrays.push_back(inputs[i]->array);
  }
  client::ExecuteOptions options;
  if (deadline.has_value()) {
    if (!(*deadline > 0)) throw StatusError{Invalid("deadline must be a number of seconds > 0")};
    options.deadline = absl::Seconds(*deadline);
  }
  client::Run run;
  {
    py::gil_scoped_release unlocked;
    run = Take(p.client->impl->Execute(p.program, arrays, options));
  }
  py::list outputs;
  for (client::Array& out : run.outputs) outputs.append(std::make_shared<PyArray>(p.client, std::move(out)));
  run.outputs.clear();
  return py::make_tuple(outputs, PyFuture{p.client, std::move(run)});
}

// ---- functions and programs -------------------------------------------------

std::vector<TensorSpec> Specs(const std::vector<std::pair<std::vector<int64_t>, py::object>>& specs) {
  std::vector<TensorSpec> out;
  for (const auto& [shape, dtype] : specs) out.push_back({Shape(shape.begin(), shape.end()), DTypeOf(dtype)});
  return out;
}

KernelStep MakeStep(std::shared_ptr<const Kernel> kernel, std::vector<int> args, std::vector<uint32_t> groups,
                    const py::bytes& push_constants, const std::vector<std::pair<uint32_t, uint32_t>>& spec) {
  if (kernel == nullptr) throw StatusError{Invalid("a step needs a kernel")};
  if (groups.empty() || groups.size() > 3) {
    throw StatusError{Invalid(absl::StrCat("groups takes 1 to 3 counts, given ", groups.size()))};
  }
  KernelStep step;
  step.kernel = std::move(kernel);
  step.args = std::move(args);
  for (size_t i = 0; i < groups.size(); ++i) step.groups[i] = groups[i];
  const std::string bytes = push_constants;
  step.push_constants.assign(bytes.begin(), bytes.end());
  step.spec = spec;
  return step;
}

CollectiveDef::Algorithm AlgorithmOf(const std::string& name) {
  if (name == "auto") return CollectiveDef::AUTO;
  if (name == "direct") return CollectiveDef::DIRECT;
  if (name == "ring") return CollectiveDef::RING;
  if (name == "direct_read") return CollectiveDef::DIRECT_READ;
  throw StatusError{
      Invalid(absl::StrCat("algorithm '", name, "' is not one of auto, direct, ring, direct_read"))};
}
CollectiveDef::ReduceOp ReduceOpOf(const std::string& name) {
  if (name == "sum") return CollectiveDef::SUM;
  if (name == "max") return CollectiveDef::MAX;
  throw StatusError{Invalid(absl::StrCat("reduce op '", name, "' is not one of sum, max"))};
}

CollectiveDef Collective(CollectiveDef::Kind kind, std::string mesh, std::string input, std::string output,
                         const std::string& algorithm, std::optional<int> mesh_axis) {
  CollectiveDef c;
  c.set_kind(kind);
  c.set_mesh(std::move(mesh));
  c.set_input(std::move(input));
  c.set_output(std::move(output));
  c.set_algorithm(AlgorithmOf(algorithm));
  if (mesh_axis.has_value()) c.set_mesh_axis(*mesh_axis);
  return c;
}

// The builder's method for a reducing collective of `kind` (all-reduce,
// reduce-scatter).
auto ReduceNode(CollectiveDef::Kind kind) {
  return [kind](ProgramDefBuilder& b, std::string node, std::string mesh, std::string input,
                std::string output, const std::string& op, const std::string& algorithm,
                std::optional<int> mesh_axis) -> ProgramDefBuilder& {
    CollectiveDef c =
        Collective(kind, std::move(mesh), std::move(input), std::move(output), algorithm, mesh_axis);
    c.set_op(ReduceOpOf(op));
    return b.Collective(std::move(node), std::move(c));
  };
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read failed"));
  return text;
}

py::dict ProgramFileInputs(const cli::ProgramFile& file) {
  py::dict inputs;
  for (const InputDef& input : file.def.inputs()) {
    const ParameterDef* parameter = nullptr;
    for (const ParameterDef& p : file.def.program().parameters()) {
      if (p.value() == input.value()) parameter = &p;
    }
    if (parameter == nullptr) continue;  // ReadProgramFile refuses such a file
    const Shape shape(parameter->shape().begin(), parameter->shape().end());
    const DType dtype = Take(FromDef(parameter->dtype()));
    const std::string bytes = Take(cli::InputBytes(input, shape, dtype));
    py::array out(NumpyDType(dtype), std::vector<py::ssize_t>(shape.begin(), shape.end()));
    std::memcpy(out.mutable_data(), bytes.data(), std::min<size_t>(bytes.size(), out.nbytes()));
    inputs[py::str(input.value())] = out;
  }
  return inputs;
}

// (shape, dtype name) of each spec, as custom() takes them.
py::list SpecList(const std::vector<TensorSpec>& specs) {
  py::list out;
  for (const TensorSpec& t : specs) out.append(py::make_tuple(ShapeTuple(t.shape), DTypeName(t.dtype)));
  return out;
}

// ---- devices of this machine ------------------------------------------------

py::list PhysicalDevices() {
  std::shared_ptr<Instance> instance;
  {
    py::gil_scoped_release unlocked;
    instance = Take(Instance::Create(InstanceOptions{}));
  }
  py::list out;
  for (const PhysicalDeviceInfo& d : instance->physical_devices()) {
    const DeviceCapabilities caps = CapabilitiesOf(d);
    py::dict info;
    info["index"] = d.index;
    info["name"] = d.name;
    info["kind"] = std::string(DeviceKindName(caps.kind));
    info["driver"] = d.driver_name;
    info["uuid"] = d.UuidString();
    info["subgroup_size"] = caps.subgroup_size;
    info["max_workgroup_invocations"] = caps.max_workgroup_invocations;
    info["max_storage_buffers"] = caps.max_storage_buffers;
    py::list heaps;
    for (const auto& h : d.heaps) heaps.append(py::make_tuple(h.size, h.device_local));
    info["heaps"] = heaps;
    out.append(info);
  }
  return out;
}

ClientPtr Local(int accelerators, const std::string& device, const std::string& sharing,
                uint64_t memory_budget, const std::string& name) {
  if (accelerators < 1)
    throw StatusError{Invalid(absl::StrCat("accelerators must be >= 1, given ", accelerators))};
  RuntimeOptions options;
  options.accelerators = accelerators;
  options.device = device;
  options.sharing = sharing;
  options.memory_budget = memory_budget;
  py::gil_scoped_release unlocked;
  return std::make_shared<PyClient>(PyClient{Take(client::LocalClient::Create(options, {}, name))});
}

ClientPtr Connect(const std::vector<std::string>& islands, const std::optional<std::string>& secret_file,
                  const std::string& name, double call_timeout) {
  transport::ControllerOptions options;
  options.name = name;
  if (!(call_timeout > 0)) throw StatusError{Invalid("call_timeout must be a number of seconds > 0")};
  options.call_timeout = absl::Seconds(call_timeout);
  py::gil_scoped_release unlocked;
  if (secret_file.has_value()) {
    options.secret = Take(transport::Secret::FromFile(*secret_file));
  } else if (!EnvString(transport::kSecretEnvironmentVariable).empty()) {
    options.secret = Take(transport::Secret::FromEnvironment());
  }
  return std::make_shared<PyClient>(PyClient{Take(client::RemoteClient::Connect(islands, options))});
}

// The kernel library's operations (causeway/kernels/*_ops.h) as plans, and
// FunctionBuilder, which makes a function of them: causeway.ops.
void BindOps(py::module_& m) {
  py::class_<ops::OpPlan>(m, "OpPlan", "One operation of the kernel library, its sizes fixed.")
      .def_readonly("name", &ops::OpPlan::name)
      .def_property_readonly(
          "operands",
          [](const ops::OpPlan& p) {
            std::vector<std::pair<std::string, uint64_t>> out;
            for (const auto& o : p.operands) out.emplace_back(o.name, o.bytes);
            return out;
          },
          "Each operand's name and the bytes it needs, in the order add() binds them.")
      .def("__repr__", [](const ops::OpPlan& p) { return absl::StrCat("OpPlan('", p.name, "')"); });

  py::module_ o = m.def_submodule("ops", "The kernel library's operations, for FunctionBuilder.add.");
  o.def(
      "gemm",
      [](uint32_t m, uint32_t n, uint32_t k, bool transpose_a, bool transpose_b, float alpha, float beta,
         uint32_t batch, const client::Device* device) {
        ops::GemmOptions options;
        options.transpose_a = transpose_a;
        options.transpose_b = transpose_b;
        options.alpha = alpha;
        options.beta = beta;
        options.batch = batch;
        return Take(ops::PlanGemm(m, n, k, options, device == nullptr ? nullptr : &device->capabilities));
      },
      py::arg("m"), py::arg("n"), py::arg("k"), py::arg("transpose_a") = false,
      py::arg("transpose_b") = false, py::arg("alpha") = 1.0f, py::arg("beta") = 0.0f, py::arg("batch") = 1,
      py::arg("device") = py::none(),
      "C = alpha op(A) op(B) + beta C (A: m x k, B: k x n, C: m x n, row-major; `batch` of each back to "
      "back), "
      "planned for `device` (a Device of a client: the fastest path it runs; None: a path any device runs).");
  o.def(
      "bias_gelu", [](uint32_t rows, uint32_t cols) { return Take(ops::PlanBiasGelu(rows, cols)); },
      py::arg("rows"), py::arg("cols"));
  o.def(
      "bias_gelu_backward",
      [](uint32_t rows, uint32_t cols) { return Take(ops::PlanBiasGeluBackward(rows, cols)); },
      py::arg("rows"), py::arg("cols"));
  o.def(
      "layer_norm",
      [](uint32_t rows, uint32_t cols, float eps) { return Take(ops::PlanLayerNorm(rows, cols, eps)); },
      py::arg("rows"), py::arg("cols"), py::arg("eps") = 1e-5f);
  o.def(
      "layer_norm_backward",
      [](uint32_t rows, uint32_t cols) { return Take(ops::PlanLayerNormBackward(rows, cols)); },
      py::arg("rows"), py::arg("cols"));
  o.def(
      "softmax_causal",
      [](uint32_t batch_heads, uint32_t t, float scale) {
        return Take(ops::PlanSoftmaxCausal(batch_heads, t, scale));
      },
      py::arg("batch_heads"), py::arg("t"), py::arg("scale") = 1.0f);
  o.def(
      "softmax_causal_backward",
      [](uint32_t batch_heads, uint32_t t, float scale) {
        return Take(ops::PlanSoftmaxCausalBackward(batch_heads, t, scale));
      },
      py::arg("batch_heads"), py::arg("t"), py::arg("scale") = 1.0f);
  o.def(
      "cross_entropy", [](uint32_t rows, uint32_t vocab) { return Take(ops::PlanCrossEntropy(rows, vocab)); },
      py::arg("rows"), py::arg("vocab"));
  o.def(
      "cross_entropy_backward",
      [](uint32_t rows, uint32_t vocab, std::optional<float> scale) {
        return Take(ops::PlanCrossEntropyBackward(rows, vocab, scale));
      },
      py::arg("rows"), py::arg("vocab"), py::arg("scale") = py::none());
  o.def(
      "embedding",
      [](uint32_t tokens, uint32_t dim, uint32_t vocab, uint32_t seq_len, bool with_positions) {
        return Take(ops::PlanEmbedding(tokens, dim, vocab, seq_len, with_positions));
      },
      py::arg("tokens"), py::arg("dim"), py::arg("vocab"), py::arg("seq_len"),
      py::arg("with_positions") = false);
  o.def(
      "embedding_backward",
      [](uint32_t tokens, uint32_t dim, uint32_t vocab) {
        return Take(ops::PlanEmbeddingBackward(tokens, dim, vocab));
      },
      py::arg("tokens"), py::arg("dim"), py::arg("vocab"));
  o.def(
      "permute0213",
      [](uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return Take(ops::PlanPermute0213(a, b, c, d)); },
      py::arg("a"), py::arg("b"), py::arg("c"), py::arg("d"), "[a, b, c, d] to [a, c, b, d].");
  auto attention = [](uint32_t batch, uint32_t heads, uint32_t seq_len, uint32_t head_dim) {
    AttentionShape shape;
    shape.batch = batch;
    shape.heads = heads;
    shape.seq_len = seq_len;
    shape.head_dim = head_dim;
    return shape;
  };
  o.def(
      "attention",
      [attention](uint32_t batch, uint32_t heads, uint32_t seq_len, uint32_t head_dim,
                  const client::Device* device) {
        return Take(ops::PlanAttentionForward(attention(batch, heads, seq_len, head_dim),
                                              device == nullptr ? nullptr : &device->capabilities));
      },
      py::arg("batch"), py::arg("heads"), py::arg("seq_len"), py::arg("head_dim"),
      py::arg("device") = py::none(),
      "Causal attention, fused, planned for `device` (None: the kernels for GPUs, which any device with "
      "their shared memory runs).");
  o.def(
      "attention_backward",
      [attention](uint32_t batch, uint32_t heads, uint32_t seq_len, uint32_t head_dim,
                  const client::Device* device) {
        return Take(ops::PlanAttentionBackward(attention(batch, heads, seq_len, head_dim),
                                               device == nullptr ? nullptr : &device->capabilities));
      },
      py::arg("batch"), py::arg("heads"), py::arg("seq_len"), py::arg("head_dim"),
      py::arg("device") = py::none());

  o.def(
      "adam_update",
      [](uint32_t count, float lr, float beta1, float beta2, float eps, float weight_decay) {
        ops::AdamConfig config;
        config.lr = lr;
        config.beta1 = beta1;
        config.beta2 = beta2;
        config.eps = eps;
        config.weight_decay = weight_decay;
        return Take(ops::PlanAdamUpdate(count, config));
      },
      py::arg("count"), py::arg("lr") = 1e-3f, py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
      py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.0f,
      "One Adam step out of place: p, g, m, v, step (f32 [1], from 1) to p', m', v'.");

  py::class_<FunctionBuilder>(
      m, "FunctionBuilder",
      "Makes a Function of kernel-library operations: declare buffers, then add operations "
      "that bind them, in the order they run.")
      .def(py::init<std::string>(), py::arg("name"))
      .def(
          "input",
          [](FunctionBuilder& f, const Shape& shape, const py::object& dtype) {
            return f.Input({shape, DTypeOf(dtype)});
          },
          py::arg("shape"), py::arg("dtype") = "f32")
      .def(
          "output",
          [](FunctionBuilder& f, const Shape& shape, const py::object& dtype) {
            return f.Output({shape, DTypeOf(dtype)});
          },
          py::arg("shape"), py::arg("dtype") = "f32")
      .def(
          "scratch",
          [](FunctionBuilder& f, const Shape& shape, const py::object& dtype) {
            return f.Scratch({shape, DTypeOf(dtype)});
          },
          py::arg("shape"), py::arg("dtype") = "f32")
      .def(
          "add",
          [](FunctionBuilder& f, const ops::OpPlan& plan, std::vector<int> buffers) -> FunctionBuilder& {
            return f.Add(plan, std::move(buffers));
          },
          py::arg("plan"), py::arg("buffers"), py::return_value_policy::reference_internal)
      .def("build",
           [](const FunctionBuilder& f) { return std::const_pointer_cast<Function>(Take(f.Build())); });
}

}  // namespace

// The benchmark language model's data, initial weights and C++ trainer
// (causeway/models/): causeway.models, so a Python model can start where the
// C++ one does and be measured against it.
models::TransformerConfig ModelConfig(uint32_t vocab, uint32_t d_model, uint32_t heads, uint32_t d_ff,
                                      uint32_t layers, uint32_t seq_len) {
  models::TransformerConfig c;
  c.vocab = vocab;
  c.d_model = d_model;
  c.heads = heads;
  c.d_ff = d_ff;
  c.layers = layers;
  c.seq_len = seq_len;
  Check(c.Validate());
  return c;
}

// A BatchSampler with the corpus whose tokens it reads.
struct Sampler {
  std::shared_ptr<models::TextCorpus> corpus;
  models::BatchSampler sampler;
};

void BindModels(py::module_& m) {
  py::class_<models::TextCorpus>(m, "TextCorpus",
                                 "A character-level corpus split into train and held-out tokens.")
      .def_static(
          "load",
          [](const std::string& path, double held_out) {
            return Take(models::TextCorpus::Load(path, held_out));
          },
          py::arg("path"), py::arg("held_out") = 0.1)
      .def_property_readonly("vocab_size", [](const models::TextCorpus& c) { return c.vocab().size(); })
      .def_property_readonly("train_tokens", [](const models::TextCorpus& c) { return c.train().size(); });

  py::class_<Sampler>(m, "BatchSampler", "The C++ trainer's batches: the same seed gives the same windows.")
      .def(py::init([](const models::TextCorpus& corpus, uint32_t batch, uint32_t seq_len, uint64_t seed) {
             auto held = std::make_shared<models::TextCorpus>(corpus);
             models::BatchSampler sampler(held->train(), batch, seq_len, seed);
             return Sampler{std::move(held), std::move(sampler)};
           }),
           py::arg("corpus"), py::arg("batch"), py::arg("seq_len"), py::arg("seed"))
      .def(
          "next",
          [](Sampler& s) {
            const models::TokenBatch b = Take(s.sampler.Next());
            py::array_t<int32_t> inputs({b.batch, b.seq_len}), targets({b.batch, b.seq_len});
            std::memcpy(inputs.mutable_data(), b.inputs.data(), b.inputs.size() * sizeof(int32_t));
            std::memcpy(targets.mutable_data(), b.targets.data(), b.targets.size() * sizeof(int32_t));
            return py::make_tuple(inputs, targets);
          },
          "(inputs, targets), int32 [batch, seq_len]: the next batch.");

  m.def(
      "initial_parameters",
      [](uint32_t vocab, uint32_t d_model, uint32_t heads, uint32_t d_ff, uint32_t layers, uint32_t seq_len,
         uint64_t seed) {
        const models::TransformerConfig c = ModelConfig(vocab, d_model, heads, d_ff, layers, seq_len);
        const std::vector<models::ParameterInfo> infos = models::Parameters(c);
        const std::vector<std::vector<float>> values = models::InitialParameters(c, seed);
        py::list out;
        for (size_t i = 0; i < infos.size(); ++i) {
          py::array_t<float> a(std::vector<py::ssize_t>(infos[i].shape.begin(), infos[i].shape.end()));
          std::memcpy(a.mutable_data(), values[i].data(), values[i].size() * sizeof(float));
          out.append(py::make_tuple(infos[i].name, a));
        }
        return out;
      },
      py::arg("vocab"), py::arg("d_model"), py::arg("heads"), py::arg("d_ff"), py::arg("layers"),
      py::arg("seq_len"), py::arg("seed"),
      "(name, numpy array) of every model tensor in the C++ model's order, as it initializes them.");

  py::class_<models::Trainer>(m, "Trainer", "The C++ trainer of the benchmark model, on a client's island.")
      .def(py::init([](const ClientPtr& client, const models::TextCorpus& corpus, uint32_t d_model,
                       uint32_t heads, uint32_t d_ff, uint32_t layers, uint32_t seq_len, uint32_t batch,
                       uint64_t seed, float lr, std::string checkpoint_dir, uint64_t checkpoint_every) {
             models::TrainOptions options;
             options.checkpoint_dir = std::move(checkpoint_dir);
             options.checkpoint_every = checkpoint_every;
             options.config = ModelConfig(static_cast<uint32_t>(corpus.vocab().size()), d_model, heads, d_ff,
                                          layers, seq_len);
             options.layout.batch = batch;
             options.seed = seed;
             options.adam.lr = lr;
             py::gil_scoped_release unlocked;
             return Take(models::Trainer::Create(client->impl.get(), corpus, options));
           }),
           py::arg("client"), py::arg("corpus"), py::arg("d_model"), py::arg("heads"), py::arg("d_ff"),
           py::arg("layers"), py::arg("seq_len"), py::arg("batch"), py::arg("seed") = 1,
           py::arg("lr") = 1e-3f, py::arg("checkpoint_dir") = "", py::arg("checkpoint_every") = 0,
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>())
      .def(
          "train",
          [](models::Trainer& t, uint64_t steps) {
            py::gil_scoped_release unlocked;
            return Take(t.Train(steps));
          },
          py::arg("steps"), "Runs `steps` steps; their mean losses.")
      .def(
          "restore",
          [](models::Trainer& t, const std::string& path) {
            py::gil_scoped_release unlocked;
            models::CheckpointState state = Take(models::ReadCheckpoint(path));
            Check(t.Restore(state));
          },
          py::arg("path"),
          "Continues from the newest checkpoint in directory `path` (or the checkpoint file `path`), "
          "written by any layout.")
      .def(
          "save_checkpoint",
          [](models::Trainer& t) {
            py::gil_scoped_release unlocked;
            Check(t.SaveCheckpoint());
          },
          "Writes a checkpoint of the steps so far into checkpoint_dir now.")
      .def_property_readonly("steps_done", &models::Trainer::steps_done)
      .def_property_readonly("checkpointed_step", &models::Trainer::checkpointed_step);
}

void Bind(py::module_& m) {
  m.doc() = "Causeway's native client API; use the causeway package.";
  MakeErrors(m);

  py::class_<Sharding>(m, "Sharding", "Which array axis is split over which mesh axis, or replicated.")
      .def_readonly("array_axis", &Sharding::array_axis)
      .def_readonly("mesh_axis", &Sharding::mesh_axis)
      .def_property_readonly("replicated", &Sharding::replicated)
      .def("__eq__", [](const Sharding& a, const Sharding& b) { return a == b; })
      .def("__repr__", [](const Sharding& s) { return s.ToString(); });
  m.def("replicated", &Sharding::Replicated, "Every device holds the whole array.");
  m.def("split", &Sharding::Split, py::arg("array_axis"), py::arg("mesh_axis") = 0,
        "The array split along `array_axis` over the mesh's `mesh_axis`.");

  py::class_<client::Device>(m, "Device", "One accelerator of a client's islands.")
      .def_readonly("island", &client::Device::island)
      .def_readonly("index", &client::Device::index)
      .def_readonly("island_name", &client::Device::island_name)
      .def_property_readonly("name", [](const client::Device& d) { return d.capabilities.name; })
      .def_property_readonly("kind",
                             [](const client::Device& d) { return DeviceKindName(d.capabilities.kind); })
      .def_property_readonly("subgroup_size",
                             [](const client::Device& d) { return d.capabilities.subgroup_size; })
      .def_property_readonly("max_workgroup_invocations",
                             [](const client::Device& d) { return d.capabilities.max_workgroup_invocations; })
      .def_property_readonly("max_storage_buffers",
                             [](const client::Device& d) { return d.capabilities.max_storage_buffers; })
      .def_property_readonly("healthy", [](const client::Device& d) { return d.health.ok(); })
      .def_property_readonly(
          "health", [](const client::Device& d) { return d.health.ok() ? "ok" : d.health.ToString(); })
      .def("__repr__", [](const client::Device& d) {
        return absl::StrCat("Device(island ", d.island, " '", d.island_name, "', index ", d.index, ", '",
                            d.capabilities.name, "')");
      });

  py::class_<PyMesh>(m, "Mesh", "A mesh of accelerators on one island.")
      .def_property_readonly("island", [](const PyMesh& mesh) { return mesh.mesh.island; })
      .def_property_readonly("dims", [](const PyMesh& mesh) { return mesh.mesh.dims; })
      .def("__repr__", [](const PyMesh& mesh) {
        return absl::StrCat("Mesh([", absl::StrJoin(mesh.mesh.dims, ", "), "] on island ", mesh.mesh.island,
                            ")");
      });

  py::class_<PyArray, ArrayPtr>(m, "Array", "An array on a mesh; given back when no reference is left.")
      .def_property_readonly("shape", [](const PyArray& a) { return ShapeTuple(a.array.shape); })
      .def_property_readonly("dtype", [](const PyArray& a) { return NumpyDType(a.array.dtype); })
      .def_property_readonly("island", [](const PyArray& a) { return a.array.island; })
      .def_property_readonly("nbytes", [](const PyArray& a) { return a.array.bytes(); })
      .def("numpy", &ToNumpy, py::arg("timeout") = py::none(),
           "The whole array once written, as a new numpy array; waits at most `timeout` seconds.")
      .def("upload", &Upload, py::arg("data"), "Replaces the array's contents (same shape and dtype).")
      .def("release", &ReleaseArray, "Gives the array back now (after the runs that use it).")
      .def("__repr__", [](const PyArray& a) {
        return absl::StrCat("Array(", DTypeName(a.array.dtype), ShapeString(a.array.shape), " on island ",
                            a.array.island, a.released ? ", released" : "", ")");
      });

  py::class_<PyFuture>(m, "Future", "A run's completion.")
      .def(
          "result",
          [](const PyFuture& f, const std::optional<double>& timeout) {
            const absl::Time deadline = DeadlineFrom(timeout);
            absl::Status status;
            {
              py::gil_scoped_release unlocked;
              status = f.run.done.Await(deadline);
            }
            if (!status.ok() && !f.run.done.IsReady() && timeout.has_value()) {
              throw StatusError{absl::DeadlineExceededError(absl::StrCat(
                  "run of program '", f.run.program->name(), "' not finished within ", *timeout, " s"))};
            }
            Check(status);
          },
          py::arg("timeout") = py::none(),
          "Waits for the run: None once it has ended well, else raises its error (TimeoutError after "
          "`timeout` seconds).")
      .def("done", [](const PyFuture& f) { return f.run.done.IsReady(); })
      .def(
          "cancel",
          [](const PyFuture& f) {
            py::gil_scoped_release unlocked;
            Check(f.client->impl->Cancel(f.run));
          },
          "Cancels the run: what is not yet dispatched never is.")
      .def("__repr__", [](const PyFuture& f) {
        return absl::StrCat("Future(run ", f.run.tag, " of '", f.run.program->name(), "', ",
                            f.run.done.IsReady() ? "done" : "running", ")");
      });

  py::class_<PyProgram>(m, "Program", "A program loaded on its islands; call it with its inputs.")
      .def_property_readonly("name", [](const PyProgram& p) { return p.program->name(); })
      .def("__call__", &Execute, py::arg("inputs"), py::arg("deadline") = py::none(),
           "Starts a run on `inputs` (in the program's parameter order) and returns (outputs, future) at "
           "once. "
           "`deadline`: seconds the run may take.")
      .def("__repr__", [](const PyProgram& p) { return absl::StrCat("Program('", p.program->name(), "')"); });

  py::class_<PyClient, ClientPtr>(m, "Client",
                                  "A client of islands, in this process or behind island servers.")
      .def_property_readonly("kind", [](const PyClient& c) { return std::string(c.impl->kind()); })
      .def_property_readonly("island_count", [](const PyClient& c) { return c.impl->island_count(); })
      .def("devices", &Devices, "Every accelerator of every island, with its health now.")
      .def("mesh", &AllocateMesh, py::arg("dims"), py::arg("island") = 0, "Allocates a mesh of accelerators.")
      .def("put", &Put, py::arg("data"), py::arg("mesh"), py::arg("sharding") = py::none(),
           "A new array on `mesh` holding numpy array `data` (float32, float16 or int32).")
      .def("empty", &Empty, py::arg("shape"), py::arg("dtype"), py::arg("mesh"),
           py::arg("sharding") = py::none(), "A new array on `mesh`, unwritten.")
      .def("load", &Load, py::arg("definition"), py::arg("meshes"),
           "Loads a ProgramDef, binding each of its mesh names to a mesh of this client.");

  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel",
                                              "A SPIR-V compute kernel, reflected and validated.")
      .def_static(
          "from_glsl",
          [](const std::string& name, const std::string& source,
             const std::vector<std::pair<std::string, std::string>>& defines) {
            py::gil_scoped_release unlocked;
            return std::const_pointer_cast<Kernel>(Take(Kernel::FromGlsl(name, source, defines)));
          },
          py::arg("name"), py::arg("source"),
          py::arg("defines") = std::vector<std::pair<std::string, std::string>>{})
      .def_static(
          "from_spirv",
          [](const std::string& name, const py::bytes& spirv) {
            const std::string bytes = spirv;
            return std::const_pointer_cast<Kernel>(Take(Kernel::FromSpirvBytes(name, bytes)));
          },
          py::arg("name"), py::arg("spirv"))
      .def_property_readonly("name", &Kernel::name)
      .def("__repr__", [](const Kernel& k) { return absl::StrCat("Kernel('", k.name(), "')"); });

  py::class_<KernelStep>(m, "Step", "One kernel dispatch of a custom function.")
      .def(py::init([](const std::shared_ptr<Kernel>& kernel, std::vector<int> args,
                       std::vector<uint32_t> groups, const py::bytes& push_constants,
                       const std::vector<std::pair<uint32_t, uint32_t>>& spec) {
             return MakeStep(kernel, std::move(args), std::move(groups), push_constants, spec);
           }),
           py::arg("kernel"), py::arg("args"), py::arg("groups"), py::arg("push_constants") = py::bytes(),
           py::arg("spec") = std::vector<std::pair<uint32_t, uint32_t>>{})
      .def_property_readonly("kernel",
                             [](const KernelStep& s) { return std::const_pointer_cast<Kernel>(s.kernel); })
      .def_readonly("args", &KernelStep::args)
      .def_property_readonly(
          "groups",
          [](const KernelStep& s) { return std::vector<uint32_t>(s.groups.begin(), s.groups.end()); })
      .def_property_readonly("push_constants",
                             [](const KernelStep& s) {
                               return py::bytes(reinterpret_cast<const char*>(s.push_constants.data()),
                                                s.push_constants.size());
                             })
      .def_readonly("spec", &KernelStep::spec);

  py::class_<Function, std::shared_ptr<Function>>(m, "Function", "What a gang call runs on each device.")
      .def_property_readonly("name", &Function::name)
      .def_property_readonly("inputs", [](const Function& f) { return SpecList(f.inputs()); })
      .def_property_readonly("outputs", [](const Function& f) { return SpecList(f.outputs()); })
      .def_property_readonly("scratch", [](const Function& f) { return SpecList(f.scratch()); })
      .def_property_readonly("steps", &Function::steps,
                             "Its kernel steps; args index inputs, outputs, then scratch.")
      .def("__repr__", [](const Function& f) { return absl::StrCat("Function('", f.name(), "')"); });
  auto fn = [](absl::StatusOr<std::shared_ptr<const Function>> f) {
    return std::const_pointer_cast<Function>(Take(std::move(f)));
  };
  m.def(
      "elementwise",
      [fn](const std::string& op, const Shape& shape) { return fn(Function::Elementwise(op, shape)); },
      py::arg("op"), py::arg("shape"));
  m.def(
      "scale", [fn](const Shape& shape, float alpha) { return fn(Function::Scale(shape, alpha)); },
      py::arg("shape"), py::arg("alpha"));
  m.def(
      "matmul", [fn](uint32_t m, uint32_t n, uint32_t k) { return fn(Function::Matmul(m, n, k)); },
      py::arg("m"), py::arg("n"), py::arg("k"));
  m.def(
      "custom",
      [fn](std::string name, const std::vector<std::pair<std::vector<int64_t>, py::object>>& inputs,
           const std::vector<std::pair<std::vector<int64_t>, py::object>>& outputs,
           std::vector<KernelStep> steps,
           const std::vector<std::pair<std::vector<int64_t>, py::object>>& scratch) {
        return fn(Function::Create(std::move(name), Specs(inputs), Specs(outputs), Specs(scratch),
                                   std::move(steps)));
      },
      py::arg("name"), py::arg("inputs"), py::arg("outputs"), py::arg("steps"),
      py::arg("scratch") = std::vector<std::pair<std::vector<int64_t>, py::object>>{});

  BindOps(m);
  py::module_ models_module =
      m.def_submodule("models", "The benchmark language model's data and C++ trainer.");
  BindModels(models_module);

  py::class_<ProgramDef>(m, "ProgramDef", "A program as data: meshes by name, parameters, nodes, outputs.")
      .def_static(
          "from_text",
          [](const std::string& text, const std::string& source) {
            return Take(ParseProgramDefText(text, source));
          },
          py::arg("text"), py::arg("source") = "<text>")
      .def_static(
          "from_file",
          [](const std::string& path) {
            const std::string text = Take(ReadFile(path));
            return Take(ParseProgramDefText(text, path));
          },
          py::arg("path"))
      .def_property_readonly("name", [](const ProgramDef& d) { return d.name(); })
      .def_property_readonly("meshes",
                             [](const ProgramDef& d) {
                               py::dict meshes;
                               for (const MeshDef& mesh : d.meshes()) {
                                 meshes[py::str(mesh.name())] =
                                     std::vector<int>(mesh.dims().begin(), mesh.dims().end());
                               }
                               return meshes;
                             })
      .def_property_readonly("parameters",
                             [](const ProgramDef& d) {
                               std::vector<std::string> names;
                               for (const ParameterDef& p : d.parameters()) names.push_back(p.value());
                               return names;
                             })
      .def_property_readonly("outputs",
                             [](const ProgramDef& d) {
                               return std::vector<std::string>(d.outputs().begin(), d.outputs().end());
                             })
      .def("text", &ProgramDefToText)
      .def("__repr__", [](const ProgramDef& d) { return absl::StrCat("ProgramDef('", d.name(), "')"); });

  py::class_<ProgramDefBuilder>(m, "ProgramBuilder", "Builds a ProgramDef node by node.")
      .def(py::init<std::string>(), py::arg("name"))
      .def(
          "mesh",
          [](ProgramDefBuilder& b, std::string name, const std::vector<int>& dims) -> ProgramDefBuilder& {
            return b.Mesh(std::move(name), dims);
          },
          py::arg("name"), py::arg("dims"), py::return_value_policy::reference_internal)
      .def(
          "parameter",
          [](ProgramDefBuilder& b, std::string value, std::string mesh, const Shape& shape,
             const py::object& dtype, const std::optional<Sharding>& sharding) -> ProgramDefBuilder& {
            return b.Parameter(std::move(value), std::move(mesh), shape, DTypeOf(dtype),
                               sharding.value_or(Sharding::Replicated()));
          },
          py::arg("value"), py::arg("mesh"), py::arg("shape"), py::arg("dtype") = "f32",
          py::arg("sharding") = py::none(), py::return_value_policy::reference_internal)
      .def(
          "call",
          [](ProgramDefBuilder& b, std::string node, const std::shared_ptr<Function>& function,
             std::string mesh, const std::vector<std::string>& inputs,
             const std::vector<std::string>& outputs,
             const std::vector<Sharding>& output_shardings) -> ProgramDefBuilder& {
            return b.Call(std::move(node), function, std::move(mesh), inputs, outputs, output_shardings);
          },
          py::arg("node"), py::arg("function"), py::arg("mesh"), py::arg("inputs"), py::arg("outputs"),
          py::arg("output_shardings") = std::vector<Sharding>{}, py::return_value_policy::reference_internal)
      .def("all_reduce", ReduceNode(CollectiveDef::ALL_REDUCE), py::arg("node"), py::arg("mesh"),
           py::arg("input"), py::arg("output"), py::arg("op") = "sum", py::arg("algorithm") = "auto",
           py::arg("mesh_axis") = py::none(), py::return_value_policy::reference_internal)
      .def("reduce_scatter", ReduceNode(CollectiveDef::REDUCE_SCATTER), py::arg("node"), py::arg("mesh"),
           py::arg("input"), py::arg("output"), py::arg("op") = "sum", py::arg("algorithm") = "auto",
           py::arg("mesh_axis") = py::none(), py::return_value_policy::reference_internal)
      .def(
          "all_gather",
          [](ProgramDefBuilder& b, std::string node, std::string mesh, std::string input, std::string output,
             const std::string& algorithm, std::optional<int> mesh_axis) -> ProgramDefBuilder& {
            return b.Collective(std::move(node),
                                Collective(CollectiveDef::ALL_GATHER, std::move(mesh), std::move(input),
                                           std::move(output), algorithm, mesh_axis));
          },
          py::arg("node"), py::arg("mesh"), py::arg("input"), py::arg("output"),
          py::arg("algorithm") = "auto", py::arg("mesh_axis") = py::none(),
          py::return_value_policy::reference_internal)
      .def(
          "broadcast",
          [](ProgramDefBuilder& b, std::string node, std::string mesh, std::string input, std::string output,
             int root, std::optional<int> mesh_axis) -> ProgramDefBuilder& {
            CollectiveDef c = Collective(CollectiveDef::BROADCAST, std::move(mesh), std::move(input),
                                         std::move(output), "auto", mesh_axis);
            c.set_root(root);
            return b.Collective(std::move(node), std::move(c));
          },
          py::arg("node"), py::arg("mesh"), py::arg("input"), py::arg("output"), py::arg("root") = 0,
          py::arg("mesh_axis") = py::none(), py::return_value_policy::reference_internal)
      .def(
          "permute",
          [](ProgramDefBuilder& b, std::string node, std::string mesh, std::string input, std::string output,
             const std::vector<std::pair<int, int>>& pairs,
             std::optional<int> mesh_axis) -> ProgramDefBuilder& {
            CollectiveDef c = Collective(CollectiveDef::PERMUTE, std::move(mesh), std::move(input),
                                         std::move(output), "auto", mesh_axis);
            for (const auto& [from, to] : pairs) {
              CollectiveDef::Pair* p = c.add_pairs();
              p->set_from(from);
              p->set_to(to);
            }
            return b.Collective(std::move(node), std::move(c));
          },
          py::arg("node"), py::arg("mesh"), py::arg("input"), py::arg("output"), py::arg("pairs"),
          py::arg("mesh_axis") = py::none(), py::return_value_policy::reference_internal)
      .def(
          "reshard",
          [](ProgramDefBuilder& b, std::string node, std::string mesh, std::string input, std::string output,
             const Sharding& sharding) -> ProgramDefBuilder& {
            return b.Reshard(std::move(node), std::move(mesh), std::move(input), std::move(output), sharding);
          },
          py::arg("node"), py::arg("mesh"), py::arg("input"), py::arg("output"), py::arg("sharding"),
          py::return_value_policy::reference_internal)
      .def(
          "output",
          [](ProgramDefBuilder& b, std::string value) -> ProgramDefBuilder& {
            return b.Output(std::move(value));
          },
          py::arg("value"), py::return_value_policy::reference_internal)
      .def(
          "build", [](const ProgramDefBuilder& b) { return Take(b.Build()); },
          "The ProgramDef, or the first error met while adding to it (naming the node).");

  py::class_<cli::ProgramFile>(m, "ProgramFile",
                               "A program file: a program with its inputs and expectations.")
      .def_static(
          "read",
          [](const std::string& path) {
            py::gil_scoped_release unlocked;
            return Take(cli::ReadProgramFile(path));
          },
          py::arg("path"))
      .def_property_readonly("definition", [](const cli::ProgramFile& f) { return f.def.program(); })
      .def_property_readonly("accelerators", &cli::ProgramFile::accelerators)
      .def_property_readonly("inputs", &ProgramFileInputs,
                             "Each parameter's input as a numpy array, by parameter name.");

  m.def("local", &Local, py::arg("accelerators") = 1, py::arg("device") = "", py::arg("sharing") = "auto",
        py::arg("memory_budget") = 0, py::arg("name") = "python");
  m.def("connect", &Connect, py::arg("islands"), py::arg("secret_file") = py::none(),
        py::arg("name") = "python", py::arg("call_timeout") = 30.0);
  m.def("physical_devices", &PhysicalDevices);

  py::class_<TraceSession, std::unique_ptr<TraceSession>>(m, "TraceSession")
      .def_static(
          "start", [](std::string path) { return Take(TraceSession::Start(std::move(path))); },
          py::arg("path"))
      .def("finish",
           [](TraceSession& t) {
             py::gil_scoped_release unlocked;
             Check(t.Finish());
           })
      .def_property_readonly("path", &TraceSession::path);
}

}  // namespace causeway::python

PYBIND11_MODULE(_causeway, m) { causeway::python::Bind(m); }
