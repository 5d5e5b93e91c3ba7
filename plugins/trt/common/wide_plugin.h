// wide_plugin.h: the IPluginV3 machinery shared by the four `wide` plugins.
//
// WidePlugin implements IPluginV3 + IPluginV3OneCore/Build/Runtime once:
// capability lookup, name/version/namespace, field serialization, output
// types, configure/shape-change validation, and the try/catch around every
// noexcept entry point. A concrete plugin only supplies the op-specific parts
// (the protected pure virtuals). WideCreator<P> is the matching creator.
#ifndef WIDE_PLUGIN_H
#define WIDE_PLUGIN_H

#include "wide_plugin_common.h"

#include <string>
#include <vector>

namespace wide
{
namespace trt
{

class WidePlugin : public nvinfer1::IPluginV3,
                   public nvinfer1::IPluginV3OneCore,
                   public nvinfer1::IPluginV3OneBuild,
                   public nvinfer1::IPluginV3OneRuntime
{
public:
    WidePlugin(std::string name, std::vector<IntField> fields);
    WidePlugin(WidePlugin const& other);
    WidePlugin& operator=(WidePlugin const&) = delete;
    ~WidePlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;

    // IPluginV3OneCore
    char const* getPluginName() const noexcept override;
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;
    void setPluginNamespace(char const* ns) noexcept;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs,
        nvinfer1::DimsExprs const* shapeInputs, int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs,
        int32_t nbOutputs, nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut,
        int32_t nbInputs, int32_t nbOutputs) noexcept override;
    int32_t getNbOutputs() const noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::PluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

protected:
    //! Range of input counts the node may have (optional trailing inputs, e.g. a bias).
    virtual int32_t minInputs() const = 0;
    virtual int32_t maxInputs() const { return minInputs(); }
    //! Whether input/output `pos` (inputs first) may have the type inOut[pos].desc.type;
    //! formats are checked (linear) by the base. Earlier positions are already fixed.
    virtual bool supportsType(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs) const = 0;
    //! Output type from the input types.
    virtual nvinfer1::DataType outputType(nvinfer1::DataType const* inputTypes) const = 0;
    //! Output dims from the input dims.
    virtual void outputShape(nvinfer1::DimsExprs const* inputs, nvinfer1::DimsExprs& output,
        nvinfer1::IExprBuilder& exprBuilder) const = 0;
    //! Check concrete or partly known (-1) dims of inputs and output; throw PluginError if inconsistent.
    virtual void validateDims(nvinfer1::Dims const* inputs, nvinfer1::Dims const& output) const = 0;
    //! Workspace bytes for inputs of the given (maximum) dims.
    virtual size_t workspaceFor(nvinfer1::Dims const* inputs, nvinfer1::DataType type) const = 0;
    //! Queue the kernel(s); throw PluginError on a bad status. nbInputs() is set.
    virtual void run(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const& outputDesc,
        void const* const* inputs, void* output, void* workspace, size_t workspaceSize, cudaStream_t stream) const = 0;

    int32_t field(std::string const& name) const;
    //! Input count of the node, known once configurePlugin / onShapeChange ran.
    int32_t nbInputs() const noexcept { return mNbInputs; }
    //! Throw unless minInputs() <= nb <= maxInputs().
    void checkInputCount(int32_t nb) const;
    std::string const& name() const noexcept { return mName; }

private:
    std::string mName;
    std::string mNamespace;
    std::vector<IntField> mFields;
    std::vector<nvinfer1::PluginField> mSerialized;
    nvinfer1::PluginFieldCollection mSerializedCollection{};
    size_t mWorkspaceSize{0};
    int32_t mNbInputs{0};
};

//! CRTP helper: clone() through the concrete plugin's copy constructor.
template <typename Derived, typename Base = WidePlugin>
class WidePluginT : public Base
{
public:
    using Base::Base;

    nvinfer1::IPluginV3* clone() noexcept override
    {
        return guarded<nvinfer1::IPluginV3*>(this->name() + " clone", nullptr, [&]() -> nvinfer1::IPluginV3* {
            return new Derived(static_cast<Derived const&>(*this));
        });
    }
};

//! Creator for plugin P. P provides:
//!   static constexpr char const* kName;
//!   static std::vector<std::string> fieldNames();
//!   static std::vector<int32_t> fieldDefaults();     // INT32_MIN = required
//!   P(std::vector<IntField> fields);                  // validates
template <typename P>
class WideCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    WideCreator()
    {
        for (std::string const& n : P::fieldNames())
        {
            mNames.push_back(n);
        }
        for (std::string const& n : mNames)
        {
            mFields.emplace_back(n.c_str(), nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        }
        mCollection.nbFields = static_cast<int32_t>(mFields.size());
        mCollection.fields = mFields.data();
    }

    nvinfer1::IPluginV3* createPlugin(char const* name, nvinfer1::PluginFieldCollection const* fc,
        nvinfer1::TensorRTPhase /*phase*/) noexcept override
    {
        std::string const where = std::string(P::kName) + " '" + (name ? name : "") + "'";
        return guarded<nvinfer1::IPluginV3*>(where, nullptr, [&]() -> nvinfer1::IPluginV3* {
            auto* plugin = new P(parseIntFields(where, fc, P::fieldNames(), P::fieldDefaults()));
            plugin->setPluginNamespace(mNamespace.c_str());
            return plugin;
        });
    }

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override { return &mCollection; }
    char const* getPluginName() const noexcept override { return P::kName; }
    char const* getPluginVersion() const noexcept override { return kPluginVersion; }
    char const* getPluginNamespace() const noexcept override { return mNamespace.c_str(); }

private:
    std::string mNamespace{kPluginNamespace};
    std::vector<std::string> mNames;
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mCollection{};
};

} // namespace trt
} // namespace wide

#endif // WIDE_PLUGIN_H
