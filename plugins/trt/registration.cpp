// How TensorRT finds the trtspec creators.
//
// Two ways, both supported in one process:
//  * IPluginRegistry::loadLibrary, trtexec --dynamicPlugins / --setPluginsToSerialize: TensorRT dlopens
//    the library and calls the exported entry points getCreators() and setLoggerFinder(). They have
//    default visibility and are listed in plugins/trt/trtspec_plugins.map (the linker version script:
//    everything else stays local, as in TensorRT's own plugin library).
//  * loading the library any other way (LD_PRELOAD into tritonserver, ctypes.CDLL(..., RTLD_GLOBAL),
//    dlopen) registers both creators with the global registry from a static initialiser, when a libnvinfer
//    is already in the process; TRTSPEC_PLUGINS_NO_AUTO_REGISTER=1 skips that.
// loadLibrary fails when one of its creators is already registered, so getCreators() first takes back
// what the static initialiser registered: the two ways never register a creator twice.
#include <cstdlib>
#include <mutex>

#include "plugin_common.h"
#include "rmsnorm_heads_plugin.h"
#include "tree_verify_plugin.h"

#define TRTSPEC_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

trtspec::trt::RmsNormHeadsCreator gRmsNormHeadsCreator;
trtspec::trt::TreeVerifyCreator gTreeVerifyCreator;
nvinfer1::IPluginCreatorInterface* const gCreators[] = {&gRmsNormHeadsCreator, &gTreeVerifyCreator};
constexpr int32_t kNbCreators = static_cast<int32_t>(sizeof(gCreators) / sizeof(gCreators[0]));

std::mutex gRegistryMutex;
nvinfer1::IPluginRegistry* gAutoRegistry = nullptr;  // where the static initialiser registered, if anywhere
bool gAutoRegistered[kNbCreators] = {};

struct AutoRegister {
    AutoRegister() noexcept {
        char const* off = std::getenv("TRTSPEC_PLUGINS_NO_AUTO_REGISTER");
        if (off != nullptr && off[0] == '1') return;
        using GetRegistry = nvinfer1::IPluginRegistry* (*)() noexcept;
        auto get = reinterpret_cast<GetRegistry>(trtspec::trt::findNvinferSymbol("getPluginRegistry"));
        nvinfer1::IPluginRegistry* registry = get != nullptr ? get() : nullptr;
        if (registry == nullptr) return;  // no TensorRT in the process yet: loadLibrary/getCreators will do
        std::lock_guard<std::mutex> lock(gRegistryMutex);
        gAutoRegistry = registry;
        for (int32_t i = 0; i < kNbCreators; ++i) {
            gAutoRegistered[i] = registry->registerCreator(*gCreators[i], trtspec::trt::kPluginNamespace);
        }
    }
};
AutoRegister gAutoRegister;

}  // namespace

// The creators, for TensorRT's plugin-library loader (IPluginV3 creators: IPluginCreatorV3One).
TRTSPEC_PLUGIN_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
    {
        std::lock_guard<std::mutex> lock(gRegistryMutex);
        for (int32_t i = 0; i < kNbCreators; ++i) {
            if (gAutoRegistered[i] && gAutoRegistry != nullptr) gAutoRegistry->deregisterCreator(*gCreators[i]);
            gAutoRegistered[i] = false;
        }
    }
    nbCreators = kNbCreators;
    return gCreators;
}

// TensorRT passes the logger of the builder/runtime that loads the library; plugin errors go there.
TRTSPEC_PLUGIN_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
    trtspec::trt::setLoggerFinderImpl(finder);
}
