// TrtspecTreeVerify (version 1, namespace trtspec): tree verification per sequence
// (trtspec/runtime/verify.py semantics; the kernel is plugins/kernels/tree_verify.cu).
//
// Fields   mode   (int32) 0 greedy, 1 lossless rejection sampling
//          target (int32) 0 target argmax ids, 1 logits, 2 probabilities (sampling only with 1 or 2)
// Inputs   0 paths        int32 [P, L]     TreeBuffers.paths (root first, -1 padded), L = max depth + 1
//          1 draft_tokens int32 [B, N1]    token of each tree node, index 0 = root
//          2 target       int32 [B, N1] (ids) or float32/float16/bfloat16 [B, N1, V] (logits/probs)
//          mode 1, target 1: 3 temperature float32 [B], 4 seed int64 [1] or [2]
//          mode 1, target 2: 3 seed int64 [1] or [2]
//          seed [2] = (seed, step): step s draws with the key seed + s * 0x9E3779B97F4A7C15 (the s-th state
//          of the splitmix64 sequence from seed), so a fixed seed and a step counter never repeat draws;
//          seed [1] is step 0 (then the caller must pass a fresh seed every step).
// Shapes and types are checked against each other in configurePlugin (extents known at build time) and
// onShapeChange (all of them); a mismatch is one error through TensorRT's logger and a failed build.
// Outputs  0 accepted_len int32 [B]; 1 tokens int32 [B, L] (accepted + bonus, -1 padded);
//          2 best_path int32 [B]; 3 keep_nodes int32 [B, L] (root + accepted nodes, -1 padded)
#pragma once

#include <vector>

#include "plugin_common.h"

namespace trtspec {
namespace trt {

class TreeVerifyPlugin : public nvinfer1::IPluginV3,
                           public nvinfer1::IPluginV3OneCore,
                           public nvinfer1::IPluginV3OneBuild,
                           public nvinfer1::IPluginV3OneRuntime {
public:
    TreeVerifyPlugin(int32_t mode, int32_t target) noexcept;
    TreeVerifyPlugin(TreeVerifyPlugin const& other) noexcept;
    TreeVerifyPlugin& operator=(TreeVerifyPlugin const&) = delete;
    ~TreeVerifyPlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;
    nvinfer1::IPluginV3* clone() noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t getNbOutputs() const noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
                               nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
                            nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs,
                            nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
                            nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
                                   int32_t nbOutputs) noexcept override;
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
                            nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
                            nvinfer1::DynamicPluginTensorDesc const* outputs,
                            int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
                          nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
                    void const* const* inputs, void* const* outputs, void* workspace,
                    cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

private:
    static constexpr int32_t kMaxInputs = 5;
    int32_t expectedInputs() const noexcept;
    // Input ranks, extents and types against each other; reports the first mismatch, false then.
    bool checkInputs(nvinfer1::Dims const* dims, nvinfer1::DataType const* types, int32_t nbInputs) const noexcept;
    int32_t kernelMode() const noexcept;

    int32_t mMode;
    int32_t mTarget;
    std::vector<nvinfer1::PluginField> mSerialFields;
    nvinfer1::PluginFieldCollection mSerialFC{};
};

class TreeVerifyCreator : public nvinfer1::IPluginCreatorV3One {
public:
    TreeVerifyCreator() noexcept;
    ~TreeVerifyCreator() override = default;

    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override;
    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
                                      nvinfer1::TensorRTPhase phase) noexcept override;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFC{};
};

}  // namespace trt
}  // namespace trtspec
