// registration.cpp: how TensorRT finds the `wide` plugin creators.
//
// Two ways, pick ONE per process:
//  1. dlopen the library (Polygraphy --plugins, trtexec --staticPlugins,
//     Triton's LD_PRELOAD / --backend-config=tensorrt,plugins): static
//     registration through REGISTER_TENSORRT_PLUGIN runs when it is loaded.
//  2. IPluginRegistry::loadLibrary(path): TensorRT calls the exported
//     getCreators() / setLoggerFinder() and owns the registration (needed for
//     version-compatible / lean-runtime engines and for TensorRT-RTX).
// loadLibrary also dlopens the library, which would run the static
// registration first and make the second registration fail as a duplicate. So
// getCreators() first takes back what the static registrar registered; see
// takeBackStaticRegistration(). Loading the library both ways explicitly
// (dlopen AND loadLibrary) in one process is still unsupported.
#include "masked_gated_mlp_plugin.h"
#include "masked_gemm_k_plugin.h"
#include "masked_gemm_n_plugin.h"
#include "router_plugin.h"

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
    nvinfer1::IPluginCreatorInterface* list[4]{&router, &gemmN, &gatedMlp, &gemmK};
};

//! Is `c` one of this library's creators (and not a same-named one from elsewhere)?
bool isOurs(nvinfer1::IPluginCreatorInterface* c)
{
    return dynamic_cast<RouterCreator*>(c) != nullptr || dynamic_cast<MaskedGemmNCreator*>(c) != nullptr
        || dynamic_cast<MaskedGatedMlpCreator*>(c) != nullptr || dynamic_cast<MaskedGemmKCreator*>(c) != nullptr;
}

#if WIDE_TRT_STATIC_REGISTRATION && NV_TENSORRT_MAJOR < 11
//! Built against 10.x headers: the IPluginRegistry vtable of TensorRT 11 and
//! TensorRT-RTX differs (the V2 overloads are gone), so registering into them
//! through 10.x headers crashes. Register statically only into a 10.x runtime;
//! elsewhere IPluginRegistry::loadLibrary (getCreators) is the way in.
bool gStaticallyRegistered{false};

template <typename C>
struct VersionCheckedRegistrar
{
    VersionCheckedRegistrar()
    {
        if (getInferLibVersion() / 10000 == NV_TENSORRT_MAJOR)
        {
            gStaticallyRegistered = getPluginRegistry()->registerCreator(instance, kPluginNamespace)
                || gStaticallyRegistered;
        }
    }
    C instance{};
};
#endif

//! loadLibrary dlopened us, so the static registrars below already ran: take
//! their creators back so TensorRT can register ours under the library handle.
void takeBackStaticRegistration()
{
#if WIDE_TRT_STATIC_REGISTRATION
#if NV_TENSORRT_MAJOR < 11
    if (!gStaticallyRegistered)
    {
        return; // nothing registered (or a runtime whose registry these headers cannot call)
    }
#endif
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    nvinfer1::IPluginRegistry* registry = getPluginRegistry();
    for (char const* name : {RouterPlugin::kName, MaskedGemmNPlugin::kName, MaskedGatedMlpPlugin::kName,
             MaskedGemmKPlugin::kName})
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
#if NV_TENSORRT_MAJOR >= 11
REGISTER_TENSORRT_PLUGIN(RouterCreator);
REGISTER_TENSORRT_PLUGIN(MaskedGemmNCreator);
REGISTER_TENSORRT_PLUGIN(MaskedGatedMlpCreator);
REGISTER_TENSORRT_PLUGIN(MaskedGemmKCreator);
#else
namespace
{
VersionCheckedRegistrar<RouterCreator> gRouterRegistrar;
VersionCheckedRegistrar<MaskedGemmNCreator> gGemmNRegistrar;
VersionCheckedRegistrar<MaskedGatedMlpCreator> gGatedMlpRegistrar;
VersionCheckedRegistrar<MaskedGemmKCreator> gGemmKRegistrar;
} // namespace
#endif
} // namespace trt
} // namespace wide
#endif

extern "C" WIDE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    static wide::trt::Creators creators;
    wide::trt::takeBackStaticRegistration();
    nbCreators = 4;
    return creators.list;
}

extern "C" WIDE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    wide::trt::setLoggerFinderImpl(finder);
}
