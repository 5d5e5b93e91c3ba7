// wide_plugin.cpp: the IPluginV3 plumbing shared by the `wide` plugins.
#include "wide_plugin.h"

namespace wide
{
namespace trt
{

using namespace nvinfer1;

WidePlugin::WidePlugin(std::string name, std::vector<IntField> fields)
    : mName(std::move(name))
    , mNamespace(kPluginNamespace)
    , mFields(std::move(fields))
{
}

WidePlugin::WidePlugin(WidePlugin const& other)
    : IPluginV3(other)
    , IPluginV3OneCore(other)
    , IPluginV3OneBuild(other)
    , IPluginV3OneRuntime(other)
    , mName(other.mName)
    , mNamespace(other.mNamespace)
    , mFields(other.mFields)
    , mWorkspaceSize(other.mWorkspaceSize)
    , mNbInputs(other.mNbInputs)
{
    // mSerialized points into mFields: rebuilt on demand, never copied.
}

IPluginCapability* WidePlugin::getCapabilityInterface(PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
    case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
    case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
    }
    reportError(mName, "unknown capability requested");
    return nullptr;
}

char const* WidePlugin::getPluginName() const noexcept
{
    return mName.c_str();
}

char const* WidePlugin::getPluginVersion() const noexcept
{
    return kPluginVersion;
}

char const* WidePlugin::getPluginNamespace() const noexcept
{
    return mNamespace.c_str();
}

void WidePlugin::setPluginNamespace(char const* ns) noexcept
{
    guarded<int>(mName, 0, [&]() {
        mNamespace = ns == nullptr ? "" : ns;
        return 0;
    });
}

int32_t WidePlugin::field(std::string const& fieldName) const
{
    return fieldValue(mFields, fieldName);
}

void WidePlugin::checkInputCount(int32_t nb) const
{
    int32_t const lo = minInputs();
    int32_t const hi = maxInputs();
    check(nb >= lo && nb <= hi, mName,
        "expected " + (lo == hi ? std::to_string(lo) : std::to_string(lo) + " or " + std::to_string(hi))
            + " inputs, got " + std::to_string(nb));
}

int32_t WidePlugin::getNbOutputs() const noexcept
{
    return 1;
}

int32_t WidePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>(mName + " configurePlugin", -1, [&]() {
        checkInputCount(nbInputs);
        check(nbOutputs == 1, mName, "expected 1 output");
        mNbInputs = nbInputs;
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].desc.dims);
        }
        validateDims(dims.data(), out[0].desc.dims);
        return 0;
    });
}

int32_t WidePlugin::getOutputDataTypes(
    DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    return guarded<int32_t>(mName + " getOutputDataTypes", -1, [&]() {
        checkInputCount(nbInputs);
        check(nbOutputs == 1, mName, "expected 1 output");
        outputTypes[0] = outputType(inputTypes);
        return 0;
    });
}

int32_t WidePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /*shapeInputs*/,
    int32_t /*nbShapeInputs*/, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept
{
    return guarded<int32_t>(mName + " getOutputShapes", -1, [&]() {
        checkInputCount(nbInputs);
        check(nbOutputs == 1, mName, "expected 1 output");
        check(inputs[0].nbDims >= 2, mName, "input 0 must have rank >= 2 ([..., features])");
        outputShape(inputs, outputs[0], exprBuilder);
        return 0;
    });
}

bool WidePlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept
{
    return guarded<bool>(mName + " supportsFormatCombination", false, [&]() {
        if (pos < 0 || pos >= nbInputs + nbOutputs || inOut[pos].desc.format != TensorFormat::kLINEAR)
        {
            return false;
        }
        return supportsType(pos, inOut, nbInputs);
    });
}

size_t WidePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /*outputs*/, int32_t /*nbOutputs*/) const noexcept
{
    return guarded<size_t>(mName + " getWorkspaceSize", 0, [&]() {
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(inputs[i].max);
        }
        return workspaceFor(dims.data(), inputs[0].desc.type);
    });
}

int32_t WidePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    return guarded<int32_t>(mName + " onShapeChange", -1, [&]() {
        checkInputCount(nbInputs);
        check(nbOutputs == 1, mName, "expected 1 output");
        mNbInputs = nbInputs;
        std::vector<Dims> dims;
        for (int32_t i = 0; i < nbInputs; ++i)
        {
            dims.push_back(in[i].dims);
        }
        validateDims(dims.data(), out[0].dims);
        mWorkspaceSize = workspaceFor(dims.data(), in[0].type);
        return 0;
    });
}

int32_t WidePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    return guarded<int32_t>(mName + " enqueue", -1, [&]() {
        run(inputDesc, outputDesc[0], inputs, outputs[0], workspace, mWorkspaceSize, stream);
        return 0;
    });
}

IPluginV3* WidePlugin::attachToContext(IPluginResourceContext* /*context*/) noexcept
{
    // No per-context resources: a clone is all an execution context needs.
    return clone();
}

PluginFieldCollection const* WidePlugin::getFieldsToSerialize() noexcept
{
    return guarded<PluginFieldCollection const*>(mName + " getFieldsToSerialize", nullptr, [&]() {
        mSerialized.clear();
        for (IntField const& f : mFields)
        {
            mSerialized.emplace_back(f.name.c_str(), &f.value, PluginFieldType::kINT32, 1);
        }
        mSerializedCollection.nbFields = static_cast<int32_t>(mSerialized.size());
        mSerializedCollection.fields = mSerialized.data();
        return &mSerializedCollection;
    });
}

} // namespace trt
} // namespace wide
