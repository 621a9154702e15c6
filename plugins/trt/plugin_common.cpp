#include "plugin_common.h"

#include <cstdio>
#include <cstring>

namespace trtspec {
namespace trt {

using nvinfer1::DataType;
using nvinfer1::PluginField;
using nvinfer1::PluginFieldCollection;
using nvinfer1::PluginFieldType;

int toKernelDtype(DataType type) noexcept {
    switch (type) {
        case DataType::kFLOAT:
            return TRTSPEC_FLOAT32;
        case DataType::kHALF:
            return TRTSPEC_FLOAT16;
        case DataType::kBF16:
            return TRTSPEC_BFLOAT16;
        default:
            return -1;
    }
}

bool isActivationType(DataType type) noexcept { return toKernelDtype(type) >= 0; }

namespace {
PluginField const* findField(PluginFieldCollection const* fc, char const* name) noexcept {
    if (fc == nullptr || fc->fields == nullptr) return nullptr;
    for (int32_t i = 0; i < fc->nbFields; ++i) {
        PluginField const& f = fc->fields[i];
        if (f.name != nullptr && std::strcmp(f.name, name) == 0 && f.data != nullptr && f.length >= 1) return &f;
    }
    return nullptr;
}
}  // namespace

bool readIntField(PluginFieldCollection const* fc, char const* name, int32_t& out) noexcept {
    PluginField const* f = findField(fc, name);
    if (f == nullptr) return false;
    switch (f->type) {
        case PluginFieldType::kINT32:
            out = *static_cast<int32_t const*>(f->data);
            return true;
        case PluginFieldType::kINT64:
            out = static_cast<int32_t>(*static_cast<int64_t const*>(f->data));
            return true;
        case PluginFieldType::kINT16:
            out = *static_cast<int16_t const*>(f->data);
            return true;
        case PluginFieldType::kINT8:
            out = *static_cast<int8_t const*>(f->data);
            return true;
        default:
            return false;
    }
}

bool readFloatField(PluginFieldCollection const* fc, char const* name, float& out) noexcept {
    PluginField const* f = findField(fc, name);
    if (f == nullptr) return false;
    switch (f->type) {
        case PluginFieldType::kFLOAT32:
            out = *static_cast<float const*>(f->data);
            return true;
        case PluginFieldType::kFLOAT64:
            out = static_cast<float>(*static_cast<double const*>(f->data));
            return true;
        default:
            return false;
    }
}

void reportError(char const* plugin, char const* message) noexcept {
    std::fprintf(stderr, "[trtspec] %s: %s\n", plugin, message);
}

int64_t volume(nvinfer1::Dims const& dims, int32_t begin, int32_t end) noexcept {
    int64_t v = 1;
    for (int32_t i = begin; i < end; ++i) {
        if (dims.d[i] < 0) return -1;
        v *= dims.d[i];
    }
    return v;
}

}  // namespace trt
}  // namespace trtspec
