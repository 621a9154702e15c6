#include "plugin_common.h"

#include <dlfcn.h>

#include <NvInferVersion.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

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

uint16_t loadBits(void const* p) noexcept {
    uint16_t bits;
    std::memcpy(&bits, p, sizeof(bits));
    return bits;
}

std::atomic<nvinfer1::ILoggerFinder*> gLoggerFinder{nullptr};
}  // namespace

float halfBitsToFloat(uint16_t bits) noexcept {
    const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
    const uint32_t exp = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    uint32_t out;
    if (exp == 0x1fu) {
        out = sign | 0x7f800000u | (mant << 13);  // inf / NaN
    } else if (exp != 0) {
        out = sign | ((exp + 112u) << 23) | (mant << 13);  // normal: rebias 15 -> 127
    } else if (mant == 0) {
        out = sign;  // +-0
    } else {  // subnormal: normalise
        int32_t e = 113;
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            --e;
        }
        out = sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &out, sizeof(f));
    return f;
}

float bf16BitsToFloat(uint16_t bits) noexcept {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
}

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
        case PluginFieldType::kFLOAT16:
            out = halfBitsToFloat(loadBits(f->data));
            return true;
        case PluginFieldType::kBF16:
            out = bf16BitsToFloat(loadBits(f->data));
            return true;
        default:
            return false;
    }
}

void setLoggerFinderImpl(nvinfer1::ILoggerFinder* finder) noexcept { gLoggerFinder.store(finder); }

void* findNvinferSymbol(char const* name) noexcept {
    static std::string const soname = "libnvinfer.so." + std::to_string(NV_TENSORRT_MAJOR);
    void* handle = dlopen(soname.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    void* sym = handle != nullptr ? dlsym(handle, name) : nullptr;
    if (handle != nullptr) dlclose(handle);  // NOLOAD took a reference; the library stays loaded
    return sym != nullptr ? sym : dlsym(RTLD_DEFAULT, name);
}

nvinfer1::ILogger* pluginLogger() noexcept {
    if (nvinfer1::ILoggerFinder* finder = gLoggerFinder.load()) {
        if (nvinfer1::ILogger* logger = finder->findLogger()) return logger;
    }
    using GetLogger = nvinfer1::ILogger* (*)() noexcept;
    auto get = reinterpret_cast<GetLogger>(findNvinferSymbol("getLogger"));
    return get != nullptr ? get() : nullptr;
}

void reportError(char const* plugin, char const* message) noexcept {
    char line[512];
    std::snprintf(line, sizeof(line), "[trtspec] %s: %s", plugin, message);
    if (nvinfer1::ILogger* logger = pluginLogger()) {
        logger->log(nvinfer1::ILogger::Severity::kERROR, line);
    } else {
        std::fprintf(stderr, "%s\n", line);
    }
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
