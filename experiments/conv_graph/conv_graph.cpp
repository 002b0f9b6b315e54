#include "conv_graph.h"

#include <cudnn.h>

#include <array>
#include <map>
#include <utility>

namespace ltrain::kernels {

namespace {

// The graph's tensors, by the unique ids the variant pack names them with.
enum TensorId : int64_t {
  kX = 1, kWeight, kY, kGradY, kGradX, kGradWeight, kScale, kBias, kSum, kSquareSum,
  kScaled = 101, kShifted, kActivated,  // the prologue's virtual tensors
};

/// One pass's convolution operation: its descriptor type and the attributes naming its three tensors
/// (in the order the pass's graph passes them), its convolution descriptor and its alpha and beta.
struct ConvolutionOperation {
  cudnnBackendDescriptorType_t type;
  std::array<cudnnBackendAttributeName_t, 3> tensors;
  cudnnBackendAttributeName_t convolution, alpha, beta;
  const char* name;  // for the step that failed
};

// forward: x, w, y; data gradient: w, dy, dx; weight gradient: x, dy, dw.
constexpr ConvolutionOperation kForwardOperation = {
    CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
    {CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
     CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y},
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, "forward op"};
constexpr ConvolutionOperation kDataGradientOperation = {
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX},
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, "data op"};
constexpr ConvolutionOperation kWeightGradientOperation = {
    CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
    {CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
     CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW},
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
    CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA, "filter op"};

/// Owns every backend descriptor one graph is made of: the plan may refer to any of them.
class Descriptors {
 public:
  Descriptors() = default;
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;
  ~Descriptors() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  /// A new descriptor of `type`, or null (status in *status).
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, cudnnStatus_t* status) {
    cudnnBackendDescriptor_t descriptor = nullptr;
    *status = cudnnBackendCreateDescriptor(type, &descriptor);
    if (*status != CUDNN_STATUS_SUCCESS) return nullptr;
    owned_.push_back(descriptor);
    return descriptor;
  }
 private:
  std::vector<cudnnBackendDescriptor_t> owned_;
};

/// Builds descriptors, remembering the first failure: every later call does nothing, so a graph
/// reads as a list of steps with one check at the end.
class Builder {
 public:
  explicit Builder(Descriptors& descriptors) : descriptors_(descriptors) {}

  bool ok() const { return status_ == CUDNN_STATUS_SUCCESS; }
  cudnnStatus_t status() const { return status_; }
  const std::string& failed_step() const { return failed_step_; }

  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char* step) {
    if (!ok()) return nullptr;
    cudnnStatus_t status = CUDNN_STATUS_SUCCESS;
    cudnnBackendDescriptor_t descriptor = descriptors_.make(type, &status);
    record(status, step);
    return descriptor;
  }
  template <typename T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const T* values, const char* step) {
    if (ok()) record(cudnnBackendSetAttribute(d, name, type, count, values), step);
  }
  void set_descriptor(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t value,
                      const char* step) {
    set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, step);
  }
  void finalize(cudnnBackendDescriptor_t d, const char* step) {
    if (ok()) record(cudnnBackendFinalize(d), step);
  }

  /// A finalized tensor descriptor: NHWC strides for 4-D dims in NCHW order.
  cudnnBackendDescriptor_t tensor(int64_t id, cudnnDataType_t type, const std::array<int64_t, 4>& dims,
                                  bool is_virtual) {
    const std::array<int64_t, 4> strides = {dims[1] * dims[2] * dims[3], 1, dims[3] * dims[1], dims[1]};
    const int64_t alignment = 16;
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, "tensor type");
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), "tensor dims");
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), "tensor strides");
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &id, "tensor id");
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment, "tensor alignment");
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    finalize(t, "tensor");
    return t;
  }

  /// A finalized convolution operation of `o` on its three tensors, alpha 1 and beta 0.
  cudnnBackendDescriptor_t convolution(const ConvolutionOperation& o,
                                       const std::array<cudnnBackendDescriptor_t, 3>& tensors,
                                       cudnnBackendDescriptor_t conv) {
    const float alpha = 1.0f, beta = 0.0f;
    cudnnBackendDescriptor_t op = make(o.type, o.name);
    for (size_t i = 0; i < tensors.size(); ++i) set_descriptor(op, o.tensors[i], tensors[i], o.name);
    set_descriptor(op, o.convolution, conv, o.name);
    set(op, o.alpha, CUDNN_TYPE_FLOAT, 1, &alpha, o.name);
    set(op, o.beta, CUDNN_TYPE_FLOAT, 1, &beta, o.name);
    finalize(op, o.name);
    return op;
  }

  /// y = x <mode> b (b may be null for one-input modes), computed in float32.
  cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t operator_ = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(operator_, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(operator_, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision, "pointwise precision");
    finalize(operator_, "pointwise");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, operator_, "pointwise op");
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise x");
    if (b != nullptr) set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, "pointwise b");
    set_descriptor(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise y");
    finalize(op, "pointwise op");
    return op;
  }

 private:
  void record(cudnnStatus_t status, const char* step) {
    if (status != CUDNN_STATUS_SUCCESS && ok()) {
      status_ = status;
      failed_step_ = step;
    }
  }
  Descriptors& descriptors_;
  cudnnStatus_t status_ = CUDNN_STATUS_SUCCESS;
  std::string failed_step_;
};

/// This thread's cuDNN handle for `device`, made on first use. Never destroyed: at exit the CUDA
/// context may be gone before a thread's destructors run, and cudnnDestroy would then touch it.
cudnnHandle_t handle_for(int device, std::string* error) {
  thread_local std::map<int, cudnnHandle_t> handles;
  auto found = handles.find(device);
  if (found != handles.end()) return found->second;
  int current = 0;
  cudaGetDevice(&current);
  cudaSetDevice(device);
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  cudaSetDevice(current);
  if (status != CUDNN_STATUS_SUCCESS) {
    *error = std::string("cudnnCreate: ") + cudnnGetErrorString(status);
    return nullptr;
  }
  handles[device] = handle;
  return handle;
}

cudnnDataType_t cudnn_type(ElementType type) {
  switch (type) {
    case ElementType::float16: return CUDNN_DATA_HALF;
    case ElementType::bfloat16: return CUDNN_DATA_BFLOAT16;
    case ElementType::float32: break;
  }
  return CUDNN_DATA_FLOAT;
}

/// The operation graph of one pass with its fusion, finalized; null where cuDNN refuses it.
/// Where the prologue's types are free, what cuDNN's engines take: the scale and bias, and the
/// activation the convolution reads (a virtual tensor: only registers).
struct PrologueTypes {
  ElementType scale_bias = ElementType::float32;
  ElementType activation = ElementType::float32;
};

cudnnBackendDescriptor_t build_operation_graph(Builder& b, cudnnHandle_t handle, ElementType type,
                                               PrologueTypes prologue, ConvPass pass, const ConvShape& s,
                                               const ConvFusion& fusion) {
  const cudnnDataType_t element = cudnn_type(type);
  const std::array<int64_t, 4> x_dims = {s.batch, s.in_channels, s.height, s.width};
  const std::array<int64_t, 4> y_dims = {s.batch, s.out_channels, s.out_height(), s.out_width()};
  const std::array<int64_t, 4> w_dims = {s.out_channels, s.in_channels, s.kernel, s.kernel};
  const std::array<int64_t, 4> in_channel_dims = {1, s.in_channels, 1, 1};
  const std::array<int64_t, 4> out_channel_dims = {1, s.out_channels, 1, 1};
  std::vector<cudnnBackendDescriptor_t> ops;

  // The convolution's input: x itself, or relu(x * scale + bias) in float32 registers.
  cudnnBackendDescriptor_t conv_input = nullptr;
  if (pass != ConvPass::backward_data) {
    cudnnBackendDescriptor_t x = b.tensor(kX, element, x_dims, false);
    conv_input = x;
    if (fusion.input_scale_bias_relu) {
      const cudnnDataType_t parameter = cudnn_type(prologue.scale_bias);
      cudnnBackendDescriptor_t scale = b.tensor(kScale, parameter, in_channel_dims, false);
      cudnnBackendDescriptor_t bias = b.tensor(kBias, parameter, in_channel_dims, false);
      cudnnBackendDescriptor_t scaled = b.tensor(kScaled, CUDNN_DATA_FLOAT, x_dims, true);
      cudnnBackendDescriptor_t shifted = b.tensor(kShifted, CUDNN_DATA_FLOAT, x_dims, true);
      cudnnBackendDescriptor_t activated = b.tensor(kActivated, cudnn_type(prologue.activation), x_dims, true);
      ops.push_back(b.pointwise(CUDNN_POINTWISE_MUL, x, scale, scaled));
      ops.push_back(b.pointwise(CUDNN_POINTWISE_ADD, scaled, bias, shifted));
      ops.push_back(b.pointwise(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, activated));
      conv_input = activated;
    }
  }

  const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  const int64_t spatial_dims = 2;
  const std::array<int64_t, 2> strides = {s.stride, s.stride}, paddings = {s.padding, s.padding}, dilations = {1, 1};
  cudnnBackendDescriptor_t conv = b.make(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR, "convolution");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute, "convolution type");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode, "convolution mode");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial_dims, "convolution dims");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, strides.data(), "convolution strides");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, paddings.data(), "convolution padding");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, paddings.data(), "convolution padding");
  b.set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilations.data(), "convolution dilations");
  b.finalize(conv, "convolution");

  cudnnBackendDescriptor_t y = nullptr;  // the forward's output, which the statistics read
  if (pass == ConvPass::forward) {
    y = b.tensor(kY, element, y_dims, false);
    ops.push_back(b.convolution(kForwardOperation, {conv_input, b.tensor(kWeight, element, w_dims, false), y}, conv));
  } else if (pass == ConvPass::backward_data) {
    ops.push_back(b.convolution(kDataGradientOperation,
                                {b.tensor(kWeight, element, w_dims, false), b.tensor(kGradY, element, y_dims, false),
                                 b.tensor(kGradX, element, x_dims, false)},
                                conv));
  } else {
    ops.push_back(b.convolution(kWeightGradientOperation,
                                {conv_input, b.tensor(kGradY, element, y_dims, false),
                                 b.tensor(kGradWeight, element, w_dims, false)},
                                conv));
  }
  if (pass == ConvPass::forward && fusion.output_statistics) {
    const cudnnGenStatsMode_t stats_mode = CUDNN_GENSTATS_SUM_SQSUM;
    cudnnBackendDescriptor_t sum = b.tensor(kSum, CUDNN_DATA_FLOAT, out_channel_dims, false);
    cudnnBackendDescriptor_t square_sum = b.tensor(kSquareSum, CUDNN_DATA_FLOAT, out_channel_dims, false);
    cudnnBackendDescriptor_t stats = b.make(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, "statistics op");
    b.set(stats, CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &stats_mode, "statistics mode");
    b.set(stats, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &compute, "statistics type");
    b.set_descriptor(stats, CUDNN_ATTR_OPERATION_GENSTATS_XDESC, y, "statistics x");
    b.set_descriptor(stats, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, sum, "statistics sum");
    b.set_descriptor(stats, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, square_sum, "statistics square sum");
    b.finalize(stats, "statistics op");
    ops.push_back(stats);
  }

  cudnnBackendDescriptor_t graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
        ops.data(), "operation graph ops");
  // cuDNN 9 deprecates naming the handle here (a device-properties descriptor replaces it) but
  // still honours it; every cuDNN 9 release takes it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  b.set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, "operation graph handle");
#pragma GCC diagnostic pop
  b.finalize(graph, "operation graph");
  return b.ok() ? graph : nullptr;
}

/// The engine configurations cuDNN's heuristics of `mode` offer, best first.
std::vector<cudnnBackendDescriptor_t> heuristic_configs(Builder& b, cudnnBackendDescriptor_t graph,
                                                        cudnnBackendHeurMode_t mode) {
  cudnnBackendDescriptor_t heuristics = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
  b.set_descriptor(heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
  b.set(heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
  b.finalize(heuristics, "heuristics");
  if (!b.ok()) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS)
    return {};
  std::vector<cudnnBackendDescriptor_t> configs;
  for (int64_t i = 0; i < count; ++i) configs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "config"));
  if (!b.ok() || count == 0) return {};
  int64_t returned = 0;
  if (cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &returned, configs.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  configs.resize(static_cast<size_t>(returned));
  return configs;
}

/// "engine 12, compiled at run time".
std::string describe_engine(cudnnBackendDescriptor_t config) {
  cudnnBackendDescriptor_t engine = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &engine) != CUDNN_STATUS_SUCCESS) return "engine ?";
  std::string text = "engine ?";
  int64_t count = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                               &engine) == CUDNN_STATUS_SUCCESS) {
    int64_t index = -1;
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &count, &index) ==
        CUDNN_STATUS_SUCCESS)
      text = "engine " + std::to_string(index);
    std::array<cudnnBackendBehaviorNote_t, CUDNN_BEHAVIOR_NOTE_TYPE_COUNT> notes{};
    int64_t note_count = 0;
    if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                                 static_cast<int64_t>(notes.size()), &note_count, notes.data()) == CUDNN_STATUS_SUCCESS)
      for (int64_t i = 0; i < note_count; ++i)
        if (notes[static_cast<size_t>(i)] == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) text += ", compiled at run time";
  }
  cudnnBackendDestroyDescriptor(engine);
  return text;
}

}  // namespace

std::unique_ptr<ConvGraph> ConvGraph::make_plan(void* handle_pointer, void* config_pointer) {
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_pointer);
  cudnnBackendDescriptor_t config = config_pointer;
  cudnnBackendDescriptor_t plan = nullptr;
  if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS)
    return nullptr;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  cudnnStatus_t status = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
#pragma GCC diagnostic pop
  if (status == CUDNN_STATUS_SUCCESS)
    status = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                      &config);
  // Finalizing is where an engine says whether it takes the graph (and compiles, if it does so).
  if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(plan);
  int64_t workspace = 0, count = 0;
  if (status == CUDNN_STATUS_SUCCESS)
    status = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count,
                                      &workspace);
  if (status != CUDNN_STATUS_SUCCESS) {
    cudnnBackendDestroyDescriptor(plan);
    return nullptr;
  }
  std::unique_ptr<ConvGraph> made(new ConvGraph());
  made->plan_ = plan;
  made->workspace_bytes_ = workspace;
  made->engine_ = describe_engine(config);
  return made;
}

ConvGraph::~ConvGraph() {
  if (plan_ != nullptr) cudnnBackendDestroyDescriptor(plan_);
}

std::vector<std::unique_ptr<ConvGraph>> ConvGraph::candidates(ElementType type, ConvPass pass, const ConvShape& shape,
                                                              const ConvFusion& fusion, int limit,
                                                              std::string* why_not) {
  std::vector<std::unique_ptr<ConvGraph>> plans;
  int device = 0;
  cudaGetDevice(&device);
  std::string handle_error;
  cudnnHandle_t handle = handle_for(device, &handle_error);
  if (handle == nullptr) {
    if (why_not != nullptr) *why_not = handle_error;
    return plans;
  }
  std::string reason = "no engine of cuDNN's heuristics takes " + describe(pass, fusion);
  // Float32 scale and bias keep the BatchNorm's shift exact and float32 activations its rounding
  // to one; some engines take only the tensors' type.
  std::vector<PrologueTypes> prologue_types = {{ElementType::float32, ElementType::float32}};
  if (fusion.input_scale_bias_relu && type != ElementType::float32)
    prologue_types.insert(prologue_types.end(),
                          {{ElementType::float32, type}, {type, ElementType::float32}, {type, type}});
  for (PrologueTypes prologue : prologue_types) {
    // Shared by the plans made from this graph: a plan may refer to the descriptors it was made of.
    auto descriptors = std::make_shared<Descriptors>();
    Builder b(*descriptors);
    cudnnBackendDescriptor_t graph = build_operation_graph(b, handle, type, prologue, pass, shape, fusion);
    if (graph == nullptr) {
      reason = "cuDNN refused the " + describe(pass, fusion) + " graph at " + b.failed_step() + ": " +
               cudnnGetErrorString(b.status());
      continue;
    }
    // Mode B where mode A offers nothing that finalizes, the fallback list where neither does.
    int made = 0;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}) {
      Builder query(*descriptors);  // a mode that fails leaves the next one to try
      for (cudnnBackendDescriptor_t config : heuristic_configs(query, graph, mode)) {
        if (made >= limit) break;
        std::unique_ptr<ConvGraph> plan = make_plan(handle, config);
        if (plan == nullptr) continue;
        plan->descriptors_ = descriptors;
        plan->device_ = device;
        plan->scale_bias_type_ = prologue.scale_bias;
        plan->pass_ = pass;
        plan->fusion_ = fusion;
        plans.push_back(std::move(plan));
        ++made;
      }
      if (made > 0) break;
    }
  }
  if (plans.empty() && why_not != nullptr) *why_not = reason;
  return plans;
}

std::string ConvGraph::run(const ConvBuffers& buffers, void* workspace, cudaStream_t stream) const {
  std::string error;
  cudnnHandle_t handle = handle_for(device_, &error);
  if (handle == nullptr) return error;
  cudnnStatus_t status = cudnnSetStream(handle, stream);
  if (status != CUDNN_STATUS_SUCCESS) return std::string("cudnnSetStream: ") + cudnnGetErrorString(status);
  std::vector<int64_t> ids;
  std::vector<void*> pointers;
  auto add = [&](TensorId id, const void* pointer) {
    ids.push_back(id);
    pointers.push_back(const_cast<void*>(pointer));
  };
  switch (pass_) {
    case ConvPass::forward:
      add(kX, buffers.x);
      add(kWeight, buffers.weight);
      add(kY, buffers.y);
      break;
    case ConvPass::backward_data:
      add(kWeight, buffers.weight);
      add(kGradY, buffers.grad_y);
      add(kGradX, buffers.grad_x);
      break;
    case ConvPass::backward_filter:
      add(kX, buffers.x);
      add(kGradY, buffers.grad_y);
      add(kGradWeight, buffers.grad_weight);
      break;
  }
  if (fusion_.input_scale_bias_relu) {
    add(kScale, buffers.scale);
    add(kBias, buffers.bias);
  }
  if (fusion_.output_statistics) {
    add(kSum, buffers.sum);
    add(kSquareSum, buffers.square_sum);
  }
  cudnnBackendDescriptor_t pack = nullptr;
  status = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (status != CUDNN_STATUS_SUCCESS) return std::string("variant pack: ") + cudnnGetErrorString(status);
  const auto count = static_cast<int64_t>(ids.size());
  status = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, count, ids.data());
  if (status == CUDNN_STATUS_SUCCESS)
    status = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, count,
                                      pointers.data());
  if (status == CUDNN_STATUS_SUCCESS)
    status = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendFinalize(pack);
  if (status == CUDNN_STATUS_SUCCESS) status = cudnnBackendExecute(handle, plan_, pack);
  cudnnBackendDestroyDescriptor(pack);
  if (status != CUDNN_STATUS_SUCCESS) return std::string("cudnnBackendExecute: ") + cudnnGetErrorString(status);
  return "";
}

std::string describe(ConvPass pass, const ConvFusion& fusion) {
  std::string text = pass == ConvPass::forward         ? "forward convolution"
                     : pass == ConvPass::backward_data ? "data-gradient convolution"
                                                       : "weight-gradient convolution";
  if (fusion.input_scale_bias_relu) text += " with a scale-bias-ReLU prologue";
  if (fusion.output_statistics) text += (fusion.input_scale_bias_relu ? " and" : " with") + std::string(" statistics");
  return text;
}

}  // namespace ltrain::kernels
