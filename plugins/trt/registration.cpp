// registration.cpp: how TensorRT finds the `wide` plugin creators.
//
// Two ways, pick ONE per process:
//  1. dlopen the library (Polygraphy --plugins, trtexec --staticPlugins,
//     Triton's LD_PRELOAD / --backend-config=tensorrt,plugins): static
//     registration runs when it is loaded, into the TensorRT runtime already in
//     the process. The library never references getPluginRegistry /
//     getInferLibVersion at link time: it looks them up when it is loaded
//     (dlsym in the global scope, else in an already loaded libnvinfer /
//     libtensorrt_rtx found with RTLD_NOLOAD, which is how Triton's TensorRT
//     backend holds it), so it loads with or without libnvinfer linked.
//  2. IPluginRegistry::loadLibrary(path): TensorRT calls the exported
//     getCreators() / setLoggerFinder() and owns the registration (needed for
//     version-compatible / lean-runtime engines and for TensorRT-RTX).
// loadLibrary also dlopens the library, which would run the static
// registration first and make the second registration fail as a duplicate. So
// getCreators() first takes back what the static registrar registered; see
// takeBackStaticRegistration(). Loading the library both ways explicitly
// (dlopen AND loadLibrary) in one process is still unsupported.
#include "masked_attention_plugin.h"
#include "masked_gated_mlp_plugin.h"
#include "masked_gemm_k_plugin.h"
#include "masked_gemm_n_plugin.h"
#include "router_plugin.h"

#include <dlfcn.h>
#include <mutex>

// TENSORRTAPI only exports when TensorRT itself is being built; the library is
// compiled with -fvisibility=hidden, so the two entry points export explicitly.
#define WIDE_TRT_EXPORT __attribute__((visibility("default")))

#ifndef WIDE_TRT_STATIC_REGISTRATION
#define WIDE_TRT_STATIC_REGISTRATION 1
#endif

namespace wide
{
namespace trt
{
namespace
{

//! The creators handed to IPluginRegistry::loadLibrary through getCreators().
struct Creators
{
    RouterCreator router;
    MaskedGemmNCreator gemmN;
    MaskedGatedMlpCreator gatedMlp;
    MaskedGemmKCreator gemmK;
    MaskedAttentionCreator attention;
    nvinfer1::IPluginCreatorInterface* list[5]{&router, &gemmN, &gatedMlp, &gemmK, &attention};
};

//! Is `c` one of this library's creators (and not a same-named one from elsewhere)?
bool isOurs(nvinfer1::IPluginCreatorInterface* c)
{
    return dynamic_cast<RouterCreator*>(c) != nullptr || dynamic_cast<MaskedGemmNCreator*>(c) != nullptr
        || dynamic_cast<MaskedGatedMlpCreator*>(c) != nullptr || dynamic_cast<MaskedGemmKCreator*>(c) != nullptr
        || dynamic_cast<MaskedAttentionCreator*>(c) != nullptr;
}

#if WIDE_TRT_STATIC_REGISTRATION
#define WIDE_TRT_STR2(x) #x
#define WIDE_TRT_STR(x) WIDE_TRT_STR2(x)

//! getPluginRegistry / getInferLibVersion of the TensorRT runtime already loaded in this process, if any.
struct Runtime
{
    using RegistryFn = nvinfer1::IPluginRegistry* (*) ();
    using VersionFn = int32_t (*)();
    RegistryFn registry{nullptr};
    VersionFn version{nullptr};
};

Runtime const& runtime()
{
    static Runtime const rt = [] {
        Runtime r;
        r.registry = reinterpret_cast<Runtime::RegistryFn>(dlsym(RTLD_DEFAULT, "getPluginRegistry"));
        r.version = reinterpret_cast<Runtime::VersionFn>(dlsym(RTLD_DEFAULT, "getInferLibVersion"));
        // A runtime loaded RTLD_LOCAL (Triton's TensorRT backend): find it without loading anything new.
        for (char const* lib : {"libnvinfer.so." WIDE_TRT_STR(NV_TENSORRT_MAJOR), "libnvinfer.so", "libtensorrt_rtx.so.1",
                 "libtensorrt_rtx.so"})
        {
            if (r.registry != nullptr)
            {
                break;
            }
            if (void* h = dlopen(lib, RTLD_NOW | RTLD_NOLOAD))
            {
                r.registry = reinterpret_cast<Runtime::RegistryFn>(dlsym(h, "getPluginRegistry"));
                r.version = reinterpret_cast<Runtime::VersionFn>(dlsym(h, "getInferLibVersion"));
            }
        }
        return r;
    }();
    return rt;
}

bool gStaticallyRegistered{false};

//! REGISTER_TENSORRT_PLUGIN without the link-time reference to getPluginRegistry. Built against 10.x
//! headers it registers only into a 10.x runtime: the IPluginRegistry vtable of TensorRT 11 and
//! TensorRT-RTX differs (the V2 overloads are gone), and IPluginRegistry::loadLibrary (getCreators)
//! is the way in there.
template <typename C>
struct Registrar
{
    Registrar()
    {
        Runtime const& rt = runtime();
        if (rt.registry == nullptr)
        {
            return; // no TensorRT in the process yet: IPluginRegistry::loadLibrary is the way in
        }
#if NV_TENSORRT_MAJOR < 11
        if (rt.version == nullptr || rt.version() / 10000 != NV_TENSORRT_MAJOR)
        {
            return;
        }
#endif
        gStaticallyRegistered = rt.registry()->registerCreator(instance, kPluginNamespace) || gStaticallyRegistered;
    }
    C instance{};
};
#endif

//! loadLibrary dlopened us, so the static registrars below already ran: take
//! their creators back so TensorRT can register ours under the library handle.
void takeBackStaticRegistration()
{
#if WIDE_TRT_STATIC_REGISTRATION
    if (!gStaticallyRegistered)
    {
        return; // nothing registered (or a runtime whose registry these headers cannot call)
    }
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    nvinfer1::IPluginRegistry* registry = runtime().registry();
    for (char const* name : {RouterPlugin::kName, MaskedGemmNPlugin::kName, MaskedGatedMlpPlugin::kName,
             MaskedGemmKPlugin::kName, MaskedAttentionPlugin::kName})
    {
        nvinfer1::IPluginCreatorInterface* c = registry->getCreator(name, kPluginVersion, kPluginNamespace);
        if (c != nullptr && isOurs(c))
        {
            registry->deregisterCreator(*c);
        }
    }
#endif
}

} // namespace
} // namespace trt
} // namespace wide

#if WIDE_TRT_STATIC_REGISTRATION
namespace wide
{
namespace trt
{
namespace
{
Registrar<RouterCreator> gRouterRegistrar;
Registrar<MaskedGemmNCreator> gGemmNRegistrar;
Registrar<MaskedGatedMlpCreator> gGatedMlpRegistrar;
Registrar<MaskedGemmKCreator> gGemmKRegistrar;
Registrar<MaskedAttentionCreator> gAttentionRegistrar;
} // namespace
} // namespace trt
} // namespace wide
#endif

extern "C" WIDE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static wide::trt::Creators creators;
    wide::trt::takeBackStaticRegistration();
    nbCreators = 5;
    return creators.list;
}

extern "C" WIDE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    wide::trt::setLoggerFinderImpl(finder);
}
