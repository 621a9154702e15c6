#include "tree_verify_plugin.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <new>

namespace trtspec {
namespace trt {

using namespace nvinfer1;

namespace {
constexpr int32_t kInPaths = 0;
constexpr int32_t kInDraft = 1;
constexpr int32_t kInTarget = 2;
constexpr int32_t kNbOutputs = 4;
constexpr int32_t kModeGreedy = 0;
constexpr int32_t kModeSampling = 1;
constexpr int32_t kTargetIds = 0;
constexpr int32_t kTargetLogits = 1;
constexpr int32_t kTargetProbs = 2;

// Reports one formatted error through the TensorRT logger; returns false so checks read `return fail(...)`.
__attribute__((format(printf, 1, 2))) bool fail(char const* fmt, ...) noexcept {
    char msg[384];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(msg, sizeof(msg), fmt, args);
    va_end(args);
    reportError(kTreeVerifyName, msg);
    return false;
}

// a and b are the same extent, or one of them is not known yet (-1 at build time).
bool sameExtent(int64_t a, int64_t b) noexcept { return a < 0 || b < 0 || a == b; }
}  // namespace

bool TreeVerifyPlugin::checkInputs(Dims const* dims, DataType const* types, int32_t nbInputs) const noexcept {
    if (nbInputs != expectedInputs()) {
        return fail("mode %d with target %d takes %d inputs, got %d", mMode, mTarget, expectedInputs(), nbInputs);
    }
    Dims const& paths = dims[kInPaths];
    Dims const& draft = dims[kInDraft];
    Dims const& target = dims[kInTarget];
    const int32_t targetRank = mTarget == kTargetIds ? 2 : 3;
    if (paths.nbDims != 2 || draft.nbDims != 2 || target.nbDims != targetRank) {
        return fail("paths must be [P, L], draft_tokens [B, N1] and target %s; got ranks %d, %d, %d",
                    mTarget == kTargetIds ? "[B, N1]" : "[B, N1, V]", paths.nbDims, draft.nbDims, target.nbDims);
    }
    if (types[kInPaths] != DataType::kINT32 || types[kInDraft] != DataType::kINT32) {
        return fail("paths and draft_tokens must be int32");
    }
    if (mTarget == kTargetIds ? types[kInTarget] != DataType::kINT32 : !isActivationType(types[kInTarget])) {
        return fail("target must be %s", mTarget == kTargetIds ? "int32 ids" : "float32, float16 or bfloat16");
    }
    const int64_t batch = draft.d[0], nodes = draft.d[1], numPaths = paths.d[0], pathLen = paths.d[1];
    if (!sameExtent(batch, target.d[0]) || !sameExtent(nodes, target.d[1])) {
        return fail("target is [%lld, %lld, ...] but draft_tokens is [%lld, %lld]: batch and node counts must match",
                    static_cast<long long>(target.d[0]), static_cast<long long>(target.d[1]),
                    static_cast<long long>(batch), static_cast<long long>(nodes));
    }
    if (nodes > TRTSPEC_MAX_TREE_NODES || nodes == 0) {
        return fail("draft tree has %lld nodes; 1..%d are supported", static_cast<long long>(nodes),
                    TRTSPEC_MAX_TREE_NODES);
    }
    if (numPaths == 0 || pathLen == 0 || !sameExtent(std::max(nodes, numPaths), nodes) ||
        !sameExtent(std::max(nodes, pathLen), nodes)) {
        return fail("paths [%lld, %lld] do not fit a tree of %lld nodes (need 1 <= P <= N1 and 1 <= L <= N1)",
                    static_cast<long long>(numPaths), static_cast<long long>(pathLen), static_cast<long long>(nodes));
    }
    if (mTarget != kTargetIds && target.d[2] == 0) return fail("target has an empty vocabulary axis");
    if (mMode == kModeSampling) {
        if (mTarget == kTargetLogits) {
            Dims const& temp = dims[3];
            if (types[3] != DataType::kFLOAT || temp.nbDims != 1 || !sameExtent(temp.d[0], batch)) {
                return fail("temperature must be float32 [B] with B = %lld", static_cast<long long>(batch));
            }
        }
        Dims const& seed = dims[nbInputs - 1];
        const int64_t n = volume(seed, 0, seed.nbDims);
        if (types[nbInputs - 1] != DataType::kINT64 || seed.nbDims > 1 || n == 0 || n > 2) {
            return fail("seed must be int64 [1] (seed) or [2] (seed, step)");
        }
    }
    return true;
}

TreeVerifyPlugin::TreeVerifyPlugin(int32_t mode, int32_t target) noexcept : mMode(mode), mTarget(target) {}

TreeVerifyPlugin::TreeVerifyPlugin(TreeVerifyPlugin const& other) noexcept
    : IPluginV3(), IPluginV3OneCore(), IPluginV3OneBuild(), IPluginV3OneRuntime(), mMode(other.mMode),
      mTarget(other.mTarget) {}

int32_t TreeVerifyPlugin::expectedInputs() const noexcept {
    if (mMode == kModeGreedy) return 3;
    return mTarget == kTargetLogits ? 5 : 4;
}

int32_t TreeVerifyPlugin::kernelMode() const noexcept {
    if (mMode == kModeGreedy) return mTarget == kTargetIds ? TRTSPEC_VERIFY_GREEDY_IDS : TRTSPEC_VERIFY_GREEDY_LOGITS;
    return mTarget == kTargetLogits ? TRTSPEC_VERIFY_SAMPLE_LOGITS : TRTSPEC_VERIFY_SAMPLE_PROBS;
}

IPluginCapability* TreeVerifyPlugin::getCapabilityInterface(PluginCapabilityType type) noexcept {
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

IPluginV3* TreeVerifyPlugin::clone() noexcept { return new (std::nothrow) TreeVerifyPlugin(*this); }

char const* TreeVerifyPlugin::getPluginName() const noexcept { return kTreeVerifyName; }
char const* TreeVerifyPlugin::getPluginVersion() const noexcept { return kPluginVersion; }
char const* TreeVerifyPlugin::getPluginNamespace() const noexcept { return kPluginNamespace; }

int32_t TreeVerifyPlugin::getNbOutputs() const noexcept { return kNbOutputs; }

int32_t TreeVerifyPlugin::getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs,
                                             DataType const* /*inputTypes*/, int32_t nbInputs) const noexcept {
    if (nbInputs != expectedInputs() || nbOutputs != kNbOutputs) return -1;
    for (int32_t i = 0; i < kNbOutputs; ++i) outputTypes[i] = DataType::kINT32;
    return 0;
}

int32_t TreeVerifyPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
                                          DimsExprs const* /*shapeInputs*/, int32_t /*nbShapeInputs*/,
                                          DimsExprs* outputs, int32_t nbOutputs,
                                          IExprBuilder& /*exprBuilder*/) noexcept {
    if (nbInputs != expectedInputs() || nbOutputs != kNbOutputs) {
        reportError(kTreeVerifyName, "wrong number of inputs for this mode/target (see tree_verify_plugin.h)");
        return -1;
    }
    const int32_t targetRank = mTarget == kTargetIds ? 2 : 3;
    if (inputs[kInPaths].nbDims != 2 || inputs[kInDraft].nbDims != 2 || inputs[kInTarget].nbDims != targetRank) {
        reportError(kTreeVerifyName, "paths must be [P, L], draft_tokens [B, N1], target [B, N1] or [B, N1, V]");
        return -1;
    }
    IDimensionExpr const* batch = inputs[kInDraft].d[0];
    IDimensionExpr const* width = inputs[kInPaths].d[1];
    outputs[0].nbDims = 1;
    outputs[0].d[0] = batch;
    outputs[1].nbDims = 2;
    outputs[1].d[0] = batch;
    outputs[1].d[1] = width;
    outputs[2].nbDims = 1;
    outputs[2].d[0] = batch;
    outputs[3].nbDims = 2;
    outputs[3].d[0] = batch;
    outputs[3].d[1] = width;
    return 0;
}

bool TreeVerifyPlugin::supportsFormatCombination(int32_t pos, DynamicPluginTensorDesc const* inOut,
                                                 int32_t nbInputs, int32_t nbOutputs) noexcept {
    if (nbInputs != expectedInputs() || nbOutputs != kNbOutputs || pos < 0 || pos >= nbInputs + nbOutputs) {
        return false;
    }
    PluginTensorDesc const& d = inOut[pos].desc;
    if (d.format != TensorFormat::kLINEAR) return false;
    if (pos >= nbInputs) return d.type == DataType::kINT32;  // all outputs
    if (pos == kInPaths || pos == kInDraft) return d.type == DataType::kINT32;
    if (pos == kInTarget) return mTarget == kTargetIds ? d.type == DataType::kINT32 : isActivationType(d.type);
    if (pos == nbInputs - 1) return d.type == DataType::kINT64;  // seed (sampling modes)
    return d.type == DataType::kFLOAT;                             // temperature
}

int32_t TreeVerifyPlugin::configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs,
                                          DynamicPluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept {
    if (nbOutputs != kNbOutputs || nbInputs < 0 || nbInputs > kMaxInputs) {
        return fail("expects %d outputs and at most %d inputs", kNbOutputs, kMaxInputs) ? 0 : -1;
    }
    Dims dims[kMaxInputs];
    DataType types[kMaxInputs];
    for (int32_t i = 0; i < nbInputs; ++i) {
        dims[i] = in[i].desc.dims;  // -1 where the extent is dynamic: checked again in onShapeChange
        types[i] = in[i].desc.type;
    }
    return checkInputs(dims, types, nbInputs) ? 0 : -1;
}

size_t TreeVerifyPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* /*inputs*/, int32_t /*nbInputs*/,
                                          DynamicPluginTensorDesc const* /*outputs*/,
                                          int32_t /*nbOutputs*/) const noexcept {
    return 0;
}

int32_t TreeVerifyPlugin::onShapeChange(PluginTensorDesc const* in, int32_t nbInputs,
                                        PluginTensorDesc const* /*out*/, int32_t nbOutputs) noexcept {
    if (nbOutputs != kNbOutputs || nbInputs < 0 || nbInputs > kMaxInputs) {
        return fail("expects %d outputs and at most %d inputs", kNbOutputs, kMaxInputs) ? 0 : -1;
    }
    Dims dims[kMaxInputs];
    DataType types[kMaxInputs];
    for (int32_t i = 0; i < nbInputs; ++i) {
        dims[i] = in[i].dims;
        types[i] = in[i].type;
    }
    return checkInputs(dims, types, nbInputs) ? 0 : -1;
}

int32_t TreeVerifyPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /*outputDesc*/,
                                  void const* const* inputs, void* const* outputs, void* /*workspace*/,
                                  cudaStream_t stream) noexcept {
    Dims const& paths = inputDesc[kInPaths].dims;
    Dims const& draft = inputDesc[kInDraft].dims;
    const int64_t numPaths = paths.d[0], pathLen = paths.d[1];
    const int64_t batch = draft.d[0], nodes = draft.d[1];
    int64_t vocab = 0;
    int dtype = TRTSPEC_FLOAT32;
    void const* target = nullptr;
    int32_t const* targetIds = nullptr;
    if (mTarget == kTargetIds) {
        targetIds = static_cast<int32_t const*>(inputs[kInTarget]);
    } else {
        target = inputs[kInTarget];
        vocab = inputDesc[kInTarget].dims.d[2];
        dtype = toKernelDtype(inputDesc[kInTarget].type);
    }
    if (numPaths > INT32_MAX || pathLen > INT32_MAX || batch > INT32_MAX || nodes > INT32_MAX || vocab > INT32_MAX) {
        reportError(kTreeVerifyName, "shape out of range");
        return -1;
    }
    float const* temperature = nullptr;
    int64_t const* seed = nullptr;
    int32_t seedLen = 0;
    if (mMode == kModeSampling) {
        const int32_t nb = expectedInputs();
        seed = static_cast<int64_t const*>(inputs[nb - 1]);
        seedLen = static_cast<int32_t>(volume(inputDesc[nb - 1].dims, 0, inputDesc[nb - 1].dims.nbDims));
        if (mTarget == kTargetLogits) temperature = static_cast<float const*>(inputs[3]);
    }
    const int status = trtspec_tree_verify(
        kernelMode(), static_cast<int32_t const*>(inputs[kInPaths]), static_cast<int32_t>(numPaths),
        static_cast<int32_t>(pathLen), static_cast<int32_t const*>(inputs[kInDraft]), static_cast<int32_t>(batch),
        static_cast<int32_t>(nodes), targetIds, target, dtype, static_cast<int32_t>(vocab), temperature, seed, seedLen,
        static_cast<int32_t*>(outputs[0]), static_cast<int32_t*>(outputs[1]), static_cast<int32_t*>(outputs[2]),
        static_cast<int32_t*>(outputs[3]), stream);
    if (status != TRTSPEC_OK) {
        reportError(kTreeVerifyName, status == TRTSPEC_ERR_CUDA ? trtspec_last_cuda_error()
                                                                : trtspec_status_string(status));
        return -1;
    }
    return 0;
}

IPluginV3* TreeVerifyPlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept { return clone(); }

PluginFieldCollection const* TreeVerifyPlugin::getFieldsToSerialize() noexcept {
    mSerialFields.clear();
    mSerialFields.emplace_back("mode", &mMode, PluginFieldType::kINT32, 1);
    mSerialFields.emplace_back("target", &mTarget, PluginFieldType::kINT32, 1);
    mSerialFC.nbFields = static_cast<int32_t>(mSerialFields.size());
    mSerialFC.fields = mSerialFields.data();
    return &mSerialFC;
}

TreeVerifyCreator::TreeVerifyCreator() noexcept {
    mFields.emplace_back("mode", nullptr, PluginFieldType::kINT32, 1);
    mFields.emplace_back("target", nullptr, PluginFieldType::kINT32, 1);
    mFC.nbFields = static_cast<int32_t>(mFields.size());
    mFC.fields = mFields.data();
}

char const* TreeVerifyCreator::getPluginName() const noexcept { return kTreeVerifyName; }
char const* TreeVerifyCreator::getPluginVersion() const noexcept { return kPluginVersion; }
char const* TreeVerifyCreator::getPluginNamespace() const noexcept { return kPluginNamespace; }
PluginFieldCollection const* TreeVerifyCreator::getFieldNames() noexcept { return &mFC; }

IPluginV3* TreeVerifyCreator::createPlugin(char const* /*name*/, PluginFieldCollection const* fc,
                                           TensorRTPhase /*phase*/) noexcept {
    int32_t mode = kModeGreedy;
    int32_t target = kTargetIds;
    readIntField(fc, "mode", mode);
    readIntField(fc, "target", target);
    if (mode != kModeGreedy && mode != kModeSampling) {
        reportError(kTreeVerifyName, "field 'mode' must be 0 (greedy) or 1 (sampling)");
        return nullptr;
    }
    if (target < kTargetIds || target > kTargetProbs || (mode == kModeSampling && target == kTargetIds)) {
        reportError(kTreeVerifyName, "field 'target' must be 0 (ids, greedy only), 1 (logits) or 2 (probs)");
        return nullptr;
    }
    return new (std::nothrow) TreeVerifyPlugin(mode, target);
}

}  // namespace trt
}  // namespace trtspec
