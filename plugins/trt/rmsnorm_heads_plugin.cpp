#include "rmsnorm_heads_plugin.h"

#include <cstdio>
#include <new>

namespace trtspec {
namespace trt {

using namespace nvinfer1;

namespace {
constexpr int32_t kInHidden = 0;
constexpr int32_t kInWeights = 1;

// hidden [..., H] and weights [K, H] of one activation type; extents < 0 (dynamic) are checked later.
bool checkInputs(Dims const& x, DataType xType, Dims const& w, DataType wType) noexcept {
    char msg[256];
    if (x.nbDims < 1 || x.nbDims >= Dims::MAX_DIMS || w.nbDims != 2) {
        std::snprintf(msg, sizeof(msg), "hidden must have rank 1..7 and weights must be [K, H]; got ranks %d and %d",
                      x.nbDims, w.nbDims);
    } else if (!isActivationType(xType) || wType != xType) {
        std::snprintf(msg, sizeof(msg), "hidden and weights must share one type: float32, float16 or bfloat16");
    } else if (x.d[x.nbDims - 1] >= 0 && w.d[1] >= 0 && x.d[x.nbDims - 1] != w.d[1]) {
        std::snprintf(msg, sizeof(msg), "hidden size of the input (%lld) and of the weights (%lld) differ",
                      static_cast<long long>(x.d[x.nbDims - 1]), static_cast<long long>(w.d[1]));
    } else if (x.d[x.nbDims - 1] == 0) {
        std::snprintf(msg, sizeof(msg), "hidden size must be at least 1");
    } else {
        return true;
    }
    reportError(kRmsNormHeadsName, msg);
    return false;
}
}  // namespace

RmsNormHeadsPlugin::RmsNormHeadsPlugin(float eps, int32_t layout) noexcept : mEps(eps), mLayout(layout) {}

RmsNormHeadsPlugin::RmsNormHeadsPlugin(RmsNormHeadsPlugin const& other) noexcept
    : IPluginV3(), IPluginV3OneCore(), IPluginV3OneBuild(), IPluginV3OneRuntime(), mEps(other.mEps),
      mLayout(other.mLayout) {}

IPluginCapability* RmsNormHeadsPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept {
    switch (type) {
        case PluginCapabilityType::kCORE:
            return static_cast<IPluginV3OneCore*>(this);
        case PluginCapabilityType::kBUILD:
            return static_cast<IPluginV3OneBuild*>(this);
        case PluginCapabilityType::kRUNTIME:
            return static_cast<IPluginV3OneRuntime*>(this);
    }
    return nullptr;
}

IPluginV3* RmsNormHeadsPlugin::clone() noexcept { return new (std::nothrow) RmsNormHeadsPlugin(*this); }

char const* RmsNormHeadsPlugin::getPluginName() const noexcept { return kRmsNormHeadsName; }
char const* RmsNormHeadsPlugin::getPluginVersion() const noexcept { return kPluginVersion; }
char const* RmsNormHeadsPlugin::getPluginNamespace() const noexcept { return kPluginNamespace; }

int32_t RmsNormHeadsPlugin::getNbOutputs() const noexcept { return 1; }

int32_t RmsNormHeadsPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                               DataType const* inputTypes, int32_t nbInputs) const noexcept {
    if (nbInputs != 2 || nbOutputs != 1) return -1;
    outputTypes[0] = inputTypes[kInHidden];
    return 0;
}

int32_t RmsNormHeadsPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
                                            DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                            DimsExprs* outputs, int32_t nbOutputs,
                                            IExprBuilder& /*exprBuilder*/) noexcept {
    if (nbInputs != 2 || nbOutputs != 1) return -1;
    DimsExprs const& x = inputs[kInHidden];
    DimsExprs const& w = inputs[kInWeights];
    if (x.nbDims < 1 || x.nbDims >= Dims::MAX_DIMS || w.nbDims != 2) {
        reportError(kRmsNormHeadsName, "hidden must have rank 1..7 and weights must be [K, H]");
        return -1;
    }
    DimsExprs& out = outputs[0];
    out.nbDims = x.nbDims + 1;
    if (mLayout == TRTSPEC_LAYOUT_HEAD_MAJOR) {
        out.d[0] = w.d[0];
        for (int32_t i = 0; i < x.nbDims; ++i) out.d[i + 1] = x.d[i];
    } else {
        for (int32_t i = 0; i + 1 < x.nbDims; ++i) out.d[i] = x.d[i];
        out.d[x.nbDims - 1] = w.d[0];
        out.d[x.nbDims] = x.d[x.nbDims - 1];
    }
    return 0;
}

bool RmsNormHeadsPlugin::supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                                   int32_t nbInputs, int32_t nbOutputs) noexcept {
    if (nbInputs != 2 || nbOutputs != 1 || pos < 0 || pos > 2) return false;
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR) return false;
    if (pos == 0) return isActivationType(d.type);
    return d.type == inOut[0].desc.type;  // weights and output share the hidden state's type
}

int32_t RmsNormHeadsPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                            DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept {
    if (nbInputs != 2 || nbOutputs != 1) {
        reportError(kRmsNormHeadsName, "takes 2 inputs (hidden, weights) and gives 1 output");
        return -1;
    }
    return checkInputs(in[kInHidden].desc.dims, in[kInHidden].desc.type, in[kInWeights].desc.dims,
                       in[kInWeights].desc.type) ? 0 : -1;
}

size_t RmsNormHeadsPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
                                            DynamicPluginTensorDesc const* /*outputs*/,
                                            int32_t /*nbOutputs*/) const noexcept {
    return 0;
}

int32_t RmsNormHeadsPlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs,
                                          PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept {
    if (nbInputs != 2 || nbOutputs != 1) {
        reportError(kRmsNormHeadsName, "takes 2 inputs (hidden, weights) and gives 1 output");
        return -1;
    }
    return checkInputs(in[kInHidden].dims, in[kInHidden].type, in[kInWeights].dims, in[kInWeights].type) ? 0 : -1;
}

int32_t RmsNormHeadsPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
                                    void const* const* inputs, void* const* outputs, void* /*workspace*/,
                                    cudaStream_t stream) noexcept {
    Dims const& x = inputDesc[kInHidden].dims;
    Dims const& w = inputDesc[kInWeights].dims;
    const int64_t tokens = volume(x, 0, x.nbDims - 1);
    const int64_t hidden = x.d[x.nbDims - 1];
    const int64_t heads = w.d[0];
    if (tokens < 0 || tokens > INT32_MAX || hidden <= 0 || hidden > INT32_MAX || heads < 0 || heads > INT32_MAX) {
        reportError(kRmsNormHeadsName, "shape out of range");
        return -1;
    }
    const int dtype = toKernelDtype(inputDesc[kInHidden].type);
    const int status = trtspec_rmsnorm_heads_layout(inputs[kInHidden], inputs[kInWeights], outputs[0],
                                                    static_cast<int32_t>(tokens), static_cast<int32_t>(hidden),
                                                    static_cast<int32_t>(heads), mEps, dtype, mLayout, stream);
    if (status != TRTSPEC_OK) {
        reportError(kRmsNormHeadsName, status == TRTSPEC_ERR_CUDA ? trtspec_last_cuda_error()
                                                                  : trtspec_status_string(status));
        return -1;
    }
    return 0;
}

IPluginV3* RmsNormHeadsPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept { return clone(); }

PluginFieldCollection const* RmsNormHeadsPlugin::getFieldsToSerialize() noexcept {
    // Rebuilt on every call: the fields point into this object, never into the one it was cloned from.
    mSerialFields.clear();
    mSerialFields.emplace_back("eps", &mEps, PluginFieldType::kFLOAT32, 1);
    mSerialFields.emplace_back("layout", &mLayout, PluginFieldType::kINT32, 1);
    mSerialFC.nbFields = static_cast<int32_t>(mSerialFields.size());
    mSerialFC.fields = mSerialFields.data();
    return &mSerialFC;
}

RmsNormHeadsCreator::RmsNormHeadsCreator() noexcept {
    mFields.emplace_back("eps", nullptr, PluginFieldType::kFLOAT32, 1);
    mFields.emplace_back("layout", nullptr, PluginFieldType::kINT32, 1);
    mFC.nbFields = static_cast<int32_t>(mFields.size());
    mFC.fields = mFields.data();
}

char const* RmsNormHeadsCreator::getPluginName() const noexcept { return kRmsNormHeadsName; }
char const* RmsNormHeadsCreator::getPluginVersion() const noexcept { return kPluginVersion; }
char const* RmsNormHeadsCreator::getPluginNamespace() const noexcept { return kPluginNamespace; }
PluginFieldCollection const* RmsNormHeadsCreator::getFieldNames() noexcept { return &mFC; }

IPluginV3* RmsNormHeadsCreator::createPlugin(char const* /*name*/, PluginFieldCollection const* fc,
                                             TensorRTPhase /*phase*/) noexcept {
    float eps = 1e-6f;
    int32_t layout = TRTSPEC_LAYOUT_HEAD_MAJOR;
    readFloatField(fc, "eps", eps);  // float32/64 or float16/bfloat16 (ONNX attributes may arrive as either)
    readIntField(fc, "layout", layout);
    if (layout != TRTSPEC_LAYOUT_HEAD_MAJOR && layout != TRTSPEC_LAYOUT_TOKEN_MAJOR) {
        reportError(kRmsNormHeadsName, "field 'layout' must be 0 (head-major) or 1 (token-major)");
        return nullptr;
    }
    if (!(eps >= 0.0f)) {
        reportError(kRmsNormHeadsName, "field 'eps' must be >= 0");
        return nullptr;
    }
    return new (std::nothrow) RmsNormHeadsPlugin(eps, layout);
}

}  // namespace trt
}  // namespace trtspec
