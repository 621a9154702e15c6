// How TensorRT finds the trtspec creators.
//
// Two ways, both supported:
//  * loading the library (LD_PRELOAD into tritonserver, ctypes.CDLL(..., RTLD_GLOBAL), dlopen) registers
//    both creators with the global plugin registry under the namespace "trtspec", from a static
//    initialiser; set TRTSPEC_PLUGINS_NO_AUTO_REGISTER=1 to skip that;
//  * IPluginRegistry::loadLibrary / trtexec --dynamicPlugins call the exported getCreators().
// Use one of them per process: registering the same creator twice makes TensorRT log an error.
#include <cstdlib>

#include "plugin_common.h"
#include "rmsnorm_heads_plugin.h"
#include "tree_verify_plugin.h"

namespace {

trtspec::trt::RmsNormHeadsCreator gRmsNormHeadsCreator;
trtspec::trt::TreeVerifyCreator gTreeVerifyCreator;
nvinfer1::IPluginCreatorInterface* const gCreators[] = {&gRmsNormHeadsCreator, &gTreeVerifyCreator};

struct AutoRegister {
    AutoRegister() noexcept {
        char const* off = std::getenv("TRTSPEC_PLUGINS_NO_AUTO_REGISTER");
        if (off != nullptr && off[0] == '1') return;
        nvinfer1::IPluginRegistry* registry = getPluginRegistry();
        if (registry == nullptr) return;
        for (nvinfer1::IPluginCreatorInterface* creator : gCreators) {
            registry->registerCreator(*creator, trtspec::trt::kPluginNamespace);
        }
    }
};
AutoRegister gAutoRegister;

}  // namespace

extern "C" TENSORRTAPI nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
    nbCreators = static_cast<int32_t>(sizeof(gCreators) / sizeof(gCreators[0]));
    return gCreators;
}

extern "C" TENSORRTAPI void setLoggerFinder(nvinfer1::ILoggerFinder* /*finder*/) {}
