// Shared pieces of the trtspec TensorRT plugins: names, dtype mapping, plugin-field parsing, errors.
//
// The plugins are thin IPluginV3 wrappers (TensorRT 10+) around the C ABI in trtspec_kernels.h: shape
// inference and format checks here, all GPU work in the kernels.
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>

#include "trtspec_kernels.h"

namespace trtspec {
namespace trt {

// The engine and Triton helpers look the creators up by exactly these strings.
constexpr char const* kPluginNamespace = "trtspec";
constexpr char const* kPluginVersion = "1";
constexpr char const* kRmsNormHeadsName = "TrtspecRmsNormHeads";
constexpr char const* kTreeVerifyName = "TrtspecTreeVerify";

// TensorRT activation type -> trtspec_dtype, or -1 when the kernels do not take it.
int toKernelDtype(nvinfer1::DataType type) noexcept;

bool isActivationType(nvinfer1::DataType type) noexcept;

// Finds an int32 (or int64 / int16 / int8) field by name; false when absent or of another type.
bool readIntField(nvinfer1::PluginFieldCollection const* fc, char const* name, int32_t& out) noexcept;

// Finds a float32 (or float64 / float16) field by name; false when absent or of another type.
bool readFloatField(nvinfer1::PluginFieldCollection const* fc, char const* name, float& out) noexcept;

// One line on stderr, prefixed with the plugin name (TensorRT shows plugin errors no other way here).
void reportError(char const* plugin, char const* message) noexcept;

// Product of dims [begin, end); -1 on a negative (unknown) extent.
int64_t volume(nvinfer1::Dims const& dims, int32_t begin, int32_t end) noexcept;

}  // namespace trt
}  // namespace trtspec
