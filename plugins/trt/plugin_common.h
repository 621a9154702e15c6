// Shared pieces of the trtspec TensorRT plugins: names, dtype mapping, plugin-field parsing, logging,
// and the shape checks both plugins run at build time (configurePlugin) and at run time (onShapeChange).
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

// Finds an integer field (int32, int64, int16 or int8) by name; false when absent or of another type.
bool readIntField(nvinfer1::PluginFieldCollection const* fc, char const* name, int32_t& out) noexcept;

// Finds a floating-point field (float32, float64, float16 or bfloat16) by name; false when absent or of
// another type. Half-precision fields are widened exactly (every fp16/bf16 value is a float).
bool readFloatField(nvinfer1::PluginFieldCollection const* fc, char const* name, float& out) noexcept;

// IEEE half / bfloat16 bit patterns -> float (host code; no CUDA headers in the wrappers).
float halfBitsToFloat(uint16_t bits) noexcept;
float bf16BitsToFloat(uint16_t bits) noexcept;

// The finder TensorRT hands over through setLoggerFinder (nullptr until then).
void setLoggerFinderImpl(nvinfer1::ILoggerFinder* finder) noexcept;

// The logger errors go to: the finder's logger, else TensorRT's global logger (getLogger() of the
// libnvinfer already in the process), else nullptr (then errors go to stderr).
nvinfer1::ILogger* pluginLogger() noexcept;

// One error line "[trtspec] <plugin>: <message>" through pluginLogger() (kERROR), or on stderr without one.
void reportError(char const* plugin, char const* message) noexcept;

// A TensorRT entry point of the libnvinfer already loaded in this process (dlopen RTLD_NOLOAD), or nullptr.
// Why not a link-time dependency: the plugin library must also load where only TensorRT's headers were
// at hand (IPluginRegistry::loadLibrary supplies the registry itself through getCreators).
void* findNvinferSymbol(char const* name) noexcept;

// Product of dims [begin, end); -1 on a negative (unknown) extent.
int64_t volume(nvinfer1::Dims const& dims, int32_t begin, int32_t end) noexcept;

}  // namespace trt
}  // namespace trtspec
