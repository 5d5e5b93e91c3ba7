// wide_plugin_common.h: helpers shared by the `wide` TensorRT plugins.
//
// Field parsing (PluginFieldCollection -> named int values), error reporting
// (through the ILoggerFinder TensorRT hands to setLoggerFinder, else stderr),
// TensorRT <-> wide_kernels dtype mapping, and the exception guard every
// noexcept plugin method runs its body in.
#ifndef WIDE_PLUGIN_COMMON_H
#define WIDE_PLUGIN_COMMON_H

#include <NvInferRuntime.h>
#include <NvInferVersion.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "wide_kernels.h"

#if !defined(NV_TENSORRT_MAJOR) || NV_TENSORRT_MAJOR < 10
#error "the wide plugins are IPluginV3 plugins: they need TensorRT 10.x or 11.x headers"
#endif

// TensorRT 11 dropped the deprecated IPluginCreator (V2) overloads from
// IPluginRegistry; the V3 interfaces this library uses are otherwise the same
// in 10.x and 11.x. A library compiled against 10.x headers has the 10.x
// registry vtable: static registration then only works inside a 10.x runtime
// (inside TensorRT 11 / TensorRT-RTX use IPluginRegistry::loadLibrary).
#if NV_TENSORRT_MAJOR >= 11
#define WIDE_TRT_REGISTRY_LAYOUT 11
#else
#define WIDE_TRT_REGISTRY_LAYOUT 10
#endif

namespace wide
{
namespace trt
{

//! The plugin version and default namespace every `wide` node carries (docs/opset.md).
constexpr char const* kPluginVersion = "1";
constexpr char const* kPluginNamespace = "";

//! Thrown for invalid fields, shapes or types; caught by guarded() and reported.
class PluginError : public std::runtime_error
{
public:
    using std::runtime_error::runtime_error;
};

//! Throw PluginError(where + ": " + what) unless cond holds.
void check(bool cond, std::string const& where, std::string const& what);

//! Report an error (severity kERROR) or a warning (kWARNING) for plugin `where`.
void reportError(std::string const& where, std::string const& what) noexcept;
void reportWarning(std::string const& where, std::string const& what) noexcept;

//! Remember the ILoggerFinder TensorRT passes to setLoggerFinder (first non-null wins).
void setLoggerFinderImpl(nvinfer1::ILoggerFinder* finder) noexcept;

//! Run fn() (returning T); on any exception report it and return onError instead.
template <typename T, typename Fn>
T guarded(std::string const& where, T onError, Fn&& fn) noexcept
{
    try
    {
        return fn();
    }
    catch (std::exception const& e)
    {
        reportError(where, e.what());
    }
    catch (...)
    {
        reportError(where, "unknown exception");
    }
    return onError;
}

//! One INT32 plugin field: its name and value.
struct IntField
{
    std::string name;
    int32_t value;
};

//! Parse the int fields `names` out of fc. Accepts INT8/16/32/64 data of
//! length 1; fields `plugin_version` / `plugin_namespace` are ignored; unknown
//! fields are reported as warnings; missing fields take `defaults` (same order
//! as names, nullopt-like sentinel INT32_MIN = required).
std::vector<IntField> parseIntFields(std::string const& plugin, nvinfer1::PluginFieldCollection const* fc,
    std::vector<std::string> const& names, std::vector<int32_t> const& defaults);

//! Value of field `name` in fields (throws if absent).
int32_t fieldValue(std::vector<IntField> const& fields, std::string const& name);

//! The wide_kernels dtype of a TensorRT activation type; throws for others.
wide_dtype_t toWideDtype(nvinfer1::DataType type);

//! Activation types the kernels support: kFLOAT, kHALF, kBF16.
bool isActivationType(nvinfer1::DataType type) noexcept;

//! Equal, or at least one side unknown (-1 while building with dynamic shapes).
inline bool dimsCompatible(int64_t a, int64_t b) noexcept
{
    return a < 0 || b < 0 || a == b;
}

//! Number of rows M = product of all but the last dimension.
int64_t leadingRows(nvinfer1::Dims const& dims);

//! Throw a PluginError carrying the kernel's status string unless status == WIDE_OK.
void checkKernel(std::string const& where, int status);

} // namespace trt
} // namespace wide

#endif // WIDE_PLUGIN_COMMON_H
