// plugin_probe: drives libtrtspec_plugins.so the way TensorRT's plugin-library loader does, without TensorRT.
//
// Why: TensorRT cannot be installed on CI machines, but its public headers can. This program dlopens the
// plugin library, looks up the two exported entry points (getCreators, setLoggerFinder) exactly as
// IPluginRegistry::loadLibrary does, hands over a logger finder, creates plugins from field collections
// and calls the build-time (configurePlugin) and run-time (onShapeChange) checks with good and bad shapes.
// It never enqueues (no GPU). tests/test_plugins_trt.py compiles it against the TensorRT 10 headers and
// reads its output: one line per case,
//   case <name> rc=<return code> errors=<n> last=<last error logged, or ->
// plus "creator ..." / "field ..." / "serialized ..." lines describing what the creators register.
#include <NvInferRuntime.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

class CapturingLogger : public ILogger {
public:
    void log(Severity severity, AsciiChar const* msg) noexcept override {
        if (severity <= Severity::kERROR) errors.emplace_back(msg);
    }
    std::vector<std::string> errors;
};

class Finder : public ILoggerFinder {
public:
    explicit Finder(ILogger* logger) : mLogger(logger) {}
    ILogger* findLogger() override { return mLogger; }
    ~Finder() override = default;

private:
    ILogger* mLogger;
};

CapturingLogger gLogger;

void report(char const* name, int64_t rc) {
    std::printf("case %s rc=%lld errors=%zu last=%s\n", name, static_cast<long long>(rc), gLogger.errors.size(),
                gLogger.errors.empty() ? "-" : gLogger.errors.back().c_str());
    gLogger.errors.clear();
    std::fflush(stdout);
}

Dims dims(std::initializer_list<int64_t> d) {
    Dims out{};
    out.nbDims = static_cast<int32_t>(d.size());
    int32_t i = 0;
    for (int64_t v : d) out.d[i++] = v;
    return out;
}

struct Tensor {
    Dims d;
    DataType t;
};

int32_t configure(IPluginV3* plugin, std::vector<Tensor> const& in, int32_t nbOutputs) {
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    std::vector<DynamicPluginTensorDesc> ins(in.size()), outs(static_cast<size_t>(nbOutputs));
    for (size_t i = 0; i < in.size(); ++i) {
        ins[i].desc.dims = in[i].d;
        ins[i].desc.type = in[i].t;
        ins[i].desc.format = TensorFormat::kLINEAR;
        ins[i].min = ins[i].max = ins[i].opt = in[i].d;
    }
    return build->configurePlugin(ins.data(), static_cast<int32_t>(ins.size()), outs.data(), nbOutputs);
}

int32_t shapeChange(IPluginV3* plugin, std::vector<Tensor> const& in, int32_t nbOutputs) {
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<PluginTensorDesc> ins(in.size()), outs(static_cast<size_t>(nbOutputs));
    for (size_t i = 0; i < in.size(); ++i) {
        ins[i].dims = in[i].d;
        ins[i].type = in[i].t;
        ins[i].format = TensorFormat::kLINEAR;
    }
    return rt->onShapeChange(ins.data(), static_cast<int32_t>(ins.size()), outs.data(), nbOutputs);
}

char const* typeName(PluginFieldType t) {
    switch (t) {
        case PluginFieldType::kFLOAT32:
            return "float32";
        case PluginFieldType::kINT32:
            return "int32";
        default:
            return "other";
    }
}

IPluginCreatorV3One* findCreator(IPluginCreatorInterface* const* creators, int32_t n, char const* name) {
    for (int32_t i = 0; i < n; ++i) {
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (std::strcmp(c->getPluginName(), name) == 0) return c;
    }
    return nullptr;
}

IPluginV3* make(IPluginCreatorV3One* creator, std::vector<PluginField> const& fields) {
    PluginFieldCollection fc{};
    fc.nbFields = static_cast<int32_t>(fields.size());
    fc.fields = fields.data();
    return creator->createPlugin("probe", &fc, TensorRTPhase::kBUILD);
}

float serializedFloat(IPluginV3* plugin, char const* name) {
    auto* rt = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    PluginFieldCollection const* fc = rt->getFieldsToSerialize();
    for (int32_t i = 0; i < fc->nbFields; ++i) {
        if (std::strcmp(fc->fields[i].name, name) == 0) return *static_cast<float const*>(fc->fields[i].data);
    }
    return -1.0f;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: plugin_probe path/to/libtrtspec_plugins.so\n");
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        std::fprintf(stderr, "error: dlopen: %s\n", dlerror());
        return 1;
    }
    using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
    using SetLoggerFinder = void (*)(ILoggerFinder*);
    auto getCreators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    auto setLoggerFinder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
    std::printf("entry getCreators=%d setLoggerFinder=%d\n", getCreators != nullptr, setLoggerFinder != nullptr);
    if (getCreators == nullptr || setLoggerFinder == nullptr) return 1;

    int32_t n = 0;
    IPluginCreatorInterface* const* creators = getCreators(n);
    for (int32_t i = 0; i < n; ++i) {
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        std::printf("creator %s version=%s namespace=%s interface=%s\n", c->getPluginName(), c->getPluginVersion(),
                    c->getPluginNamespace(), c->getInterfaceInfo().kind);
        PluginFieldCollection const* fc = c->getFieldNames();
        for (int32_t f = 0; f < fc->nbFields; ++f) {
            std::printf("field %s %s %s %d\n", c->getPluginName(), fc->fields[f].name, typeName(fc->fields[f].type),
                        fc->fields[f].length);
        }
    }
    std::fflush(stdout);
    auto* rms = findCreator(creators, n, "TrtspecRmsNormHeads");
    auto* tv = findCreator(creators, n, "TrtspecTreeVerify");
    if (rms == nullptr || tv == nullptr) return 1;

    // Before setLoggerFinder (and with no libnvinfer in the process) errors go to stderr, not to our logger.
    {
        int32_t badLayout = 7;
        IPluginV3* p = make(rms, {PluginField("layout", &badLayout, PluginFieldType::kINT32, 1)});
        report("no_finder_bad_layout", p == nullptr ? -1 : 0);
        delete p;
    }
    Finder finder(&gLogger);
    setLoggerFinder(&finder);

    // ------------------------------------------------------------------ RmsNormHeads fields
    {
        uint16_t epsHalf = 0x1419;  // fp16 for 0.0010004
        IPluginV3* p = make(rms, {PluginField("eps", &epsHalf, PluginFieldType::kFLOAT16, 1)});
        std::printf("serialized eps_fp16 %.9g\n", p ? serializedFloat(p, "eps") : -1.0f);
        delete p;
        uint16_t epsBf16 = 0x3a83;  // bf16 for 0.00099945068
        p = make(rms, {PluginField("eps", &epsBf16, PluginFieldType::kBF16, 1)});
        std::printf("serialized eps_bf16 %.9g\n", p ? serializedFloat(p, "eps") : -1.0f);
        delete p;
        double epsF64 = 1e-5;
        p = make(rms, {PluginField("eps", &epsF64, PluginFieldType::kFLOAT64, 1)});
        std::printf("serialized eps_fp64 %.9g\n", p ? serializedFloat(p, "eps") : -1.0f);
        delete p;
        p = make(rms, {});
        std::printf("serialized eps_default %.9g\n", p ? serializedFloat(p, "eps") : -1.0f);
        delete p;
        float negative = -1.0f;
        p = make(rms, {PluginField("eps", &negative, PluginFieldType::kFLOAT32, 1)});
        report("rms_negative_eps", p == nullptr ? -1 : 0);
        delete p;
    }
    std::fflush(stdout);

    // ------------------------------------------------------------------ RmsNormHeads shapes
    {
        IPluginV3* p = make(rms, {});
        const DataType h = DataType::kHALF;
        report("rms_ok", configure(p, {{dims({8, 4096}), h}, {dims({4, 4096}), h}}, 1));
        report("rms_dynamic_ok", configure(p, {{dims({-1, 4096}), h}, {dims({4, -1}), h}}, 1));
        report("rms_hidden_mismatch", configure(p, {{dims({8, 4096}), h}, {dims({4, 2048}), h}}, 1));
        report("rms_weight_rank", configure(p, {{dims({8, 4096}), h}, {dims({4096}), h}}, 1));
        report("rms_type_mismatch", configure(p, {{dims({8, 4096}), h}, {dims({4, 4096}), DataType::kFLOAT}}, 1));
        report("rms_runtime_mismatch", shapeChange(p, {{dims({8, 4096}), h}, {dims({4, 4095}), h}}, 1));
        report("rms_runtime_ok", shapeChange(p, {{dims({2, 3, 64}), h}, {dims({4, 64}), h}}, 1));
        delete p;
    }

    // ------------------------------------------------------------------ TreeVerify shapes
    {
        const DataType i32 = DataType::kINT32, f16 = DataType::kHALF, f32 = DataType::kFLOAT,
                       i64 = DataType::kINT64;
        int32_t greedy = 0, sampling = 1, ids = 0, logits = 1;
        IPluginV3* g = make(tv, {PluginField("mode", &greedy, PluginFieldType::kINT32, 1),
                                 PluginField("target", &logits, PluginFieldType::kINT32, 1)});
        report("tv_greedy_ok", configure(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 64, 1000}), f16}}, 4));
        report("tv_greedy_dynamic_ok",
               configure(g, {{dims({40, 6}), i32}, {dims({-1, 64}), i32}, {dims({-1, 64, 1000}), f16}}, 4));
        report("tv_batch_mismatch",
               configure(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({5, 64, 1000}), f16}}, 4));
        report("tv_nodes_mismatch",
               configure(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 63, 1000}), f16}}, 4));
        report("tv_paths_too_long",
               configure(g, {{dims({40, 65}), i32}, {dims({4, 64}), i32}, {dims({4, 64, 1000}), f16}}, 4));
        report("tv_too_many_paths",
               configure(g, {{dims({65, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 64, 1000}), f16}}, 4));
        report("tv_too_many_nodes",
               configure(g, {{dims({40, 6}), i32}, {dims({4, 1025}), i32}, {dims({4, 1025, 1000}), f16}}, 4));
        report("tv_target_type",
               configure(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 64, 1000}), i32}}, 4));
        report("tv_wrong_input_count", configure(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}}, 4));
        report("tv_runtime_batch_mismatch",
               shapeChange(g, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({3, 64, 1000}), f16}}, 4));
        report("tv_runtime_ok",
               shapeChange(g, {{dims({40, 6}), i32}, {dims({3, 64}), i32}, {dims({3, 64, 1000}), f16}}, 4));
        delete g;

        IPluginV3* gi = make(tv, {PluginField("mode", &greedy, PluginFieldType::kINT32, 1),
                                  PluginField("target", &ids, PluginFieldType::kINT32, 1)});
        report("tv_ids_ok", configure(gi, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 64}), i32}}, 4));
        report("tv_ids_rank", configure(gi, {{dims({40, 6}), i32}, {dims({4, 64}), i32}, {dims({4, 64, 9}), i32}}, 4));
        delete gi;

        IPluginV3* s = make(tv, {PluginField("mode", &sampling, PluginFieldType::kINT32, 1),
                                 PluginField("target", &logits, PluginFieldType::kINT32, 1)});
        const Tensor paths{dims({40, 6}), i32}, draft{dims({4, 64}), i32}, target{dims({4, 64, 1000}), f16};
        report("tv_sampling_ok", configure(s, {paths, draft, target, {dims({4}), f32}, {dims({1}), i64}}, 4));
        report("tv_sampling_step_ok", configure(s, {paths, draft, target, {dims({4}), f32}, {dims({2}), i64}}, 4));
        report("tv_temperature_batch", configure(s, {paths, draft, target, {dims({5}), f32}, {dims({1}), i64}}, 4));
        report("tv_seed_three", configure(s, {paths, draft, target, {dims({4}), f32}, {dims({3}), i64}}, 4));
        report("tv_seed_type", configure(s, {paths, draft, target, {dims({4}), f32}, {dims({1}), i32}}, 4));
        report("tv_runtime_temperature",
               shapeChange(s, {paths, {dims({2, 64}), i32}, {dims({2, 64, 1000}), f16}, {dims({3}), f32},
                               {dims({1}), i64}}, 4));
        delete s;

        int32_t badMode = 3;
        IPluginV3* bad = make(tv, {PluginField("mode", &badMode, PluginFieldType::kINT32, 1)});
        report("tv_bad_mode", bad == nullptr ? -1 : 0);
        delete bad;
    }
    return 0;
}
