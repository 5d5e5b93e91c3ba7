// wide_plugin_common.cpp: field parsing, error reporting and dtype mapping.
#include "wide_plugin_common.h"

#include <climits>
#include <cstdio>
#include <mutex>

namespace wide
{
namespace trt
{
namespace
{

std::mutex gLoggerMutex;
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};

void log(nvinfer1::ILogger::Severity severity, std::string const& where, std::string const& what) noexcept
{
    try
    {
        std::string const msg = "[wide plugin " + where + "] " + what;
        nvinfer1::ILogger* logger{nullptr};
        {
            std::lock_guard<std::mutex> lock(gLoggerMutex);
            if (gLoggerFinder != nullptr)
            {
                logger = gLoggerFinder->findLogger();
            }
        }
        if (logger != nullptr)
        {
            logger->log(severity, msg.c_str());
        }
        else
        {
            std::fprintf(stderr, "%s\n", msg.c_str());
        }
    }
    catch (...)
    {
        // Nothing sensible left to do: reporting must never throw.
    }
}

int64_t readInt(std::string const& plugin, nvinfer1::PluginField const& f)
{
    using nvinfer1::PluginFieldType;
    check(f.data != nullptr && f.length == 1, plugin,
        std::string("field '") + f.name + "' must be one integer");
    switch (f.type)
    {
    case PluginFieldType::kINT8: return *static_cast<int8_t const*>(f.data);
    case PluginFieldType::kINT16: return *static_cast<int16_t const*>(f.data);
    case PluginFieldType::kINT32: return *static_cast<int32_t const*>(f.data);
    case PluginFieldType::kINT64: return *static_cast<int64_t const*>(f.data);
    default: break;
    }
    throw PluginError(plugin + ": field '" + f.name + "' must be an integer (INT32) field");
}

} // namespace

void check(bool cond, std::string const& where, std::string const& what)
{
    if (!cond)
    {
        throw PluginError(where + ": " + what);
    }
}

void reportError(std::string const& where, std::string const& what) noexcept
{
    log(nvinfer1::ILogger::Severity::kERROR, where, what);
}

void reportWarning(std::string const& where, std::string const& what) noexcept
{
    log(nvinfer1::ILogger::Severity::kWARNING, where, what);
}

void setLoggerFinderImpl(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    if (gLoggerFinder == nullptr && finder != nullptr)
    {
        gLoggerFinder = finder;
    }
}

std::vector<IntField> parseIntFields(std::string const& plugin, nvinfer1::PluginFieldCollection const* fc,
    std::vector<std::string> const& names, std::vector<int32_t> const& defaults)
{
    std::vector<IntField> out;
    for (size_t i = 0; i < names.size(); ++i)
    {
        out.push_back({names[i], defaults[i]});
    }
    int32_t const nb = fc == nullptr ? 0 : fc->nbFields;
    for (int32_t i = 0; i < nb; ++i)
    {
        nvinfer1::PluginField const& f = fc->fields[i];
        std::string const name = f.name == nullptr ? "" : f.name;
        if (name == "plugin_version" || name == "plugin_namespace")
        {
            continue;
        }
        bool known = false;
        for (IntField& field : out)
        {
            if (field.name == name)
            {
                int64_t const v = readInt(plugin, f);
                check(v >= INT32_MIN && v <= INT32_MAX, plugin, "field '" + name + "' is out of int32 range");
                field.value = static_cast<int32_t>(v);
                known = true;
            }
        }
        if (!known)
        {
            reportWarning(plugin, "ignoring unknown field '" + name + "'");
        }
    }
    for (IntField const& field : out)
    {
        check(field.value != INT32_MIN, plugin, "missing required field '" + field.name + "'");
    }
    return out;
}

int32_t fieldValue(std::vector<IntField> const& fields, std::string const& name)
{
    for (IntField const& f : fields)
    {
        if (f.name == name)
        {
            return f.value;
        }
    }
    throw PluginError("no field named '" + name + "'");
}

wide_dtype_t toWideDtype(nvinfer1::DataType type)
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return WIDE_FLOAT32;
    case nvinfer1::DataType::kHALF: return WIDE_FLOAT16;
    case nvinfer1::DataType::kBF16: return WIDE_BFLOAT16;
    default: break;
    }
    throw PluginError("unsupported activation type " + std::to_string(static_cast<int>(type))
        + " (float32, float16 and bfloat16 are supported)");
}

bool isActivationType(nvinfer1::DataType type) noexcept
{
    return type == nvinfer1::DataType::kFLOAT || type == nvinfer1::DataType::kHALF
        || type == nvinfer1::DataType::kBF16;
}

int64_t leadingRows(nvinfer1::Dims const& dims)
{
    int64_t rows = 1;
    for (int32_t i = 0; i + 1 < dims.nbDims; ++i)
    {
        rows *= dims.d[i];
    }
    return rows;
}

void checkKernel(std::string const& where, int status)
{
    if (status != WIDE_OK)
    {
        std::string detail = wide_status_string(status);
        if (status == WIDE_ERR_CUDA || status == WIDE_ERR_NO_KERNEL)
        {
            detail += std::string(" (") + wide_last_cuda_error_string() + ")";
        }
        throw PluginError(where + ": kernel failed: " + detail);
    }
}

} // namespace trt
} // namespace wide
